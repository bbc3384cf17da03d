"""CaptureStore throughput beside a raw ``os.write`` + ``os.fsync`` loop, in one run.

    .venv/bin/python bench/store.py [--dir DIR] [--appends N] [--records N] [--size BYTES]

Appends: one writer on one file; 16 writers (threads, as a model server's thread pool would run
them) on 16 files; 16 writers on one file. The raw loop writes the same bytes to an already open
descriptor with no lock, no torn-line check and no re-open, so the ratio is the price of the
store's guarantees. Reads: a 100k-record file read, parsed, normalized and aggregated, beside a
raw read + ``orjson.loads`` of every line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from rollcap import CaptureStore, aggregate_model_call_metrics


def _record(size: int, n: int) -> dict[str, object]:
    base: dict[str, object] = {
        "model_call_id": f"{n:032x}",
        "dialect": "chat",
        "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "started_at": 1786032154.12,
        "completed_at": 1786032154.96,
        "latency_ms": 842.7,
        "latency_ttft_ms": 213.4,
        "status_code": 200,
        "error_category": None,
        "request": {"model": "m", "messages": [{"role": "user", "content": ""}]},
        "response": {
            "id": "chatcmpl-1",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 94, "completion_tokens": 28, "total_tokens": 122},
        },
    }
    pad = size - len(orjson.dumps(base))
    base["request"] = {"model": "m", "messages": [{"role": "user", "content": "x" * max(pad, 0)}]}
    return base


def _threads(writers: int, work: Callable[[int], None]) -> float:
    barrier = threading.Barrier(writers + 1)

    def run(w: int) -> None:
        barrier.wait()
        work(w)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def bench_append(root: Path, writers: int, files: int, per_writer: int, size: int) -> float:
    record = _record(size, 1)
    # A fresh store per round: its first append to each file opens it, as a new server's would.
    with CaptureStore(root / "store") as store:

        def work(w: int) -> None:
            rollout = f"r-{w % files}"
            for _ in range(per_writer):
                store.append(rollout, record)

        return writers * per_writer / _threads(writers, work)


def bench_batched(root: Path, writers: int, files: int, per_writer: int, size: int) -> float:
    """One thread hands the store a batch of one record per file (the model server's writer)."""
    record = _record(size, 1)
    items = [(f"r-{f}", record) for f in range(files)]
    with CaptureStore(root / "batched") as store:
        start = time.perf_counter()
        for _ in range(per_writer):
            assert store.append_many(items) == [None] * files  # type: ignore[arg-type]
        return files * per_writer / (time.perf_counter() - start)


def bench_raw(root: Path, writers: int, files: int, per_writer: int, size: int) -> float:
    line = orjson.dumps(_record(size, 1)) + b"\n"
    (root / "raw").mkdir(exist_ok=True)
    fds = [
        os.open(root / "raw" / f"r-{f}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for f in range(files)
    ]

    def work(w: int) -> None:
        fd = fds[w % files]
        for _ in range(per_writer):
            os.write(fd, line)
            os.fsync(fd)

    try:
        return writers * per_writer / _threads(writers, work)
    finally:
        for fd in fds:
            os.close(fd)


def bench_read(root: Path, records: int, size: int) -> tuple[float, float]:
    store = CaptureStore(root / "read")
    store.append("big", _record(size, 0))
    with store.path_for("big").open("ab") as handle:
        for n in range(1, records):
            handle.write(orjson.dumps(_record(size, n)) + b"\n")
    path = store.path_for("big")

    start = time.perf_counter()
    raw = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    raw_rate = len(raw) / (time.perf_counter() - start)

    start = time.perf_counter()
    metrics = aggregate_model_call_metrics(store, "big")
    store_rate = records / (time.perf_counter() - start)
    assert metrics["num_calls"] == records, metrics
    return store_rate, raw_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write (default: a temp dir on the project disk)")
    parser.add_argument("--appends", type=int, default=2000, help="appends per configuration")
    parser.add_argument("--records", type=int, default=100_000, help="records for the read bench")
    parser.add_argument("--size", type=int, default=2048, help="bytes per record line")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per row")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="rollcap-bench-", dir=args.dir))
    try:
        print(f"record size {args.size} B, {args.appends} appends per row, dir {root}")
        print(f"{'appends with fsync':<28}{'store/s':>10}{'raw/s':>10}{'ratio':>8}")
        for label, writers, files, bench in (
            ("1 writer, 1 file", 1, 1, bench_append),
            ("16 writers, 16 files", 16, 16, bench_append),
            ("16 writers, 1 file", 16, 1, bench_append),
            # Raw: 16 threads on 16 files, as above; store: one thread, append_many.
            ("batches over 16 files", 16, 16, bench_batched),
        ):
            per = max(args.appends // writers, 1)
            raws, stores = [], []
            # fsync time on a shared disk drifts by several times within a minute, so the two
            # sides alternate and each reports its median.
            for _ in range(args.rounds):
                raws.append(bench_raw(root, writers, files, per, args.size))
                stores.append(bench(root, writers, files, per, args.size))
            raw, store = statistics.median(raws), statistics.median(stores)
            print(f"{label:<28}{store:>10.0f}{raw:>10.0f}{store / raw:>8.2f}")
        store_rate, raw_rate = bench_read(root, args.records, args.size)
        print(f"{'read+aggregate, records/s':<28}{store_rate:>10.0f}{raw_rate:>10.0f}", end="")
        print(f"{store_rate / raw_rate:>8.2f}   ({args.records} records)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
