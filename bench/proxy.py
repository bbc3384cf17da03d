"""Model-server overhead: direct calls, rollcap with capture off and on, and a durable sketch.

    .venv/bin/python bench/proxy.py [--requests N] [--concurrent-requests N] [--streams N]
        [--peer litellm] [--peer nemo-gym]

Everything runs on this machine: the fake upstream (``python -m rollcap.testing``), each rollcap
model server (``rollcap serve model``), the durable sketch (``bench/_sketch.py``: the least a
durable capture proxy in Python does, the floor for capture on) and each peer in processes of
their own, the client here, all over 127.0.0.1. Zero upstream delay: non-streamed Chat
Completions answers of about 1 KiB, and streams of 50 events in both the Chat Completions and the
Responses dialects. Capture-on, sketch and NeMo Gym calls are spread over 64 rollouts. Reported:
sequential p50 and p99 latency (a stream's: to its last byte), time to first chunk, throughput at
64 concurrent requests with the server's CPU per call, server RSS, and RSS while 500 streams are
open at once. Sequential calls and throughput rounds alternate between the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
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

from _procs import free_port, server_url, started, stop

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
THROUGHPUT_ROUNDS = 3
SEQUENTIAL_ROUNDS = 5
KEY = "bench-key"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _process(args: list[str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start a server that prints its URL on its first line; yield it and the URL."""
    with started(args) as (proc, lines):
        yield proc, server_url(lines[0])


@contextlib.contextmanager
def _polled(
    args: list[str], url: str, health: str, name: str, env: dict[str, str], cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server that says nothing useful on stdout; wait until ``health`` answers."""
    proc = subprocess.Popen(
        args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}{health}", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start") from None
                time.sleep(0.5)
        yield proc
    finally:
        stop(proc)


LITELLM_VENV = HERE / ".venv-litellm"


@contextlib.contextmanager
def _litellm(upstream: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """LiteLLM's proxy on the same upstream, installed into a venv of its own on first use."""
    litellm = LITELLM_VENV / "bin" / "litellm"
    if not litellm.exists():
        print(f"installing litellm[proxy] into {LITELLM_VENV} (first run only)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        pip = [str(LITELLM_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "litellm[proxy]"], check=True)
    port = free_port()
    env = {
        **os.environ,
        "OPENAI_API_KEY": KEY,
        # No master key: a local benchmark with nothing to protect, as LiteLLM's docs allow.
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    args = [str(litellm), "--model", "openai/fake-model", "--api_base", f"{upstream}/v1",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with _polled(args, url, "/health/liveliness", "litellm proxy", env) as proc:
        yield proc, url


NEMO_GYM_VENV = HERE / ".venv-nemo-gym"
NEMO_GYM = "nemo-gym==0.7.0"
# Run in NeMo Gym's venv: its own parser resolves the global config (openai_model's yaml, our
# overrides) as `gym env start` does, and names the server's directory to start app.py in.
_NEMO_GYM_CONFIG = """
import json, sys
from pathlib import Path
from omegaconf import OmegaConf
import responses_api_models.openai_model as server
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
upstream, key, capture_dir, port, headers = sys.argv[1:6]
model = {"openai_default_headers": json.loads(headers), "port": int(port), "host": "127.0.0.1"}
initial = OmegaConf.create({
    "config_paths": ["responses_api_models/openai_model/configs/openai_model.yaml"],
    "policy_base_url": upstream, "policy_api_key": key, "policy_model_name": "fake-model",
    "policy_model": {"responses_api_models": {"openai_model": model}},
    "observability_enabled": True, "model_call_capture_dir": capture_dir,
})
parsed = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
    initial_global_config_dict=initial, skip_load_from_cli=True, skip_load_from_dotenv=True))
print(json.dumps({"dir": str(Path(server.__file__).parent), "config": OmegaConf.to_yaml(parsed)}))
"""


def _python_313() -> str:
    """The first Python >= 3.13 here that runs (a pyenv shim may name a version it won't run)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = ["python3.13", "python3.14", *map(str, sorted(pyenv.glob("3.1[3-9]*/bin/python")))]
    for candidate in candidates:
        check = [candidate, "-c", "import sys; assert sys.version_info >= (3, 13)"]
        with contextlib.suppress(OSError):
            if subprocess.run(check, capture_output=True, check=False).returncode == 0:
                return candidate
    raise RuntimeError("NeMo Gym 0.7.0 needs Python >= 3.13: give one with --nemo-gym-python")


def _nemo_gym_python(interpreter: str | None) -> Path:
    """NeMo Gym 0.7.0 in a venv of its own, installed on first use. It asks for Python >= 3.13.14;
    where the newest 3.13 here is older, pip is told to ignore that (and says so)."""
    python = NEMO_GYM_VENV / "bin" / "python"
    if (NEMO_GYM_VENV / ".installed").exists():
        return python
    interpreter = interpreter or _python_313()
    print(f"installing {NEMO_GYM} into {NEMO_GYM_VENV} (first run only)...", flush=True)
    subprocess.run([interpreter, "-m", "venv", str(NEMO_GYM_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    if subprocess.run([*pip, NEMO_GYM], check=False).returncode != 0:
        print(f"pip refused {NEMO_GYM} on {interpreter}: again with --ignore-requires-python")
        sys.stdout.flush()
        subprocess.run([*pip, "--ignore-requires-python", NEMO_GYM], check=True)
    (NEMO_GYM_VENV / ".installed").touch()
    return python


@contextlib.contextmanager
def _nemo_gym(
    upstream: str, capture_dir: Path, headers: dict[str, str], interpreter: str | None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """NeMo Gym's `openai_model` model server with its model-call capture on, pointed at the
    same upstream, started as `gym env start` starts it: `python app.py` in the server's
    directory, the resolved global config in NEMO_GYM_CONFIG_DICT, its name in
    NEMO_GYM_CONFIG_PATH. It forwards none of the client's headers, so the fake's knobs are
    its default headers (one server for each answer size)."""
    python = _nemo_gym_python(interpreter)
    port = free_port()
    made = subprocess.run(
        [str(python), "-c", _NEMO_GYM_CONFIG, f"{upstream}/v1", KEY, str(capture_dir), str(port),
         json.dumps(headers)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    found = json.loads(made.stdout.strip().splitlines()[-1])
    env = {
        **os.environ,
        "NEMO_GYM_CONFIG_DICT": found["config"],
        "NEMO_GYM_CONFIG_PATH": "policy_model",
    }
    url = f"http://127.0.0.1:{port}"
    with _polled([str(python), "app.py"], url, "/health", "nemo gym", env, Path(found["dir"])) as p:
        yield p, url


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process (all its threads) has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


@dataclass(frozen=True)
class Kind:
    key: str
    dialect: str  # "chat" or "responses"
    stream: bool
    title: str


KINDS = (
    Kind("json", "chat", False, "chat completions, non-streamed ~1 KiB"),
    Kind("stream", "chat", True, "chat completions, 50-event stream"),
    Kind("rstream", "responses", True, "responses, 50-event stream"),
)
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def _body(kind: Kind, n: int, model: str = "fake-model") -> bytes:
    question = f"Question number {n}: which option is right?"
    body: dict[str, object] = {"model": model}
    if kind.dialect == "chat":
        body["messages"] = [{"role": "user", "content": question}]
        if kind.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
    else:
        body |= {"input": question, "stream": kind.stream}
    return orjson.dumps(body)


@dataclass
class Target:
    label: str
    base: str  # base URL up to (not including) /v1/...
    rollouts: bool  # spread calls over /ng-rollout/<id>/
    pid: int | None
    model: str = "fake-model"
    stream_base: str | None = None  # streams go here instead (NeMo Gym: its knobs are per server)
    stream_pid: int | None = None
    open_streams: bool = True  # measure RSS with many slow streams open

    def url(self, n: int, kind: Kind) -> str:
        prefix = f"/ng-rollout/bench-{n % 64}" if self.rollouts else ""
        base = self.stream_base if kind.stream and self.stream_base else self.base
        return f"{base}{prefix}{PATHS[kind.dialect]}"

    def pid_for(self, kind: Kind) -> int | None:
        return self.stream_pid if kind.stream and self.stream_pid else self.pid


HEADERS_PLAIN = {"content-type": "application/json", "authorization": f"Bearer {KEY}",
                 "x-fake-content-bytes": "1024"}  # fmt: skip
HEADERS_STREAM = {"content-type": "application/json", "authorization": f"Bearer {KEY}",
                  "x-fake-events": "50"}  # fmt: skip


async def _one(
    session: aiohttp.ClientSession, target: Target, n: int, kind: Kind
) -> tuple[float, float]:
    """(time to first chunk, time to the last byte) in ms."""
    start = time.perf_counter()
    first = None
    async with session.post(
        target.url(n, kind),
        data=_body(kind, n, target.model),
        headers=HEADERS_STREAM if kind.stream else HEADERS_PLAIN,
    ) as response:
        async for _ in response.content.iter_any():
            if first is None:
                first = time.perf_counter()
        if response.status != 200:
            raise RuntimeError(f"{target.label}: HTTP {response.status}")
    end = time.perf_counter()
    return ((first or end) - start) * 1000, (end - start) * 1000


async def _sequential(
    session: aiohttp.ClientSession, targets: list[Target], count: int, kind: Kind
) -> dict[str, dict[str, float]]:
    """Sequential calls, the targets taking turns in rounds: p50, p99 and time to first chunk
    over all of a target's calls."""
    ttfc: dict[str, list[float]] = {t.label: [] for t in targets}
    total: dict[str, list[float]] = {t.label: [] for t in targets}
    for target in targets:
        for n in range(20):  # warm-up: connections, caches, first-call imports
            await _one(session, target, n, kind)
    per_round = max(1, count // SEQUENTIAL_ROUNDS)
    for r in range(SEQUENTIAL_ROUNDS):
        for target in targets if r % 2 == 0 else reversed(targets):
            for n in range(r * per_round, (r + 1) * per_round):
                a, b = await _one(session, target, n, kind)
                ttfc[target.label].append(a)
                total[target.label].append(b)
    out = {}
    for target in targets:
        q = statistics.quantiles(total[target.label], n=100)
        out[target.label] = {
            "p50": statistics.median(total[target.label]),
            "p99": q[98],
            "ttfc_p50": statistics.median(ttfc[target.label]),
        }
    return out


async def _throughput(
    session: aiohttp.ClientSession, target: Target, count: int, kind: Kind
) -> tuple[float, float]:
    """(calls per second at 64 concurrent, the server's CPU microseconds per call)."""
    next_n = 0

    async def worker() -> None:
        nonlocal next_n
        while next_n < count:
            n = next_n
            next_n += 1
            await _one(session, target, n, kind)

    pid = target.pid_for(kind)
    cpu = _cpu_s(pid) if pid is not None else 0.0
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(64)))
    rate = count / (time.perf_counter() - start)
    cpu_us = (_cpu_s(pid) - cpu) / count * 1e6 if pid is not None else math.nan
    return rate, cpu_us


async def _open_streams(
    session: aiohttp.ClientSession, target: Target, count: int
) -> tuple[float, int]:
    """Peak RSS (MB) of the target's process while ``count`` slow streams are open at once,
    and how many of the streams failed."""
    kind = KINDS[1]
    pid = target.pid_for(kind)
    assert pid is not None
    headers = {**HEADERS_STREAM, "x-fake-chunk-delay-ms": "20"}
    peak = 0.0

    async def one(n: int) -> None:
        data = _body(kind, n, target.model)
        async with session.post(target.url(n, kind), data=data, headers=headers) as response:
            async for _ in response.content.iter_any():
                pass

    tasks = [asyncio.create_task(one(n)) for n in range(count)]
    while not all(t.done() for t in tasks):
        peak = max(peak, _rss_mb(pid))
        await asyncio.sleep(0.05)
    failed = sum(1 for t in await asyncio.gather(*tasks, return_exceptions=True) if t is not None)
    return peak, failed


async def _measure(targets: list[Target], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {t.label: {} for t in targets}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for kind in KINDS:
            live = []
            for target in targets:  # a peer that cannot serve this kind sits it out
                try:
                    await _one(session, target, 0, kind)
                    live.append(target)
                except (aiohttp.ClientError, RuntimeError) as exc:
                    results[target.label][f"{kind.key}_error"] = str(exc) or type(exc).__name__
            seq = await _sequential(session, live, args.requests, kind)
            for label, figures in seq.items():
                results[label] |= {f"{kind.key}_{k}": v for k, v in figures.items()}
            # A throughput run lasts about a second, and the shared cores drift: the targets
            # take turns (in the opposite order every other round), and each reports its
            # median round.
            rates: dict[str, list[float]] = {t.label: [] for t in live}
            cpus: dict[str, list[float]] = {t.label: [] for t in live}
            for r in range(THROUGHPUT_ROUNDS):
                for target in live if r % 2 == 0 else reversed(live):
                    rate, cpu = await _throughput(session, target, args.concurrent_requests, kind)
                    rates[target.label].append(rate)
                    cpus[target.label].append(cpu)
            for target in live:
                results[target.label][f"{kind.key}_rps"] = statistics.median(rates[target.label])
                results[target.label][f"{kind.key}_cpu_us"] = statistics.median(cpus[target.label])
        for target in targets:
            if target.pid is not None:
                results[target.label]["rss_mb"] = _rss_mb(target.pid)
            if target.pid is not None and target.open_streams:
                peak, failed = await _open_streams(session, target, args.streams)
                results[target.label]["rss_streams_mb"] = peak
                results[target.label]["streams_failed"] = failed
    return results


def _ratio_line(results: dict[str, dict[str, float]], kind: Kind, peer: str, stream: bool) -> str:
    on, other = results["capture on"], results[peer]
    line = f"capture-on throughput / {peer}: {on[f'{kind.key}_rps'] / other[f'{kind.key}_rps']:.2f}"
    if stream:
        direct = results["direct"][f"{kind.key}_p50"]
        line += (
            f"; added total {on[f'{kind.key}_p50'] - direct:+.2f} ms against "
            f"{other[f'{kind.key}_p50'] - direct:+.2f} ms"
        )
    return line


def _report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    direct = results["direct"]
    print(
        f"zero-delay fake upstream; {args.requests} sequential calls ({SEQUENTIAL_ROUNDS} "
        f"alternating rounds), {args.concurrent_requests} calls at 64 concurrent (median of "
        f"{THROUGHPUT_ROUNDS} alternating rounds), {os.cpu_count()} cores shared\n"
    )
    for kind in KINDS:
        p50 = "total ms" if kind.stream else "p50 ms"
        added = "+total" if kind.stream else "+p50"
        print(kind.title)
        print(
            f"{'':<15}{p50:>9}{added:>8}{'p99 ms':>8}{'ttfc ms':>9}{'+ttfc':>7}"
            f"{'req/s':>8}{'x direct':>9}{'cpu us/call':>12}"
        )
        for label, r in results.items():
            if f"{kind.key}_error" in r:
                print(f"{label:<15}failed: {r[f'{kind.key}_error'][:80]}")
                continue
            cpu, rps = r[f"{kind.key}_cpu_us"], r[f"{kind.key}_rps"]
            print(
                f"{label:<15}{r[f'{kind.key}_p50']:>9.2f}"
                f"{r[f'{kind.key}_p50'] - direct[f'{kind.key}_p50']:>+8.2f}"
                f"{r[f'{kind.key}_p99']:>8.2f}{r[f'{kind.key}_ttfc_p50']:>9.2f}"
                f"{r[f'{kind.key}_ttfc_p50'] - direct[f'{kind.key}_ttfc_p50']:>+7.2f}"
                f"{rps:>8.0f}{rps / direct[f'{kind.key}_rps']:>9.2f}"
                f"{'' if math.isnan(cpu) else f'{cpu:.0f}':>12}"
            )
        ratio = results["capture on"][f"{kind.key}_rps"] / results["capture off"][f"{kind.key}_rps"]
        print(f"capture-on throughput / capture-off: {ratio:.2f}")
        for peer in ("sketch", "nemo gym", "litellm"):
            if peer in results and f"{kind.key}_rps" in results[peer]:
                print(_ratio_line(results, kind, peer, kind.stream))
        print()
    for label, r in results.items():
        if "rss_mb" in r:
            line = f"{label}: RSS {r['rss_mb']:.0f} MB after the run"
            if "rss_streams_mb" in r:
                failed = f" ({r['streams_failed']:.0f} failed)" if r["streams_failed"] else ""
                line += f", {r['rss_streams_mb']:.0f} MB peak with {args.streams} streams open"
                line += failed
            print(line)


def _records(directory: Path) -> tuple[int, int]:
    files = [p for p in directory.iterdir() if p.is_file() and p.suffix == ".jsonl"]
    return sum(1 for p in files for _ in p.open("rb")), len(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="sequential calls per target")
    parser.add_argument(
        "--concurrent-requests", type=int, default=3000, help="calls at 64 concurrent"
    )
    parser.add_argument("--streams", type=int, default=500, help="streams open at once for RSS")
    parser.add_argument(
        "--peer", choices=["litellm", "nemo-gym"], action="append", default=[],
        help="also measure this proxy (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--nemo-gym-python",
        help="the Python >= 3.13 that NeMo Gym's venv is made with (first run only; default: the "
        "first of python3.13, python3.14 and pyenv's 3.13 that runs)",
    )
    args = parser.parse_args()

    dirs = {name: Path(tempfile.mkdtemp(prefix=f"rollcap-bench-proxy-{name}-"))
            for name in ("capture on", "sketch", "nemo gym")}  # fmt: skip
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
                        f"++model_call_capture_dir={dirs['capture on']}",
                    ]
                ) as (on, on_url),
                _process([sys.executable, str(HERE / "_sketch.py"), up, str(dirs["sketch"])]) as (
                    sketch,
                    sketch_url,
                ),
            ):
                targets = [
                    Target("direct", up, False, None),
                    Target("capture off", off_url, True, off.pid),
                    Target("capture on", on_url, True, on.pid),
                    Target("sketch", sketch_url, True, sketch.pid),
                ]
                with contextlib.ExitStack() as stack:
                    if "nemo-gym" in args.peer:
                        plain, plain_url = stack.enter_context(
                            _nemo_gym(up, dirs["nemo gym"], {"x-fake-content-bytes": "1024"},
                                      args.nemo_gym_python)
                        )  # fmt: skip
                        streams, streams_url = stack.enter_context(
                            _nemo_gym(up, dirs["nemo gym"], {"x-fake-events": "50"},
                                      args.nemo_gym_python)
                        )  # fmt: skip
                        # Its streams are answered whole by the upstream and replayed: the
                        # fake's chunk delay never reaches it, so no slow streams for RSS.
                        targets.append(Target("nemo gym", plain_url, True, plain.pid,
                                              stream_base=streams_url, stream_pid=streams.pid,
                                              open_streams=False))  # fmt: skip
                    if "litellm" in args.peer:
                        peer, peer_url = stack.enter_context(_litellm(up))
                        targets.append(
                            Target("litellm", peer_url, False, peer.pid, "openai/fake-model")
                        )
                    results = asyncio.run(_measure(targets, args))
        _report(results, args)
        for name, directory in dirs.items():
            if name != "nemo gym" or "nemo-gym" in args.peer:
                records, files = _records(directory)
                print(f"{name} wrote {records} records to {files} files")
    finally:
        for directory in dirs.values():
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
