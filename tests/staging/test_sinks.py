"""Staging sinks: one rename per call, all or nothing, written once, ids mapped reversibly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.staging._digest import (
    EMPTY_EXTRAS_DIGEST,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    hash_token_ids,
)
from rollcap.staging._records import (
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCallSnapshot,
    StagedRecordError,
)
from rollcap.staging._sinks import (
    ATTACHMENTS_DIR,
    RECORD_FILE,
    DirectoryStagingSink,
    InMemoryStagingSink,
    StagingSink,
    StagingSource,
    decode_path_component,
    encode_path_component,
)
from tests.staging.test_capture import (
    ATTACHMENTS_0E3F,
    RECORD_LINES,
    check_rollout_0_0,
    run_rollout_0_0,
)

Sink = InMemoryStagingSink | DirectoryStagingSink


def make_record(
    rollout_id: str = "r",
    model_call_id: str = "c",
    *,
    weight_version: int = 1,
    generated: tuple[int, ...] = (3,),
    extras: Any = None,
) -> StagedCallRecord:
    """A valid root record: prompt [1, 2], then ``generated`` at logprob -0.5."""
    ids = [1, 2, *generated]
    fields: dict[str, Any] = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": len(ids),
        "cum_len": len(ids),
        "weight_version": weight_version,
        "token_ids_delta": ids,
        "token_mask_delta": [0.0, 0.0] + [1.0] * len(generated),
        "generation_log_probs_delta": [0.0, 0.0] + [-0.5] * len(generated),
        "extras_digest": compute_extras_digest(extras),
        "chain_hash": compute_chain_hash(None, ids),
        "cumulative_hash": hash_token_ids(ids),
    }
    return StagedCallRecord(**fields, digest=compute_staging_digest(**fields), extras=extras)


@pytest.fixture(params=["memory", "directory"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Sink:
    if request.param == "memory":
        return InMemoryStagingSink()
    return DirectoryStagingSink(tmp_path / "staging")


def visible(sink: Sink, rollout_id: str = "r") -> list[str]:
    return sink.rollout_keys(rollout_id)


# --- both sinks: the StagingSink / StagingSource contract ----------------------------------


def test_both_are_sinks_and_sources(sink: Sink) -> None:
    assert isinstance(sink, StagingSink)
    assert isinstance(sink, StagingSource)


def test_stage_then_fetch(sink: Sink) -> None:
    records = [make_record(model_call_id=f"c{n}", weight_version=n) for n in range(3)]
    for record in records:
        result = sink.stage(record)
        assert result.ok
        assert result.staging_key == f"r/{record.model_call_id}"
    keys = ["r/c2", "r/c0", "r/c1", "r/c2"]
    snapshots = sink.fetch(keys)
    # One per key asked, in the order asked, without extras.
    assert [s.model_call_id for s in snapshots] == ["c2", "c0", "c1", "c2"]
    assert all(type(s) is StagedCallBaseSnapshot for s in snapshots)
    assert all("extras" not in s.model_dump() for s in snapshots)
    assert sink.fetch_records(["r/c1"]) == [records[1]]
    assert sink.fetch_record("r/c0") == records[0]
    assert sink.fetch([]) == []
    assert sink.rollout_keys("r") == ["r/c0", "r/c1", "r/c2"]
    assert sink.rollout_keys("other") == []
    assert sink.rollouts() == ["r"]


def test_a_missing_key_is_a_key_error_naming_it(sink: Sink) -> None:
    sink.stage(make_record())
    for key in ("r/nope", "nope/c", "no-slash", "r/", "/r", "/%zz/c", "/r/c", ""):
        with pytest.raises(KeyError, match="no staged record for key"):
            sink.fetch(["r/c", key])
    with pytest.raises(KeyError, match="r/nope"):
        sink.attachments("r/nope")
    with pytest.raises(TypeError):
        sink.fetch("r/c")  # type: ignore[arg-type]


def test_restaging_the_same_content_is_idempotent(sink: Sink) -> None:
    record = make_record(extras={"routed_experts": "nrlre1:int8:1x1x1:AQ=="})
    assert sink.stage(record, attachments={"a.bin": b"1"}).ok
    again = sink.stage(
        make_record(extras={"routed_experts": "nrlre1:int8:1x1x1:AQ=="}),
        attachments={"a.bin": bytearray(b"1")},
    )
    assert again.ok
    assert again.staging_key == "r/c"
    assert visible(sink) == ["r/c"]


@pytest.mark.parametrize(
    ("second", "attachments"),
    [
        pytest.param(make_record(weight_version=2), {"a.bin": b"1"}, id="other-record"),
        pytest.param(make_record(extras={"x": 1}), {"a.bin": b"1"}, id="other-extras"),
        pytest.param(make_record(), {"a.bin": b"2"}, id="other-attachment-bytes"),
        pytest.param(make_record(), {"b.bin": b"1"}, id="other-attachment-name"),
        pytest.param(make_record(), None, id="no-attachments"),
    ],
)
def test_restaging_other_content_is_a_conflict(
    sink: Sink, second: StagedCallRecord, attachments: Mapping[str, bytes] | None
) -> None:
    first = make_record()
    assert sink.stage(first, attachments={"a.bin": b"1"}).ok
    result = sink.stage(second, attachments=attachments)
    assert not result.ok
    assert result.error is not None
    assert result.error.startswith("conflicting record for key 'r/c'")
    # The first write stands untouched.
    assert sink.fetch_record("r/c") == first
    assert sink.attachments("r/c") == {"a.bin": b"1"}


@pytest.mark.parametrize(
    "attachments",
    [
        pytest.param({"../escape": b"x"}, id="dot-dot-slash"),
        pytest.param({".hidden": b"x"}, id="leading-dot"),
        pytest.param({"a/b": b"x"}, id="slash"),
        pytest.param({"": b"x"}, id="empty"),
        pytest.param({"a b": b"x"}, id="space"),
        pytest.param({"x" * 256: b"x"}, id="too-long"),
        pytest.param({1: b"x"}, id="non-string-name"),
        pytest.param({"a": "text"}, id="str-value"),
        pytest.param({"a": 5}, id="int-value"),
        pytest.param({"a": [1, 2]}, id="list-value"),
        pytest.param({"ok": b"x", "a": None}, id="one-bad-value"),
        pytest.param([("a", b"x")], id="not-a-mapping"),
    ],
)
def test_bad_attachments_are_refused_whole(sink: Sink, attachments: Any) -> None:
    result = sink.stage(make_record(), attachments=attachments)
    assert not result.ok
    assert result.error
    assert visible(sink) == []
    assert sink.rollouts() == []


def test_bytes_like_attachments_read_back_as_bytes(sink: Sink) -> None:
    attachments = {
        "pixels-0.bin": b"\x00\x01",
        "b": bytearray(b"\xff"),
        "m": memoryview(b"abc"),
        "e": b"",
    }
    assert sink.stage(make_record(), attachments=attachments).ok
    assert sink.attachments("r/c") == {
        "pixels-0.bin": b"\x00\x01",
        "b": b"\xff",
        "m": b"abc",
        "e": b"",
    }
    assert sink.stage(make_record(model_call_id="d"), attachments={}).ok
    assert sink.attachments("r/d") == {}


def test_a_snapshot_is_staged_as_a_record(sink: Sink) -> None:
    snapshot = StagedCallSnapshot.model_validate(make_record(extras={"x": 1}).model_dump())
    assert sink.stage(snapshot).ok
    assert sink.fetch_record("r/c").model_dump() == snapshot.model_dump()


def test_anything_but_a_valid_record_is_refused(sink: Sink) -> None:
    assert not sink.stage(make_record().model_dump()).ok  # type: ignore[arg-type]
    forged = StagedCallRecord.model_construct(**{**make_record().model_dump(), "weight_version": 9})
    result = sink.stage(forged)
    assert not result.ok
    assert visible(sink) == []


def test_ids_are_any_non_empty_strings(sink: Sink) -> None:
    pairs = [
        ("a/b", "c"),
        ("a", "b/c"),
        ("a/b/", "/"),
        (".hidden", ".."),
        ("%", "%41"),
        ("é 🙂", "x y"),
        ("-", "_"),
    ]
    keys = []
    for rollout_id, call in pairs:
        result = sink.stage(make_record(rollout_id, call))
        assert result.ok, result.error
        assert result.staging_key is not None
        keys.append(result.staging_key)
    assert len(set(keys)) == len(keys)
    # The default key wherever it is unambiguous.
    assert keys[1] == "a/b/c"
    assert keys[0].startswith("/")
    for (rollout_id, call), key, snapshot in zip(pairs, keys, sink.fetch(keys), strict=True):
        assert (snapshot.rollout_id, snapshot.model_call_id) == (rollout_id, call)
        assert sink.rollout_keys(rollout_id) == [key]
    assert sink.rollouts() == sorted(rollout_id for rollout_id, _ in pairs)


# --- the directory sink: layout, durability, concurrency -----------------------------------


def test_rollout_0_0_reads_back_bit_for_bit(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    check_rollout_0_0(sink, run_rollout_0_0(sink))
    for line, call in zip(RECORD_LINES, ["0a1b", "0c2d", "0e3f"], strict=True):
        stored = (tmp_path / "0-0" / call / RECORD_FILE).read_bytes()
        assert stored == orjson.dumps(orjson.loads(line))
    assert (
        tmp_path / "0-0" / "0e3f" / ATTACHMENTS_DIR / "pixels-0.bin"
    ).read_bytes() == b"\x00\x01"
    assert not (tmp_path / "0-0" / "0a1b" / ATTACHMENTS_DIR).exists()
    # A second sink on the same root (another process, after a restart) reads the same.
    again = DirectoryStagingSink(tmp_path)
    check_rollout_0_0(again, run_rollout_0_0(InMemoryStagingSink()))
    assert again.attachments("0-0/0e3f") == ATTACHMENTS_0E3F


def test_layout_and_names(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path / "new" / "root")
    assert sink.root == tmp_path / "new" / "root"
    assert sink.stage(make_record("roll.1", "call_2"), attachments={"img.0": b"z"}).ok
    assert sorted(p.relative_to(sink.root).as_posix() for p in sink.root.rglob("*")) == [
        "roll.1",
        "roll.1/call_2",
        "roll.1/call_2/attachments",
        "roll.1/call_2/attachments/img.0",
        "roll.1/call_2/record.json",
    ]
    assert sink.stage(make_record("a/b", ".x")).ok
    assert (sink.root / "%a%2Fb" / "%.x" / RECORD_FILE).is_file()


@pytest.mark.parametrize(
    "value",
    ["a", "A-z_0.9", "-x", "a/b", ".x", ".", "..", "%", "%41", "a b", "é", "🙂", "\x00", "x" * 255],
)
def test_path_components_round_trip(value: str) -> None:
    name = encode_path_component(value)
    assert decode_path_component(name) == value
    assert not name.startswith(".")
    assert "/" not in name
    assert "\x00" not in name
    assert len(name.encode()) <= 255


def test_path_components_are_distinct_and_canonical() -> None:
    values = ["a", "%a", "%61", "a%", ".a", "%.a", "A", "a.", "a/b", "a%2Fb", "%a%2Fb"]
    names = [encode_path_component(v) for v in values]
    assert len(set(names)) == len(values)
    for name in ("%41", "%a%2fb", "%", ".x", "a b", "%%", "%zz", "%C3", ""):
        with pytest.raises(ValueError, match=r"file name|malformed|UTF-8|canonical|non-empty"):
            decode_path_component(name)
    with pytest.raises(ValueError, match="non-empty"):
        encode_path_component("")
    with pytest.raises(ValueError, match="too long"):
        encode_path_component("/" * 100)


def test_an_id_too_long_for_a_file_name_is_refused(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    result = sink.stage(make_record("r", "x" * 256))
    assert not result.ok
    assert "too long" in (result.error or "")
    with pytest.raises(KeyError):
        sink.fetch(["r/" + "x" * 256])


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temp_name(pid: int, host: str | None = None) -> str:
    host_part = encode_path_component(host or socket.gethostname())[:64]
    return f".staging-{host_part}-{pid}-{uuid.uuid4().hex}"


def plant_temp(rollout_dir: Path, name: str) -> Path:
    """What a writer killed mid-stage leaves: a complete-looking call in a temp dir."""
    temp = rollout_dir / name
    (temp / ATTACHMENTS_DIR).mkdir(parents=True)
    (temp / RECORD_FILE).write_bytes(
        orjson.dumps(make_record(model_call_id="ghost").model_dump(mode="json"))
    )
    (temp / ATTACHMENTS_DIR / "a").write_bytes(b"half")
    return temp


def test_a_crashed_writers_temp_dir_is_ignored_then_cleaned(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    (tmp_path / "r").mkdir()
    crashed = plant_temp(tmp_path / "r", temp_name(dead_pid()))
    ours = plant_temp(tmp_path / "r", temp_name(os.getpid()))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = plant_temp(tmp_path / "r", temp_name(sleeper.pid))
        elsewhere = plant_temp(tmp_path / "r", temp_name(dead_pid(), host="another-host"))
        # A host named like ours plus "-<digits>": its temp dirs are not ours either.
        lookalike = plant_temp(
            tmp_path / "r", temp_name(dead_pid(), host=f"{socket.gethostname()}-{dead_pid()}")
        )
        # Readers never see what a temp dir holds.
        assert sink.rollout_keys("r") == []
        assert sink.rollouts() == []
        with pytest.raises(KeyError):
            sink.fetch(["r/ghost"])
        assert sink.stage(make_record()).ok
        assert not crashed.exists()
        assert not ours.exists()  # this process's, but not in flight: a failed write's
        assert live.exists()  # its writer may still be writing
        assert elsewhere.exists()  # another host's pids mean nothing here
        assert lookalike.exists()
        assert sink.rollout_keys("r") == ["r/c"]
    finally:
        sleeper.kill()
        sleeper.wait()


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".staging-*"))


def test_a_failed_rename_leaves_nothing_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = DirectoryStagingSink(tmp_path)

    def refuse(source: Any, target: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", refuse)
    result = sink.stage(make_record(), attachments={"a": b"x"})
    assert not result.ok
    assert "No space left" in (result.error or "")
    assert sink.rollout_keys("r") == []
    assert leftovers(tmp_path) == []
    with pytest.raises(KeyError):
        sink.fetch(["r/c"])
    monkeypatch.undo()
    assert sink.stage(make_record(), attachments={"a": b"x"}).ok
    assert sink.attachments("r/c") == {"a": b"x"}


def count_fsyncs(
    monkeypatch: pytest.MonkeyPatch, fail_at: int | None
) -> tuple[list[str], Callable[[], None]]:
    """Patch ``os.fsync`` (raising at call ``fail_at``) and ``os.rename``; log both in order."""
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append("fsync")
        if fail_at is not None and events.count("fsync") == fail_at + 1:
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    def rename(source: Any, target: Any) -> None:
        events.append("rename")
        real_rename(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    return events, monkeypatch.undo


def test_every_write_is_fsynced_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = DirectoryStagingSink(tmp_path)
    events, undo = count_fsyncs(monkeypatch, None)
    assert sink.stage(make_record(), attachments={"a": b"1", "b": b"2"}).ok
    undo()
    # root (new rollout dir), record, two attachments, attachments dir, temp dir | rename | parent.
    assert events == ["fsync"] * 6 + ["rename", "fsync"]


@pytest.mark.parametrize("fail_at", range(6))
def test_an_fsync_failure_before_the_rename_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    sink = DirectoryStagingSink(tmp_path)
    events, undo = count_fsyncs(monkeypatch, fail_at)
    result = sink.stage(make_record(), attachments={"a": b"1", "b": b"2"})
    undo()
    assert "rename" not in events
    assert not result.ok
    assert "Input/output error" in (result.error or "")
    assert sink.rollout_keys("r") == []
    assert leftovers(tmp_path) == []
    assert sink.stage(make_record(), attachments={"a": b"1", "b": b"2"}).ok


def test_an_fsync_failure_after_the_rename_is_reported_and_restage_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = DirectoryStagingSink(tmp_path)
    _, undo = count_fsyncs(monkeypatch, 6)
    result = sink.stage(make_record(), attachments={"a": b"1", "b": b"2"})
    undo()
    assert not result.ok
    # Durability unknown, so not ok; the record is whole, and staging it again says so.
    assert sink.rollout_keys("r") == ["r/c"]
    assert sink.stage(make_record(), attachments={"a": b"1", "b": b"2"}).ok


def test_a_write_failing_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = DirectoryStagingSink(tmp_path)
    real_write = os.write
    writes = []

    def write(fd: int, data: Any) -> int:
        writes.append(fd)
        if len(writes) == 2:  # the record went through; the first attachment does not
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    assert not sink.stage(make_record(), attachments={"a": b"1"}).ok
    monkeypatch.undo()
    assert sink.rollout_keys("r") == []
    assert leftovers(tmp_path) == []


def write_raw(root: Path, rollout_id: str, call: str, data: bytes) -> None:
    folder = root / encode_path_component(rollout_id) / encode_path_component(call)
    folder.mkdir(parents=True)
    (folder / RECORD_FILE).write_bytes(data)


def test_a_schema_1_record_is_named(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    old = {
        "schema_version": 1,
        "rollout_id": "r",
        "model_call_id": "c",
        "token_ids": [1, 2, 3],
        "loss_mask": [0, 0, 1],
        "logprobs": [0.0, 0.0, -0.5],
    }
    write_raw(tmp_path, "r", "c", orjson.dumps(old))
    assert sink.rollout_keys("r") == ["r/c"]
    with pytest.raises(StagedRecordError, match="schema_version 1"):
        sink.fetch(["r/c"])
    with pytest.raises(StagedRecordError, match="'r/c'"):
        sink.fetch_record("r/c")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(b"{not json", "not JSON", id="not-json"),
        pytest.param(b"[]", "JSON object", id="not-an-object"),
        pytest.param(
            orjson.dumps({**make_record().model_dump(mode="json"), "weight_version": 2}),
            "digest mismatch",
            id="tampered",
        ),
        pytest.param(
            orjson.dumps({**make_record().model_dump(mode="json"), "extras": {"x": 1}}),
            "extras digest mismatch",
            id="tampered-extras",
        ),
        pytest.param(
            orjson.dumps(make_record(model_call_id="other").model_dump(mode="json")),
            "holds call 'other'",
            id="misfiled",
        ),
    ],
)
def test_an_invalid_record_is_a_staged_record_error(
    tmp_path: Path, data: bytes, match: str
) -> None:
    write_raw(tmp_path, "r", "c", data)
    with pytest.raises(StagedRecordError, match=match):
        DirectoryStagingSink(tmp_path).fetch(["r/c"])


def test_fetch_proves_the_stored_extras_too(tmp_path: Path) -> None:
    # One file holds the record and its extras: a fetch parses (and so proves) both.
    record = make_record(extras={"x": 1})
    sink = DirectoryStagingSink(tmp_path)
    assert sink.stage(record).ok
    path = tmp_path / "r" / "c" / RECORD_FILE
    path.write_bytes(orjson.dumps({**record.model_dump(mode="json"), "extras": {"x": 2}}))
    with pytest.raises(StagedRecordError, match="extras digest mismatch"):
        sink.fetch(["r/c"])


def test_concurrent_stages_of_one_key(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    threads_n = 12
    start = threading.Barrier(threads_n)
    results: list[tuple[int, bool, str | None]] = []
    lock = threading.Lock()

    def stage(index: int) -> None:
        # Two contents race: even threads stage version 1, odd ones version 2.
        record = make_record(weight_version=1 + index % 2)
        start.wait()
        result = sink.stage(record, attachments={"a": bytes([index % 2])})
        with lock:
            results.append((index, result.ok, result.error))

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winner = sink.fetch_record("r/c").weight_version
    for index, ok, error in results:
        if 1 + index % 2 == winner:
            assert ok, error
        else:
            assert not ok
            assert (error or "").startswith("conflicting record for key")
    assert sink.attachments("r/c") == {"a": bytes([winner - 1])}
    assert leftovers(tmp_path) == []


def test_concurrent_stages_of_many_keys(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    threads_n, per_thread = 8, 10
    start = threading.Barrier(threads_n)
    failures: list[str | None] = []

    def stage(index: int) -> None:
        start.wait()
        for n in range(per_thread):
            result = sink.stage(
                make_record(f"r{n % 3}", f"t{index}-{n}"), attachments={"a": bytes([index, n])}
            )
            if not result.ok:
                failures.append(result.error)

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert sink.rollouts() == ["r0", "r1", "r2"]
    keys = [key for rollout in sink.rollouts() for key in sink.rollout_keys(rollout)]
    assert len(keys) == threads_n * per_thread
    assert len(sink.fetch(keys)) == len(keys)
    assert leftovers(tmp_path) == []


# --- the in-memory sink ---------------------------------------------------------------------


def test_in_memory_records_do_not_alias_what_was_staged() -> None:
    sink = InMemoryStagingSink()
    extras: dict[str, Any] = {"media_spans": [{"offset": 1}]}
    payload = bytearray(b"ab")
    assert sink.stage(make_record(extras=extras), attachments={"a": payload}).ok
    extras["media_spans"].append({"offset": 2})
    payload[0] = 0
    assert sink.fetch_record("r/c").extras == {"media_spans": [{"offset": 1}]}
    assert sink.attachments("r/c") == {"a": b"ab"}
    sink.attachments("r/c")["a"] = b"changed"
    assert sink.attachments("r/c") == {"a": b"ab"}
    assert sink.fetch(["r/c"])[0].extras_digest != EMPTY_EXTRAS_DIGEST
