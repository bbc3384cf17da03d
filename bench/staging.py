"""RL token staging: buffered-SSE calls vs plain non-streamed calls through the same stack.

    .venv/bin/python bench/staging.py [--calls N] [--concurrency C] [--dialect chat|responses]

The fake upstream (``python -m rollcap.testing``, which returns token ids and logprobs when
asked), a capture worker (``rollcap serve worker``) staging into a temporary directory, and a
model server, the gate (``rollcap serve model --model-type vllm_model`` with
``token_id_capture: {enabled: true, external_staging: true, rebuild_response: false}``, its
control token in ``NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN``, and capture on) run in processes of
their own, on 127.0.0.1. The same training calls
(``/ng-rollout/<id>/training-token-capture/v1/...``), spread over 64 rollouts, go through that
stack non-streamed and with ``stream: true`` (buffered SSE: the answer is staged, committed to
the ledger, then replayed as events), alternating rounds. Reported: calls/s and p50 latency for
each, the ratio buffered / plain, the staged records on disk
(``<staging_dir>/<rollout_id>/<call>/record.json``) and what the gate's manifests say.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from _procs import started

BIN = Path(sys.executable).parent
KEY = "bench-key"
CONTROL_TOKEN = "bench-control-token"
CONTROL_TOKEN_ENV = "NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN"
ROUNDS = 3
ROLLOUTS = 64
CALL_TIMEOUT_S = 60


def _body(dialect: str, n: int, stream: bool) -> bytes:
    text = f"Question number {n}: which option is right?"
    body: dict[str, object] = {"model": "fake-model", "stream": stream}
    if dialect == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["input"] = text
    return orjson.dumps(body)


async def _round(
    base: str, dialect: str, stream: bool, calls: int, concurrency: int
) -> tuple[float, list[float]]:
    path = "/v1/chat/completions" if dialect == "chat" else "/v1/responses"
    latencies: list[float] = []
    numbers = iter(range(calls))

    async def worker(session: aiohttp.ClientSession) -> None:
        for n in numbers:
            start = time.perf_counter()
            async with session.post(
                f"{base}/ng-rollout/bench-{n % ROLLOUTS}/training-token-capture{path}",
                data=_body(dialect, n, stream),
                headers={"content-type": "application/json"},
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
            latencies.append((time.perf_counter() - start) * 1000)

    connector = aiohttp.TCPConnector(limit=concurrency)
    # Bounded: a call that never ends fails the run instead of hanging it.
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return calls / elapsed, latencies


async def _manifests(base: str) -> tuple[int, int]:
    """``(records, failures)`` over every rollout's manifest, read on the control route."""
    records = failures = 0
    headers = {"authorization": f"Bearer {CONTROL_TOKEN}"}
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for n in range(ROLLOUTS):
            url = f"{base}/training-token-capture/control/rollouts/bench-{n}/manifest"
            async with session.get(url, headers=headers) as response:
                if response.status != 200:
                    raise RuntimeError(f"manifest of bench-{n}: HTTP {response.status}")
                manifest = orjson.loads(await response.read())
            records += len(manifest["records"])
            failures += len(manifest["failures"])
    return records, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and mode")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--dialect", choices=["chat", "responses"], default="chat")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rollcap-bench-staging-"))
    env = {**os.environ, "ROLLCAP_BENCH_UPSTREAM_KEY": KEY, CONTROL_TOKEN_ENV: CONTROL_TOKEN}
    try:
        up_args = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        with started(up_args, "http") as (_, up_lines):
            upstream = up_lines[0].strip()
            worker_args = [str(BIN / "rollcap"), "serve", "worker", "--upstream", upstream,
                           "--staging-dir", str(work / "staging"), "--port", "0",
                           "--api-key-env", "ROLLCAP_BENCH_UPSTREAM_KEY"]  # fmt: skip
            with started(worker_args, "rollcap", env=env) as (_, worker_lines):
                worker = worker_lines[-1].split(" on ", 1)[1].split(" ", 1)[0]
                model_args = [str(BIN / "rollcap"), "serve", "model", "--model-type",
                              "vllm_model", "--port", "0", f"++policy_base_url={worker}/v1",
                              "++token_id_capture.enabled=true",
                              "++token_id_capture.external_staging=true",
                              "++token_id_capture.rebuild_response=false",
                              "++observability_enabled=true",
                              f"++model_call_capture_dir={work / 'calls'}"]  # fmt: skip
                with started(model_args, "rollcap", env=env) as (_, model_lines):
                    model = model_lines[-1].split(" on ", 1)[1].split(" ", 1)[0]
                    results: dict[bool, list[tuple[float, list[float]]]] = {False: [], True: []}
                    for _ in range(ROUNDS):
                        for stream in (False, True):
                            measured = _round(
                                model, args.dialect, stream, args.calls, args.concurrency
                            )
                            results[stream].append(asyncio.run(measured))
                    records, failures = asyncio.run(_manifests(model))
        print(f"{args.dialect}, {args.calls} calls x {ROUNDS} rounds per mode, "
              f"{args.concurrency} concurrent over {ROLLOUTS} rollouts; upstream, worker and "
              f"model server share {os.cpu_count()} cores with the client")  # fmt: skip
        rates = {}
        for stream, label in ((False, "plain (non-streamed)"), (True, "buffered SSE")):
            rate = statistics.median(r for r, _ in results[stream])
            p50 = statistics.median(x for _, lat in results[stream] for x in lat)
            rates[stream] = rate
            print(f"{label:<22} {rate:8.0f} calls/s   p50 {p50:6.2f} ms")
        print(f"buffered SSE / plain: {rates[True] / rates[False]:.2f}")
        staged = sum(1 for _ in (work / "staging").glob("*/*/record.json"))
        print(f"staged records on disk: {staged} of {2 * ROUNDS * args.calls} calls")
        print(f"manifests: {records} committed, {failures} failures")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
