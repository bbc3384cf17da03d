"use strict";
// rollcap's run report: one page, no framework, no build step. Every string that came from a
// capture (prompts, answers, tool arguments, error bodies) is hostile text: it only ever
// reaches the page through text nodes (h() below), never as markup.
(() => {
  const DATA = JSON.parse(document.getElementById("rollcap-data").textContent);
  const SERVED = DATA.mode === "served";
  const PAGE_ROWS = 500;
  const MAX_BARS = 2000;
  const MAX_TOKENS = 20000;
  const POLL_MS = 2000;
  const VIEW_HINT = "open with rollcap capture view";

  const state = {
    summary: null, rows: [], callStart: [], rowById: new Map(), groupByTask: new Map(),
    cache: new Map(), sort: { key: "id", desc: false }, filter: { text: "", kind: "all", minCalls: "" },
    bin: null, page: 0, revision: null,
  };

  // --- DOM ---------------------------------------------------------------------------------
  function add(el, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { for (const c of child) add(el, c); return; }
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "class") el.setAttribute("class", v);
      else el.setAttribute(k, String(v));
    }
  }
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    add(el, children);
    return el;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    setAttrs(el, attrs);
    add(el, children);
    return el;
  }
  const app = () => document.getElementById("app");
  function fill(el, ...children) {
    el.replaceChildren();
    add(el, children);
    return el;
  }
  function show(...children) {
    fill(app(), children);
    window.scrollTo(0, 0);
  }

  // --- formatting --------------------------------------------------------------------------
  const dash = "–";
  function num(v) {
    if (v === null || v === undefined) return dash;
    if (typeof v !== "number") return String(v);
    if (!Number.isInteger(v)) return String(Math.round(v * 1000) / 1000);
    return String(v).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  }
  function ms(v) {
    if (v === null || v === undefined) return dash;
    if (v >= 10000) return (v / 1000).toFixed(1) + " s";
    if (v >= 1000) return (v / 1000).toFixed(2) + " s";
    return Math.round(v) + " ms";
  }
  function when(epoch) {
    if (epoch === null || epoch === undefined) return dash;
    return new Date(epoch * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  function pretty(v) {
    if (typeof v === "string") {
      try { return JSON.stringify(JSON.parse(v), null, 2); } catch (e) { return v; }
    }
    return JSON.stringify(v, null, 2);
  }
  function tag(text, kind) { return h("span", { class: "tag" + (kind ? " " + kind : "") }, text); }
  function shortGap(code) { return String(code).replace(/^model_call_capture_/, ""); }

  // --- data ----------------------------------------------------------------------------------
  async function inflate(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip")).getReader();
    const decoder = new TextDecoder();
    let text = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    return JSON.parse(text + decoder.decode());
  }
  async function api(path) {
    const response = await fetch(path, { headers: { accept: "application/json" } });
    if (!response.ok) throw new Error(path + ": HTTP " + response.status);
    return response.json();
  }

  function useSummary(summary) {
    state.summary = summary;
    const cols = summary.rollouts;
    const n = cols.id.length;
    const rows = new Array(n);
    const starts = new Array(n);
    let offset = 0;
    state.rowById = new Map();
    for (let i = 0; i < n; i++) {
      const row = { index: i };
      for (const key of Object.keys(cols)) row[key] = cols[key][i];
      row.tokens = row.tokens_in === null && row.tokens_out === null ? null : (row.tokens_in || 0) + (row.tokens_out || 0);
      rows[i] = row;
      starts[i] = offset;
      offset += row.calls;
      state.rowById.set(row.id, row);
    }
    state.rows = rows;
    state.callStart = starts;
    state.groupByTask = new Map(summary.groups.map((g) => [g.task, g]));
  }

  function callsOf(row) {
    const c = state.summary.calls;
    const first = state.callStart[row.index];
    const out = [];
    for (let k = 0; k < row.calls; k++) {
      const j = first + k;
      out.push({
        pos: k, start: c.start[j], latency: c.latency[j], ttft: c.ttft[j], stream: c.stream[j] === 1,
        tin: c.tin[j], tout: c.tout[j], treason: c.treason[j], cached: c.cached[j], status: c.status[j],
        err: c.err[j] === null ? null : state.summary.tables.err[c.err[j]],
        finish: c.finish[j] === null ? null : state.summary.tables.finish[c.finish[j]],
        tools: c.tools[j], gaps: c.gaps[j],
      });
    }
    return out;
  }

  // A rollout's payload (every call's delta and answer), tokens or raw texts, decoded once.
  async function blob(kind, rolloutId) {
    const key = kind + "/" + rolloutId;
    if (state.cache.has(key)) return state.cache.get(key);
    let value = null;
    const packed = DATA[kind] && DATA[kind][rolloutId];
    if (packed) value = await inflate(packed);
    else if (SERVED) {
      const path = "api/rollout/" + encodeURIComponent(rolloutId) + (kind === "payloads" ? "" : "/" + kind);
      value = await api(path);
    }
    if (!SERVED || kind !== "payloads") state.cache.set(key, value);
    return value;
  }
  function leftOutNote(what) {
    return h("p", { class: "marker" }, what + " did not fit in this report's payload budget: " + VIEW_HINT + ".");
  }

  // The whole request of call i: its parent's conversation up to `keep`, then its own messages.
  function conversation(payload, i, memo) {
    if (memo.has(i)) return memo.get(i);
    const chain = [];
    for (let at = i; at !== null && at !== undefined && !memo.has(at); at = payload.calls[at].parent) chain.push(at);
    for (let k = chain.length - 1; k >= 0; k--) {
      const call = payload.calls[chain[k]];
      let messages = call.new;
      if (call.parent !== null && call.parent !== undefined) {
        const parent = payload.calls[call.parent];
        const before = memo.get(call.parent).concat(parent.answer);
        messages = before.slice(0, call.keep).concat(call.new);
      }
      memo.set(chain[k], messages);
    }
    return memo.get(i);
  }
  // Parameters and tool definitions are stored once per distinct value; a call may name the
  // call that holds them.
  function paramsOf(payload, i) {
    const call = payload.calls[i];
    const pick = (key) => (call[key] !== undefined ? call[key] : call[key + "_ref"] !== undefined ? payload.calls[call[key + "_ref"]][key] : undefined);
    const params = Object.assign({}, pick("params") || {});
    const tools = pick("tools");
    if (tools !== undefined) params.tools = tools;
    return params;
  }

  // --- plots ---------------------------------------------------------------------------------
  const W = 320, H = 150, PAD = { l: 40, r: 8, t: 8, b: 28 };
  function ticks(lo, hi, count) {
    if (hi <= lo) return [lo];
    const raw = (hi - lo) / count;
    const step = Math.pow(10, Math.floor(Math.log10(raw)));
    const nice = [1, 2, 5, 10].map((m) => m * step).find((v) => v >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / nice) * nice; v <= hi + 1e-9; v += nice) out.push(Math.round(v * 1e6) / 1e6);
    return out;
  }
  function axes(svg, x, y, xs, ys, fmtX, fmtY) {
    for (const v of ys) {
      svg.appendChild(s("line", { class: "grid", x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v) }));
      svg.appendChild(s("text", { x: PAD.l - 4, y: y(v) + 3, "text-anchor": "end" }, fmtY(v)));
    }
    svg.appendChild(s("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }));
    for (const v of xs) svg.appendChild(s("text", { x: x(v), y: H - PAD.b + 12, "text-anchor": "middle" }, fmtX(v)));
  }
  // values: [{v, row}]; a click on a bar keeps the rollouts behind it in the list.
  function histogram(title, values, fmt, id) {
    const box = h("div", { class: "plot", id: id }, h("h4", null, title + " (" + num(values.length) + ")"));
    if (!values.length) { box.appendChild(h("p", { class: "muted" }, "no values")); return box; }
    let lo = Infinity, hi = -Infinity;
    for (const { v } of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
    // Counts get whole-number bins: [3, 4) holds the 3s.
    const integer = values.every(({ v }) => Number.isInteger(v));
    const range = integer ? hi - lo + 1 : hi - lo;
    const bins = Math.min(integer ? range : 30, Math.max(1, Math.ceil(Math.sqrt(values.length))));
    const width = range > 0 ? (integer ? Math.ceil(range / bins) : range / bins) : 1;
    const counts = new Array(bins).fill(0);
    const rows = Array.from({ length: bins }, () => new Set());
    for (const { v, row } of values) {
      const b = Math.min(bins - 1, Math.floor((v - lo) / width));
      counts[b]++;
      rows[b].add(row);
    }
    const top = Math.max(...counts);
    const x = (v) => PAD.l + ((v - lo) / (width * bins)) * (W - PAD.l - PAD.r);
    const y = (c) => H - PAD.b - (c / top) * (H - PAD.t - PAD.b);
    const svg = s("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    axes(svg, x, y, ticks(lo, lo + width * bins, 4), ticks(0, top, 3).filter(Number.isInteger), fmt, num);
    counts.forEach((count, b) => {
      if (!count) return;
      const from = lo + b * width, to = from + width;
      const range = integer ? (width === 1 ? fmt(from) : fmt(from) + dash + fmt(to - 1)) : fmt(from) + dash + fmt(to);
      const label = title + " " + range;
      svg.appendChild(s("rect", {
        class: "bin", x: x(from) + 0.5, width: Math.max(1, x(to) - x(from) - 1), y: y(count), height: H - PAD.b - y(count),
        onclick: () => { state.bin = { label: label, rows: rows[b] }; state.page = 0; route(); },
      }, s("title", null, label + ": " + num(count) + " · click to list the rollouts")));
    });
    box.appendChild(svg);
    return box;
  }
  function scatter(title, points, id) {
    const box = h("div", { class: "plot", id: id }, h("h4", null, title + " (" + num(points.length) + ")"));
    if (!points.length) { box.appendChild(h("p", { class: "muted" }, "no rollout with a reward")); return box; }
    const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= 1; y1 += 1; }
    const x = (v) => PAD.l + ((v - x0) / (x1 - x0)) * (W - PAD.l - PAD.r - 6) + 3;
    const y = (v) => H - PAD.b - ((v - y0) / (y1 - y0)) * (H - PAD.t - PAD.b - 6) - 3;
    const svg = s("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    axes(svg, x, y, ticks(x0, x1, 4), ticks(y0, y1, 3), num, num);
    for (const p of points) {
      svg.appendChild(s("circle", { cx: x(p.x), cy: y(p.y), r: 3, onclick: () => go("#/r/" + encodeURIComponent(p.id)) },
        s("title", null, p.id + ": " + num(p.x) + " calls, reward " + num(p.y))));
    }
    box.appendChild(svg);
    return box;
  }

  // --- overview and rollout list -------------------------------------------------------------
  function card(label, value) { return h("div", { class: "card" }, h("b", null, value), h("span", null, label)); }
  function overview() {
    const run = state.summary.run;
    const span = run.start !== null && run.end !== null ? ms((run.end - run.start) * 1000) : dash;
    const errors = Object.entries(run.errors);
    const gaps = Object.entries(run.gaps);
    const parts = [
      h("div", { class: "cards", id: "run-cards" },
        card("rollouts", num(run.rollouts)), card("calls", num(run.calls)),
        card("failed rollouts", num(run.failed_rollouts)), card("mean reward", num(run.mean_reward)),
        card("tokens in", num(run.tokens_in)), card("tokens out", num(run.tokens_out)),
        card("reasoning tokens", num(run.tokens_reasoning)), card("cached tokens", num(run.cached_tokens)),
        card("calls with errors", num(errors.reduce((a, [, n]) => a + n, 0))), card("wall-clock span", span)),
      h("p", { class: "muted" }, "from " + when(run.start) + " to " + when(run.end)),
    ];
    if (errors.length) parts.push(h("p", { id: "run-errors" }, "Errors: ", errors.map(([k, n]) => tag(k + " × " + n, "err"))));
    if (gaps.length) parts.push(h("p", { id: "run-gaps" }, "Gaps: ", gaps.map(([k, n]) => tag(shortGap(k) + " × " + n, "gap"))));
    for (const note of state.summary.notes) parts.push(h("p", { class: "marker" }, note.code + (note.detail ? ": " + note.detail : "")));
    const left = DATA.budget ? DATA.budget.left_out : null;
    if (left && left.payloads) parts.push(leftOutNote(num(left.payloads) + " rollouts' payloads"));
    parts.push(plots());
    return parts;
  }
  function plots() {
    const c = state.summary.calls;
    const latency = [], ttft = [], tin = [], tout = [], perRollout = [], reward = [];
    state.rows.forEach((row, r) => {
      perRollout.push({ v: row.calls, row: r });
      if (row.reward !== null) reward.push({ x: row.calls, y: row.reward, id: row.id });
      const first = state.callStart[r];
      for (let j = first; j < first + row.calls; j++) {
        if (c.latency[j] !== null) latency.push({ v: c.latency[j], row: r });
        if (c.ttft[j] !== null) ttft.push({ v: c.ttft[j], row: r });
        if (c.tin[j] !== null) tin.push({ v: c.tin[j], row: r });
        if (c.tout[j] !== null) tout.push({ v: c.tout[j], row: r });
      }
    });
    return h("div", { class: "plots" },
      histogram("Latency per call", latency, ms, "plot-latency"),
      histogram("TTFT per streamed call", ttft, ms, "plot-ttft"),
      histogram("Tokens in per call", tin, num, "plot-tokens-in"),
      histogram("Tokens out per call", tout, num, "plot-tokens-out"),
      histogram("Calls per rollout", perRollout, num, "plot-calls"),
      scatter("Reward against calls", reward, "plot-reward"));
  }

  const COLUMNS = [
    ["id", "rollout", false], ["task", "task", true], ["attempt", "attempt", true], ["reward", "reward", true],
    ["calls", "calls", true], ["tokens", "tokens", true], ["wall_ms", "wall time", true],
    ["ttft_p50", "TTFT p50", true], ["errors", "errors", true], ["gaps", "gaps", false], ["finish", "finish", false],
  ];
  function matches(row) {
    const f = state.filter;
    if (state.bin && !state.bin.rows.has(row.index)) return false;
    if (f.text && !row.id.includes(f.text)) return false;
    if (f.minCalls !== "" && !(row.calls > Number(f.minCalls))) return false;
    switch (f.kind) {
      case "zero": return row.reward === 0;
      case "positive": return row.reward !== null && row.reward > 0;
      case "errors": return row.errors > 0;
      case "gaps": return row.gaps.length > 0;
      case "failed": return row.failure !== null;
      default: return true;
    }
  }
  function compare(a, b) {
    const key = state.sort.key;
    let x = a[key], y = b[key];
    if (Array.isArray(x)) { x = x.length; y = y.length; }
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    let out = 0;
    if (key === "id") out = a.index - b.index;
    else out = x < y ? -1 : x > y ? 1 : a.index - b.index;
    return state.sort.desc ? -out : out;
  }
  function rolloutList() {
    const wrap = h("div", { id: "rollout-list" });
    const draw = () => {
      const rows = state.rows.filter(matches).sort(compare);
      const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
      state.page = Math.min(state.page, pages - 1);
      const shown = rows.slice(state.page * PAGE_ROWS, (state.page + 1) * PAGE_ROWS);
      const head = h("tr", null, COLUMNS.map(([key, label, numeric]) => h("th", {
        class: (numeric ? "num " : "") + (state.sort.key === key ? "sorted" + (state.sort.desc ? " desc" : "") : ""),
        "data-key": key,
        onclick: () => { state.sort = { key: key, desc: state.sort.key === key ? !state.sort.desc : false }; draw(); },
      }, label)));
      const body = h("tbody", null, shown.map((row) => h("tr", {
        class: row.errors ? "has-errors" : null, "data-rollout": row.id,
        onclick: () => go("#/r/" + encodeURIComponent(row.id)),
      },
      h("td", null, row.id), h("td", { class: "num" }, num(row.task)), h("td", { class: "num" }, num(row.attempt)),
      h("td", { class: "num" }, num(row.reward)), h("td", { class: "num" }, num(row.calls)),
      h("td", { class: "num" }, num(row.tokens)), h("td", { class: "num" }, ms(row.wall_ms)),
      h("td", { class: "num" }, ms(row.ttft_p50)), h("td", { class: "num errors" }, num(row.errors)),
      h("td", null, row.gaps.map((g) => tag(shortGap(g), "gap"))),
      h("td", null, row.failure !== null ? tag("failed", "err") : null, row.finish.map((f) => tag(f))))));
      const pager = pages > 1 ? h("div", { class: "pager" },
        h("button", { disabled: state.page === 0 ? "" : null, onclick: () => { state.page--; draw(); } }, "previous"),
        " page " + (state.page + 1) + " of " + pages + " ",
        h("button", { disabled: state.page >= pages - 1 ? "" : null, onclick: () => { state.page++; draw(); } }, "next")) : null;
      fill(wrap, h("p", { class: "muted", id: "list-count" }, num(rows.length) + " of " + num(state.rows.length) + " rollouts"),
        pager, h("table", { id: "rollouts" }, h("thead", null, head), body));
    };
    const text = h("input", { type: "search", placeholder: "rollout id contains", value: state.filter.text,
      oninput: (e) => { state.filter.text = e.target.value; state.page = 0; draw(); } });
    const kind = h("select", { id: "filter-kind", onchange: (e) => { state.filter.kind = e.target.value; state.page = 0; draw(); } },
      [["all", "all rollouts"], ["zero", "reward = 0"], ["positive", "reward > 0"], ["errors", "has errors"],
        ["gaps", "has gaps"], ["failed", "failed"]].map(([v, l]) => h("option", { value: v, selected: state.filter.kind === v ? "" : null }, l)));
    const calls = h("input", { type: "number", min: 0, value: state.filter.minCalls,
      oninput: (e) => { state.filter.minCalls = e.target.value; state.page = 0; draw(); } });
    const bin = state.bin ? h("span", { class: "chip" }, state.bin.label + " ",
      h("button", { onclick: () => { state.bin = null; route(); } }, "clear")) : null;
    draw();
    return [h("div", { class: "controls" }, text, kind, " calls > ", calls, bin), wrap];
  }
  function home() {
    show(h("h2", null, "Run"), overview(), h("h2", null, "Rollouts"), rolloutList());
  }

  // --- rollout: waterfall, call detail, tokens -----------------------------------------------
  function waterfall(row, calls, picked) {
    const shown = calls.slice(0, MAX_BARS);
    let end = 0;
    for (const c of shown) end = Math.max(end, (c.start || 0) + (c.latency || 0));
    end = end || 1;
    const width = 900, left = 56, bar = 14, top = 18;
    const x = (v) => left + (v / end) * (width - left - 30);
    const svg = s("svg", { id: "waterfall", width: width, height: top + shown.length * bar + 6, viewBox: "0 0 " + width + " " + (top + shown.length * bar + 6) });
    for (const t of ticks(0, end, 6)) {
      svg.appendChild(s("line", { class: "grid", x1: x(t), x2: x(t), y1: top - 4, y2: top + shown.length * bar }));
      svg.appendChild(s("text", { x: x(t), y: 11, "text-anchor": "middle" }, ms(t)));
    }
    for (const c of shown) {
      const y = top + c.pos * bar;
      const start = c.start || 0;
      const g = s("g", { class: "bar" + (c.pos === picked ? " picked" : ""), "data-call": c.pos, "data-stream": c.stream ? "1" : "0",
        onclick: () => go("#/r/" + encodeURIComponent(row.id) + "/" + c.pos) });
      g.appendChild(s("rect", { class: "hit", x: 0, y: y, width: width, height: bar }));
      g.appendChild(s("text", { x: 4, y: y + 10, class: c.stream ? "stream" : null }, "#" + c.pos + (c.stream ? " ≋" : "")));
      g.appendChild(s("rect", { class: "call" + (c.err ? " error" : ""), x: x(start), y: y + 2, height: bar - 4,
        width: Math.max(2, x(start + (c.latency || 0)) - x(start)) }));
      if (c.stream && c.ttft !== null) {
        g.appendChild(s("rect", { class: "ttft", x: x(start), y: y + 2, height: bar - 4, width: Math.max(1, x(start + c.ttft) - x(start)) }));
      }
      const facts = ["call #" + c.pos, ms(c.latency), c.stream ? "streamed, TTFT " + ms(c.ttft) : "not streamed",
        "tokens in " + num(c.tin) + " / out " + num(c.tout), "finish " + (c.finish || dash)];
      if (c.err) facts.push("error " + c.err + (c.status ? " (HTTP " + c.status + ")" : ""));
      g.appendChild(s("title", null, facts.join(" · ")));
      svg.appendChild(g);
    }
    return h("div", null,
      h("p", { class: "legend muted" }, h("span", null, h("i", { style: "background:var(--accent)" }), "call"),
        h("span", null, h("i", { style: "background:var(--ttft)" }), "time to first token (streamed calls, ≋)"),
        h("span", null, h("i", { style: "background:var(--err)" }), "error"), h("span", null, "gaps between bars: agent and tool time")),
      calls.length > MAX_BARS ? h("p", { class: "muted" }, "the first " + MAX_BARS + " of " + calls.length + " calls") : null,
      h("div", { class: "wf" }, svg));
  }

  function messageView(m) {
    if (m === null || typeof m !== "object") return h("pre", null, pretty(m));
    const role = String(m.role || "?");
    const box = h("div", { class: "msg role-" + role.replace(/[^a-z]/g, "") },
      h("div", { class: "role" }, role, m.tool_call_id ? " · result of " + m.tool_call_id : "", m.name ? " · " + m.name : ""));
    if (m.reasoning_content) box.appendChild(h("details", null, h("summary", null, "reasoning"), h("pre", null, String(m.reasoning_content))));
    const content = m.content;
    if (typeof content === "string") { if (content) box.appendChild(h("pre", { class: "text" }, content)); }
    else if (Array.isArray(content)) {
      for (const part of content) {
        if (part && typeof part.text === "string") box.appendChild(h("pre", { class: "text" }, part.text));
        else if (part && part.type === "image_url") box.appendChild(h("p", { class: "muted" }, "[image, not shown]"));
        else box.appendChild(h("pre", null, pretty(part)));
      }
    } else if (content !== null && content !== undefined) box.appendChild(h("pre", null, pretty(content)));
    for (const call of m.tool_calls || []) {
      const fn = (call && call.function) || {};
      box.appendChild(h("div", { class: "tool-call" }, h("span", { class: "name" }, String(fn.name)), h("pre", null, pretty(fn.arguments))));
    }
    return box;
  }
  function download(name, value) {
    const url = URL.createObjectURL(new Blob([JSON.stringify(value, null, 2)], { type: "application/json" }));
    const a = h("a", { href: url, download: name });
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }
  function kv(pairs) {
    return h("dl", { class: "kv" }, pairs.filter((p) => p).map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
  }

  function callDetail(row, payload, pos) {
    const call = payload.calls[pos];
    // Times come from the summary, which a served page may not have caught up with yet.
    const timing = callsOf(row)[pos] || { start: null, latency: null, ttft: null };
    const memo = new Map();
    const whole = conversation(payload, pos, memo);
    const box = h("section", { class: "detail", id: "call-detail", "data-call": pos });
    const link = (i) => h("a", { href: "#/r/" + encodeURIComponent(row.id) + "/" + i }, "#" + i);
    const usage = call.usage;
    box.appendChild(h("h3", null, "Call #" + pos + " ", call.error_category ? tag(call.error_category, "err") : tag(call.finish_reason || "no finish reason", "ok")));
    box.appendChild(kv([
      ["model call id", call.id], ["model", call.model || dash], ["dialect", call.dialect],
      ["HTTP status", num(call.status_code)], ["error category", h("span", { class: "error-category" }, call.error_category || dash)],
      ["finish reason", call.finish_reason || dash], ["response status", call.response_status || dash],
      ["started", timing.start === null ? dash : when(row.t0 + timing.start / 1000)], ["latency", ms(timing.latency)],
      ["streamed", call.stream ? "yes, first byte after " + ms(timing.ttft) : "no"],
      ["tokens", "in " + num(usage.tokens_in) + " (cached " + num(usage.cached_tokens) + ") · out " + num(usage.tokens_out) +
        " (reasoning " + num(usage.tokens_reasoning) + ")"],
      call.session ? ["client session", call.session] : null,
      ["continues", call.parent === null ? "nothing: first of its conversation" : h("span", null, "call ", link(call.parent), ", " + call.keep + " messages kept")],
    ]));
    if (call.gaps.length) box.appendChild(h("p", null, "Gaps: ", call.gaps.map((g) => tag(g.code + (g.detail ? ": " + g.detail : ""), "gap"))));

    const newOnes = h("div", { id: "new-messages" });
    const showMessages = (all) => {
      const list = all ? whole : call.new;
      fill(newOnes, list.length ? list.map(messageView) : h("p", { class: "muted" }, "no new message (the same request as call #" + call.parent + ")"));
    };
    showMessages(false);
    const toggle = h("label", null, h("input", { type: "checkbox", id: "whole-request", onchange: (e) => showMessages(e.target.checked) }), " whole request (" + whole.length + " messages)");
    box.appendChild(h("h3", null, "New messages (" + call.new.length + ") "));
    box.appendChild(toggle);
    if (call.request_error) box.appendChild(h("div", null, h("p", { class: "marker" }, "the request could not be read as a conversation: " + call.request_error), h("pre", null, pretty(call.request))));
    box.appendChild(newOnes);
    const params = paramsOf(payload, pos) || {};
    const tools = params.tools;
    const rest = Object.assign({}, params);
    delete rest.tools;
    box.appendChild(h("details", null, h("summary", null, "request parameters"), h("pre", null, pretty(rest))));
    if (tools) box.appendChild(h("details", null, h("summary", null, "tool definitions (" + (Array.isArray(tools) ? tools.length : 1) + ")"), h("pre", null, pretty(tools))));

    const answer = h("div", { id: "answer" });
    const text = call.answer.map((m) => (typeof m.content === "string" ? m.content : Array.isArray(m.content) ? m.content.map((p) => (p && p.text) || "").join("") : "")).join("");
    if (text) answer.appendChild(h("pre", { class: "text answer-text" }, text));
    const toolCalls = call.tool_calls || call.answer.flatMap((m) => (m.tool_calls || []).map((t) => {
      const fn = (t && t.function) || {};
      return { call_id: t && t.id, name: fn.name, arguments: fn.arguments };
    }));
    for (const t of toolCalls) {
      answer.appendChild(h("div", { class: "tool-call" }, "tool call ", h("span", { class: "name" }, String(t.name)),
        t.call_id ? h("span", { class: "muted" }, " (" + t.call_id + ")") : null, h("pre", { class: "arguments" }, pretty(t.arguments))));
    }
    if (call.reasoning !== null) answer.appendChild(h("details", { class: "reasoning" }, h("summary", null, "reasoning"), h("pre", null, call.reasoning)));
    if (call.response !== undefined) {
      const why = call.answer_error ? "the answer could not be read (" + call.answer_error + "); the response as captured:" : "the response as captured for this failed call:";
      answer.appendChild(h("div", null, h("p", null, why), h("pre", { class: "error-body" }, pretty(call.response))));
    }
    if (!answer.childNodes.length) answer.appendChild(h("p", { class: "muted" }, "no answer captured"));
    box.appendChild(h("h3", null, "Answer"));
    box.appendChild(answer);

    if (call.raw) {
      const rawBox = h("div");
      const details = h("details", { id: "raw", ontoggle: async () => {
        if (!details.open || rawBox.childNodes.length) return;
        let raw = null;
        if (SERVED) raw = await api("api/rollout/" + encodeURIComponent(row.id) + "/call/" + pos + "/raw");
        else { const all = await blob("raw", row.id); raw = all && all[String(pos)]; }
        if (!raw) { rawBox.appendChild(leftOutNote("This call's raw texts")); return; }
        if (raw.response_raw) rawBox.appendChild(h("div", null, h("p", null, "response as received"), h("pre", null, raw.response_raw)));
        if (raw.request_raw) rawBox.appendChild(h("div", null, h("p", null, "request as received"), h("pre", null, raw.request_raw)));
      } }, h("summary", null, "raw stream and texts"), rawBox);
      box.appendChild(details);
    }
    box.appendChild(h("p", null, h("button", { onclick: () => download(row.id + "-call-" + pos + ".json", Object.assign({}, call, { messages: whole, params: paramsOf(payload, pos) })) }, "download JSON")));
    return box;
  }

  // The staged tokens (rollcap.report._tokens): the trainer's verdict from the gate's manifest,
  // its failures, each staged call, and each chain verified (mask 1.0 = generated).
  function tokenView(tokens, payload) {
    const box = h("section", { class: "detail", id: "token-view" }, h("h3", null, "Tokens"));
    const position = new Map((payload ? payload.calls : []).map((c, i) => [c.id, i]));
    const name = (id) => (position.has(id) ? "#" + position.get(id) : String(id).slice(0, 8));
    const refusal = (r) => r.code + (r.detail ? ": " + r.detail : "");
    if (tokens.error) box.appendChild(h("p", { class: "marker" }, tokens.error));
    const ledger = tokens.ledger;
    const verdict = tokens.verdict;
    if (ledger && ledger.error) box.appendChild(h("p", { class: "marker" }, "the ledger " + ledger.path + " cannot be read: " + ledger.error));
    if (verdict) {
      const how = verdict.selection ? " (" + verdict.selection + (verdict.attribution ? ": " + verdict.attribution : "") + ")" : "";
      box.appendChild(h("p", { id: "token-verdict" }, "Trainer: ", verdict.trainable
        ? [tag("trainable", "ok"), " terminal call " + name(verdict.terminal) + how]
        : [tag("refused", "err"), " ", h("code", { class: "refusal" }, refusal(verdict)), verdict.terminal ? " · terminal call " + name(verdict.terminal) + how : ""]));
    } else if (ledger && !ledger.error) {
      box.appendChild(h("p", { class: "marker", id: "token-verdict" }, "No ledger at " + ledger.path + ": what the gate committed and which calls failed is unknown; the chains are verified against the staged records alone."));
    }
    if (tokens.failures.length) {
      box.appendChild(h("p", { id: "token-failures" }, "Failed calls: ", tokens.failures.map((f) => tag(name(f.call) + " " + f.reason, "err"))));
    }
    if (tokens.calls.length) box.appendChild(h("p", { class: "token-calls" }, "Staged calls: ", tokens.calls.map((c) => {
      const what = name(c.id) + " · " + (c.read === null ? "verified" : c.staged ? "does not verify" : "unreadable") + (c.weight_version === null ? "" : " · weights v" + c.weight_version) + (ledger && !c.in_manifest ? " · not in the ledger" : "");
      return h("span", { class: "tag " + (c.read === null ? "ok" : "err"), title: (c.key || c.id) + (c.read ? "\n" + c.read : "") }, what);
    })));
    tokens.chains.forEach((chain, n) => {
      const generated = chain.mask.filter((m) => m === 1).length;
      const head = "Chain " + (n + 1) + (chain.terminal ? " (terminal)" : "") + ": " + chain.ids.length + " tokens (" + generated + " generated), " + chain.calls.length + " calls" + (chain.chain_hash ? ", chain hash " + String(chain.chain_hash).slice(0, 16) : "") + " ";
      box.appendChild(h("h4", { class: "chain" }, head, chain.refusal ? tag("refused", "err") : tag("verified", "ok"), chain.custody === "ledger" ? null : tag(chain.custody === "records" ? "records only" : "partly in the ledger", "gap")));
      if (chain.refusal) box.appendChild(h("p", { class: "marker refusal" }, "refused: " + refusal(chain.refusal) + (chain.ids.length ? " (the tokens below are as staged, unverified)" : "")));
      const cells = h("div", { class: "tokens" });
      const limit = Math.min(chain.ids.length, MAX_TOKENS);
      const links = new Map((chain.links || []).map(([id, carry, gen]) => [id, [carry, gen]]));
      let boundary = 0;
      for (let i = 0; i < limit; i++) {
        while (boundary < chain.spans.length && chain.spans[boundary].start === i) {
          const span = chain.spans[boundary];
          const link = links.get(span.call);
          cells.appendChild(h("b", { class: "cut", title: span.call }, "call " + name(span.call) + " · weights v" + num(span.weight_version) + " · tokens " + span.start + "–" + span.end + (link ? " · " + link[0] + " carried + " + link[1] + " generated" : "")));
          boundary++;
        }
        const m = chain.mask[i];
        const kind = m === 1 ? "gen" : m === 0 ? "masked" : "odd";
        const lp = chain.logprobs[i];
        const shade = kind === "gen" && typeof lp === "number" ? "background:hsl(" + Math.round(120 * Math.exp(Math.max(lp, -10))) + ",70%,78%)" : null;
        cells.appendChild(h("span", { class: kind, style: shade, title: "id " + chain.ids[i] + " · mask " + m + (kind === "masked" ? " (prompt)" : " · logprob " + lp) }, String(chain.ids[i])));
      }
      if (chain.ids.length > limit) box.appendChild(h("p", { class: "muted" }, "the first " + limit + " tokens"));
      box.appendChild(cells);
    });
    return box;
  }

  async function rolloutPage(id, pos) {
    const row = state.rowById.get(id);
    if (!row) { show(h("p", { class: "marker" }, "no rollout " + id + " in this run")); return; }
    const calls = callsOf(row);
    const group = row.task !== null ? state.groupByTask.get(row.task) : null;
    const head = [
      h("h2", null, "Rollout " + row.id),
      kv([
        ["task", row.task === null ? dash : h("span", null, num(row.task), group && group.rows.length > 1 ? [" · ", h("a", { href: "#/t/" + row.task, id: "group-link" }, "compare its " + group.rows.length + " rollouts")] : null)],
        ["attempt", num(row.attempt)], ["reward", num(row.reward)],
        row.failure !== null ? ["failure", h("span", { class: "tag err" }, row.failure)] : null,
        ["calls", num(row.calls) + " (" + num(row.errors) + " with errors)"], ["wall time", ms(row.wall_ms)],
        ["tokens", "in " + num(row.tokens_in) + " · out " + num(row.tokens_out) + " · reasoning " + num(row.tokens_reasoning) + " · cached " + num(row.cached_tokens)],
        ["gaps", row.gaps.length ? row.gaps.map((g) => tag(shortGap(g), "gap")) : dash],
      ]),
      h("h3", null, "Calls on one time axis"), waterfall(row, calls, pos),
    ];
    const detail = h("div", { id: "rollout-detail" });
    show(head, detail);
    const payload = await blob("payloads", row.id);
    if (!payload) { detail.appendChild(leftOutNote("This rollout's payloads")); }
    else {
      for (const g of payload.gaps) detail.appendChild(h("p", { class: "marker" }, g.code + (g.detail ? ": " + g.detail : "")));
      if (pos !== null && pos < payload.calls.length) detail.appendChild(callDetail(row, payload, pos));
      else if (payload.calls.length) detail.appendChild(h("p", { class: "muted" }, "Click a bar to open its call."));
    }
    if (DATA.tokens !== undefined || SERVED) {
      const tokens = await blob("tokens", row.id);
      if (tokens) detail.appendChild(tokenView(tokens, payload));
    }
  }

  // --- task group ----------------------------------------------------------------------------
  async function groupPage(task, a, b) {
    const group = state.groupByTask.get(task);
    if (!group) { show(h("p", { class: "marker" }, "no task " + task + " in this run")); return; }
    const rows = group.rows.map((i) => state.rows[i]);
    const rewards = rows.map((r) => r.reward).filter((r) => r !== null);
    const mean = rewards.length ? rewards.reduce((x, y) => x + y, 0) / rewards.length : null;
    const spread = rewards.length ? Math.max(...rewards) - Math.min(...rewards) : null;
    const div = (i, j) => (group.div[i] ? group.div[i][j] : undefined);
    a = Math.min(a, rows.length - 1); b = Math.min(b, rows.length - 1);
    const table = h("table", { id: "group-rollouts" }, h("thead", null, h("tr", null, ["rollout", "reward", "calls", "errors", "diverges from " + rows[a].id].map((t) => h("th", null, t)))),
      h("tbody", null, rows.map((r, i) => h("tr", { "data-rollout": r.id, onclick: () => go("#/r/" + encodeURIComponent(r.id)) },
        h("td", null, r.id), h("td", { class: "num" }, num(r.reward)), h("td", { class: "num" }, num(r.calls)), h("td", { class: "num" }, num(r.errors)),
        h("td", { class: "num" }, i === a ? dash : div(a, i) === null ? "never" : div(a, i) === undefined ? "not computed" : "call #" + div(a, i))))));
    const pick = (which, value) => h("select", { id: "pick-" + which, onchange: (e) => go("#/t/" + task + "/" + (which === "a" ? e.target.value + "/" + b : a + "/" + e.target.value)) },
      rows.map((r, i) => h("option", { value: i, selected: i === value ? "" : null }, r.id)));
    const k = div(a, b);
    const verdict = a === b ? "the same rollout" : k === null ? "they made the same requests" : k === undefined ? "not computed for a group this large; compare with the first rollout" : "they first diverge at call #" + k;
    const columns = h("div", { class: "cols", id: "diverging-calls" });
    show(h("h2", null, "Task " + task + ": " + rows.length + " rollouts"),
      kv([["rewards", rewards.map(num).join(", ") || dash], ["mean", num(mean)], ["spread", num(spread)],
        ["advantage", spread === 0 && rewards.length > 1 ? h("span", { class: "tag gap", id: "zero-advantage" }, "all rewards equal: zero advantage") : dash]]),
      table, h("h3", null, "Where two rollouts part"),
      h("div", { class: "controls" }, pick("a", a), " and ", pick("b", b)),
      h("p", { id: "divergence", "data-call": typeof k === "number" ? k : "" }, verdict), columns);
    if (typeof k !== "number") return;
    for (const r of [rows[a], rows[b]]) {
      const col = h("div", { class: "col" }, h("h4", null, h("a", { href: "#/r/" + encodeURIComponent(r.id) + "/" + k }, r.id + " call #" + k)));
      columns.appendChild(col);
      const payload = await blob("payloads", r.id);
      if (!payload) { col.appendChild(leftOutNote("This rollout's payloads")); continue; }
      const call = payload.calls[k];
      if (!call) { col.appendChild(h("p", { class: "muted" }, "no call #" + k + ": the rollout ended after " + payload.calls.length + " calls")); continue; }
      const memo = new Map();
      const whole = conversation(payload, k, memo);
      const previous = k > 0 && payload.calls[k - 1] ? payload.calls[k - 1] : null;
      col.appendChild(h("p", { class: "muted" }, whole.length + " messages; new since call #" + (call.parent === null ? dash : call.parent) + ":"));
      col.appendChild(h("div", { class: "diverge" }, call.new.length ? call.new.map(messageView) : h("p", { class: "muted" }, "none")));
      if (previous) col.appendChild(h("details", null, h("summary", null, "the answer of call #" + (k - 1)), previous.answer.map(messageView)));
    }
  }

  // --- routing -------------------------------------------------------------------------------
  function go(hash) { if (location.hash === hash) route(); else location.hash = hash; }
  let routing = Promise.resolve();
  function route() {
    routing = routing.then(render).catch((e) => { console.error(e); });
    return routing;
  }
  async function render() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    if (parts[0] === "r" && parts[1]) await rolloutPage(parts[1], parts[2] !== undefined && parts[2] !== "" ? Number(parts[2]) : null);
    else if (parts[0] === "t" && parts[1] !== undefined) await groupPage(Number(parts[1]), Number(parts[2] || 0), Number(parts[3] || 1));
    else home();
  }

  async function poll() {
    try {
      const summary = await api("api/summary");
      document.getElementById("live").textContent = "live · " + summary.run.rollouts + " rollouts · checked " + new Date().toLocaleTimeString();
      if (summary.revision !== state.revision) {
        state.revision = summary.revision;
        const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
        const before = parts[0] === "r" ? state.rowById.get(parts[1]) : null;
        useSummary(summary);
        const after = before ? state.rowById.get(parts[1]) : null;
        // A rollout's page is drawn again only when that rollout changed; the list not while
        // its filters are being typed in (the next keystroke draws it from the new summary).
        const typing = document.activeElement && document.activeElement.tagName === "INPUT";
        if ((parts[0] === "" && !typing) || (before && after && (before.calls !== after.calls || before.gaps.length !== after.gaps.length))) await route();
      }
    } catch (e) {
      document.getElementById("live").textContent = "not reachable: " + e.message;
    }
    setTimeout(poll, POLL_MS);
  }

  async function start() {
    let summary;
    if (SERVED) { summary = await api("api/summary"); state.revision = summary.revision; }
    else summary = await inflate(DATA.summary);
    useSummary(summary);
    document.getElementById("source").textContent = summary.source.capture_dir || "";
    window.addEventListener("hashchange", route);
    await route();
    document.documentElement.dataset.ready = "1";
    if (SERVED) setTimeout(poll, POLL_MS);
  }
  start().catch((e) => { console.error(e); show(h("p", { class: "marker" }, "the report could not be shown: " + e.message)); });
})();
