"""The run report at scale: its size, and the time until it is ready in Chromium.

    .venv/bin/python bench/report.py [--rollouts N] [--calls C]

Writes a synthetic run with ``CaptureStore`` (by default 2,000 rollouts x 40 calls, 8 repeats
per task that part at a random call; every call resends the conversation, as agents do, and adds
a tool call and its result; every other call streamed, with its raw SSE; one rollout in 50 hit
by a 429 that is retried), then builds its report twice: with the default payload budget, and
with a budget of 0 (the summary alone). Baselines in the same run: the capture files' size and
the summary's plain JSON size; an empty run's report in the same browser.

Chromium is Debian's (/usr/bin/chromium), driven by Playwright; "ready" is the page's
``data-ready`` flag, measured from navigation start, median of 3 rounds, alternating with the
empty report. Also timed: opening the last call of one rollout (decoding its payload).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from playwright.sync_api import Page, sync_playwright

from rollcap.records import RawRecord, model_ref
from rollcap.report import build_report, find_run, unpack
from rollcap.store import CaptureStore

CHROMIUM = "/usr/bin/chromium"
ROUNDS = 3
REPEATS = 8
SEARCHED = "kilo"  # + the rollout's number: a word of one rollout's final answer
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the task's documents.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "page": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]


def _filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _sse(text: str) -> str:
    pieces = [text[i : i + 24] for i in range(0, len(text), 24)]
    events = [
        orjson.dumps({"object": "chat.completion.chunk", "choices": [{"delta": {"content": p}}]})
        for p in pieces
    ]
    return "".join(f"data: {e.decode()}\n\n" for e in events) + "data: [DONE]\n\n"


def _rollout(
    task: int, index: int, calls: int, start: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rollout's records, and its timed tool runs (``ng_trajectory.tool_calls``)."""
    shared = random.Random(task)  # what every repeat of the task sees until it parts
    own = random.Random(task * 1000 + index + 1)
    parts_at = own.randrange(1, calls)
    messages: list[Any] = [
        {"role": "system", "content": "You are a careful research agent. " + _filler(shared, 20)},
        {"role": "user", "content": f"Task {task}: " + _filler(shared, 25)},
    ]
    records: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    clock = start
    rate_limited = own.random() < 0.02
    for k in range(calls):
        rng = own if k >= parts_at else shared
        streamed = k % 2 == 1
        last = k == calls - 1
        latency = rng.uniform(200, 2000)
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        usage = {
            "prompt_tokens": chars // 4,
            "completion_tokens": 40,
            "total_tokens": chars // 4 + 40,
        }
        request = {
            "model": "policy",
            "messages": list(messages),
            "tools": TOOLS,
            "stream": streamed,
        }
        if rate_limited and k == 5:
            records.append(
                RawRecord(
                    model_call_id=f"{own.getrandbits(128):032x}",
                    dialect="chat",
                    model_ref=model_ref("policy_model"),
                    started_at=clock,
                    completed_at=clock + 0.05,
                    latency_ms=50.0,
                    latency_ttft_ms=50.0,
                    status_code=429,
                    error_category="rate_limit",
                    request=request,
                    response={"error": {"message": "Rate limit reached.", "type": "requests"}},
                ).to_json()
            )
            clock += 1.05
        text = _filler(rng, 30)
        if last:
            message: dict[str, Any] = {"role": "assistant", "content": text}
        else:
            arguments = orjson.dumps({"query": _filler(rng, 4), "page": k}).decode()
            message = {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": f"call_{k}",
                        "type": "function",
                        "function": {"name": "search", "arguments": arguments},
                    }
                ],
            }
        response = {
            "id": f"chatcmpl-{task}-{index}-{k}",
            "object": "chat.completion",
            "model": "policy",
            "choices": [
                {"index": 0, "finish_reason": "stop" if last else "tool_calls", "message": message}
            ],
            "usage": usage,
        }
        records.append(
            RawRecord(
                model_call_id=f"{own.getrandbits(128):032x}",
                dialect="chat",
                model_ref=model_ref("policy_model"),
                started_at=clock,
                completed_at=clock + latency / 1000,
                latency_ms=latency,
                latency_ttft_ms=rng.uniform(50, 300),
                status_code=200,
                error_category=None,
                request=request,
                response=response,
                response_raw=_sse(text) if streamed else None,
            ).to_json()
        )
        done = clock + latency / 1000
        clock = done + rng.uniform(0.05, 0.5)
        messages.append(message)
        if last:
            break
        result = _filler(rng, 30)
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": result})
        runs.append(
            {"tool_call_id": f"call_{k}", "tool_name": "search", "started_at": done + 0.01,
             "completed_at": clock - 0.01, "duration_ms": (clock - done - 0.02) * 1000,
             "timing_source": "executor", "status": "completed", "output": result}
        )  # fmt: skip
    return records, runs


def write_run(job: Path, rollouts: int, calls: int) -> None:
    store = CaptureStore(job / "model-calls")
    lines = []
    for r in range(rollouts):
        task, index = divmod(r, REPEATS)
        rollout_id = f"{task}-{index}"
        records, runs = _rollout(task, index, calls, 1.8e9 + r)
        store.append_many([(rollout_id, rec) for rec in records])
        # A collected line's shape: the task, the ids, the graded answer, the trajectory.
        line = {"responses_create_params": {"input": [{"role": "user", "content": f"Task {task}"}]},
                "expected_answer": f"answer {task}",
                "_ng_task_index": task, "_ng_rollout_index": index, "_ng_attempt_index": 0,
                "rollout_id": rollout_id, "response": {"text": f"final answer {SEARCHED}{r}"},
                "reward": float(r % 3 == 0), "extracted_answer": f"answer {r % 7}",
                "resolved": r % 3 == 0, "ng_trajectory": {"tool_calls": runs}}  # fmt: skip
        lines.append(orjson.dumps(line))
    store.close()
    (job / "rollouts.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def _ready_ms(page: Page, url: str) -> float:
    start = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_selector("html[data-ready='1']", timeout=120_000)
    return (time.perf_counter() - start) * 1000


def _open_call_ms(page: Page, url: str, rollout_id: str, position: int) -> float:
    start = time.perf_counter()
    page.goto(f"{url}#/r/{rollout_id}/{position}")
    page.wait_for_selector(f"#call-detail[data-call='{position}']", timeout=60_000)
    return (time.perf_counter() - start) * 1000


def _transcript_ms(page: Page, url: str, rollout_id: str, calls: int) -> float:
    start = time.perf_counter()
    page.goto(f"{url}#/r/{rollout_id}")
    page.wait_for_selector(f"#turn-{calls - 1}", timeout=60_000)
    return (time.perf_counter() - start) * 1000


def _search_ms(page: Page, url: str, word: str) -> float:
    """From the query in the URL to the list of the one rollout that holds the word."""
    start = time.perf_counter()
    page.goto(f"{url}#/?q={word}")
    page.wait_for_selector("#rollouts tbody tr:only-child", timeout=60_000)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        job, empty = root / "job", root / "empty"
        start = time.perf_counter()
        write_run(job, args.rollouts, args.calls)
        (empty / "model-calls").mkdir(parents=True)
        written = time.perf_counter() - start
        capture_bytes = sum(p.stat().st_size for p in (job / "model-calls").iterdir())
        print(f"synthetic run: {args.rollouts} rollouts x {args.calls} calls, "
              f"{capture_bytes / 1e6:.1f} MB of capture files, "
              f"written in {written:.1f} s")  # fmt: skip

        run = find_run(job)
        start = time.perf_counter()
        page, stats = build_report(run)
        built = time.perf_counter() - start
        lean, lean_stats = build_report(run, payload_budget=0)
        summary_json = len(orjson.dumps(unpack(_data(lean)["summary"])))
        full_path, lean_path, empty_path = root / "full.html", root / "lean.html", root / "e.html"
        full_path.write_text(page)
        lean_path.write_text(lean)
        empty_path.write_text(build_report(find_run(empty))[0])
        print(f"report, default budget: {stats.size / 1e6:.2f} MB (built in {built:.1f} s; "
              f"payloads of {stats.payloads_embedded} rollouts, "
              f"{stats.payloads_left_out} left out, "
              f"raw texts of {stats.raw_left_out} left out)")  # fmt: skip
        print(f"report, budget 0 (summary only): {lean_stats.size / 1e6:.2f} MB; "
              f"baseline: the summary as plain JSON {summary_json / 1e6:.2f} MB")  # fmt: skip

        times: dict[str, list[float]] = {
            "empty": [], "full": [], "lean": [], "call": [], "transcript": [], "search": []
        }  # fmt: skip
        with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
            browser = p.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync", "--no-first-run"],
            )  # fmt: skip
            middle = args.rollouts // 2
            picked = f"{middle // REPEATS}-{middle % REPEATS}"
            for _ in range(ROUNDS):
                for name, path in (("empty", empty_path), ("full", full_path), ("lean", lean_path)):
                    tab = browser.new_page()
                    times[name].append(_ready_ms(tab, path.as_uri()))
                    if name == "full":
                        url = path.as_uri()
                        times["call"].append(_open_call_ms(tab, url, picked, args.calls - 1))
                        times["transcript"].append(_transcript_ms(tab, url, picked, args.calls))
                    tab.close()
                    if name == "full":
                        # A fresh page: the first search decodes the texts.
                        tab = browser.new_page()
                        _ready_ms(tab, path.as_uri())
                        word = f"{SEARCHED}{args.rollouts - 1}"
                        times["search"].append(_search_ms(tab, path.as_uri(), word))
                        tab.close()
            browser.close()
        med = {name: statistics.median(values) for name, values in times.items()}
        print(f"ready in Chromium (median of {ROUNDS}): empty report {med['empty']:.0f} ms "
              f"(baseline), full {med['full']:.0f} ms, summary only {med['lean']:.0f} ms; "
              f"opening the last call of a rollout {med['call']:.0f} ms; "
              f"its whole transcript {med['transcript']:.0f} ms; "
              f"a full-text search's first answer {med['search']:.0f} ms")  # fmt: skip


def _data(page: str) -> dict[str, Any]:
    start = page.index('id="rollcap-data">') + len('id="rollcap-data">')
    end = page.index("</script>", start)
    data: dict[str, Any] = orjson.loads(page[start:end])
    return data


if __name__ == "__main__":
    main()
