from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from rollcap.attachment import capture_attachment
from rollcap.records import RawRecord
from rollcap.store import (
    CaptureReadError,
    CaptureStore,
    _files,
    _shared,
    _sync,
    aggregate_model_call_metrics,
    read_model_call_records,
)
from tests.store._helpers import (
    PAYLOAD,
    numbered_record,
    open_file_paths,
    watch_fsyncs,
)
from tests.test_records import SPEC_RECORD


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
    store.append("0-0", numbered_record(0))
    store.mark_incomplete("0-0")
    assert stat.S_IMODE((tmp_path / "a" / "calls").stat().st_mode) == 0o700
    for name in ("0-0.capture.jsonl", "0-0.capture.incomplete"):
        assert stat.S_IMODE((tmp_path / "a" / "calls" / name).stat().st_mode) == 0o600


def test_file_order_call_index_and_rollout_ids(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    for n in range(5):
        store.append("3-1", numbered_record(n))
    store.append("3-0-a1", numbered_record(9))
    records = read_model_call_records(store, "3-1")
    assert [r.call_index for r in records] == [0, 1, 2, 3, 4]
    assert [r.model_call_id for r in records] == [f"{n:032x}" for n in range(5)]
    assert store.rollout_ids() == ["3-0-a1", "3-1"]
    assert CaptureStore(tmp_path / "missing").rollout_ids() == []
    assert store.read("never-written") == []


def test_torn_last_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    for n in range(3):
        store.append("0-0", numbered_record(n))
    path = store.path_for("0-0")
    with path.open("ab") as handle:  # a crash in the middle of a write
        handle.write(orjson.dumps(numbered_record(3))[:100])
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
    store.append("0-0", numbered_record(4))
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


def test_every_reader_skips_blank_lines(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("x").write_bytes(b'\n{"a": 1}\n  \r\n\t\n{"b": 2}\n\n')
    assert store.read("x") == [{"a": 1}, {"b": 2}]
    assert store.read_available("x").records == [(0, {"a": 1}), (1, {"b": 2})]
    assert [r.call_index for r in read_model_call_records(store, "x")] == [0, 1]
    assert [r.call_index for r in read_model_call_records(store, "x", strict=False)] == [0, 1]
    assert aggregate_model_call_metrics(store, "x")["num_calls"] == 2
    # A bad line is still named by its line in the file, blank lines counted.
    store.path_for("y").write_bytes(b'\n\n{"a": 1}\nnope\n')
    with pytest.raises(CaptureReadError, match="line 4: not valid JSON"):
        store.read("y")


def test_a_strict_read_error_is_also_orjson_s_decode_error(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("x").write_bytes(b'{"a": 1}\n{"a": 1, oops}\n')
    # Code written for NeMo Gym catches orjson's error around a strict read.
    with pytest.raises(orjson.JSONDecodeError) as caught:
        read_model_call_records(store, "x")
    error = caught.value
    assert isinstance(error, CaptureReadError)
    assert isinstance(error, json.JSONDecodeError)
    assert isinstance(error, ValueError)
    assert str(error).startswith(f"{store.path_for('x')}: line 2: not valid JSON (")
    assert error.msg == str(error)
    assert (error.path, error.line_number, error.lineno) == (store.path_for("x"), 2, 2)
    assert error.doc == '{"a": 1, oops}'
    assert error.doc[error.pos :].startswith("oops")
    assert error.colno == error.pos + 1
    copy = pickle.loads(pickle.dumps(error))  # errors cross process boundaries (cluster)
    assert (type(copy), str(copy), copy.line_number, copy.pos) == (
        CaptureReadError,
        str(error),
        2,
        error.pos,
    )
    store.path_for("y").write_bytes(b"[1]\n")
    with pytest.raises(orjson.JSONDecodeError, match="line 1: not a JSON object"):
        store.read("y")


def test_a_value_json_has_no_type_for_is_written_as_its_str(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    record = {**numbered_record(0), "request": {"file": tmp_path / "prompt.txt"}}
    store.append("0-0", record)
    assert store.append_many([("0-1", record)]) == [None]
    for rollout_id in ("0-0", "0-1"):
        (read,) = store.read(rollout_id)
        assert read["request"] == {"file": str(tmp_path / "prompt.txt")}


def test_clear_and_markers(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.clear("0-0")  # nothing there: fine
    store.append("0-0", numbered_record(0))
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
        store.append("0-0", numbered_record(0))
    assert info.value.errno == errno.ENOSPC
    # The failed descriptor is not kept: once the disk has room, the next append lands.
    store.path_for("0-0").unlink()
    store.append("0-0", numbered_record(1))
    assert [r["model_call_id"] for r in store.read("0-0")] == [f"{1:032x}"]


def test_short_write_then_full_disk_then_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", numbered_record(0))
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:50])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        store.append("0-0", numbered_record(1))
    assert open_file_paths().count(str(store.path_for("0-0"))) == 0  # the failed fd was dropped
    monkeypatch.setattr(os, "write", real_write)
    store.append("0-0", numbered_record(2))
    available = store.read_available("0-0")
    assert [r["model_call_id"] for _, r in available.records] == [f"{0:032x}", f"{2:032x}"]
    assert available.bad_lines == 1


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
            lambda rid: store.append(rid, numbered_record(0)),
            store.read,
            store.read_available,
            store.clear,
            store.mark_incomplete,
            store.is_incomplete,
            lambda rid: read_model_call_records(store, rid),
            lambda rid: capture_attachment(store, rid),
        ):
            with pytest.raises(ValueError, match="Invalid rollout id"):
                call(bad)
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert not (root / "calls").exists()


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


def test_clear_while_another_store_has_the_file_open(tmp_path: Path) -> None:
    first = CaptureStore(tmp_path)
    first.append("0-0", numbered_record(0))
    second = CaptureStore(tmp_path)
    second.clear("0-0")
    first.append("0-0", numbered_record(1))  # must not go to the unlinked file it still holds
    assert [r["model_call_id"] for r in second.read("0-0")] == [f"{1:032x}"]

    # Clearing through the same store drops its descriptor too.
    first.clear("0-0")
    assert str(first.path_for("0-0")) + " (deleted)" not in open_file_paths()
    first.append("0-0", numbered_record(2))
    assert [r["model_call_id"] for r in first.read("0-0")] == [f"{2:032x}"]


def test_close_releases_every_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    store = CaptureStore(tmp_path)
    for n in range(10):
        store.append(f"0-{n}", numbered_record(n))
    assert len(os.listdir("/proc/self/fd")) == before + 10
    store.close()
    assert len(os.listdir("/proc/self/fd")) == before
    store.append("0-0", numbered_record(10))  # still usable: it reopens
    assert len(store.read("0-0")) == 2
    with store:
        store.append("0-1", numbered_record(11))
    assert len(os.listdir("/proc/self/fd")) == before


def test_open_descriptors_are_bounded_least_recently_used_first(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    store = CaptureStore(tmp_path, max_open=4)
    for n in range(20):
        store.append(f"0-{n}", numbered_record(n))
        assert len(os.listdir("/proc/self/fd")) <= before + 4
    assert all(len(store.read(f"0-{n}")) == 1 for n in range(20))

    store = CaptureStore(tmp_path / "lru", max_open=2)
    store.append("a", numbered_record(0))
    store.append("b", numbered_record(1))
    store.append("a", numbered_record(2))
    store.append("c", numbered_record(3))  # evicts b, the least recently used
    open_paths = open_file_paths()
    assert [str(store.path_for(r)) in open_paths for r in ("a", "b", "c")] == [True, False, True]
    with pytest.raises(ValueError, match="max_open"):
        CaptureStore(tmp_path, max_open=0)


def test_append_many_writes_each_rollout_in_order_and_reports_each_failure(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    items: list[tuple[str, object]] = [
        ("a", numbered_record(0)),
        ("b", numbered_record(1)),
        ("../x", numbered_record(2)),  # refused: only this item fails
        ("a", numbered_record(3)),
        ("b", ["not", "an", "object"]),
        ("a", numbered_record(5)),
    ]
    errors = store.append_many(items)  # type: ignore[arg-type]  # a non-object, on purpose
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
    store.append("a", numbered_record(0))  # the descriptor is cached now
    store.clear("a")  # unlinks the file: the cached descriptor is stale
    assert store.append_many([("a", numbered_record(1)), ("b", numbered_record(2))]) == [None, None]
    assert [r["model_call_id"] for r in store.read("a")] == [f"{1:032x}"]
    store.close()


def test_append_many_and_append_from_threads_never_interleave(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)

    def batches(worker: int) -> None:
        for n in range(50):
            items = [
                (f"r{k}", numbered_record(worker * 1000 + n, pad="x" * 5000)) for k in range(4)
            ]
            assert store.append_many(items) == [None] * 4

    def singles(worker: int) -> None:
        for n in range(50):
            store.append(f"r{n % 4}", numbered_record(worker * 1000 + n, pad="y" * 5000))

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
    CaptureStore(tmp_path).append("b", numbered_record(0))
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
    store = CaptureStore(tmp_path, sync="fsync")
    synced = watch_fsyncs(monkeypatch, lambda name: name.endswith("bad.capture.jsonl"))
    items = [(f"r{k}", numbered_record(k)) for k in range(20)] + [("bad", numbered_record(99))]
    errors = store.append_many(items)
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
    store = CaptureStore(tmp_path, sync="fsync")
    store.append("old", numbered_record(0))
    synced = watch_fsyncs(monkeypatch)
    items = [(f"new{k}", numbered_record(k)) for k in range(10)] + [("old", numbered_record(10))]
    assert store.append_many(items) == [None] * 11
    assert synced.count(str(tmp_path)) == 1
    synced.clear()
    assert store.append_many([("new0", numbered_record(11)), ("old", numbered_record(12))]) == [
        None,
        None,
    ]
    assert str(tmp_path) not in synced  # no file created: no directory sync
    store.close()


def _watch_syncfs(
    monkeypatch: pytest.MonkeyPatch, fails: Callable[[], bool] = lambda: False
) -> list[str]:
    """The files ``syncfs`` was called on from now on; a call while ``fails()`` raises EIO."""
    real = _sync.syncfs
    called: list[str] = []

    def syncfs(fd: int) -> None:
        if fails():
            raise OSError(errno.EIO, "Input/output error")
        called.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(_files, "syncfs", syncfs)
    return called


def test_append_many_with_syncfs_syncs_a_batch_once_and_no_file_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path, sync="syncfs")
    store.append("old", numbered_record(0))
    fsynced = watch_fsyncs(monkeypatch)
    called = _watch_syncfs(monkeypatch)
    items = [(f"new{k}", numbered_record(k)) for k in range(10)] + [("old", numbered_record(10))]
    assert store.append_many(items) == [None] * 11
    # One syncfs made the writes and the new files' directory entries durable: no fsync at all.
    assert len(called) == 1
    assert called[0].endswith(".capture.jsonl")
    assert fsynced == []
    assert [r["model_call_id"] for r in store.read("old")] == [f"{n:032x}" for n in (0, 10)]
    assert store.read("new3") == [numbered_record(3)]
    store.close()


def test_with_syncfs_a_batch_of_one_file_is_synced_by_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path, sync="syncfs")
    fsynced = watch_fsyncs(monkeypatch)
    called = _watch_syncfs(monkeypatch)
    assert store.append_many([("one", numbered_record(0)), ("one", numbered_record(1))]) == [
        None,
        None,
    ]
    assert called == []
    # The file and, since the batch created it, its directory entry.
    assert fsynced == [str(tmp_path), str(store.path_for("one"))]
    store.close()


def test_a_failed_syncfs_fails_every_record_of_its_batch_and_the_next_batch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path, sync="syncfs")
    broken = {"now": True}
    _watch_syncfs(monkeypatch, lambda: broken["now"])
    errors = store.append_many([("a", numbered_record(0)), ("b", numbered_record(1))])
    # Which file's writeback failed is not told, so no record of the batch is reported durable.
    assert all(isinstance(e, OSError) and e.errno == errno.EIO for e in errors)
    broken["now"] = False
    assert store.append_many([("a", numbered_record(2)), ("b", numbered_record(3))]) == [None] * 2
    store.close()


def test_a_store_asked_for_an_unknown_sync_refuses(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sync must be one of auto, fsync, syncfs"):
        CaptureStore(tmp_path, sync="fdatasync")
    assert CaptureStore(tmp_path, sync="fsync").sync_mode == "fsync"


def test_a_failed_directory_sync_fails_only_the_new_files_and_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path, sync="fsync")
    store.append("old", numbered_record(0))
    broken = {"dir": True}
    synced = watch_fsyncs(monkeypatch, lambda name: name == str(tmp_path) and broken["dir"])
    errors = store.append_many([("new", numbered_record(1)), ("old", numbered_record(2))])
    assert isinstance(errors[0], OSError)
    assert errors[1] is None
    assert [r["model_call_id"] for r in store.read("old")] == [f"{n:032x}" for n in (0, 2)]
    # The new file's entry may not be durable: the next append that succeeds syncs it.
    broken["dir"] = False
    store.append("old", numbered_record(3))
    assert str(tmp_path) in synced
    synced.clear()
    store.append("old", numbered_record(4))
    assert str(tmp_path) not in synced
    store.close()


def test_reset_clears_a_rollout_and_leaves_its_file_empty_and_private(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "new")  # the directory comes with the first reset
    store.append("a", numbered_record(0))
    store.mark_incomplete("a")
    store.reset("a")
    assert store.read("a") == []
    assert not store.is_incomplete("a")
    assert store.path_for("a").exists()
    assert stat.S_IMODE(os.stat(store.path_for("a")).st_mode) == 0o600
    store.reset("b")
    assert store.rollout_ids() == ["a", "b"]
    store.close()


def test_marker_for_names_the_file_mark_incomplete_leaves(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "calls")
    assert not store.marker_for("0-0").exists()
    store.mark_incomplete("0-0")
    assert store.marker_for("0-0").is_file()
    assert store.marker_for("0-0") == tmp_path / "calls" / "0-0.capture.incomplete"
    with pytest.raises(ValueError, match="rollout id"):
        store.marker_for("../x")


# -- a cached descriptor whose file went away (shared filesystems) ---------------------------


def _ids(store: CaptureStore, rollout_id: str) -> list[str]:
    return [r["model_call_id"] for r in store.read(rollout_id)]


@pytest.mark.parametrize("check_identity", [True, False])
def test_a_file_renamed_away_and_recreated_under_a_cached_descriptor(
    tmp_path: Path, check_identity: bool
) -> None:
    # What an NFS client does when a file open here is removed on this host: it renames it to
    # .nfsXXXX, where it keeps its link. The cached descriptor's link count cannot tell.
    store = CaptureStore(tmp_path, check_identity=check_identity)
    store.append("0-0", numbered_record(0))
    path = store.path_for("0-0")
    hidden = tmp_path / ".nfs000000000001"
    os.rename(path, hidden)
    path.touch()  # the collector's reset: the next attempt's empty file
    store.append("0-0", numbered_record(1))
    hidden_ids = [orjson.loads(line)["model_call_id"] for line in hidden.read_bytes().splitlines()]
    if check_identity:
        assert _ids(store, "0-0") == [f"{1:032x}"]
        assert hidden_ids == [f"{0:032x}"]
    else:  # the control: without the check the record goes into the renamed file
        assert _ids(store, "0-0") == []
        assert hidden_ids == [f"{0:032x}", f"{1:032x}"]


def test_the_identity_check_is_on_where_other_hosts_mount_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not CaptureStore(tmp_path)._check_identity  # this machine's own disk
    nfs = tmp_path / "mountinfo"
    nfs.write_text(f"40 27 0:50 / {tmp_path} rw - nfs4 fs1:/export rw,vers=4.2,hard\n")
    real = _shared.on_shared_filesystem
    monkeypatch.setattr(_files, "on_shared_filesystem", lambda d: real(d, mountinfo=str(nfs)))
    assert CaptureStore(tmp_path / "calls")._check_identity
    assert not CaptureStore(tmp_path, check_identity=False)._check_identity


def test_append_many_follows_a_replaced_file_too(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path, check_identity=True)
    store.append_many([("a", numbered_record(0)), ("b", numbered_record(1))])
    os.replace(store.path_for("a"), tmp_path / "elsewhere")
    store.path_for("a").touch()
    results = store.append_many([("a", numbered_record(2)), ("b", numbered_record(3))])
    assert results == [None, None]
    assert _ids(store, "a") == [f"{2:032x}"]
    assert _ids(store, "b") == [f"{1:032x}", f"{3:032x}"]


@pytest.mark.parametrize("call", ["fstat", "write", "fsync"])
def test_estale_once_reopens_and_appends_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # A file removed on another NFS host: the cached handle answers ESTALE.
    store = CaptureStore(tmp_path)
    store.append("0-0", numbered_record(0))
    real = getattr(os, call)
    failed: list[int] = []

    def stale_once(fd: int, *args: object) -> object:
        if not failed:
            failed.append(fd)
            raise OSError(errno.ESTALE, "Stale file handle")
        return real(fd, *args)

    monkeypatch.setattr(os, call, stale_once)
    store.append("0-0", numbered_record(1))
    monkeypatch.setattr(os, call, real)
    assert failed  # the fault was met
    # Nothing lost; a record written before the fsync's ESTALE is written again, and a
    # real ESTALE means that first copy went away with the file on the server.
    ids = _ids(store, "0-0")
    assert ids[0] == f"{0:032x}"
    assert ids[-1] == f"{1:032x}"
    assert ids.count(f"{1:032x}") == (2 if call == "fsync" else 1)
    assert not store.is_incomplete("0-0")


def test_a_file_that_keeps_going_stale_is_an_error_not_a_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    real_fstat = os.fstat

    def always_stale(fd: int) -> os.stat_result:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".capture.jsonl"):
            raise OSError(errno.ESTALE, "Stale file handle")
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", always_stale)
    with pytest.raises(OSError, match="removed or replaced 8 times") as caught:
        store.append("0-0", numbered_record(0))
    assert caught.value.errno == errno.ESTALE
