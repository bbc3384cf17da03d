from __future__ import annotations

import errno
import multiprocessing
import os
import stat
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
    assert available.bad_lines == 3


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
    gaps = capture_attachment(store, "0-2")["gaps"]
    assert gaps[0]["code"] == "model_call_capture_unreadable"
    assert "IsADirectoryError" in gaps[0]["detail"]


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
