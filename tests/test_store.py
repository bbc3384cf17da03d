from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from rollcap.records import RawRecord
from rollcap.store import (
    CaptureReadError,
    CaptureStore,
    aggregate_model_call_metrics,
    capture_attachment,
    read_model_call_records,
)
from tests.test_records import SPEC_RECORD


def _record(n: int, **extra: object) -> dict[str, object]:
    return {**SPEC_RECORD, "model_call_id": f"{n:032x}", **extra}


def _open_fds() -> dict[int, str]:
    """This process's descriptors and what they point at (Linux)."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # listdir's own descriptor, gone by now
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    return fds


def _open_paths() -> list[str]:
    return list(_open_fds().values())


def _watch_fsyncs(
    monkeypatch: pytest.MonkeyPatch, fails: Callable[[str], bool] = lambda name: False
) -> list[str]:
    """The paths synced from now on, in order; syncing a path that ``fails`` raises EIO."""
    real_fsync = os.fsync
    synced: list[str] = []

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if fails(name):
            raise OSError(errno.EIO, "Input/output error")
        synced.append(name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_spec_record_through_the_store(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "calls")
    store.append("0-0", RawRecord.from_json(SPEC_RECORD))
    (record,) = read_model_call_records(store, "0-0")
    assert (record.tokens_in, record.tokens_out, record.tokens_total) == (94, 28, 122)
    assert record.latency_total_ms == 842.7
    metrics = aggregate_model_call_metrics(store, "0-0")
    assert metrics["num_calls"] == 1
    assert metrics["tokens_total"] == 122
    # The persisted line is the record, byte for byte what orjson writes, one line.
    assert (tmp_path / "calls" / "0-0.capture.jsonl").read_bytes() == orjson.dumps(
        SPEC_RECORD
    ) + b"\n"


def test_private_permissions(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "a" / "calls")
    store.append("0-0", _record(0))
    store.mark_incomplete("0-0")
    assert stat.S_IMODE((tmp_path / "a" / "calls").stat().st_mode) == 0o700
    for name in ("0-0.capture.jsonl", "0-0.capture.incomplete"):
        assert stat.S_IMODE((tmp_path / "a" / "calls" / name).stat().st_mode) == 0o600


def test_file_order_call_index_and_rollout_ids(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    for n in range(5):
        store.append("3-1", _record(n))
    store.append("3-0-a1", _record(9))
    records = read_model_call_records(store, "3-1")
    assert [r.call_index for r in records] == [0, 1, 2, 3, 4]
    assert [r.model_call_id for r in records] == [f"{n:032x}" for n in range(5)]
    assert store.rollout_ids() == ["3-0-a1", "3-1"]
    assert CaptureStore(tmp_path / "missing").rollout_ids() == []
    assert store.read("never-written") == []


def test_torn_last_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    for n in range(3):
        store.append("0-0", _record(n))
    path = store.path_for("0-0")
    with path.open("ab") as handle:  # a crash in the middle of a write
        handle.write(orjson.dumps(_record(3))[:100])
    with pytest.raises(CaptureReadError, match=r"0-0\.capture\.jsonl: line 4: not valid JSON"):
        store.read("0-0")
    with pytest.raises(CaptureReadError):
        read_model_call_records(store, "0-0")
    available = store.read_available("0-0")
    assert [index for index, _ in available.records] == [0, 1, 2]
    assert available.bad_lines == 1
    tolerant = read_model_call_records(store, "0-0", strict=False)
    assert [r.call_index for r in tolerant] == [0, 1, 2]

    # The next append must not be glued onto the torn line.
    store.append("0-0", _record(4))
    available = store.read_available("0-0")
    assert [index for index, _ in available.records] == [0, 1, 2, 4]
    assert available.records[-1][1]["model_call_id"] == f"{4:032x}"
    assert available.bad_lines == 1


def test_non_object_lines_are_bad(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("x").write_bytes(b'[1, 2]\n{"a": 1}\n\n"s"\n')
    with pytest.raises(CaptureReadError, match="line 1: not a JSON object"):
        store.read("x")
    available = store.read_available("x")
    assert available.records == [(1, {"a": 1})]
    assert available.bad_lines == 2  # the blank line is no record, not a bad one


def test_blank_lines_are_neither_counted_nor_indexed(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("x").write_bytes(b'\n{"a": 1}\n  \n\t\nnot json\n\n{"b": 2}\n')
    available = store.read_available("x")
    assert available.records == [(0, {"a": 1}), (2, {"b": 2})]
    assert available.bad_lines == 1


def test_clear_and_markers(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.clear("0-0")  # nothing there: fine
    store.append("0-0", _record(0))
    store.mark_incomplete("0-0")
    assert store.is_incomplete("0-0")
    store.clear("0-0")
    assert not store.is_incomplete("0-0")
    assert list(tmp_path.iterdir()) == []
    # Errors other than "not there" surface.
    store.path_for("0-1").mkdir()
    with pytest.raises(IsADirectoryError):
        store.clear("0-1")


def test_append_to_full_disk_raises_and_writes_nothing_else(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("0-0").symlink_to("/dev/full")
    with pytest.raises(OSError, match="No space left") as info:
        store.append("0-0", _record(0))
    assert info.value.errno == errno.ENOSPC
    # The failed descriptor is not kept: once the disk has room, the next append lands.
    store.path_for("0-0").unlink()
    store.append("0-0", _record(1))
    assert [r["model_call_id"] for r in store.read("0-0")] == [f"{1:032x}"]


def test_short_write_then_full_disk_then_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", _record(0))
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:50])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        store.append("0-0", _record(1))
    assert _open_paths().count(str(store.path_for("0-0"))) == 0  # the failed fd was dropped
    monkeypatch.setattr(os, "write", real_write)
    store.append("0-0", _record(2))
    available = store.read_available("0-0")
    assert [r["model_call_id"] for _, r in available.records] == [f"{0:032x}", f"{2:032x}"]
    assert available.bad_lines == 1


def test_capture_attachment_gaps(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    assert capture_attachment(store, "0-0")["gaps"] == [{"code": "model_call_capture_no_records"}]

    store.append("0-1", _record(0))
    attachment = capture_attachment(store, "0-1")
    assert "gaps" not in attachment
    assert attachment["metrics"]["num_calls"] == 1

    with store.path_for("0-1").open("ab") as handle:
        handle.write(b'{"torn')
    store.mark_incomplete("0-1")
    assert capture_attachment(store, "0-1", payloads=False)["gaps"] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=1"},
        {"code": "model_call_capture_incomplete"},
    ]

    store.path_for("0-2").mkdir()  # cannot be read as a file
    assert capture_attachment(store, "0-2")["gaps"] == [{"code": "model_call_capture_unreadable"}]

    # A marker alone is an incomplete capture, not a capture without records.
    store.mark_incomplete("0-3")
    assert capture_attachment(store, "0-3")["gaps"] == [{"code": "model_call_capture_incomplete"}]
    # Only bad lines: they are what is wrong, not a lack of records.
    store.path_for("0-4").write_bytes(b"{bad\n[]\n")
    assert capture_attachment(store, "0-4")["gaps"] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"}
    ]
    # An empty file: dispatched, nothing recorded.
    store.reset("0-5")
    assert capture_attachment(store, "0-5")["gaps"] == [{"code": "model_call_capture_no_records"}]


HOSTILE_IDS = [
    "../x", "/etc/passwd", "a/b", "..", "", "x" * 300, "a\x00b", "%2e%2e", "%2e%2e%2fx", ".",
    "...", ".hidden", "-rf", "_a", " a", "a ", "a\n", "a\r", "a\tb", "a\\b", "C:\\x", "~",
    "~root", "$HOME", "a;b", "a|b", "a*", "a?", "a:b", "a'b", 'a"b', "<a>", "a#b", "a&b",
    "a=b", "a+b", "a@b", "a,b", "[a]", "{a}",
    "\uff41\uff42",  # fullwidth letters
    "\u0430b",  # Cyrillic a
    "a\u2024\u2024b",  # one-dot leaders that look like ".."
    "a\u2215b",  # division slash
    "a\u2044b",  # fraction slash
    "\u200ba",  # zero-width space
    "a\u202eb",  # right-to-left override
    "ﬁle",  # ligature
    "x" * 201,
    "./a",
]  # fmt: skip


def test_fifty_hostile_ids_are_refused_and_touch_nothing(tmp_path: Path) -> None:
    assert len(HOSTILE_IDS) == 50
    assert len(set(HOSTILE_IDS)) == 50
    root = tmp_path / "root"
    root.mkdir()
    store = CaptureStore(root / "calls")
    before = sorted(p for p in tmp_path.rglob("*"))
    for bad in HOSTILE_IDS:
        for call in (
            lambda rid: store.append(rid, _record(0)),
            store.read,
            store.read_available,
            store.clear,
            store.mark_incomplete,
            store.is_incomplete,
            lambda rid: read_model_call_records(store, rid),
            lambda rid: capture_attachment(store, rid),
        ):
            with pytest.raises(ValueError, match="invalid rollout id"):
                call(bad)
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert not (root / "calls").exists()


PAYLOAD = 64 * 1024
APPENDS = 200
WRITERS = 8


def _writer(directory: str, rollout_id: str, writer: int) -> None:
    store = CaptureStore(directory)
    pad = chr(ord("a") + writer) * PAYLOAD
    for seq in range(APPENDS):
        store.append(rollout_id, {"writer": writer, "seq": seq, "pad": pad})


@pytest.mark.slow
def test_concurrent_processes_never_interleave(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    jobs = [(str(tmp_path), "shared", w) for w in range(WRITERS)]
    jobs += [(str(tmp_path), f"own-{w}", w) for w in range(WRITERS)]
    procs = [ctx.Process(target=_writer, args=job) for job in jobs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
        assert proc.exitcode == 0
    store = CaptureStore(tmp_path)
    shared = store.read("shared")  # strict: every line must parse
    assert len(shared) == WRITERS * APPENDS
    for w in range(WRITERS):
        mine = [r for r in shared if r["writer"] == w]
        assert [r["seq"] for r in mine] == list(range(APPENDS))
        assert all(r["pad"] == chr(ord("a") + w) * PAYLOAD for r in mine)
        own = store.read(f"own-{w}")
        assert [r["seq"] for r in own] == list(range(APPENDS))


THREADS = 16
THREAD_APPENDS = 200


def test_threads_share_one_store(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    other = CaptureStore(tmp_path)  # another descriptor on the same file, as another process
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            barrier.wait()
            for seq in range(THREAD_APPENDS):
                target = other if thread == 0 and seq % 10 == 0 else store
                target.append("shared", {"thread": thread, "seq": seq})
                store.append(f"own-{thread % 4}", {"thread": thread, "seq": seq})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    shared = store.read("shared")  # strict: every line parses, no empty line between records
    assert len(shared) == THREADS * THREAD_APPENDS
    for t in range(THREADS):
        assert [r["seq"] for r in shared if r["thread"] == t] == list(range(THREAD_APPENDS))
    for own in range(4):
        assert len(store.read(f"own-{own}")) == THREADS // 4 * THREAD_APPENDS


def test_a_failed_batch_fails_every_line_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    real_write = os.write
    calls = {"n": 0}

    def slow_failing_write(fd: int, data: bytes | memoryview) -> int:
        time.sleep(0.002)  # let the other threads queue behind this write
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", slow_failing_write)
    barrier = threading.Barrier(8)
    written: list[int] = []
    failed: list[OSError] = []

    def work(thread: int) -> None:
        barrier.wait()
        for seq in range(20):
            try:
                store.append("0-0", {"n": thread * 100 + seq})
            except OSError as exc:
                failed.append(exc)
            else:
                written.append(thread * 100 + seq)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.setattr(os, "write", real_write)
    assert failed
    assert all(exc.errno == errno.EIO for exc in failed)
    assert len({id(exc) for exc in failed}) == len(failed)  # no exception shared by threads
    # A failed write wrote nothing, so exactly the lines reported written are in the file.
    assert sorted(r["n"] for r in store.read("0-0")) == sorted(written)
    assert len(written) + len(failed) == 8 * 20
    store.append("0-0", {"n": -1})
    assert store.read("0-0")[-1] == {"n": -1}


def _append_in_child(directory: str, path: str) -> None:
    assert path not in _open_paths(), "the parent's cached descriptor was not closed"
    store = CaptureStore(directory)
    for seq in range(50):
        store.append("0-0", {"writer": "child", "seq": seq, "pad": "c" * PAYLOAD})


def test_fork_does_not_share_cached_descriptors(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", {"writer": "parent", "seq": -1})
    path = str(store.path_for("0-0"))
    assert path in _open_paths()
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_append_in_child, args=(str(tmp_path), path))
    child.start()
    for seq in range(50):
        store.append("0-0", {"writer": "parent", "seq": seq, "pad": "p" * PAYLOAD})
    child.join(timeout=120)
    assert child.exitcode == 0
    store.append("0-0", {"writer": "parent", "seq": 50})
    records = store.read("0-0")
    assert [r["seq"] for r in records if r["writer"] == "parent"] == list(range(-1, 51))
    assert [r["seq"] for r in records if r["writer"] == "child"] == list(range(50))
    assert all(r.get("pad", "p" * PAYLOAD) in ("p" * PAYLOAD, "c" * PAYLOAD) for r in records)


def test_clear_while_another_store_has_the_file_open(tmp_path: Path) -> None:
    first = CaptureStore(tmp_path)
    first.append("0-0", _record(0))
    second = CaptureStore(tmp_path)
    second.clear("0-0")
    first.append("0-0", _record(1))  # must not go to the unlinked file it still holds
    assert [r["model_call_id"] for r in second.read("0-0")] == [f"{1:032x}"]

    # Clearing through the same store drops its descriptor too.
    first.clear("0-0")
    assert str(first.path_for("0-0")) + " (deleted)" not in _open_paths()
    first.append("0-0", _record(2))
    assert [r["model_call_id"] for r in first.read("0-0")] == [f"{2:032x}"]


def test_close_releases_every_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    store = CaptureStore(tmp_path)
    for n in range(10):
        store.append(f"0-{n}", _record(n))
    assert len(os.listdir("/proc/self/fd")) == before + 10
    store.close()
    assert len(os.listdir("/proc/self/fd")) == before
    store.append("0-0", _record(10))  # still usable: it reopens
    assert len(store.read("0-0")) == 2
    with store:
        store.append("0-1", _record(11))
    assert len(os.listdir("/proc/self/fd")) == before


def test_open_descriptors_are_bounded_least_recently_used_first(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    store = CaptureStore(tmp_path, max_open=4)
    for n in range(20):
        store.append(f"0-{n}", _record(n))
        assert len(os.listdir("/proc/self/fd")) <= before + 4
    assert all(len(store.read(f"0-{n}")) == 1 for n in range(20))

    store = CaptureStore(tmp_path / "lru", max_open=2)
    store.append("a", _record(0))
    store.append("b", _record(1))
    store.append("a", _record(2))
    store.append("c", _record(3))  # evicts b, the least recently used
    open_paths = _open_paths()
    assert [str(store.path_for(r)) in open_paths for r in ("a", "b", "c")] == [True, False, True]
    with pytest.raises(ValueError, match="max_open"):
        CaptureStore(tmp_path, max_open=0)


class _Interrupted(Exception):
    pass


def test_an_interrupted_follower_strands_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", {"n": "first"})
    real_write = os.write
    writing, release = threading.Event(), threading.Event()

    def blocking_write(fd: int, data: bytes | memoryview) -> int:
        if not writing.is_set():
            writing.set()
            release.wait()
        return real_write(fd, data)

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    monkeypatch.setattr(os, "write", blocking_write)
    # Daemon threads: a stranded one fails the test instead of hanging the run.
    leader = threading.Thread(target=store.append, args=("0-0", {"n": "leader"}), daemon=True)
    leader.start()
    assert writing.wait(10)
    # Queues behind the main thread, which is waiting as a follower by then.
    later = threading.Timer(0.05, store.append, args=("0-0", {"n": "later"}))
    later.daemon = True
    later.start()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            store.append("0-0", {"n": "interrupted"})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    release.set()
    leader.join(10)
    later.join(10)
    assert not leader.is_alive()
    assert not later.is_alive()
    assert [r["n"] for r in store.read("0-0")] == ["first", "leader", "later"]


def test_append_many_writes_each_rollout_in_order_and_reports_each_failure(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    items: list[tuple[str, object]] = [
        ("a", _record(0)),
        ("b", _record(1)),
        ("../x", _record(2)),  # refused: only this item fails
        ("a", _record(3)),
        ("b", ["not", "an", "object"]),
        ("a", _record(5)),
    ]
    errors = store.append_many(items)  # type: ignore[arg-type]
    assert [type(e).__name__ if e else None for e in errors] == [
        None,
        None,
        "ValueError",
        None,
        "TypeError",
        None,
    ]
    assert [r["model_call_id"] for r in store.read("a")] == [f"{n:032x}" for n in (0, 3, 5)]
    assert [r["model_call_id"] for r in store.read("b")] == [f"{1:032x}"]
    assert sorted(os.listdir(tmp_path)) == ["a.capture.jsonl", "b.capture.jsonl"]
    store.close()


def test_append_many_follows_a_file_cleared_under_it(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("a", _record(0))  # the descriptor is cached now
    store.clear("a")  # unlinks the file: the cached descriptor is stale
    assert store.append_many([("a", _record(1)), ("b", _record(2))]) == [None, None]
    assert [r["model_call_id"] for r in store.read("a")] == [f"{1:032x}"]
    store.close()


def test_append_many_and_append_from_threads_never_interleave(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)

    def batches(worker: int) -> None:
        for n in range(50):
            items = [(f"r{k}", _record(worker * 1000 + n, pad="x" * 5000)) for k in range(4)]
            assert store.append_many(items) == [None] * 4  # type: ignore[arg-type]

    def singles(worker: int) -> None:
        for n in range(50):
            store.append(f"r{n % 4}", _record(worker * 1000 + n, pad="y" * 5000))

    threads = [threading.Thread(target=batches, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=singles, args=(w,)) for w in range(3, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(store.read(f"r{k}")) for k in range(4))  # strict: every line parses
    assert total == 3 * 50 * 4 + 3 * 50
    store.close()


def test_a_store_for_another_file_kind_keeps_to_its_suffixes(tmp_path: Path) -> None:
    ledger = CaptureStore(tmp_path, suffix=".tokens.jsonl", marker_suffix=".tokens.incomplete")
    ledger.append("a", {"k": 1})
    ledger.mark_incomplete("a")
    CaptureStore(tmp_path).append("b", _record(0))
    assert sorted(os.listdir(tmp_path)) == [
        "a.tokens.incomplete",
        "a.tokens.jsonl",
        "b.capture.jsonl",
    ]
    assert ledger.rollout_ids() == ["a"]
    assert ledger.read("a") == [{"k": 1}]
    with pytest.raises(ValueError, match="suffix"):
        CaptureStore(tmp_path, suffix=".x", marker_suffix=".x")
    ledger.close()


def test_append_many_syncs_files_together_and_a_failed_sync_fails_only_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    synced = _watch_fsyncs(monkeypatch, lambda name: name.endswith("bad.capture.jsonl"))
    items = [(f"r{k}", _record(k)) for k in range(20)] + [("bad", _record(99))]
    errors = store.append_many(items)  # type: ignore[arg-type]
    assert errors[:20] == [None] * 20
    assert isinstance(errors[20], OSError)
    assert errors[20].errno == errno.EIO
    files = sorted(os.path.basename(n) for n in synced if n.endswith(".capture.jsonl"))
    assert files == sorted(f"r{k}.capture.jsonl" for k in range(20))
    # The syncs of one batch ran in the store's sync threads, not one after another here.
    assert any(t.name.startswith("rollcap-sync") for t in threading.enumerate())
    store.close()


def test_append_many_syncs_the_directory_once_for_all_the_files_it_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("old", _record(0))
    synced = _watch_fsyncs(monkeypatch)
    items = [(f"new{k}", _record(k)) for k in range(10)] + [("old", _record(10))]
    assert store.append_many(items) == [None] * 11  # type: ignore[arg-type]
    assert synced.count(str(tmp_path)) == 1
    synced.clear()
    assert store.append_many([("new0", _record(11)), ("old", _record(12))]) == [None, None]
    assert str(tmp_path) not in synced  # no file created: no directory sync
    store.close()


def test_a_failed_directory_sync_fails_only_the_new_files_and_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("old", _record(0))
    broken = {"dir": True}
    synced = _watch_fsyncs(monkeypatch, lambda name: name == str(tmp_path) and broken["dir"])
    errors = store.append_many([("new", _record(1)), ("old", _record(2))])  # type: ignore[arg-type]
    assert isinstance(errors[0], OSError)
    assert errors[1] is None
    assert [r["model_call_id"] for r in store.read("old")] == [f"{n:032x}" for n in (0, 2)]
    # The new file's entry may not be durable: the next append that succeeds syncs it.
    broken["dir"] = False
    store.append("old", _record(3))
    assert str(tmp_path) in synced
    synced.clear()
    store.append("old", _record(4))
    assert str(tmp_path) not in synced
    store.close()


def test_reset_clears_a_rollout_and_leaves_its_file_empty_and_private(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "new")  # the directory comes with the first reset
    store.append("a", _record(0))
    store.mark_incomplete("a")
    store.reset("a")
    assert store.read("a") == []
    assert not store.is_incomplete("a")
    assert store.path_for("a").exists()
    assert stat.S_IMODE(os.stat(store.path_for("a")).st_mode) == 0o600
    store.reset("b")
    assert store.rollout_ids() == ["a", "b"]
    store.close()
