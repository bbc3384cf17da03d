"use strict";
// rollcap's run report: one page, no framework, no build step. Every string that came from a
// capture (prompts, answers, tool arguments, error bodies) is hostile text: it only ever
// reaches the page through text nodes (h() below), never as markup.
(() => {
  const DATA = JSON.parse(document.getElementById("rollcap-data").textContent);
  const SERVED = DATA.mode === "served";
  // Two runs compared task by task (rollcap.compare): the same helpers, other pages.
  const COMPARE = DATA.mode === "compare";
  const PAGE_ROWS = 500;
  const MAX_BARS = 2000;
  const MAX_TOKENS = 20000;
  const POLL_MS = 2000;
  const VIEW_HINT = COMPARE ? "raise the payload budget, or open that run with rollcap capture view" : "open with rollcap capture view";

  const state = {
    summary: null, rows: [], callStart: [], rowById: new Map(), groupByTask: new Map(),
    cache: new Map(), sort: { key: "id", desc: false }, filter: { text: "", kind: "all", minCalls: "" },
    bin: null, page: 0, revision: null, texts: null, hits: { q: null, set: null },
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
  function num(v, step) {
    if (v === null || v === undefined) return dash;
    if (typeof v !== "number") return String(v);
    if (step && !Number.isInteger(step)) return v.toFixed(decimals(step, 1));
    if (!Number.isInteger(v)) return String(Math.round(v * 1000) / 1000);
    return String(v).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  }
  // `step`, an axis's tick step, asks for as many decimals as tell its ticks apart.
  function decimals(step, scale) {
    return step ? Math.min(6, Math.max(0, Math.ceil(-Math.log10(step / scale) - 1e-9))) : 0;
  }
  function ms(v, step) {
    if (v === null || v === undefined) return dash;
    if (Math.abs(v) >= 1000) return (v / 1000).toFixed(Math.max(Math.abs(v) >= 10000 ? 1 : 2, decimals(step, 1000))) + " s";
    return v.toFixed(decimals(step, 1)) + " ms";
  }
  function plural(n, one, many) { return num(n) + " " + (n === 1 ? one : many || one + "s"); }
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

  // A summary's rollout rows, each call's place in its call columns, and its task groups.
  function indexSummary(summary) {
    const cols = summary.rollouts;
    const n = cols.id.length;
    const rows = new Array(n);
    const starts = new Array(n);
    const rowById = new Map();
    let offset = 0;
    for (let i = 0; i < n; i++) {
      const row = { index: i };
      for (const key of Object.keys(cols)) row[key] = cols[key][i];
      row.tokens = row.tokens_in === null && row.tokens_out === null ? null : (row.tokens_in || 0) + (row.tokens_out || 0);
      rows[i] = row;
      starts[i] = offset;
      offset += row.calls;
      rowById.set(row.id, row);
    }
    return { summary: summary, rows: rows, callStart: starts, rowById: rowById, groupByTask: new Map(summary.groups.map((g) => [g.task, g])) };
  }
  function useSummary(summary) { Object.assign(state, indexSummary(summary)); }
  // The run a row belongs to: the report's, or in compare mode its side's.
  function runOf(row) { return row.side ? cmp.sides[row.side] : state; }

  function callsOf(row) {
    const run = runOf(row);
    const c = run.summary.calls;
    const first = run.callStart[row.index];
    const out = [];
    for (let k = 0; k < row.calls; k++) {
      const j = first + k;
      out.push({
        pos: k, start: c.start[j], latency: c.latency[j], ttft: c.ttft[j], stream: c.stream[j] === 1,
        tin: c.tin[j], tout: c.tout[j], treason: c.treason[j], cached: c.cached[j], status: c.status[j],
        err: c.err[j] === null ? null : run.summary.tables.err[c.err[j]],
        finish: c.finish[j] === null ? null : run.summary.tables.finish[c.finish[j]],
        tools: c.tools[j], gaps: c.gaps[j],
      });
    }
    return out;
  }

  // A rollout's payload (every call's delta and answer), tokens or raw texts, decoded once.
  // In compare mode a side's blobs are its own, keyed by slot: rollout ids repeat across runs.
  async function blob(kind, rolloutId, side) {
    const key = (side ? side + ":" : "") + kind + "/" + rolloutId;
    if (state.cache.has(key)) return state.cache.get(key);
    let value = null;
    const store = side ? DATA.sides[side] : DATA;
    const packed = store[kind] && store[kind][rolloutId];
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
    const make = (by) => {
      const out = [];
      for (let v = Math.ceil(lo / by) * by; v <= hi + 1e-9; v += by) out.push(Math.round(v * 1e6) / 1e6);
      return out;
    };
    let out = make(nice);
    // A range that the nice step leaves with one tick gets a smaller step: one tick says no scale.
    for (const smaller of [nice / 2, nice / 5, nice / 10]) { if (out.length >= 2) break; out = make(smaller); }
    return out;
  }
  // Tick labels get the decimals their step needs, so that no two of them read the same.
  function axes(svg, x, y, xs, ys, fmtX, fmtY) {
    const step = (list) => (list.length > 1 ? list[1] - list[0] : 0);
    for (const v of ys) {
      svg.appendChild(s("line", { class: "grid", x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v) }));
      svg.appendChild(s("text", { x: PAD.l - 4, y: y(v) + 3, "text-anchor": "end" }, fmtY(v, step(ys))));
    }
    svg.appendChild(s("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }));
    for (const v of xs) svg.appendChild(s("text", { class: "tick", x: x(v), y: H - PAD.b + 12, "text-anchor": "middle" }, fmtX(v, step(xs))));
  }
  const MAX_BINS = 30;
  // values: [{v, row}]; a click on a bar keeps the rollouts behind it in the list. Whole
  // numbers get one bin per value (or per run of values when there are many), each bar centred
  // on its values; other values share MAX_BINS equal bins.
  function histogram(title, values, fmt, id) {
    const box = h("div", { class: "plot", id: id }, h("h4", null, title + " (" + num(values.length) + ")"));
    if (!values.length) { box.appendChild(h("p", { class: "muted" }, "no values")); return box; }
    let lo = Infinity, hi = -Infinity;
    for (const { v } of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
    const integer = values.every(({ v }) => Number.isInteger(v));
    let bins, width, x0, x1;
    if (integer) {
      width = Math.ceil((hi - lo + 1) / MAX_BINS);
      bins = Math.ceil((hi - lo + 1) / width);
      x0 = lo - 0.5; x1 = lo + bins * width - 0.5;
    } else {
      bins = hi > lo ? Math.min(MAX_BINS, Math.max(1, Math.ceil(Math.sqrt(values.length)))) : 1;
      width = hi > lo ? (hi - lo) / bins : 1;
      x0 = hi > lo ? lo : lo - 0.5; x1 = hi > lo ? hi : lo + 0.5;
    }
    const counts = new Array(bins).fill(0);
    const rows = Array.from({ length: bins }, () => new Set());
    for (const { v, row } of values) {
      const b = hi > lo || integer ? Math.min(bins - 1, Math.floor((v - lo) / width)) : 0;
      counts[b]++;
      rows[b].add(row);
    }
    const top = Math.max(...counts);
    const x = (v) => PAD.l + ((v - x0) / (x1 - x0)) * (W - PAD.l - PAD.r);
    const y = (c) => H - PAD.b - (c / top) * (H - PAD.t - PAD.b);
    const svg = s("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    let xs = integer ? ticks(lo, lo + bins * width - 1, 4).filter(Number.isInteger) : ticks(lo, hi, 4);
    if (!xs.length) xs = [lo];
    axes(svg, x, y, xs, ticks(0, top, 3).filter(Number.isInteger), fmt, num);
    counts.forEach((count, b) => {
      if (!count) return;
      const from = lo + b * width, to = from + width;
      const left = integer ? from - 0.5 : hi > lo ? from : x0, right = integer ? to - 0.5 : hi > lo ? to : x1;
      const span = integer ? (width === 1 ? fmt(from) : fmt(from) + dash + fmt(to - 1)) : hi > lo ? fmt(from, width) + dash + fmt(to, width) : fmt(lo);
      const label = title + " " + span;
      svg.appendChild(s("rect", {
        class: "bin", x: x(left) + 0.5, width: Math.max(1, x(right) - x(left) - 1), y: y(count), height: H - PAD.b - y(count),
        "data-from": integer ? from : null, "data-to": integer ? to - 1 : null,
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
      svg.appendChild(s("circle", { cx: x(p.x), cy: y(p.y), r: 3, onclick: () => go(rolloutLink(p.id)) },
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
  // --- filters, search and the URL ----------------------------------------------------------
  // The filters live in the URL's query (#/...?q=mars&kind=zero&calls=2&sort=calls&desc=1), so
  // a reload, a shared link or the back button keeps them; every page's links carry them.
  function filterQuery() {
    const f = state.filter, p = new URLSearchParams();
    if (f.text) p.set("q", f.text);
    if (f.kind !== "all") p.set("kind", f.kind);
    if (f.minCalls !== "") p.set("calls", f.minCalls);
    if (state.sort.key !== "id" || state.sort.desc) p.set("sort", state.sort.key);
    if (state.sort.desc) p.set("desc", "1");
    const q = p.toString();
    return q ? "?" + q : "";
  }
  function link(path) { return "#/" + path + filterQuery(); }
  function rolloutLink(id, pos) { return link("r/" + encodeURIComponent(id) + (pos === undefined || pos === null ? "" : "/" + pos)); }
  // A row's page, or with `pos` its call's: the report's rollout page; in compare mode the
  // page of the row's task (both runs' rollouts), and the call under it.
  function rowLink(row, pos) {
    if (!row.side) return rolloutLink(row.id, pos);
    const call = pos === undefined || pos === null ? "" : "/" + row.side + "/" + row.n + "/" + pos;
    return cmpLink("t/" + encodeURIComponent(row.taskId) + call);
  }
  function idLink(id, pos, attrs) { return h("a", Object.assign({ href: rolloutLink(id, pos), class: "rid" }, attrs || {}), pos === undefined || pos === null ? id : id + " call #" + pos); }
  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const cut = raw.indexOf("?");
    const path = cut < 0 ? raw : raw.slice(0, cut);
    return { parts: path.split("/").map(decodeURIComponent), params: new URLSearchParams(cut < 0 ? "" : raw.slice(cut + 1)) };
  }
  function readFilters(params) {
    const kinds = ["all", "zero", "positive", "errors", "gaps", "failed"];
    state.filter = { text: params.get("q") || "", kind: kinds.includes(params.get("kind")) ? params.get("kind") : "all", minCalls: params.get("calls") || "" };
    const key = params.get("sort");
    state.sort = { key: COLUMNS.some(([k]) => k === key) ? key : "id", desc: params.get("desc") === "1" };
  }
  // The URL follows the filters without drawing the page again.
  function keepFiltersInUrl() {
    const { parts } = parseHash();
    const path = parts.map(encodeURIComponent).join("/");
    history.replaceState(null, "", "#/" + path + filterQuery());
  }

  // Full-text search: every word of the box must be in the rollout's id or in its texts (the
  // prompt, answers, tool calls and results, expected answer, verifier fields). The file's
  // texts are decoded on the first search; the served view searches on the server.
  async function searchHits(text) {
    const words = text.toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.length) return null;
    if (state.hits.q === text && state.hits.revision === state.revision) return state.hits.set;
    let found;
    if (SERVED) {
      const answer = await api("api/search?q=" + encodeURIComponent(text));
      found = new Set(answer.ids.map((id) => state.rowById.get(id)).filter(Boolean).map((r) => r.index));
    } else {
      if (state.texts === null) state.texts = DATA.search ? await inflate(DATA.search) : [];
      found = new Set();
      state.texts.forEach((t, i) => { if (words.every((w) => t.includes(w))) found.add(i); });
    }
    for (const row of state.rows) if (words.every((w) => row.id.toLowerCase().includes(w))) found.add(row.index);
    state.hits = { q: text, set: found, revision: state.revision };
    return found;
  }
  function matches(row, hits) {
    const f = state.filter;
    if (state.bin && !state.bin.rows.has(row.index)) return false;
    if (hits && !hits.has(row.index)) return false;
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
  // The rollouts the list shows, in its order: what previous/next move through.
  async function listedRows() {
    const hits = await searchHits(state.filter.text);
    return state.rows.filter((row) => matches(row, hits)).sort(compare);
  }
  function rolloutList() {
    const wrap = h("div", { id: "rollout-list" });
    let drawing = 0;
    const draw = async () => {
      const mine = ++drawing;
      const rows = await listedRows();
      if (mine !== drawing) return;  // a later keystroke drew it already
      const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
      state.page = Math.min(state.page, pages - 1);
      const shown = rows.slice(state.page * PAGE_ROWS, (state.page + 1) * PAGE_ROWS);
      const head = h("tr", null, COLUMNS.map(([key, label, numeric]) => h("th", {
        class: (numeric ? "num " : "") + (state.sort.key === key ? "sorted" + (state.sort.desc ? " desc" : "") : ""),
        "data-key": key,
        onclick: () => { state.sort = { key: key, desc: state.sort.key === key ? !state.sort.desc : false }; keepFiltersInUrl(); draw(); },
      }, label)));
      const body = h("tbody", null, shown.map((row) => h("tr", {
        class: row.errors ? "has-errors" : null, "data-rollout": row.id,
        onclick: (e) => { if (e.target.tagName !== "A") go(rolloutLink(row.id)); },
      },
      h("td", null, idLink(row.id)), h("td", { class: "num" }, row.task === null ? dash : h("a", { href: link("t/" + row.task) }, num(row.task))),
      h("td", { class: "num" }, num(row.attempt)),
      h("td", { class: "num" }, num(row.reward)), h("td", { class: "num" }, num(row.calls)),
      h("td", { class: "num" }, num(row.tokens)), h("td", { class: "num" }, ms(row.wall_ms)),
      h("td", { class: "num" }, ms(row.ttft_p50)), h("td", { class: "num errors" }, num(row.errors)),
      h("td", null, row.gaps.map((g) => tag(shortGap(g), "gap"))),
      h("td", null, row.failure !== null ? tag("failed", "err") : null, row.finish.map((f) => tag(f))))));
      const pager = pages > 1 ? h("div", { class: "pager" },
        h("button", { disabled: state.page === 0 ? "" : null, onclick: () => { state.page--; draw(); } }, "previous"),
        " page " + (state.page + 1) + " of " + pages + " ",
        h("button", { disabled: state.page >= pages - 1 ? "" : null, onclick: () => { state.page++; draw(); } }, "next")) : null;
      fill(wrap, h("p", { class: "muted", id: "list-count" }, num(rows.length) + " of " + plural(state.rows.length, "rollout")),
        pager, h("table", { id: "rollouts" }, h("thead", null, head), body));
      wrap.dataset.drawn = String(mine);
    };
    const changed = () => { state.page = 0; keepFiltersInUrl(); draw(); };
    const text = h("input", { type: "search", id: "search", placeholder: "search prompts, answers, tool results, ids", value: state.filter.text,
      oninput: (e) => { state.filter.text = e.target.value; changed(); } });
    const kind = h("select", { id: "filter-kind", onchange: (e) => { state.filter.kind = e.target.value; changed(); } },
      [["all", "all rollouts"], ["zero", "reward = 0"], ["positive", "reward > 0"], ["errors", "has errors"],
        ["gaps", "has gaps"], ["failed", "failed"]].map(([v, l]) => h("option", { value: v, selected: state.filter.kind === v ? "" : null }, l)));
    const calls = h("input", { type: "number", id: "min-calls", min: 0, value: state.filter.minCalls,
      oninput: (e) => { state.filter.minCalls = e.target.value; changed(); } });
    const bin = state.bin ? h("span", { class: "chip" }, state.bin.label + " ",
      h("button", { onclick: () => { state.bin = null; route(); } }, "clear")) : null;
    draw();
    return [h("div", { class: "controls" }, text, kind, " calls > ", calls, bin), wrap];
  }
  function home() {
    show(live.panel, h("h2", null, "Run"), overview(), h("h2", null, "Rollouts"), rolloutList());
  }

  // --- live status ---------------------------------------------------------------------------
  // The served view started with a status source (a head server or a run's status file) shows
  // what the runs are doing now, above the overview: GET api/live, every POLL_MS, until every
  // run has finished. The panel is one element, kept across the overview's redraws.
  const live = { panel: null, answer: null, failure: null, checked: null, polling: true };
  function secs(v) {
    if (typeof v !== "number") return dash;
    if (v < 60) return v.toFixed(1) + " s";
    const t = Math.round(v);
    if (t < 3600) return Math.floor(t / 60) + " m " + String(t % 60).padStart(2, "0") + " s";
    return Math.floor(t / 3600) + " h " + String(Math.floor((t % 3600) / 60)).padStart(2, "0") + " m";
  }
  function joined(parts, sep) {
    const out = [];
    for (const part of parts) {
      if (part === null || part === undefined || part === false) continue;
      if (out.length) out.push(sep);
      out.push(part);
    }
    return out;
  }
  // What a running rollout is doing, as the status document's `doing` says.
  function doingText(doing) {
    if (!doing || doing.kind === "unknown") return dash;
    if (doing.kind === "between_calls") return "between calls (agent or tool) for " + secs(doing.for_s);
    if (doing.kind !== "model_call") return String(doing.kind);
    let text = "model call on " + (doing.server || "?") + ": " + (doing.phase || "?") + ", upstream silent " + secs(doing.upstream_silence_s);
    if (doing.state && doing.state !== "active") text += ", call " + doing.state;
    if (doing.open_calls > 1) text += " (" + doing.open_calls + " calls open)";
    return text;
  }
  function liveRun(doc) {
    const run = doc.run || {}, counts = doc.counts || {}, states = doc.states || {};
    const count = (key, label, n, warn) => h("span", { class: "live-count" + (warn && n ? " warn" : ""), "data-count": key }, num(n) + " " + label);
    const some = (key, label, n, warn) => (n ? count(key, label, n, warn) : null);
    const age = typeof run.updated_at === "number" ? Date.now() / 1000 - run.updated_at : null;
    const head = h("p", { class: "live-head" }, joined([
      h("b", { class: "live-id" }, String(run.id)),
      run.agent ? h("span", { class: "live-agent" }, String(run.agent)) : null,
      h("span", { class: "live-count", "data-count": "done" }, num(counts.done) + "/" + num(counts.planned) + " done"),
      count("failed", "failed", counts.failed, true),
      count("running", "running", counts.running),
      count("stalled", "stalled", states.stalled, true),
      count("slow", "slow", states.slow, true),
      some("cancelled", "cancelled", states.cancelled, true),
      some("retrying", "retrying", states.retrying, true),
      some("lost", "lost", counts.lost, true),
      some("skipped", "skipped (done before)", counts.skipped),
      h("span", { class: "live-rate" }, num(doc.rate_per_s) + "/s"),
      run.finished ? null : h("span", { class: "live-eta" }, "ETA " + secs(doc.eta_s)),
      run.finished ? h("span", { class: "tag ok live-finished" }, "finished")
        : age !== null && age >= 0 ? h("span", { class: "muted" }, "updated " + secs(age) + " ago") : null,
    ], " · "));
    const box = h("div", { class: "live-run", "data-run-id": String(run.id), "data-finished": run.finished ? "1" : "0" }, head);
    for (const server of doc.servers || []) {
      if (server.ok) continue;
      box.appendChild(h("p", { class: "marker live-server-down", "data-server": String(server.name) },
        "model server " + server.name + " (" + server.url + ") did not answer: " + (server.error || "no reason given")));
    }
    const rollouts = doc.rollouts || [];
    if (!rollouts.length) {
      if (!run.finished) box.appendChild(h("p", { class: "muted" }, "no rollout running"));
      return box;
    }
    const columns = [["rollout", false], ["attempt", true], ["state", false], ["elapsed", true], ["calls", true], ["doing", false]];
    box.appendChild(h("table", { class: "live-rollouts" },
      h("thead", null, h("tr", null, columns.map(([label, numeric]) => h("th", { class: numeric ? "num" : null }, label)))),
      h("tbody", null, rollouts.map((r) => h("tr", { class: "live-rollout state-" + r.state, "data-state": r.state, "data-rollout-id": r.rollout_id },
        // A rollout with a capture already links to its page; one without is plain text.
        h("td", null, state.rowById.has(r.rollout_id) ? idLink(r.rollout_id) : String(r.rollout_id)),
        h("td", { class: "num" }, num(r.attempt)),
        h("td", { class: "live-state" }, String(r.state), r.last_call === "cancelled" && r.state !== "cancelled" ? h("span", { class: "muted" }, " (last call cancelled)") : null),
        h("td", { class: "num" }, secs(r.elapsed_s)),
        h("td", { class: "num" }, num(r.calls)),
        h("td", { class: "live-doing" }, doingText(r.doing)))))));
    if (counts.running > rollouts.length) box.appendChild(h("p", { class: "muted" }, "the first " + num(rollouts.length) + " of " + plural(counts.running, "running rollout")));
    return box;
  }
  function drawLive() {
    const answer = live.answer;
    const checked = live.checked ? " · checked " + live.checked.toLocaleTimeString() : "";
    const parts = [h("h2", null, "Live status ", h("span", { class: "muted live-source" }, (answer ? "from " + answer.source : "") + checked))];
    const error = live.failure || (answer && answer.error);
    if (error) parts.push(h("p", { class: "marker", id: "live-error" }, live.failure ? "the live status could not be asked: " + error : error));
    else if (!answer) parts.push(h("p", { class: "muted" }, "asking for the run's live status…"));
    else if (!answer.runs.length) parts.push(h("p", { class: "muted" }, "no run has reported its status"));
    else parts.push(answer.runs.map(liveRun));
    fill(live.panel, parts);
    live.panel.dataset.polling = live.polling ? "1" : "0";
  }
  async function pollLive() {
    let finished = false;
    try {
      live.answer = await api("api/live");
      live.failure = null;
      const runs = live.answer.runs;
      finished = !live.answer.error && runs.length > 0 && runs.every((doc) => doc.run && doc.run.finished);
    } catch (e) {
      live.failure = e.message;
    }
    live.checked = new Date();
    live.polling = !finished;
    drawLive();
    if (!finished) setTimeout(pollLive, POLL_MS);
  }

  // --- rollout: waterfall, transcript, call detail, tokens -----------------------------------
  // The tool runs of ng_trajectory.tool_calls, each after the call that asked for it.
  function toolRuns(row, payload) {
    const runs = (payload && payload.facts && payload.facts.tool_runs) || [];
    const asked = new Map();
    if (payload) payload.calls.forEach((c, i) => { for (const t of toolCallsOf(c)) if (t.call_id) asked.set(t.call_id, i); });
    return runs.map((r) => {
      const start = typeof r.started_at === "number" && row.t0 !== null ? (r.started_at - row.t0) * 1000 : null;
      let duration = typeof r.duration_ms === "number" ? r.duration_ms : null;
      if (duration === null && typeof r.started_at === "number" && typeof r.completed_at === "number") duration = (r.completed_at - r.started_at) * 1000;
      return { id: r.id, name: r.tool_name || "tool", start: start, duration: duration, status: r.status || null, error: r.error_type || null, after: asked.has(r.id) ? asked.get(r.id) : null };
    });
  }
  function waterfall(row, calls, picked, runs) {
    const shown = calls.slice(0, MAX_BARS);
    const lanes = [];
    const byCall = new Map();
    const loose = [];
    for (const r of runs) {
      if (r.start === null) continue;
      if (r.after !== null && r.after < shown.length) { if (!byCall.has(r.after)) byCall.set(r.after, []); byCall.get(r.after).push(r); } else loose.push(r);
    }
    for (const c of shown) { lanes.push({ call: c }); for (const r of byCall.get(c.pos) || []) lanes.push({ run: r }); }
    for (const r of loose) lanes.push({ run: r });
    let end = 0;
    for (const c of shown) end = Math.max(end, (c.start || 0) + (c.latency || 0));
    for (const r of runs) if (r.start !== null) end = Math.max(end, r.start + (r.duration || 0));
    end = end || 1;
    const width = 900, left = 96, bar = 14, top = 18;
    const x = (v) => left + (v / end) * (width - left - 30);
    const height = top + lanes.length * bar + 6;
    const svg = s("svg", { id: "waterfall", width: width, height: height, viewBox: "0 0 " + width + " " + height });
    const axis = ticks(0, end, 6);
    for (const t of axis) {
      svg.appendChild(s("line", { class: "grid", x1: x(t), x2: x(t), y1: top - 4, y2: top + lanes.length * bar }));
      svg.appendChild(s("text", { class: "tick", x: x(t), y: 11, "text-anchor": "middle" }, ms(t, axis.length > 1 ? axis[1] - axis[0] : 0)));
    }
    lanes.forEach((lane, k) => {
      const y = top + k * bar;
      if (lane.run) {
        const r = lane.run;
        const failed = r.status && r.status !== "completed";
        const g = s("g", { class: "tool-run", "data-tool-call": r.id });
        g.appendChild(s("text", { x: 14, y: y + 10 }, "⚙ " + r.name));
        g.appendChild(s("rect", { class: "run" + (failed ? " error" : ""), x: x(r.start), y: y + 3, height: bar - 6, width: Math.max(2, x(r.start + (r.duration || 0)) - x(r.start)) }));
        g.appendChild(s("title", null, "tool " + r.name + " (" + r.id + ") · " + ms(r.duration) + " · " + (r.status || "status unknown") + (r.error ? " · " + r.error : "")));
        svg.appendChild(g);
        return;
      }
      const c = lane.call;
      const start = c.start || 0;
      const g = s("g", { class: "bar" + (c.pos === picked ? " picked" : ""), "data-call": c.pos, "data-stream": c.stream ? "1" : "0",
        onclick: () => go(rowLink(row, c.pos)) });
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
    });
    return h("div", null,
      h("p", { class: "legend muted" }, h("span", null, h("i", { style: "background:var(--accent)" }), "call"),
        h("span", null, h("i", { style: "background:var(--ttft)" }), "time to first token (streamed calls, ≋)"),
        h("span", null, h("i", { style: "background:var(--tool)" }), "tool run (⚙)"),
        h("span", null, h("i", { style: "background:var(--err)" }), "error"), h("span", null, "other gaps between bars: agent time")),
      calls.length > MAX_BARS ? h("p", { class: "muted" }, "the first " + MAX_BARS + " of " + calls.length + " calls") : null,
      h("div", { class: "wf" }, svg));
  }

  function contentView(box, content) {
    if (typeof content === "string") { if (content) box.appendChild(h("pre", { class: "text" }, content)); }
    else if (Array.isArray(content)) {
      for (const part of content) {
        if (part && typeof part.text === "string") box.appendChild(h("pre", { class: "text" }, part.text));
        else if (part && part.type === "image_url") box.appendChild(h("p", { class: "muted" }, "[image, not shown]"));
        else box.appendChild(h("pre", null, pretty(part)));
      }
    } else if (content !== null && content !== undefined) box.appendChild(h("pre", null, pretty(content)));
  }
  function messageView(m) {
    if (m === null || typeof m !== "object") return h("pre", null, pretty(m));
    const role = String(m.role || "?");
    const box = h("div", { class: "msg role-" + role.replace(/[^a-z]/g, ""), "data-tool-call": m.tool_call_id || null },
      h("div", { class: "role" }, role, m.tool_call_id ? " · result of " + m.tool_call_id : "", m.name ? " · " + m.name : ""));
    if (m.reasoning_content) box.appendChild(h("details", null, h("summary", null, "reasoning"), h("pre", null, String(m.reasoning_content))));
    contentView(box, m.content);
    for (const call of m.tool_calls || []) {
      const fn = (call && call.function) || {};
      box.appendChild(h("div", { class: "tool-call" }, h("span", { class: "name" }, String(fn.name)),
        call && call.id ? h("span", { class: "muted call-id" }, " (" + call.id + ")") : null, h("pre", null, pretty(fn.arguments))));
    }
    return box;
  }
  function textOf(messages) {
    return messages.map((m) => (typeof m.content === "string" ? m.content : Array.isArray(m.content) ? m.content.map((p) => (p && p.text) || "").join("") : "")).join("");
  }
  function toolCallsOf(call) {
    return call.tool_calls || call.answer.flatMap((m) => (m.tool_calls || []).map((t) => {
      const fn = (t && t.function) || {};
      return { call_id: t && t.id, name: fn.name, arguments: fn.arguments };
    }));
  }
  // What a call ended in: its error, else its finish reason or (Responses) its status, and
  // whether it asked for tools. Only a normal end is green.
  const NORMAL_END = new Set(["stop", "end_turn", "completed", "stop_sequence"]);
  const SHORT_END = new Set(["length", "max_tokens", "incomplete", "content_filter"]);
  function callBadges(call) {
    if (call.error_category) return [tag(call.error_category, "err"), call.status_code ? tag("HTTP " + call.status_code, "err") : null];
    const end = call.finish_reason || call.response_status;
    const tools = toolCallsOf(call).length;
    const out = [end ? tag(end, NORMAL_END.has(end) ? "ok" : SHORT_END.has(end) ? "gap" : null) : tag("no finish reason", "gap")];
    if (tools && end !== "tool_calls" && end !== "tool_use") out.push(tag(plural(tools, "tool call"), "tools"));
    return out;
  }

  // The task's input, the expected answer, the final answer, the verifier's fields and the
  // reward, from the rollout's line.
  // `withInput` false leaves the task's input out (a page that shows it once for several).
  function factsHeader(row, payload, withInput = true) {
    const f = payload && payload.facts;
    const box = h("section", { class: "detail", id: "rollout-header" });
    if (!f) {
      box.appendChild(h("p", { class: "muted" }, row.failure !== null ? "the rollout failed: no graded line" : "no rollout line for this rollout: the task, its expected answer and its grading are in the rollouts file (capture report --rollouts FILE)"));
      return box;
    }
    const input = f.input && f.input.length ? h("div", { id: "task-input" }, f.input.map(messageView)) : dash;
    const expected = f.expected ? h("span", { id: "expected-answer" }, h("code", null, typeof f.expected.value === "string" ? f.expected.value : JSON.stringify(f.expected.value)), h("span", { class: "muted" }, " (the line's " + f.expected.field + ")")) : h("span", { class: "muted", id: "expected-answer" }, "none found in the line");
    const verifier = Object.entries(f.verifier || {});
    box.appendChild(kv([
      withInput ? ["input", input] : null,
      ["expected answer", expected],
      ["final answer", f.answer === null || f.answer === undefined ? h("span", { class: "muted", id: "final-answer" }, "no text") : h("pre", { class: "text", id: "final-answer" }, f.answer)],
      ["verifier", verifier.length ? h("span", { id: "verifier" }, verifier.map(([k, v]) => h("span", { class: "field", "data-field": k }, h("b", null, k), " ", h("code", null, JSON.stringify(v))))) : dash],
      ["reward", h("b", { id: "reward" }, num(row.reward))],
    ]));
    return box;
  }

  // Every call in order: what it added, its answer, each tool call with its result and run.
  function transcript(row, payload, calls, runs) {
    const box = h("section", { id: "transcript" });
    const runById = new Map(runs.map((r) => [r.id, r]));
    const results = new Map();
    payload.calls.forEach((c, i) => { for (const m of c.new) if (m && m.role === "tool" && m.tool_call_id && !results.has(m.tool_call_id)) results.set(m.tool_call_id, { message: m, at: i }); });
    const paired = new Set();
    const total = payload.calls.length;
    payload.calls.forEach((c, i) => {
      const t = calls[i] || {};
      const turn = h("div", { class: "turn", id: "turn-" + i, "data-call": i });
      const facts = ["tokens in " + num(c.usage.tokens_in) + " · out " + num(c.usage.tokens_out), ms(t.latency), c.stream ? "TTFT " + ms(t.ttft) : "not streamed"];
      turn.appendChild(h("h4", null, h("a", { href: rowLink(row, i), class: "open-call" }, "turn " + (i + 1) + "/" + total + " · call #" + i), " ", callBadges(c), " ", h("span", { class: "muted" }, facts.join(" · "))));
      if (c.retry !== undefined) turn.appendChild(h("p", { class: "marker retry" }, "failed" + (c.status_code ? " with HTTP " + c.status_code : "") + (c.error_category ? " (" + c.error_category + ")" : "") + "; retried with the same request as call #" + c.retry));
      if (c.retry_of !== undefined) turn.appendChild(h("p", { class: "muted" }, "the same request as call #" + c.retry_of + ", which failed"));
      const added = c.new.filter((m) => !(m && m.role === "tool" && paired.has(m.tool_call_id)));
      if (added.length) turn.appendChild(h("div", { class: "added" }, added.map(messageView)));
      else if (c.retry_of === undefined && c.new.length === 0) turn.appendChild(h("p", { class: "muted" }, "no new message"));
      const answer = h("div", { class: "turn-answer" });
      if (c.reasoning !== null) answer.appendChild(h("details", { class: "reasoning" }, h("summary", null, "reasoning"), h("pre", null, c.reasoning)));
      const text = textOf(c.answer);
      if (text) answer.appendChild(h("div", { class: "msg role-assistant" }, h("div", { class: "role" }, "assistant"), h("pre", { class: "text answer-text" }, text)));
      for (const tc of toolCallsOf(c)) {
        const result = tc.call_id ? results.get(tc.call_id) : undefined;
        const r = tc.call_id ? runById.get(tc.call_id) : undefined;
        if (tc.call_id) paired.add(tc.call_id);
        const tool = h("div", { class: "tool-call paired", "data-tool-call": tc.call_id || "" },
          h("div", null, "tool call ", h("span", { class: "name" }, String(tc.name)), tc.call_id ? h("span", { class: "muted call-id" }, " " + tc.call_id) : null,
            r ? h("span", { class: "tool-duration" }, " · ran " + ms(r.duration) + (r.status ? " · " + r.status : "")) : h("span", { class: "muted" }, " · run not timed")),
          h("pre", { class: "arguments" }, pretty(tc.arguments)));
        if (result) {
          const out = h("div", { class: "tool-result" }, h("div", { class: "role" }, "result", result.at !== i + 1 ? " (sent with call #" + result.at + ")" : ""));
          contentView(out, result.message.content);
          tool.appendChild(out);
        } else tool.appendChild(h("p", { class: "muted" }, "no result sent back to the model"));
        answer.appendChild(tool);
      }
      if (c.response !== undefined) answer.appendChild(h("pre", { class: "error-body" }, pretty(c.response)));
      if (answer.childNodes.length) turn.appendChild(answer);
      box.appendChild(turn);
    });
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
    const link = (i) => h("a", { href: rowLink(row, i) }, "#" + i);
    const usage = call.usage;
    box.appendChild(h("p", null, h("a", { href: rowLink(row), id: "back-to-transcript" }, "← the whole transcript")));
    box.appendChild(h("h3", null, "Call #" + pos + " ", callBadges(call)));
    if (call.retry !== undefined) box.appendChild(h("p", { class: "marker retry" }, "this call failed and was retried with the same request as call ", link(call.retry)));
    if (call.retry_of !== undefined) box.appendChild(h("p", { class: "muted" }, "the same request as call ", link(call.retry_of), ", which failed"));
    box.appendChild(kv([
      ["model call id", call.id], ["model", call.model || dash], ["dialect", call.dialect],
      ["HTTP status", num(call.status_code)], ["error category", h("span", { class: "error-category" }, call.error_category || dash)],
      ["finish reason", call.finish_reason || dash], ["response status", call.response_status || dash],
      ["started", timing.start === null ? dash : when(row.t0 + timing.start / 1000)], ["latency", ms(timing.latency)],
      ["streamed", call.stream ? "yes, first byte after " + ms(timing.ttft) : "no"],
      ["tokens", "in " + num(usage.tokens_in) + " (cached " + num(usage.cached_tokens) + ") · out " + num(usage.tokens_out) +
        " (reasoning " + num(usage.tokens_reasoning) + ")"],
      call.session ? ["client session", call.session] : null,
      ["continues", call.parent === null ? "nothing: first of its conversation" : h("span", null, "call ", link(call.parent), ", " + plural(call.keep, "message") + " kept")],
    ]));
    if (call.gaps.length) box.appendChild(h("p", null, "Gaps: ", call.gaps.map((g) => tag(g.code + (g.detail ? ": " + g.detail : ""), "gap"))));

    const newOnes = h("div", { id: "new-messages" });
    const heading = h("h3", { id: "messages-heading" });
    const showMessages = (all) => {
      const list = all ? whole : call.new;
      fill(heading, all ? "The whole request (" + plural(whole.length, "message") + ")" : "New messages (" + call.new.length + " of " + whole.length + ")");
      fill(newOnes, list.length ? list.map(messageView) : h("p", { class: "muted" }, call.parent === null ? "no message" : "no new message (the same request as call #" + call.parent + ")"));
    };
    showMessages(false);
    const toggle = h("label", null, h("input", { type: "checkbox", id: "whole-request", onchange: (e) => showMessages(e.target.checked) }), " show the whole request (" + plural(whole.length, "message") + ")");
    box.appendChild(heading);
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
    const text = textOf(call.answer);
    if (text) answer.appendChild(h("pre", { class: "text answer-text" }, text));
    const toolCalls = toolCallsOf(call);
    for (const t of toolCalls) {
      answer.appendChild(h("div", { class: "tool-call" }, "tool call ", h("span", { class: "name" }, String(t.name)),
        t.call_id ? h("span", { class: "muted" }, " (" + t.call_id + ")") : null, h("pre", { class: "arguments" }, pretty(t.arguments))));
    }
    if (call.reasoning !== null) answer.appendChild(h("details", { class: "reasoning" }, h("summary", null, "reasoning"), h("pre", null, call.reasoning)));
    if (call.response !== undefined) {
      const failed = call.error_category || (call.status_code || 0) >= 400;
      const why = failed ? "the response as captured for this failed call:" : "the answer could not be read (" + call.answer_error + "); the response as captured:";
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
        else { const all = await blob("raw", row.slot || row.id, row.side); raw = all && all[String(pos)]; }
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

  // Previous/next move through the list as filtered and sorted (keys: ← →, k j).
  async function neighbours(row) {
    const rows = await listedRows();
    const at = rows.findIndex((r) => r.index === row.index);
    return { at: at, count: rows.length, prev: at > 0 ? rows[at - 1] : null, next: at >= 0 && at + 1 < rows.length ? rows[at + 1] : null };
  }
  let keysFor = null;
  document.addEventListener("keydown", (e) => {
    if (!keysFor || e.altKey || e.ctrlKey || e.metaKey) return;
    const tagName = document.activeElement && document.activeElement.tagName;
    if (tagName === "INPUT" || tagName === "SELECT" || tagName === "TEXTAREA") return;
    const target = e.key === "ArrowLeft" || e.key === "k" ? keysFor.prev : e.key === "ArrowRight" || e.key === "j" ? keysFor.next : null;
    if (target) { e.preventDefault(); go(rolloutLink(target.id)); }
  });

  async function rolloutPage(id, pos) {
    const row = state.rowById.get(id);
    if (!row) { show(h("p", { class: "marker" }, "no rollout " + id + " in this run")); return; }
    const calls = callsOf(row);
    const group = row.task !== null ? state.groupByTask.get(row.task) : null;
    const near = await neighbours(row);
    const filtered = filterQuery() !== "" && (state.filter.text || state.filter.kind !== "all" || state.filter.minCalls !== "");
    const nav = h("div", { class: "controls", id: "rollout-nav" },
      near.prev ? h("a", { href: rolloutLink(near.prev.id), id: "prev-rollout", title: "previous rollout (← or k)" }, "← " + near.prev.id) : h("span", { class: "muted" }, "← none"),
      h("span", { class: "muted", id: "nav-position" }, near.at >= 0 ? (near.at + 1) + " of " + near.count + (filtered ? " filtered" : "") + " rollouts" : "not in the filtered list"),
      near.next ? h("a", { href: rolloutLink(near.next.id), id: "next-rollout", title: "next rollout (→ or j)" }, near.next.id + " →") : h("span", { class: "muted" }, "none →"),
      h("a", { href: link(""), id: "to-list" }, "the list"));
    keysFor = near;
    const payload = await blob("payloads", row.id);
    const runs = toolRuns(row, payload);
    const head = [
      nav,
      h("h2", null, "Rollout " + row.id),
      factsHeader(row, payload),
      kv([
        ["task", row.task === null ? dash : h("span", null, h("a", { href: link("t/" + row.task) }, num(row.task)), group && group.rows.length > 1 ? [" · ", h("a", { href: link("t/" + row.task), id: "group-link" }, "compare its " + group.rows.length + " rollouts")] : null)],
        ["attempt", num(row.attempt)],
        row.failure !== null ? ["failure", h("span", { class: "tag err" }, row.failure)] : null,
        ["calls", num(row.calls) + " (" + num(row.errors) + " with errors)"], ["wall time", ms(row.wall_ms)],
        ["tokens", "in " + num(row.tokens_in) + " · out " + num(row.tokens_out) + " · reasoning " + num(row.tokens_reasoning) + " · cached " + num(row.cached_tokens)],
        ["gaps", row.gaps.length ? row.gaps.map((g) => tag(shortGap(g), "gap")) : dash],
      ]),
      h("h3", null, "Calls and tool runs on one time axis"), waterfall(row, calls, pos, runs),
    ];
    const detail = h("div", { id: "rollout-detail" });
    show(head, detail);
    if (!payload) { detail.appendChild(leftOutNote("This rollout's payloads")); }
    else {
      for (const g of payload.gaps) detail.appendChild(h("p", { class: "marker" }, g.code + (g.detail ? ": " + g.detail : "")));
      if (pos !== null && pos < payload.calls.length) detail.appendChild(callDetail(row, payload, pos));
      else if (payload.calls.length) {
        detail.appendChild(h("h3", null, "Transcript ", h("span", { class: "muted" }, "(" + plural(payload.calls.length, "call") + "; click a turn or a bar for the call's detail)")));
        detail.appendChild(transcript(row, payload, calls, runs));
      }
    }
    if (DATA.tokens !== undefined || SERVED) {
      const tokens = await blob("tokens", row.id);
      if (tokens) detail.appendChild(tokenView(tokens, payload));
    }
  }

  // --- task group ----------------------------------------------------------------------------
  // What first differs between rollouts i and j of a group (rollcap.report._diverge.explain):
  // from the report's explained pairs, else asked of the served view; `undefined` when neither
  // has it. The pairs are stored for i < j; the other way round, the sides swap.
  function swapSides(why) {
    if (!why) return why;
    const out = Object.assign({}, why, { a: why.b, b: why.a, role_a: why.role_b, role_b: why.role_a, retries: { a: why.retries.b, b: why.retries.a } });
    if (why.ended) out.ended = why.ended === "a" ? "b" : "a";
    if (why.answered_at) out.answered_at = [why.answered_at[1], why.answered_at[0]];
    if (why.params) out.params = Object.fromEntries(Object.entries(why.params).map(([k, [x, y]]) => [k, [y, x]]));
    return out;
  }
  async function explained(group, rows, i, j) {
    if (group.pairs) {
      const key = Math.min(i, j) + "-" + Math.max(i, j);
      if (key in group.pairs) return i < j ? group.pairs[key] : swapSides(group.pairs[key]);
    }
    if (SERVED) return api("api/diverge/" + encodeURIComponent(rows[i].id) + "/" + encodeURIComponent(rows[j].id));
    return undefined;
  }
  function retryNotes(why, rows) {
    const out = [];
    for (const [side, r] of [["a", rows[0]], ["b", rows[1]]]) {
      for (const [failed, retry, error, status] of why ? why.retries[side] : []) {
        out.push(h("p", { class: "marker retry" }, idLink(r.id, failed), " failed" + (status ? " with HTTP " + status : "") + (error ? " (" + error + ")" : "") + " and was retried with the same request as call #" + retry + "; the comparison leaves the failed call out"));
      }
    }
    return out;
  }
  function verdictOf(why, ra, rb) {
    if (why === null) return "they made the same requests and their last calls answered alike";
    const at = "at call #" + why.a + " of " + ra.id + " and call #" + why.b + " of " + rb.id;
    switch (why.kind) {
      case "params": return "they first differ " + at + ": the same messages, different request parameters: " + Object.keys(why.params).join(", ");
      case "message": return "they first differ " + at + ": message #" + why.message + " (" + (why.role_a || "none") + " / " + (why.role_b || "none") + ")" + (why.answered_at ? ", after calls #" + why.answered_at[0] + " / #" + why.answered_at[1] + " answered differently" : "");
      case "ended": {
        const [done, other, pos] = why.ended === "a" ? [ra, rb, why.b] : [rb, ra, why.a];
        return "the same requests until " + done.id + " stopped; " + other.id + " went on with call #" + pos;
      }
      case "answer": return "the same requests; their last calls (#" + why.a + " / #" + why.b + ") answered differently";
      case "request": return "they first differ " + at + ": requests that could not be read as conversations";
      default: return "they differ " + at;
    }
  }
  async function groupPage(task, a, b) {
    const group = state.groupByTask.get(task);
    if (!group) { show(h("p", { class: "marker" }, "no task " + task + " in this run")); return; }
    const rows = group.rows.map((i) => state.rows[i]);
    const rewards = rows.map((r) => r.reward).filter((r) => r !== null);
    const mean = rewards.length ? rewards.reduce((x, y) => x + y, 0) / rewards.length : null;
    const spread = rewards.length ? Math.max(...rewards) - Math.min(...rewards) : null;
    const div = (i, j) => (group.div[i] ? group.div[i][j] : undefined);
    a = Math.max(0, Math.min(a, rows.length - 1)); b = Math.max(0, Math.min(b, rows.length - 1));
    const partsAt = (d) => (d === null ? "never" : d === undefined ? "not computed" : d[0] === null ? "stopped first (other: call #" + d[1] + ")" : d[1] === null ? "went on (call #" + d[0] + ")" : d[0] === d[1] ? "call #" + d[1] : "call #" + d[1] + " (#" + d[0] + " there)");
    const table = h("table", { id: "group-rollouts" },
      h("thead", null, h("tr", null, [["rollout", false], ["reward", true], ["calls", true], ["errors", true], ["diverges from " + rows[a].id, false]].map(([t, n]) => h("th", { class: n ? "num" : null }, t)))),
      h("tbody", null, rows.map((r, i) => h("tr", { "data-rollout": r.id, onclick: (e) => { if (e.target.tagName !== "A") go(rolloutLink(r.id)); } },
        h("td", null, idLink(r.id)), h("td", { class: "num" }, num(r.reward)), h("td", { class: "num" }, num(r.calls)), h("td", { class: "num" }, num(r.errors)),
        h("td", null, i === a ? dash : partsAt(div(a, i)))))));
    const pick = (which, value) => h("select", { id: "pick-" + which, onchange: (e) => go(link("t/" + task + "/" + (which === "a" ? e.target.value + "/" + b : a + "/" + e.target.value))) },
      rows.map((r, i) => h("option", { value: i, selected: i === value ? "" : null }, r.id)));
    const columns = h("div", { class: "cols", id: "diverging-calls" });
    const verdict = h("p", { id: "divergence" });
    const notes = h("div", { id: "divergence-notes" });
    show(h("h2", null, "Task " + task + ": " + plural(rows.length, "rollout")),
      kv([["rewards", rewards.map((x) => num(x)).join(", ") || dash], ["mean", num(mean)], ["spread", num(spread)],
        ["advantage", spread === 0 && rewards.length > 1 ? h("span", { class: "tag gap", id: "zero-advantage" }, "all rewards equal: zero advantage") : dash]]),
      table, h("h3", null, "Where two rollouts part"),
      h("div", { class: "controls" }, pick("a", a), " and ", pick("b", b)), verdict, notes, columns);
    if (a === b) { verdict.textContent = "the same rollout"; return; }
    const why = await explained(group, rows, a, b);
    if (why === undefined) {
      const d = div(a, b);
      verdict.textContent = d === undefined ? "not computed for a group this large; compare with the first rollout" : d === null ? "they made the same requests" : "they first diverge at call #" + d[0] + " / #" + d[1] + " (not explained for a group this large: compare with the first rollout)";
      return;
    }
    const ra = rows[a], rb = rows[b];
    verdict.textContent = verdictOf(why, ra, rb);
    verdict.dataset.kind = why === null ? "same" : why.kind;
    verdict.dataset.call = why && why.a !== null && why.a !== undefined ? String(why.a) : "";
    add(notes, retryNotes(why, [ra, rb]));
    if (why && why.kind === "params") {
      notes.appendChild(h("table", { id: "param-diff" }, h("thead", null, h("tr", null, h("th", null, "parameter"), h("th", null, ra.id), h("th", null, rb.id))),
        h("tbody", null, Object.entries(why.params).map(([k, [x, y]]) => h("tr", { "data-param": k }, h("td", null, h("code", null, k)), h("td", null, x === null ? "(not sent)" : x), h("td", null, y === null ? "(not sent)" : y))))));
    }
    if (!why) return;
    for (const [r, pos] of [[ra, why.a], [rb, why.b]]) {
      const col = h("div", { class: "col" }, h("h4", null, pos === null || pos === undefined ? r.id + ": no further call" : idLink(r.id, pos)));
      columns.appendChild(col);
      if (pos === null || pos === undefined) continue;
      const payload = await blob("payloads", r.id);
      if (!payload) { col.appendChild(leftOutNote("This rollout's payloads")); continue; }
      const call = payload.calls[pos];
      if (!call) continue;
      const whole = conversation(payload, pos, new Map());
      if (why.kind === "message") {
        const m = whole[why.message];
        col.appendChild(h("p", { class: "muted" }, "message #" + why.message + " of " + plural(whole.length, "message") + ":"));
        col.appendChild(h("div", { class: "diverge" }, m === undefined ? h("p", { class: "muted" }, "none: the request ends before it") : messageView(m)));
      } else if (why.kind === "answer") {
        col.appendChild(h("div", { class: "diverge" }, call.answer.length ? call.answer.map(messageView) : h("p", { class: "muted" }, "no answer")));
      } else if (why.kind === "params") {
        col.appendChild(h("p", { class: "muted" }, "the same " + plural(whole.length, "message") + "; the parameters above differ"));
      } else {
        col.appendChild(h("p", { class: "muted" }, plural(whole.length, "message") + "; new since " + (call.parent === null ? "the start" : "call #" + call.parent) + ":"));
        col.appendChild(h("div", { class: "diverge" }, call.new.length ? call.new.map(messageView) : h("p", { class: "muted" }, "none")));
      }
    }
  }

  // --- compare mode: two runs task by task -----------------------------------------------------
  // DATA (rollcap.compare._page): the comparison document, and for each side ("a", "b") the
  // matched tasks' rollouts (`rollouts`: task id -> entries), their rows and calls in the
  // report's summary form, and the payloads that fit the budget, keyed by slot ("<task>/<n>").
  const cmp = { doc: null, sides: {}, byTask: new Map(), benchOf: new Map(), show: "all", page: 0 };
  const SIDE_NAMES = { a: "A", b: "B" };
  const SHOWS = [["all", "all tasks"], ["worse", "worse in B"], ["better", "better in B"], ["unchanged", "unchanged"]];
  // Each metric's title and decimals, as `rollcap compare` prints them.
  const METRIC_ROWS = [["reward", "reward", 3], ["tokens", "tokens/rollout", 0], ["calls", "calls/rollout", 2],
    ["latency_ms", "latency ms", 0], ["error", "error rate", 3], ["gap", "gap rate", 3]];
  const TEST_NAMES = { mcnemar_exact: "McNemar's exact test", paired_bootstrap: "paired bootstrap" };

  function cmpLink(path) { return "#/" + path + (cmp.show !== "all" ? "?show=" + cmp.show : ""); }
  // A number with `digits` decimals and thousands commas, signed when asked (Python's ",.3f"
  // and "+,.3f", so that the page reads as the printed comparison does).
  function fixed(v, digits, signed) {
    if (v === null || v === undefined) return dash;
    const text = Math.abs(v).toFixed(digits).replace(/^\d+/, (i) => i.replace(/\B(?=(\d{3})+(?!\d))/g, ","));
    return (v < 0 || Object.is(v, -0) ? "-" : signed ? "+" : "") + text;
  }
  function pValue(p) { return String(Number(p.toPrecision(4))); }
  function kindOf(change) {
    const c = change.change;
    return c === null ? "unknown" : c < 0 ? "worse" : c > 0 ? "better" : "unchanged";
  }
  function cmpListed() {
    return cmp.doc.overall.changes.filter((c) => cmp.show === "all" || kindOf(c) === cmp.show);
  }

  function meanCell(figure, digits) {
    if (!figure) return dash;
    return fixed(figure.mean, digits) + (figure.ci ? " [" + fixed(figure.ci[0], digits) + ", " + fixed(figure.ci[1], digits) + "]" : "");
  }
  function diffCell(figure, digits) {
    if (!figure) return dash;
    let text = fixed(figure.mean, digits, true);
    if (figure.se !== null) text += " (se " + fixed(figure.se, Math.max(digits, 1) + 1) + ")";
    if (figure.ci) text += " [" + fixed(figure.ci[0], digits, true) + ", " + fixed(figure.ci[1], digits, true) + "]";
    if (figure.clusters !== null && figure.clusters !== undefined) text += " " + figure.clusters + " clusters";
    return text;
  }
  function testLine(test) {
    if (!test) return "no task with a reward in both runs";
    const counted = test.name === "mcnemar_exact" ? test.a_only + " tasks solved by A only, " + test.b_only + " by B only"
      : num(test.resamples) + " resamples, seed " + test.seed;
    return [(TEST_NAMES[test.name] || test.name) + " (" + counted + "): p = ", h("b", { class: "p-value" }, pValue(test.p_value))];
  }
  function powerLine(section) {
    const power = section.power;
    if (power.tasks_needed === null) return "unknown (needs two tasks with a reward in both runs)";
    return num(power.tasks_needed) + " tasks would detect a reward difference of " + power.delta + " with " + Math.round(power.power * 100) +
      "% power (per-task difference sd " + fixed(power.sd, 3) + "; " + section.metrics.reward.tasks + " matched here)";
  }
  function cmpSection(section) {
    const t = section.tasks;
    const box = h("section", { class: "detail cmp-section", "data-section": section.name }, h("h3", null, section.name),
      h("p", { class: "cmp-tasks" }, plural(t.matched, "task") + " matched · " + num(t.only_a) + " only in A · " + num(t.only_b) + " only in B"));
    if (!t.matched) return box;
    box.appendChild(h("table", { class: "cmp-metrics" },
      h("thead", null, h("tr", null, ["", "A (95% CI)", "B (95% CI)", "B − A (se) [95% CI]", "tasks"].map((title, i) => h("th", { class: i ? "num" : null }, title)))),
      h("tbody", null, METRIC_ROWS.map(([metric, title, digits]) => {
        const figure = section.metrics[metric];
        return h("tr", { "data-metric": metric }, h("th", null, title),
          h("td", { class: "num a" }, figure ? meanCell(figure.a, digits) : dash),
          h("td", { class: "num b" }, figure ? meanCell(figure.b, digits) : dash),
          h("td", { class: "num diff" }, figure ? diffCell(figure.diff, digits) : dash),
          h("td", { class: "num" }, figure ? num(figure.tasks) : "0"));
      }))));
    box.appendChild(kv([
      ["paired test", h("span", { class: "cmp-test" }, testLine(section.test))],
      ["flips", h("span", { class: "cmp-flips" }, plural(section.flips.better, "task") + " better in B, " + num(section.flips.worse) + " worse")],
      ["power", h("span", { class: "cmp-power" }, powerLine(section))],
    ]));
    return box;
  }
  function verdictView(v) {
    let text;
    if (v.failed === null) text = "FAIL: no interval of the reward difference to gate on";
    else text = (v.failed ? "FAIL" : "PASS") + ": the 95% interval's upper bound of B − A, " + fixed(v.upper, 4, true) + ", " + (v.failed ? "is below" : "is not below") + " -" + v.fail_if_worse;
    return h("p", { class: "marker verdict " + (v.failed === false ? "pass" : "fail"), id: "verdict", "data-failed": String(v.failed) }, "verdict: " + text);
  }
  function sideLine(side) { return side.source + " (" + plural(side.rollouts, "rollout") + ", " + num(side.failed) + " failed)"; }
  // The rollouts whose payloads the budget left out, named task by task, worst change first.
  function leftOutList() {
    const left = { a: new Set(DATA.budget.left_out.a), b: new Set(DATA.budget.left_out.b) };
    let count = 0;
    const items = [];
    for (const change of cmp.doc.overall.changes) {
      const named = [];
      for (const side of ["a", "b"]) {
        for (const entry of cmp.sides[side].rollouts[change.id] || []) {
          if (!left[side].has(entry.slot)) continue;
          named.push(h("span", { class: "left-out-rollout", "data-side": side, "data-slot": entry.slot }, SIDE_NAMES[side] + " " + (entry.id || entry.slot)));
          count++;
        }
      }
      if (named.length) items.push(h("li", { "data-task": change.id }, h("a", { href: cmpLink("t/" + encodeURIComponent(change.id)) }, change.label), ": ", joined(named, ", ")));
    }
    if (!items.length) return null;
    return h("details", { class: "marker", id: "left-out", open: items.length <= 20 ? "" : null },
      h("summary", null, plural(count, "rollout") + " of " + plural(items.length, "task") + " without a transcript: their payloads did not fit in this page's payload budget (" + num(DATA.budget.total) + " bytes); " + VIEW_HINT),
      h("ul", null, items));
  }
  function taskTable() {
    const wrap = h("div", { id: "task-list" });
    const many = cmp.doc.benchmarks.length > 1;
    const draw = () => {
      const rows = cmpListed();
      const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
      cmp.page = Math.min(cmp.page, pages - 1);
      const shown = rows.slice(cmp.page * PAGE_ROWS, (cmp.page + 1) * PAGE_ROWS);
      const heads = [["task", false], many ? ["benchmark", false] : null, ["A reward", true], ["B reward", true], ["B − A", true], ["rollouts A / B", true]].filter(Boolean);
      const body = h("tbody", null, shown.map((c) => {
        const kind = kindOf(c);
        const href = cmpLink("t/" + encodeURIComponent(c.id));
        return h("tr", { class: "cmp-task " + kind, "data-task": c.id, "data-kind": kind, onclick: (e) => { if (e.target.tagName !== "A") go(href); } },
          h("td", { class: "label" }, h("a", { href: href }, c.label)),
          many ? h("td", null, cmp.benchOf.get(c.id) || dash) : null,
          h("td", { class: "num" }, num(c.a)), h("td", { class: "num" }, num(c.b)),
          h("td", { class: "num change" }, c.change === null ? dash : fixed(c.change, 3, true)),
          h("td", { class: "num" }, c.rollouts.a.length + " / " + c.rollouts.b.length));
      }));
      const pager = pages > 1 ? h("div", { class: "pager" },
        h("button", { disabled: cmp.page === 0 ? "" : null, onclick: () => { cmp.page--; draw(); } }, "previous"),
        " page " + (cmp.page + 1) + " of " + pages + " ",
        h("button", { disabled: cmp.page >= pages - 1 ? "" : null, onclick: () => { cmp.page++; draw(); } }, "next")) : null;
      fill(wrap, h("p", { class: "muted", id: "list-count" }, num(rows.length) + " of " + plural(cmp.doc.overall.changes.length, "matched task") + ", the worst change first"),
        pager, h("table", { id: "tasks" }, h("thead", null, h("tr", null, heads.map(([t, n]) => h("th", { class: n ? "num" : null }, t)))), body));
    };
    const counts = {};
    for (const c of cmp.doc.overall.changes) counts[kindOf(c)] = (counts[kindOf(c)] || 0) + 1;
    const select = h("select", { id: "task-filter", onchange: (e) => { cmp.show = e.target.value; cmp.page = 0; history.replaceState(null, "", cmpLink("")); draw(); } },
      SHOWS.map(([v, l]) => h("option", { value: v, selected: cmp.show === v ? "" : null }, l + " (" + num(v === "all" ? cmp.doc.overall.changes.length : counts[v] || 0) + ")")));
    draw();
    return [h("div", { class: "controls" }, "show ", select), wrap];
  }
  function cmpHome() {
    const doc = cmp.doc;
    const parts = [h("h2", null, "Comparison"), kv([
      ["A", h("span", { id: "side-a" }, sideLine(doc.a))], ["B", h("span", { id: "side-b" }, sideLine(doc.b))],
      ["tasks matched by", doc.key || "the task's input (responses_create_params.input)"],
      doc.cluster ? ["standard errors", "clustered by " + doc.cluster] : null,
    ])];
    if (doc.verdict) parts.push(verdictView(doc.verdict));
    const unmatched = doc.benchmarks_unmatched;
    if (unmatched.a.length || unmatched.b.length) parts.push(h("p", { class: "marker", id: "benchmarks-unmatched" }, "benchmarks not in both runs: A only " + (unmatched.a.join(", ") || dash) + ", B only " + (unmatched.b.join(", ") || dash)));
    const sections = doc.benchmarks.slice();
    if (sections.length !== 1) sections.push(doc.overall);
    parts.push(sections.map(cmpSection));
    if (!doc.overall.tasks.matched) parts.push(h("p", { class: "marker" }, "no task is in both runs: name the field that identifies a task with --key"));
    parts.push(leftOutList());
    parts.push(h("h2", null, "Tasks"), taskTable());
    show(parts);
  }

  // Two rollouts side by side repeat the report's element ids: each becomes a class instead.
  function idsToClasses(el) {
    for (const e of [el, ...el.querySelectorAll("[id]")]) if (e.id) { e.classList.add(e.id); e.removeAttribute("id"); }
    return el;
  }
  function rewardTag(reward) { return reward === null ? tag("no reward", "gap") : tag("reward " + num(reward), reward > 0 ? "ok" : "err"); }
  async function cmpRollout(side, entry) {
    const f = entry.figures;
    const box = h("section", { class: "detail cmp-rollout", "data-slot": entry.slot, "data-rollout": entry.id || "" },
      h("h4", null, "rollout " + (entry.id || "(no id)") + " ", h("span", { class: "cmp-reward" }, rewardTag(f.reward)), entry.failed ? tag("failed", "err") : null),
      h("p", { class: "muted cmp-figures" }, joined(["tokens " + num(f.tokens), "calls " + num(f.calls), "latency " + ms(f.latency_ms), f.error ? "had an error" : null, f.gap ? "has gaps" : null], " · ")));
    if (entry.unread === "no_capture_dir") {
      box.appendChild(h("p", { class: "marker no-capture" }, "the capture was not found: benchmark " + entry.benchmark + " of run " + SIDE_NAMES[side] + " was read without a capture directory (model-calls/); these are the rollouts file's figures"));
      return box;
    }
    if (entry.row === null) {
      box.appendChild(h("p", { class: "marker" }, "the rollouts file names no rollout id for it: its capture cannot be looked up"));
      return box;
    }
    const row = entry.view;
    const payload = await blob("payloads", entry.slot, side);
    if (!payload) { box.appendChild(h("div", { class: "left-out" }, leftOutNote("This rollout's payloads"))); return box; }
    for (const g of payload.gaps) box.appendChild(h("p", { class: "marker" }, g.code + (g.detail ? ": " + g.detail : "")));
    box.appendChild(factsHeader(row, payload, false));
    if (payload.calls.length) box.appendChild(transcript(row, payload, callsOf(row), toolRuns(row, payload)));
    else box.appendChild(h("p", { class: "muted" }, "no call captured"));
    return idsToClasses(box);
  }
  function taskNav(change) {
    const listed = cmpListed();
    const at = listed.indexOf(change);
    const prev = at > 0 ? listed[at - 1] : null, next = at >= 0 && at + 1 < listed.length ? listed[at + 1] : null;
    const to = (c) => cmpLink("t/" + encodeURIComponent(c.id));
    return h("div", { class: "controls", id: "task-nav" },
      prev ? h("a", { href: to(prev), id: "prev-task" }, "← worse") : h("span", { class: "muted" }, "← none"),
      h("span", { class: "muted", id: "nav-position" }, at >= 0 ? (at + 1) + " of " + listed.length + " tasks" : "not in the filtered list"),
      next ? h("a", { href: to(next), id: "next-task" }, "better →") : h("span", { class: "muted" }, "none →"),
      h("a", { href: cmpLink(""), id: "to-tasks" }, "all tasks"));
  }
  async function cmpTaskPage(taskId) {
    const change = cmp.byTask.get(taskId);
    if (!change) { show(h("p", { class: "marker" }, "no task " + taskId + " in this comparison"), h("p", null, h("a", { href: cmpLink(""), id: "to-tasks" }, "all tasks"))); return; }
    const kind = kindOf(change);
    const index = change.task_index;
    const input = h("div", { id: "task-input" });
    const columns = h("div", { class: "cols", id: "sides" });
    show(taskNav(change), h("h2", { id: "task-label" }, change.label),
      kv([
        ["benchmark", cmp.benchOf.get(taskId) || dash],
        ["task index", "A " + num(index.a) + " · B " + num(index.b)],
        ["reward", h("span", { id: "task-rewards" }, "A " + num(change.a) + " · B " + num(change.b))],
        ["B − A", h("span", { id: "task-change", class: "tag " + (kind === "worse" ? "err" : kind === "better" ? "ok" : ""), "data-kind": kind }, change.change === null ? dash : fixed(change.change, 3, true))],
        ["input", input],
      ]), columns);
    let shownInput = false;
    for (const side of ["a", "b"]) {
      const entries = cmp.sides[side].rollouts[taskId] || [];
      const col = h("div", { class: "col cmp-side", "data-side": side },
        h("h3", null, SIDE_NAMES[side] + " ", h("span", { class: "muted" }, cmp.doc[side].source + " · " + plural(entries.length, "rollout"))));
      columns.appendChild(col);
      for (const entry of entries) {
        col.appendChild(await cmpRollout(side, entry));
        if (!shownInput && entry.row !== null) {
          const payload = await blob("payloads", entry.slot, side);
          const messages = payload && payload.facts && payload.facts.input;
          if (messages && messages.length) { fill(input, messages.map(messageView)); shownInput = true; }
        }
      }
    }
    if (!shownInput) fill(input, dash);
  }
  async function cmpCallPage(taskId, side, n, pos) {
    const change = cmp.byTask.get(taskId);
    const entries = cmp.sides[side] && cmp.sides[side].rollouts[taskId];
    const entry = entries ? entries[n] : undefined;
    const back = h("p", null, h("a", { href: cmpLink("t/" + encodeURIComponent(taskId)), id: "to-task" }, "← the task's two runs"), " · ", h("a", { href: cmpLink(""), id: "to-tasks" }, "all tasks"));
    if (!change || !entry || !entry.view) { show(back, h("p", { class: "marker" }, "no such rollout in this comparison")); return; }
    const payload = await blob("payloads", entry.slot, side);
    const head = [back, h("h2", null, SIDE_NAMES[side] + " · rollout " + entry.id + " · call #" + pos), h("p", { class: "muted" }, change.label)];
    if (!payload) { show(head, leftOutNote("This rollout's payloads")); return; }
    if (!(pos >= 0 && pos < payload.calls.length)) { show(head, h("p", { class: "marker" }, "no call #" + pos + " in this rollout")); return; }
    show(head, callDetail(entry.view, payload, pos));
  }
  async function cmpRender(parts, params) {
    const wanted = params.get("show");
    cmp.show = SHOWS.some(([v]) => v === wanted) ? wanted : "all";
    if (parts[0] === "t" && parts[1]) {
      if (parts[2] && parts[3] !== undefined && parts[4] !== undefined) await cmpCallPage(parts[1], parts[2], Number(parts[3]), Number(parts[4]));
      else await cmpTaskPage(parts[1]);
    } else cmpHome();
  }
  async function cmpStart() {
    cmp.doc = await inflate(DATA.comparison);
    for (const c of cmp.doc.overall.changes) cmp.byTask.set(c.id, c);
    for (const section of cmp.doc.benchmarks) for (const c of section.changes) cmp.benchOf.set(c.id, section.name);
    for (const side of ["a", "b"]) {
      const packed = DATA.sides[side];
      const run = indexSummary(await inflate(packed.summary));
      run.rollouts = await inflate(packed.rollouts);
      for (const [taskId, entries] of Object.entries(run.rollouts)) {
        entries.forEach((entry, n) => {
          if (entry.row === null) return;
          const row = run.rows[entry.row];
          Object.assign(row, { side: side, taskId: taskId, n: n, slot: entry.slot });
          entry.view = row;
        });
      }
      cmp.sides[side] = run;
    }
    document.getElementById("source").textContent = "A: " + cmp.doc.a.source + " · B: " + cmp.doc.b.source;
  }

  // --- routing -------------------------------------------------------------------------------
  function go(hash) { if (location.hash === hash) route(); else location.hash = hash; }
  let routing = Promise.resolve();
  function route() {
    routing = routing.then(render).catch((e) => { console.error(e); });
    return routing;
  }
  async function render() {
    const { parts, params } = parseHash();
    if (COMPARE) { await cmpRender(parts, params); return; }
    readFilters(params);
    keysFor = null;  // only a rollout's page moves with the keys
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
        const { parts } = parseHash();
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
    if (COMPARE) {
      await cmpStart();
      window.addEventListener("hashchange", route);
      await route();
      document.documentElement.dataset.ready = "1";
      return;
    }
    let summary;
    if (SERVED) { summary = await api("api/summary"); state.revision = summary.revision; }
    else summary = await inflate(DATA.summary);
    useSummary(summary);
    document.getElementById("source").textContent = summary.source.capture_dir || "";
    window.addEventListener("hashchange", route);
    if (SERVED && DATA.live) {
      live.panel = h("section", { id: "live-panel", "data-polling": "1" });
      drawLive();
      pollLive();
    }
    await route();
    document.documentElement.dataset.ready = "1";
    if (SERVED) setTimeout(poll, POLL_MS);
  }
  start().catch((e) => { console.error(e); show(h("p", { class: "marker" }, "the report could not be shown: " + e.message)); });
})();
