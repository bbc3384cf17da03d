"""DirectoryStagingSink and its in-memory twin: all or nothing, write once, safe paths."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.staging import (
    DirectoryStagingSink,
    InMemoryStagingSink,
    StagedRecordError,
    StagingSink,
    StagingSource,
)
from rollcap.staging import _sinks as sinks_module
from tests.staging.test_records import make_record

SinkFactory = Callable[[Path], DirectoryStagingSink | InMemoryStagingSink]
BOTH: list[SinkFactory] = [DirectoryStagingSink, lambda _root: InMemoryStagingSink()]
BOTH_IDS = ["directory", "memory"]


def _visible(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("factory", BOTH, ids=BOTH_IDS)
def test_sinks_satisfy_both_protocols(factory: SinkFactory, tmp_path: Path) -> None:
    sink = factory(tmp_path)
    assert isinstance(sink, StagingSink)
    assert isinstance(sink, StagingSource)


@pytest.mark.parametrize("factory", BOTH, ids=BOTH_IDS)
def test_stage_then_read_back(factory: SinkFactory, tmp_path: Path) -> None:
    sink = factory(tmp_path)
    first = make_record(model_call_id="0b")
    second = make_record(model_call_id="0a")
    other = make_record(rollout_id="9-9", model_call_id="0a")
    sink.stage(first, attachments={"image.png": b"\x89PNG", "raw": bytearray(b"xy")})
    sink.stage(second)
    sink.stage(other, attachments={"m": memoryview(b"view")})
    assert sorted(sink.read("3-1"), key=lambda r: r.model_call_id) == [second, first]
    assert sink.read("9-9") == [other]
    assert sink.read("4-4") == []
    assert sink.read_attachments(first.staging_key) == {"image.png": b"\x89PNG", "raw": b"xy"}
    assert sink.read_attachments(second.staging_key) == {}
    assert sink.read_attachments(other.staging_key) == {"m": b"view"}
    with pytest.raises(KeyError):
        sink.read_attachments("3-1/0c")


@pytest.mark.parametrize("factory", BOTH, ids=BOTH_IDS)
def test_a_staging_key_is_written_once(factory: SinkFactory, tmp_path: Path) -> None:
    sink = factory(tmp_path)
    record = make_record()
    sink.stage(record)
    with pytest.raises(FileExistsError, match=record.staging_key):
        sink.stage(make_record(token_ids=[1, 1, 1]))
    assert sink.read("3-1") == [record]


@pytest.mark.parametrize("factory", BOTH, ids=BOTH_IDS)
@pytest.mark.parametrize(
    ("attachments", "error"),
    [
        ({"ok": b"1", "bad": "text is not bytes"}, TypeError),
        ({"ok": b"1", "bad": 7}, TypeError),
        ({"../escape": b"1"}, ValueError),
        ({".hidden": b"1"}, ValueError),
        ({"a/b": b"1"}, ValueError),
        ([("ok", b"1")], TypeError),
    ],
)
def test_a_bad_attachment_fails_the_whole_stage(
    factory: SinkFactory,
    tmp_path: Path,
    attachments: Any,
    error: type[Exception],
) -> None:
    sink = factory(tmp_path)
    record = make_record()
    with pytest.raises(error):
        sink.stage(record, attachments=attachments)
    assert sink.read("3-1") == []
    with pytest.raises(KeyError):
        sink.read_attachments(record.staging_key)
    if isinstance(sink, DirectoryStagingSink):
        assert not (tmp_path / "3-1" / "c0ffee").exists()
        assert [p for p in _visible(tmp_path) if "tmp" in p] == []


def test_an_io_failure_half_way_through_the_attachments_leaves_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_write = sinks_module._write_file
    written: list[str] = []

    def failing_write(path: Path, data: bytes) -> None:
        if path.parent.name == "attachments" and written:
            raise OSError(28, "No space left on device")
        real_write(path, data)
        if path.parent.name == "attachments":
            written.append(path.name)

    monkeypatch.setattr(sinks_module, "_write_file", failing_write)
    sink = DirectoryStagingSink(tmp_path)
    record = make_record()
    with pytest.raises(OSError, match="No space"):
        sink.stage(record, attachments={"first": b"1" * 1000, "second": b"2", "third": b"3"})
    assert written == ["first"]  # the failure really came after a stored attachment
    assert _visible(tmp_path) == ["3-1"]
    assert sink.read("3-1") == []
    monkeypatch.undo()
    sink.stage(record, attachments={"first": b"1"})  # and the key is still free
    assert sink.read_attachments(record.staging_key) == {"first": b"1"}


def test_directory_layout_and_durability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    root = tmp_path / "staging"
    sink = DirectoryStagingSink(root)
    record = make_record()
    sink.stage(record, attachments={"a": b"A", "b": b"B"})
    assert _visible(root) == [
        "3-1",
        "3-1/c0ffee",
        "3-1/c0ffee/attachments",
        "3-1/c0ffee/attachments/a",
        "3-1/c0ffee/attachments/b",
        "3-1/c0ffee/record.json",
    ]
    stored = orjson.loads((root / "3-1" / "c0ffee" / "record.json").read_bytes())
    assert stored == record.to_json()
    # record, 2 attachments, the attachments dir, the temp dir, the rollout dir after the
    # rename, and each newly created directory's parent (root's parent, root).
    assert len(synced) >= 7
    assert (root / "3-1" / "c0ffee" / "record.json").stat().st_mode & 0o077 == 0


def test_paths_cannot_escape_the_root(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path / "root")
    for rollout_id in ("../up", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match="rollout id"):
            sink.read(rollout_id)
    for key in ("../up/aa", "3-1/../aa", "3-1", "3-1/aa/bb", "3-1/AA"):
        with pytest.raises(ValueError, match=r"staging key|rollout id|model_call_id"):
            sink.read_attachments(key)


def _write_json(path: Path, body: Any) -> None:
    path.write_bytes(orjson.dumps(body))


def test_read_names_a_record_that_cannot_be_read(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    record = make_record()
    sink.stage(record)
    path = tmp_path / "3-1" / "c0ffee" / "record.json"

    path.write_bytes(b"{not json")
    with pytest.raises(StagedRecordError, match="c0ffee") as caught:
        sink.read("3-1")
    assert caught.value.model_call_id == "c0ffee"
    assert caught.value.staging_key == "3-1/c0ffee"

    body = record.to_json()
    body["model_call_id"] = "beef"
    body["staging_key"] = "3-1/beef"
    _write_json(path, body)
    with pytest.raises(StagedRecordError, match="belongs to 3-1/beef"):
        sink.read("3-1")

    path.unlink()
    with pytest.raises(StagedRecordError, match=r"cannot read record\.json"):
        sink.read("3-1")


def test_read_skips_uncommitted_temp_directories_and_refuses_strangers(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    record = make_record()
    sink.stage(record)
    (tmp_path / "3-1" / ".tmp-c0ffee-0123").mkdir()
    assert sink.read("3-1") == [record]
    (tmp_path / "3-1" / "notes.txt").write_text("hello")
    with pytest.raises(StagedRecordError, match=r"unexpected entry 'notes\.txt'"):
        sink.read("3-1")


def test_stage_refuses_what_is_not_a_record(tmp_path: Path) -> None:
    for sink in (DirectoryStagingSink(tmp_path), InMemoryStagingSink()):
        with pytest.raises(TypeError, match="StagedCallRecord"):
            sink.stage({"rollout_id": "3-1"})  # type: ignore[arg-type]
