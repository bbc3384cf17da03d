"""CaptureStore throughput beside a raw ``os.write`` + ``os.fsync`` loop, in one run.

    .venv/bin/python bench/store.py [--dir DIR] [--appends N] [--records N] [--size BYTES]
    .venv/bin/python bench/store.py --sync [--loop ext4|xfs] [--dir DIR]

Appends: one writer on one file; 16 writers (threads, as a model server's thread pool would run
them) on 16 files; 16 writers on one file. The raw loop writes the same bytes to an already open
descriptor with no lock, no torn-line check and no re-open, so the ratio is the price of the
store's guarantees. Reads: a 100k-record file read, parsed, normalized and aggregated, beside a
raw read + ``orjson.loads`` of every line.

``--sync``: the durability primitives alone, what making one batch of appends durable costs. 64
files; a batch writes one line to each of 1, 8 or 64 of them (the model server's writer hands the
store one batch per turn of its loop, as many records as calls ended meanwhile), then makes them
durable by an ``fsync`` of each file in 1, 4, 16 or 64 lanes (threads; the store's default has
4), ``fdatasync`` likewise, files opened ``O_DSYNC`` (each write its own sync), or one
``syncfs``. Then the store itself, ``append_many`` with ``sync="fsync"`` and ``sync="syncfs"``,
and the same two while another thread keeps writing to a file of the same filesystem without
syncing (what ``syncfs`` also has to flush). ``--loop ext4`` or ``--loop xfs`` (root) makes a
loop-mounted filesystem of that type in a file on the project disk and measures there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

from rollcap import CaptureStore, aggregate_model_call_metrics
from rollcap.store._sync import syncfs


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


SYNC_FILES = 64
# (how, lanes): the raw primitives measured; ("fsync", 4) is the store's before this bench.
PRIMITIVES = [
    *[("fsync", n) for n in (1, 4, 16, 64)],
    *[("fdatasync", n) for n in (4, 16)],
    *[("O_DSYNC", n) for n in (1, 4, 16)],
    ("syncfs", 1),
]


def bench_primitive(root: Path, how: str, lanes: int, per_batch: int, records: int,
                    line: bytes) -> float:  # fmt: skip
    """Records/s: batches of ``per_batch`` lines, each to its own file of 64, made durable."""
    directory = Path(tempfile.mkdtemp(dir=root))
    dsync = os.O_DSYNC if how == "O_DSYNC" else 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | dsync
    fds = [os.open(directory / f"r-{f}", flags, 0o600) for f in range(SYNC_FILES)]
    sync_one = {"fsync": os.fsync, "fdatasync": os.fdatasync}.get(how)
    pool = ThreadPoolExecutor(lanes) if lanes > 1 else None

    def each(fd: int) -> None:
        if sync_one is None:  # O_DSYNC: the write is the sync
            os.write(fd, line)
        else:
            sync_one(fd)

    def lane(chosen: list[int]) -> None:
        for fd in chosen:
            each(fd)

    batches = max(records // per_batch, 1)
    try:
        start = time.perf_counter()
        for b in range(batches):
            chosen = [fds[(b * per_batch + i) % SYNC_FILES] for i in range(per_batch)]
            if how != "O_DSYNC":
                for fd in chosen:
                    os.write(fd, line)
            if how == "syncfs":
                syncfs(chosen[0])
            elif pool is None or per_batch == 1:
                lane(chosen)
            else:
                list(pool.map(lane, [chosen[i::lanes] for i in range(min(lanes, per_batch))]))
        return batches * per_batch / (time.perf_counter() - start)
    finally:
        for fd in fds:
            os.close(fd)
        if pool is not None:
            pool.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


def bench_store_sync(root: Path, sync: str, per_batch: int, records: int, size: int) -> float:
    """Records/s through ``append_many`` with ``sync``, batches as in ``bench_primitive``."""
    record = _record(size, 1)
    batches = max(records // per_batch, 1)
    with CaptureStore(Path(tempfile.mkdtemp(dir=root)), sync=sync) as store:
        start = time.perf_counter()
        for b in range(batches):
            items = [(f"r-{(b * per_batch + i) % SYNC_FILES}", record) for i in range(per_batch)]
            assert store.append_many(items) == [None] * per_batch  # type: ignore[arg-type]
        rate = batches * per_batch / (time.perf_counter() - start)
    shutil.rmtree(store.directory, ignore_errors=True)
    return rate


@contextlib.contextmanager
def _neighbour(root: Path) -> Iterator[None]:
    """Another program's writes on the same filesystem, never synced: 1 MiB at a time into a
    file of at most 64 MiB (rewritten from its start), as a job writing checkpoints would."""
    stop = threading.Event()
    chunk = os.urandom(1 << 20)

    def write() -> None:
        with open(root / "neighbour", "wb") as out:
            while not stop.is_set():
                for _ in range(64):
                    out.write(chunk)
                    if stop.wait(0.005):
                        return
                out.seek(0)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        (root / "neighbour").unlink(missing_ok=True)


def run_sync(root: Path, rounds: int, records: int, size: int) -> None:
    line = orjson.dumps(_record(size, 1)) + b"\n"
    print(f"durability primitives: {SYNC_FILES} files, {size} B lines, {records} records per "
          f"row and round, {rounds} alternating rounds, medians; records/s "
          "(x fsync in 4 lanes)")  # fmt: skip
    for per_batch in (1, 8, 64):
        rates: dict[str, list[float]] = {}
        for _ in range(rounds):
            for how, lanes in PRIMITIVES:
                rate = bench_primitive(root, how, lanes, per_batch, records, line)
                rates.setdefault(f"{how}, {lanes} lane{'s' if lanes > 1 else ''}", []).append(rate)
            for sync in ("fsync", "syncfs"):
                rate = bench_store_sync(root, sync, per_batch, records, size)
                rates.setdefault(f"store, sync={sync}", []).append(rate)
                with _neighbour(root):
                    rate = bench_store_sync(root, sync, per_batch, records, size)
                rates.setdefault(f"store, sync={sync}, neighbour", []).append(rate)
        base = statistics.median(rates["fsync, 4 lanes"])
        print(f"  {per_batch} record{'s' if per_batch > 1 else ''} per batch")
        for label, values in rates.items():
            median = statistics.median(values)
            print(f"    {label:<34}{median:>9.0f}{median / base:>8.2f}")


@contextlib.contextmanager
def _loop_mount(fs_type: str, parent: str | None) -> Iterator[Path]:
    """A fresh ``fs_type`` filesystem in a 1 GiB file, loop-mounted (needs root)."""
    work = Path(tempfile.mkdtemp(prefix="rollcap-loop-", dir=parent))
    image, point = work / "fs.img", work / "mnt"
    point.mkdir()
    with open(image, "wb") as out:
        out.truncate(1 << 30)
    mkfs = ["mkfs.ext4", "-q", "-F"] if fs_type == "ext4" else ["mkfs.xfs", "-q", "-f"]
    subprocess.run([*mkfs, str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)
        shutil.rmtree(work, ignore_errors=True)


def _where(directory: Path) -> str:
    out = subprocess.run(["df", "--output=fstype,source", str(directory)], capture_output=True,
                         text=True, check=False).stdout.split()  # fmt: skip
    return f"{directory} ({' on '.join(out[2:4])})" if len(out) >= 4 else str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write (default: a temp dir on the project disk)")
    parser.add_argument("--appends", type=int, default=2000, help="appends per configuration")
    parser.add_argument("--records", type=int, default=100_000, help="records for the read bench")
    parser.add_argument("--size", type=int, default=2048, help="bytes per record line")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per row")
    parser.add_argument("--sync", action="store_true", help="the durability primitives only")
    parser.add_argument("--loop", choices=("ext4", "xfs"), help="--sync on a loop-mounted FS")
    args = parser.parse_args()

    if args.sync:
        with contextlib.ExitStack() as stack:
            root = stack.enter_context(_loop_mount(args.loop, args.dir)) if args.loop else None
            root = Path(tempfile.mkdtemp(prefix="rollcap-bench-", dir=root or args.dir))
            print(f"on {_where(root)}")
            try:
                run_sync(root, min(args.rounds, 3), args.appends, args.size)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        return
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
