"""Model-server overhead: direct calls vs rollcap with capture off vs capture on, in one run.

    .venv/bin/python bench/proxy.py [--requests N] [--concurrent-requests N] [--streams N]

Everything runs on this machine: the fake upstream (``python -m rollcap.testing``) and each
rollcap model server (``rollcap serve model``) in processes of their own, the client here, all
over 127.0.0.1. Chat Completions, zero upstream delay: non-streamed answers of about 1 KiB and
streams of 50 events. Capture-on calls are spread over 64 rollouts. Reported: sequential p50 and
p99 latency, time to first chunk for streams, throughput at 64 concurrent requests, server RSS,
and RSS while 500 streams are open at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from _procs import server_url, started, stop

BIN = Path(sys.executable).parent
THROUGHPUT_ROUNDS = 3
KEY = "bench-key"


@contextlib.contextmanager
def _process(args: list[str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start a server that prints its URL on its first line; yield it and the URL."""
    with started(args) as (proc, lines):
        yield proc, server_url(lines[0])


LITELLM_VENV = Path(__file__).resolve().parent / ".venv-litellm"


@contextlib.contextmanager
def _litellm(upstream: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """LiteLLM's proxy on the same upstream, installed into a venv of its own on first use."""
    litellm = LITELLM_VENV / "bin" / "litellm"
    if not litellm.exists():
        print(f"installing litellm[proxy] into {LITELLM_VENV} (first run only)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        pip = [str(LITELLM_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "litellm[proxy]"], check=True)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "OPENAI_API_KEY": KEY,
        # No master key: a local benchmark with nothing to protect, as LiteLLM's docs allow.
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    args = [str(litellm), "--model", "openai/fake-model", "--api_base", f"{upstream}/v1",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health/liveliness", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("litellm proxy did not start") from None
                time.sleep(0.5)
        yield proc, url
    finally:
        stop(proc)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _body(stream: bool, n: int, model: str = "fake-model") -> bytes:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": f"Question number {n}: which option is right?"}],
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(body)


@dataclass
class Target:
    label: str
    base: str  # base URL up to (not including) /v1/chat/completions
    rollouts: bool  # spread calls over /ng-rollout/<id>/
    pid: int | None
    model: str = "fake-model"

    def url(self, n: int) -> str:
        prefix = f"/ng-rollout/bench-{n % 64}" if self.rollouts else ""
        return f"{self.base}{prefix}/v1/chat/completions"


HEADERS_PLAIN = {"content-type": "application/json", "authorization": f"Bearer {KEY}",
                 "x-fake-content-bytes": "1024"}  # fmt: skip
HEADERS_STREAM = {"content-type": "application/json", "authorization": f"Bearer {KEY}",
                  "x-fake-events": "50"}  # fmt: skip


async def _one(
    session: aiohttp.ClientSession, target: Target, n: int, stream: bool
) -> tuple[float, float]:
    """(time to first chunk, total) in ms."""
    start = time.perf_counter()
    first = None
    async with session.post(
        target.url(n),
        data=_body(stream, n, target.model),
        headers=HEADERS_STREAM if stream else HEADERS_PLAIN,
    ) as response:
        async for _ in response.content.iter_any():
            if first is None:
                first = time.perf_counter()
        if response.status != 200:
            raise RuntimeError(f"{target.label}: HTTP {response.status}")
    end = time.perf_counter()
    return ((first or end) - start) * 1000, (end - start) * 1000


async def _sequential(
    session: aiohttp.ClientSession, target: Target, count: int, stream: bool
) -> dict[str, float]:
    for n in range(20):  # warm-up: connections, caches, first-call imports
        await _one(session, target, n, stream)
    ttfc, total = [], []
    for n in range(count):
        a, b = await _one(session, target, n, stream)
        ttfc.append(a)
        total.append(b)
    q = statistics.quantiles(total, n=100)
    return {"p50": statistics.median(total), "p99": q[98], "ttfc_p50": statistics.median(ttfc)}


async def _throughput(
    session: aiohttp.ClientSession, target: Target, count: int, stream: bool
) -> float:
    next_n = 0

    async def worker() -> None:
        nonlocal next_n
        while next_n < count:
            n = next_n
            next_n += 1
            await _one(session, target, n, stream)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(64)))
    return count / (time.perf_counter() - start)


async def _open_streams(
    session: aiohttp.ClientSession, target: Target, count: int
) -> tuple[float, int]:
    """Peak RSS (MB) of the target's process while ``count`` slow streams are open at once,
    and how many of the streams failed."""
    assert target.pid is not None
    headers = {**HEADERS_STREAM, "x-fake-chunk-delay-ms": "20"}
    peak = 0.0

    async def one(n: int) -> None:
        data = _body(True, n, target.model)
        async with session.post(target.url(n), data=data, headers=headers) as response:
            async for _ in response.content.iter_any():
                pass

    tasks = [asyncio.create_task(one(n)) for n in range(count)]
    while not all(t.done() for t in tasks):
        peak = max(peak, _rss_mb(target.pid))
        await asyncio.sleep(0.05)
    failed = sum(1 for t in await asyncio.gather(*tasks, return_exceptions=True) if t is not None)
    return peak, failed


async def _measure(targets: list[Target], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {t.label: {} for t in targets}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for stream in (False, True):
            kind = "stream" if stream else "json"
            for target in targets:
                seq = await _sequential(session, target, args.requests, stream)
                results[target.label] |= {f"{kind}_{k}": v for k, v in seq.items()}
            # A throughput run lasts about a second, and the shared cores drift: the targets
            # take turns, and each reports its median round.
            rates: dict[str, list[float]] = {t.label: [] for t in targets}
            for _ in range(THROUGHPUT_ROUNDS):
                for target in targets:
                    rate = await _throughput(session, target, args.concurrent_requests, stream)
                    rates[target.label].append(rate)
            for target in targets:
                results[target.label][f"{kind}_rps"] = statistics.median(rates[target.label])
        for target in targets:
            if target.pid is not None:
                results[target.label]["rss_mb"] = _rss_mb(target.pid)
                peak, failed = await _open_streams(session, target, args.streams)
                results[target.label]["rss_streams_mb"] = peak
                results[target.label]["streams_failed"] = failed
    return results


def _report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    direct = results["direct"]
    print(
        f"chat completions, zero-delay fake upstream; {args.requests} sequential calls, "
        f"{args.concurrent_requests} calls at 64 concurrent (median of {THROUGHPUT_ROUNDS} "
        f"alternating rounds), {os.cpu_count()} cores shared\n"
    )
    head = (
        f"{'':<22}{'p50 ms':>8}{'+p50':>7}{'p99 ms':>8}{'ttfc ms':>9}{'+ttfc':>7}"
        f"{'req/s':>8}{'x direct':>9}"
    )
    for kind, title in (("json", "non-streamed ~1 KiB"), ("stream", "50-event stream")):
        print(title)
        print(head)
        for label, r in results.items():
            added = r[f"{kind}_p50"] - direct[f"{kind}_p50"]
            print(
                f"{label:<22}{r[f'{kind}_p50']:>8.2f}{added:>+7.2f}"
                f"{r[f'{kind}_p99']:>8.2f}{r[f'{kind}_ttfc_p50']:>9.2f}"
                f"{r[f'{kind}_ttfc_p50'] - direct[f'{kind}_ttfc_p50']:>+7.2f}"
                f"{r[f'{kind}_rps']:>8.0f}{r[f'{kind}_rps'] / direct[f'{kind}_rps']:>9.2f}"
            )
        if "capture on" in results and "capture off" in results:
            ratio = results["capture on"][f"{kind}_rps"] / results["capture off"][f"{kind}_rps"]
            print(f"capture-on throughput / capture-off: {ratio:.2f}")
        print()
    for label, r in results.items():
        if "rss_mb" in r:
            failed = f" ({r['streams_failed']:.0f} failed)" if r["streams_failed"] else ""
            print(
                f"{label}: RSS {r['rss_mb']:.0f} MB after the run, "
                f"{r['rss_streams_mb']:.0f} MB peak with {args.streams} streams open{failed}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="sequential calls per target")
    parser.add_argument(
        "--concurrent-requests", type=int, default=3000, help="calls at 64 concurrent"
    )
    parser.add_argument("--streams", type=int, default=500, help="streams open at once for RSS")
    parser.add_argument("--peer", choices=["litellm"], help="also measure this proxy")
    args = parser.parse_args()

    capture_dir = Path(tempfile.mkdtemp(prefix="rollcap-bench-proxy-"))
    serve = [str(BIN / "rollcap"), "serve", "model", "--model-type", "openai_model", "--port", "0"]
    try:
        with _process(
            [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        ) as (_, up):
            common = [f"++policy_base_url={up}/v1", f"++policy_api_key={KEY}"]
            with (
                _process([*serve, *common]) as (off, off_url),
                _process(
                    [
                        *serve,
                        *common,
                        "++observability_enabled=true",
                        f"++model_call_capture_dir={capture_dir}",
                    ]
                ) as (on, on_url),
            ):
                targets = [
                    Target("direct", up, False, None),
                    Target("capture off", off_url, True, off.pid),
                    Target("capture on", on_url, True, on.pid),
                ]
                with contextlib.ExitStack() as stack:
                    if args.peer == "litellm":
                        peer, peer_url = stack.enter_context(_litellm(up))
                        targets.append(
                            Target("litellm", peer_url, False, peer.pid, "openai/fake-model")
                        )
                    results = asyncio.run(_measure(targets, args))
        _report(results, args)
        records = sum(1 for p in capture_dir.iterdir() for _ in p.open("rb"))
        print(f"capture on wrote {records} records to {len(list(capture_dir.iterdir()))} files")
    finally:
        shutil.rmtree(capture_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
