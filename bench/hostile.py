"""A model server against hostile clients and a runaway upstream: memory, stalls, records.

    .venv/bin/python bench/hostile.py [--probes body,streams,runaway,line,floor] [--streams N]
        [--runaway-s S] [--body-mib N] [--line-mib N] [--max-response-mib N]

Everything runs on this machine, over 127.0.0.1: the fake upstream (``python -m
rollcap.testing``) and the model server (``rollcap serve model``, capture on) in processes of
their own, the clients here. Each probe reports its figure beside a baseline taken in the same
run:

- ``body``: a chunked request body of ``--body-mib`` that keeps coming. When the 413 came (how
  much had been sent), the server's RSS growth, the records written. Baseline: a 1 KiB call.
- ``streams``: ``--streams`` clients open streams on the endless upstream and never read them.
  Server RSS (idle, peak), ``/health`` latency (idle, during), the delay until every
  ``cancelled`` record is on disk after the clients leave, RSS a few seconds after they left
  (how much memory came back).
- ``runaway``: one client reads an endless stream for ``--runaway-s`` seconds, then leaves. Peak
  RSS against ``capture_max_response_bytes``, ``/health`` latency during, the delay until the
  record is on disk and until the upstream connection is closed.
- ``line``: an SSE line of ``--line-mib`` without a newline, through the server and directly:
  the rate over the first and the last 10 s (the first and last quarter of the transfer when it
  takes less than 40 s).
- ``floor``: the ``streams`` probe against a second model server with capture off, the same
  stack relaying the same streams with nothing recorded: the ``/health`` latency capture's own
  work is to be read against.

RSS is read from ``/proc/<pid>/status`` every 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from _procs import started

BIN = Path(sys.executable).parent
KEY = "bench-key"
MIB = 1024 * 1024
HEALTH_EVERY_S = 0.05


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Server:
    pid: int
    url: str
    capture_dir: Path
    upstream: str

    def records(self, prefix: str) -> list[dict[str, object]]:
        """The whole records written so far (a line still being written is not one yet)."""
        out: list[dict[str, object]] = []
        for path in self.capture_dir.glob(f"{prefix}*.capture.jsonl"):
            lines = path.read_bytes().split(b"\n")[:-1]
            out += [orjson.loads(line) for line in lines if line]
        return out

    def count(self, prefix: str) -> int:
        """How many whole records are on disk (lines ended), without parsing them."""
        total = 0
        for path in self.capture_dir.glob(f"{prefix}*.capture.jsonl"):
            with path.open("rb") as file:
                total += sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(MIB), b""))
        return total


@contextlib.contextmanager
def _servers(max_response_mib: float, *, capture: bool = True) -> Iterator[Server]:
    capture_dir = Path(tempfile.mkdtemp(prefix="rollcap-bench-hostile-"))
    fake = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
    try:
        with started(fake) as (_, lines):
            upstream = lines[0].strip()
            serve = [
                str(BIN / "rollcap"), "serve", "model", "--model-type", "openai_model",
                "--port", "0", f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}",
                f"++observability_enabled={str(capture).lower()}",
                f"++model_call_capture_dir={capture_dir}",
                f"++capture_max_response_bytes={int(max_response_mib * MIB)}",
            ]  # fmt: skip
            with started(serve) as (proc, lines):
                url = lines[0].split(" on ", 1)[1].split(" ", 1)[0]
                yield Server(proc.pid, url, capture_dir, upstream)
    finally:
        shutil.rmtree(capture_dir, ignore_errors=True)


def _sample(url: str, pid: int, stop: Any, out: Any) -> None:
    """In a process of its own (so the bench's own work never delays a probe): the server's
    RSS every 20 ms and its ``/health`` latency every 50 ms, until ``stop`` is set."""
    import urllib.request

    start = time.perf_counter()
    rss: list[float] = []
    health: list[tuple[float, float]] = []
    next_health = 0.0
    while not stop.is_set():
        now = time.perf_counter() - start
        rss.append(_rss_mib(pid))
        if now >= next_health:
            begin = time.perf_counter()
            with urllib.request.urlopen(url + "/health", timeout=60) as answer:
                answer.read()
            health.append((begin - start, (time.perf_counter() - begin) * 1000))
            next_health = now + HEALTH_EVERY_S
        time.sleep(0.02)
    out.send((rss, health))


class Sampler:
    """Samples the server's RSS and ``/health`` latency from another process."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rss: list[float] = []
        self.health: list[tuple[float, float]] = []  # (seconds since start, latency ms)
        self._stop = multiprocessing.Event()
        self._pipe = multiprocessing.Pipe(duplex=False)
        self._process = multiprocessing.Process(
            target=_sample, args=(server.url, server.pid, self._stop, self._pipe[1])
        )

    async def __aenter__(self) -> Sampler:
        self._process.start()
        await asyncio.sleep(0.2)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        self.rss, self.health = await asyncio.to_thread(self._pipe[0].recv)
        await asyncio.to_thread(self._process.join)

    @property
    def health_ms(self) -> list[float]:
        return [latency for _, latency in self.health]

    def summary(self) -> str:
        health = sorted(self.health_ms) or [float("nan")]
        return (
            f"RSS peak {max(self.rss):.0f} MiB; /health p50 {statistics.median(health):.1f} ms, "
            f"max {health[-1]:.1f} ms over {len(health)} probes"
        )


def _request(rollout: str, body: dict[str, object], headers: dict[str, str]) -> bytes:
    data = orjson.dumps(body)
    head = [f"POST /ng-rollout/{rollout}/v1/chat/completions HTTP/1.1", "host: bench",
            "content-type: application/json", f"authorization: Bearer {KEY}",
            f"content-length: {len(data)}"]  # fmt: skip
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def _stream_body(n: int) -> dict[str, object]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": f"hostile {n}"}],
        "stream": True,
    }


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _wait_for(condition: Callable[[], bool], limit_s: float = 120.0) -> float:
    """Seconds until ``condition`` holds (polled every 20 ms, in a thread: it may read files);
    inf past ``limit_s``."""
    start = time.perf_counter()
    while not await asyncio.to_thread(condition):
        if time.perf_counter() - start > limit_s:
            return float("inf")
        await asyncio.sleep(0.02)
    return time.perf_counter() - start


async def _fake_health(server: Server) -> dict[str, int]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.upstream + "/health") as response,
    ):
        health: dict[str, int] = await response.json()
        return health


# -- probes ----------------------------------------------------------------------------------------


@dataclass
class Baseline:
    rss: float
    health: str
    landing_s: float


async def baseline(server: Server) -> Baseline:
    """The idle server, and the record of one stream whose client leaves."""
    async with Sampler(server) as sampler:
        await asyncio.sleep(1.0)
    headers = {"x-fake-scenario": "endless", "x-fake-content-bytes": "1024"}
    reader, writer = await _connect(server.url)
    writer.write(_request("hostile-one", _stream_body(0), headers))
    await reader.read(65536)
    left = time.perf_counter()
    writer.transport.abort()
    landed = await _wait_for(lambda: server.count("hostile-one") > 0)
    base = Baseline(_rss_mib(server.pid), sampler.summary(), landed)
    print(
        f"baseline, the idle server: RSS {base.rss:.0f} MiB; {base.health}; one stream's client "
        f"leaving: its record on disk after {landed:.2f} s ({time.perf_counter() - left:.2f})"
    )
    return base


async def probe_body(server: Server, base: Baseline, size_mib: int) -> None:
    reader, writer = await _connect(server.url)
    head = (
        "POST /ng-rollout/hostile-body/v1/chat/completions HTTP/1.1\r\nhost: bench\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    )
    writer.write(head.encode())
    status = asyncio.ensure_future(reader.readline())
    piece = b"x" * MIB
    frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
    sent = 0
    start = time.perf_counter()
    async with Sampler(server) as sampler:
        with contextlib.suppress(ConnectionError):
            while sent < size_mib * MIB and not status.done():
                writer.write(frame)
                await writer.drain()
                sent += len(piece)
            if not status.done():
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        line = await asyncio.wait_for(status, 60)
        answered = time.perf_counter() - start
    writer.close()
    await _wait_for(lambda: server.count("hostile-body") > 0)
    records = server.records("hostile-body")
    print(
        f"body: {size_mib} MiB chunked: {line.decode().split(' ', 1)[1].strip()!r} after "
        f"{sent / MIB:.0f} MiB sent ({answered:.2f} s); {sampler.summary()} "
        f"(+{max(sampler.rss) - base.rss:.0f} over idle); {len(records)} record, status "
        f"{records[0]['status_code']}"
    )


def _open_unread(server: Server, count: int, headers: dict[str, str]) -> list[socket.socket]:
    """``count`` clients that send a streamed request each and never read a byte."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    clients = []
    for n in range(count):
        client = socket.create_connection((host, int(port)))
        client.sendall(_request(f"hostile-stream-{n % 30}", _stream_body(n), headers))
        clients.append(client)
    return clients


async def probe_streams(server: Server, base: Baseline, count: int, hold_s: float) -> None:
    headers = {"x-fake-scenario": "endless", "x-fake-content-bytes": "1024"}
    async with Sampler(server) as sampler:
        clients = await asyncio.to_thread(_open_unread, server, count, headers)
        await asyncio.sleep(hold_s)
        held = _rss_mib(server.pid)
        left = time.perf_counter()
        for client in clients:
            client.close()
        landed = await _wait_for(lambda: server.count("hostile-stream") >= count)
        landed_rss = _rss_mib(server.pid)
        upstream_closed = await _wait_for_fake(server)
        after_leaving = time.perf_counter() - left
    cancelled = sum(
        1 for r in server.records("hostile-stream") if r["error_category"] == "cancelled"
    )
    await asyncio.sleep(max(0.0, 5.0 - after_leaving))
    print(
        f"streams: {count} unread endless streams for {hold_s:.0f} s: {sampler.summary()} "
        f"(+{max(sampler.rss) - base.rss:.0f} over idle; {held:.0f} MiB before they left)\n"
        f"  after they left: {count} records on disk after {landed:.2f} s ({cancelled} cancelled;"
        f" one alone: {base.landing_s:.2f} s), upstream connections all closed after "
        f"{upstream_closed:.2f} s; RSS {landed_rss:.0f} MiB as the records landed, "
        f"{_rss_mib(server.pid):.0f} MiB 5 s after they left (idle: {base.rss:.0f})"
    )


async def probe_floor(count: int, hold_s: float, max_response_mib: float) -> None:
    """The ``streams`` probe against a model server with capture off: what relaying the same
    streams costs ``/health`` on the same stack, with nothing recorded."""
    with _servers(max_response_mib, capture=False) as server:
        async with Sampler(server) as sampler:
            await asyncio.sleep(1.0)
        idle = sampler.summary()
        headers = {"x-fake-scenario": "endless", "x-fake-content-bytes": "1024"}
        async with Sampler(server) as sampler:
            clients = await asyncio.to_thread(_open_unread, server, count, headers)
            await asyncio.sleep(hold_s)
            for client in clients:
                client.close()
        early = [latency for at, latency in sampler.health if at < 2.0] or [float("nan")]
        print(
            f"floor, capture off: idle: {idle}; {count} unread endless streams for "
            f"{hold_s:.0f} s: {sampler.summary()} (worst in the first 2 s: {max(early):.1f} ms)"
        )


async def _wait_for_fake(server: Server) -> float:
    start = time.perf_counter()
    while (await _fake_health(server))["in_flight"] > 0:
        if time.perf_counter() - start > 120:
            return float("inf")
        await asyncio.sleep(0.01)
    return time.perf_counter() - start


async def probe_runaway(
    server: Server, base: Baseline, seconds: float, max_response_mib: float
) -> None:
    headers = {"x-fake-scenario": "endless", "x-fake-content-bytes": "16384"}
    received = 0
    async with Sampler(server) as sampler:
        reader, writer = await _connect(server.url)
        writer.write(_request("hostile-runaway", _stream_body(0), headers))
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            received += len(await reader.read(1 << 20))
        writer.transport.abort()
        landed = await _wait_for(lambda: server.count("hostile-runaway") > 0)
        upstream_closed = await _wait_for_fake(server)
    record = server.records("hostile-runaway")[0]
    print(
        f"runaway: {received / MIB:.0f} MiB read in {seconds:.0f} s: {sampler.summary()} "
        f"(+{max(sampler.rss) - base.rss:.0f} over idle; capture_max_response_bytes "
        f"{max_response_mib:g} MiB)\n  the client left: its record on disk after {landed:.2f} s"
        f" ({record['error_category']}, {len(record.get('gaps') or [])} gaps; one alone: "
        f"{base.landing_s:.2f} s), the upstream connection closed after {upstream_closed:.2f} s"
    )


def _serve_line(size: int, ready: multiprocessing.synchronize.Event, port: list[int]) -> None:
    """An upstream whose answer is one SSE line of ``size`` bytes without a newline."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        writer.write(head + b"data: ")
        piece = b"x" * (64 * 1024)
        with contextlib.suppress(ConnectionError):
            for _ in range(size // len(piece)):
                writer.write(piece)
                await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


async def _rate(url: str, body: bytes | None) -> tuple[float, list[tuple[float, int]]]:
    """Total seconds, and (seconds, bytes so far) along the way."""
    marks: list[tuple[float, int]] = []
    got = 0
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()
        async with session.post(
            url, data=body, headers={"authorization": f"Bearer {KEY}"}
        ) as response:
            async for chunk in response.content.iter_any():
                got += len(chunk)
                marks.append((time.perf_counter() - start, got))
    return time.perf_counter() - start, marks


def _windows(total: float, marks: list[tuple[float, int]]) -> tuple[float, float, str]:
    """MiB/s over the first and the last window of the bytes' arrival (up to the last byte, not
    the end of the answer): 10 s, or a quarter when shorter than 40 s."""
    total = marks[-1][0]
    width = 10.0 if total >= 40 else total / 4
    first = max((b for t, b in marks if t <= width), default=0)
    last_start = max((b for t, b in marks if t <= total - width), default=0)
    last = marks[-1][1] - last_start if marks else 0
    return first / MIB / width, last / MIB / width, f"{width:.2f} s windows"


async def probe_line(server: Server, size_mib: int) -> None:
    ready = multiprocessing.Event()
    port: list[int] = multiprocessing.Manager().list()  # type: ignore[assignment]
    child = multiprocessing.Process(target=_serve_line, args=(size_mib * MIB, ready, port))
    child.start()
    try:
        ready.wait(30)
        line_url = f"http://127.0.0.1:{port[0]}"
        # A second model server in front of it, which keeps the whole line (its bound is twice
        # the line): the decoder holds the line to its end, as it would any line under the bound.
        capture = server.capture_dir
        serve = [
            str(BIN / "rollcap"), "serve", "model", "--model-type", "openai_model", "--port", "0",
            f"++policy_base_url={line_url}/v1", "++observability_enabled=true",
            f"++model_call_capture_dir={capture}",
            f"++capture_max_response_bytes={2 * size_mib * MIB}",
        ]  # fmt: skip
        body = orjson.dumps(_stream_body(0))
        direct_total, direct_marks = await _rate(line_url + "/v1/chat/completions", body)
        with started(serve) as (_, lines):
            url = lines[0].split(" on ", 1)[1].split(" ", 1)[0]
            total, marks = await _rate(url + "/ng-rollout/hostile-line/v1/chat/completions", body)
    finally:
        child.kill()
        child.join()
    for label, t, m in (("rollcap", total, marks), ("direct", direct_total, direct_marks)):
        first, last, how = _windows(t, m)
        print(
            f"line: {label}: {m[-1][1] / MIB:.0f} MiB in {t:.1f} s; first {first:.0f} MiB/s, "
            f"last {last:.0f} MiB/s ({how}; last/first {last / first:.2f})"
        )


async def _main(args: argparse.Namespace) -> None:
    probes = set(args.probes.split(","))
    with _servers(args.max_response_mib) as server:
        print(
            f"model server: capture on, capture_max_response_bytes {args.max_response_mib:g} MiB,"
            f" max_request_bytes 100 MiB; {multiprocessing.cpu_count()} cores shared\n"
        )
        base = await baseline(server)
        if "body" in probes:
            await probe_body(server, base, args.body_mib)
        if "streams" in probes:
            await probe_streams(server, base, args.streams, args.hold_s)
        if "runaway" in probes:
            await probe_runaway(server, base, args.runaway_s, args.max_response_mib)
        if "line" in probes:
            await probe_line(server, args.line_mib)
    if "floor" in probes:
        await probe_floor(args.streams, args.hold_s, args.max_response_mib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", default="body,streams,runaway,line,floor")
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--hold-s", type=float, default=10.0, help="how long streams stay open")
    parser.add_argument("--runaway-s", type=float, default=20.0)
    parser.add_argument("--body-mib", type=int, default=256)
    parser.add_argument("--line-mib", type=int, default=256)
    parser.add_argument("--max-response-mib", type=float, default=64)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
