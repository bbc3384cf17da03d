"""A rollout's two forms: when they agree, and what a read of each gives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollcap.store._forms import (
    CaptureConflictError,
    CaptureReadError,
    Moved,
    check_agree,
    frame_entries,
    plain_entries,
    read_shared,
    strict_content,
)
from rollcap.store._frames import Gap, encode_frame


def test_a_compressed_file_whose_content_starts_the_plain_one_agrees() -> None:
    packed = encode_frame(b"a\n") + encode_frame(b"b\n")
    check_agree("p", b"a\nb\n", "z", packed)
    check_agree("p", b"a\nb\nc\n", "z", packed)  # the plain file grew after
    with pytest.raises(CaptureConflictError, match="p and z both exist and differ") as caught:
        check_agree("p", b"a\n", "z", packed)
    assert caught.value.errno == 17  # EEXIST
    with pytest.raises(CaptureConflictError):  # a compressed file that does not decode
        check_agree("p", b"a\nb\n", "z", packed[:-2])


def test_the_strict_content_joins_frames_as_lines_and_names_a_bad_stretch() -> None:
    assert strict_content("z", encode_frame(b"torn") + encode_frame(b"b\n")) == b"torn\nb\n"
    with pytest.raises(CaptureReadError, match="z: line 1: bytes 0-4 are no frame"):
        strict_content("z", b"junk")


def test_entries_keep_blank_lines_and_a_gap_for_each_bad_stretch() -> None:
    assert plain_entries(b"a\n\nb") == [b"a", b"", b"b"]
    entries = frame_entries(encode_frame(b"a\n") + b"junk" + encode_frame(b"b\nc"))
    assert entries[0] == b"a"
    assert isinstance(entries[1], Gap)
    assert entries[2:] == [b"b", b"c"]


def test_read_shared_reads_the_second_file_under_the_first_s_lock(tmp_path: Path) -> None:
    first, second = tmp_path / "1", tmp_path / "2"
    assert read_shared(str(first)) is None
    first.write_bytes(b"one")
    assert read_shared(str(first), then=str(second)) == (b"one", None)
    second.write_bytes(b"two")
    assert read_shared(str(first), then=str(second)) == (b"one", b"two")


def test_a_file_removed_between_open_and_lock_is_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    import fcntl

    real = fcntl.flock

    def flock(fd: int, op: int) -> None:
        os.unlink(path)  # a compaction finished meanwhile
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(Moved):
        read_shared(str(path))
