"""Compacted capture files: read as the plain ones, appended to, and never a record lost or
doubled, whatever dies where."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from rollcap.attachment import capture_attachment
from rollcap.store import (
    COMPRESSED_CAPTURE_SUFFIX,
    CaptureConflictError,
    CaptureReadError,
    CaptureStore,
    compress_directory,
    decompress_directory,
)
from rollcap.store._frames import Frame, encode_frame, read_frames
from tests.store._helpers import numbered_record

ROLLOUT = "7-0"


def _store_with(tmp_path: Path, count: int = 20) -> CaptureStore:
    store = CaptureStore(tmp_path)
    for n in range(count):
        store.append(ROLLOUT, numbered_record(n, text="the same conversation again " * n))
    return store


def _ids(store: CaptureStore) -> list[str]:
    return [record["model_call_id"] for record in store.read(ROLLOUT)]


def _names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_a_compacted_rollout_reads_exactly_as_before_and_is_smaller(tmp_path: Path) -> None:
    store = _store_with(tmp_path)
    plain = store.path_for(ROLLOUT)
    before, raw = store.read(ROLLOUT), plain.read_bytes()
    os.chmod(plain, 0o640)
    assert store.compact(ROLLOUT, level=19)
    packed = tmp_path / f"{ROLLOUT}{COMPRESSED_CAPTURE_SUFFIX}"
    assert _names(tmp_path) == [packed.name]
    assert packed.stat().st_size < len(raw) / 5
    assert stat.S_IMODE(packed.stat().st_mode) == 0o640  # the plain file's permissions kept
    assert store.read(ROLLOUT) == before
    assert store.read_available(ROLLOUT).records == list(enumerate(before))
    assert store.rollout_ids() == [ROLLOUT]
    assert store.has_capture(ROLLOUT)
    assert store.file_for(ROLLOUT) == packed
    frames = list(read_frames(packed.read_bytes()))
    assert len(frames) == 1
    assert isinstance(frames[0], Frame)
    assert frames[0].content == raw  # the plain file's bytes, exactly
    assert not store.compact(ROLLOUT)  # nothing plain left: nothing to do


def test_a_call_after_compaction_appends_a_frame_and_the_next_compaction_folds_it_in(
    tmp_path: Path,
) -> None:
    store = _store_with(tmp_path, 3)
    assert store.compact(ROLLOUT)
    other = CaptureStore(tmp_path)  # another model server: no cached descriptor
    other.append(ROLLOUT, numbered_record(3))
    store.append(ROLLOUT, numbered_record(4))  # this one's descriptor of the plain file is gone
    assert store.append_many([(ROLLOUT, numbered_record(5)), ("other", numbered_record(6))]) == [
        None,
        None,
    ]
    assert _names(tmp_path) == [
        f"{ROLLOUT}{COMPRESSED_CAPTURE_SUFFIX}",
        "other.capture.jsonl",
    ]
    packed = store.file_for(ROLLOUT)
    assert len(list(read_frames(packed.read_bytes()))) == 4  # one frame a late batch
    assert _ids(store) == [f"{n:032x}" for n in range(6)]
    assert store.expand(ROLLOUT)
    assert _names(tmp_path) == [f"{ROLLOUT}.capture.jsonl", "other.capture.jsonl"]
    assert _ids(store) == [f"{n:032x}" for n in range(6)]
    store.append(ROLLOUT, numbered_record(7))  # after expansion: a plain line again
    assert _ids(CaptureStore(tmp_path))[-1] == f"{7:032x}"


def test_an_empty_file_and_a_missing_one_are_left_alone(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.reset(ROLLOUT)  # dispatched, no call yet
    assert not store.compact(ROLLOUT)
    assert not store.compact("9-9")
    assert not store.expand(ROLLOUT)
    assert _names(tmp_path) == [f"{ROLLOUT}.capture.jsonl"]


def test_clear_removes_the_compressed_file_too(tmp_path: Path) -> None:
    store = _store_with(tmp_path, 2)
    store.compact(ROLLOUT)
    store.mark_incomplete(ROLLOUT)
    store.reset(ROLLOUT)
    assert _names(tmp_path) == [f"{ROLLOUT}.capture.jsonl"]
    assert store.read(ROLLOUT) == []


def test_a_frame_torn_by_a_crash_is_one_bad_line_and_the_next_append_reads(
    tmp_path: Path,
) -> None:
    store = _store_with(tmp_path, 3)
    store.compact(ROLLOUT)
    packed = store.file_for(ROLLOUT)
    with open(packed, "ab") as file:  # a late call's frame, cut short by the crash
        file.write(encode_frame(orjson_line(numbered_record(3)))[:-7])
    available = store.read_available(ROLLOUT)
    assert available.bad_lines == 1
    assert len(available.records) == 3
    with pytest.raises(CaptureReadError, match="no frame that decodes") as caught:
        store.read(ROLLOUT)
    assert caught.value.line_number == 4
    CaptureStore(tmp_path).append(ROLLOUT, numbered_record(4))
    available = store.read_available(ROLLOUT)
    assert [i for i, _ in available.records] == [0, 1, 2, 4]  # the gap keeps its index
    assert available.records[-1][1]["model_call_id"] == f"{4:032x}"
    attachment = capture_attachment(store, ROLLOUT)
    assert attachment["metrics"]["num_calls"] == 4
    assert [g["code"] for g in attachment["gaps"]] == ["model_call_capture_records_unreadable"]
    with pytest.raises(CaptureReadError):  # its plain form would lose the torn frame
        store.expand(ROLLOUT)
    assert packed.exists()


def test_a_corrupt_frame_costs_only_itself(tmp_path: Path) -> None:
    store = _store_with(tmp_path, 5)
    store.compact(ROLLOUT)
    store.append(ROLLOUT, numbered_record(5))
    packed = store.file_for(ROLLOUT)
    data = bytearray(packed.read_bytes())
    data[40] ^= 0xFF  # inside the compacted frame
    packed.write_bytes(bytes(data))
    available = store.read_available(ROLLOUT)
    assert available.bad_lines == 1
    assert [r["model_call_id"] for _, r in available.records] == [f"{5:032x}"]


def test_both_files_that_disagree_are_an_error_for_every_reader_never_a_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store_with(tmp_path, 3)
    store.compact(ROLLOUT)
    CaptureStore(tmp_path / "elsewhere").append(ROLLOUT, numbered_record(9))
    os.rename(tmp_path / "elsewhere" / f"{ROLLOUT}.capture.jsonl", store.path_for(ROLLOUT))
    for read in (store.read, store.read_available):
        with pytest.raises(CaptureConflictError, match="both exist and differ"):
            read(ROLLOUT)
    with pytest.raises(CaptureConflictError):
        store.compact(ROLLOUT)
    with pytest.raises(CaptureConflictError):
        store.expand(ROLLOUT)
    attachment = capture_attachment(store, ROLLOUT)
    assert [g["code"] for g in attachment["gaps"]] == ["model_call_capture_unreadable"]
    from rollcap.cli import main

    assert main(["capture", "compress", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"rollout {ROLLOUT}: left as it was:" in err
    assert "both exist" in err
    assert len(_names(tmp_path)) == 3  # both files and the other directory, untouched


def test_both_files_that_agree_read_once(tmp_path: Path) -> None:
    store = _store_with(tmp_path, 3)
    plain = store.path_for(ROLLOUT)
    data = plain.read_bytes()
    store.compact(ROLLOUT)
    plain.write_bytes(data + orjson_line(numbered_record(3)))  # a compaction that stopped short
    assert _ids(store) == [f"{n:032x}" for n in range(4)]
    assert store.compact(ROLLOUT)
    assert _names(tmp_path) == [f"{ROLLOUT}{COMPRESSED_CAPTURE_SUFFIX}"]
    assert _ids(store) == [f"{n:032x}" for n in range(4)]


def orjson_line(record: dict[str, object]) -> bytes:
    import orjson

    return orjson.dumps(record) + b"\n"


# -- kill -9 at every step ---------------------------------------------------------------------

# A child compacts (or expands) the rollout and SIGKILLs itself at one step; the parent then
# reads the directory with fresh stores. Each step is a system call the child wraps.
_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from rollcap.store import _files
    from rollcap.store import CaptureStore
    directory, rollout, verb, step = sys.argv[1:5]
    real = {name: getattr(os, name) for name in ("open", "write", "replace", "unlink")}
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def opened(path, flags, *args, **kwargs):
        if step == "before the write" and str(path).endswith(".tmp"):
            die()
        return real["open"](path, flags, *args, **kwargs)
    def write(fd, data):
        if step == "mid-write" and os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            real["write"](fd, bytes(data)[: len(data) // 2])
            die()
        return real["write"](fd, data)
    def replace(src, dst):
        if step == "before the rename":
            die()
        real["replace"](src, dst)
        if step == "after the rename":
            die()
    def unlink(path):
        if step == "before the removal" and not str(path).endswith(".tmp"):
            die()
        return real["unlink"](path)
    _files.os.open, _files.os.write = opened, write
    _files.os.replace, _files.os.unlink = replace, unlink
    store = CaptureStore(directory)
    getattr(store, verb)(rollout)
    print("finished without dying")
    """
)
STEPS = ["before the write", "mid-write", "before the rename", "after the rename",
         "before the removal"]  # fmt: skip


def _killed(tmp_path: Path, verb: str, step: str) -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), ROLLOUT, verb, step],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("verb", ["compact", "expand"])
def test_killed_at_any_step_every_record_reads_exactly_once(
    tmp_path: Path, verb: str, step: str
) -> None:
    store = _store_with(tmp_path, 12)
    expected = _ids(store)
    if verb == "expand":
        store.compact(ROLLOUT)
        store.append(ROLLOUT, numbered_record(12))  # a late frame too
        expected.append(f"{12:032x}")
    store.close()
    _killed(tmp_path, verb, step)
    fresh = CaptureStore(tmp_path)
    assert _ids(fresh) == expected  # strict: no bad line, none doubled
    assert fresh.rollout_ids() == [ROLLOUT]
    fresh.append(ROLLOUT, numbered_record(99))  # the rollout takes calls
    expected.append(f"{99:032x}")
    assert _ids(CaptureStore(tmp_path)) == expected
    # The interrupted pass, run again over the directory, finishes the job.
    again = compress_directory(tmp_path) if verb == "compact" else decompress_directory(tmp_path)
    assert again.failed == []
    left = _names(tmp_path)
    suffix = COMPRESSED_CAPTURE_SUFFIX if verb == "compact" else ".capture.jsonl"
    assert left == [f"{ROLLOUT}{suffix}"], left  # no leftover, no temporary
    assert _ids(CaptureStore(tmp_path)) == expected


# -- writers while compacting ------------------------------------------------------------------

WRITERS, APPENDS = 4, 60


def _append_all(directory: str, writer: int) -> None:
    store = CaptureStore(directory)
    for seq in range(APPENDS):
        store.append(ROLLOUT, {"writer": writer, "seq": seq, "pad": "p" * 2000})


def _flip(directory: str, rounds: int) -> None:
    # A pause between passes: an append that finds its file moved tries a bounded number of
    # times, and a compaction or expansion back to back with the next is no real workload.
    store = CaptureStore(directory)
    for _ in range(rounds):
        store.compact(ROLLOUT)
        time.sleep(0.005)
        store.expand(ROLLOUT)
        time.sleep(0.005)


@pytest.mark.slow
def test_writers_and_readers_during_compactions_lose_and_double_nothing(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append(ROLLOUT, {"writer": -1, "seq": 0})
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_all, args=(str(tmp_path), w)) for w in range(WRITERS)]
    procs.append(ctx.Process(target=_flip, args=(str(tmp_path), 40)))
    for proc in procs:
        proc.start()
    seen = 0
    while any(proc.is_alive() for proc in procs[:-1]):
        records = CaptureStore(tmp_path).read(ROLLOUT)  # strict, mid-flight
        assert len(records) >= seen  # never fewer than a read before saw
        seen = len(records)
    for proc in procs:
        proc.join(timeout=300)
        assert proc.exitcode == 0
    records = CaptureStore(tmp_path).read(ROLLOUT)
    for w in range(WRITERS):
        assert [r["seq"] for r in records if r["writer"] == w] == list(range(APPENDS))
    assert len(records) == WRITERS * APPENDS + 1


# -- a read-only directory ---------------------------------------------------------------------

_READER = textwrap.dedent(
    """
    import sys
    from rollcap.store import CaptureStore, compress_directory
    store = CaptureStore(sys.argv[1])
    print(len(store.read(sys.argv[2])), store.rollout_ids())
    done = compress_directory(sys.argv[1])
    print(done.changed, len(done.failed), done.failed[0][1] if done.failed else "")
    """
)


def test_a_read_only_directory_reads_both_forms_and_compaction_fails_keeping_all() -> None:
    # Not under pytest's temporary root, which only its owner may enter.
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        _read_only(Path(top) / "archive")


def _read_only(archive: Path) -> None:
    store = CaptureStore(archive)
    for rollout in ("0-0", "1-0"):
        for n in range(3):
            store.append(rollout, numbered_record(n))
    store.compact("0-0")
    for path in archive.iterdir():
        os.chmod(path, 0o444)
    os.chmod(archive, 0o555)
    before = {p.name: p.read_bytes() for p in archive.iterdir()}
    src = Path(__file__).resolve().parents[2] / "src"
    # As root, permissions stop nothing: the reader runs as nobody.
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [
            *(prefix if os.geteuid() == 0 else []),
            sys.executable,
            "-c",
            _READER,
            str(archive),
            "0-0",
        ],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=60,
        cwd="/",
    )
    os.chmod(archive, 0o700)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0] == "3 ['0-0', '1-0']"
    assert lines[1].startswith("0 1 ")
    assert "Permission denied" in lines[1]
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == before


def test_a_batch_shares_its_syncs_and_one_failure_fails_only_its_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.store._helpers import watch_fsyncs

    store = CaptureStore(tmp_path)
    ids = [f"{n}-0" for n in range(6)]
    for rollout in ids:
        for n in range(3):
            store.append(rollout, numbered_record(n))
    (tmp_path / f"{ids[2]}{COMPRESSED_CAPTURE_SUFFIX}").write_bytes(encode_frame(b"other\n"))
    synced = watch_fsyncs(monkeypatch)
    outcomes = store.compact_many([*ids, "9-9", "../bad"])
    assert outcomes[:2] == [True, True]
    assert isinstance(outcomes[2], CaptureConflictError)
    assert outcomes[3:6] == [True, True, True]
    assert outcomes[6] is False
    assert isinstance(outcomes[7], ValueError)
    assert synced.count(str(tmp_path)) == 2  # the directory: once to publish, once to remove
    assert len([name for name in synced if name.endswith(".tmp")]) == 5
    for rollout in ids[:2] + ids[3:]:
        assert len(store.read(rollout)) == 3
    assert store.path_for(ids[2]).exists()  # kept: its conflict is for a person to settle
