"""Rollouts files that may be compressed: streamed line by line, written a frame a batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollcap.store import CompressedFileError, FrameWriter, iter_lines, whole_frames_length
from rollcap.store._frames import Frame, read_frames

BATCHES = [[b'{"n": %d}\n' % (10 * b + i) for i in range(10)] for b in range(5)]


def _write(path: Path) -> None:
    writer = FrameWriter(path, level=5)
    for batch in BATCHES:
        writer.write(b"".join(batch))
    writer.write(b"")  # nothing: no frame
    writer.close()


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.zst"])
def test_a_file_written_in_batches_reads_back_line_by_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    _write(path)
    with iter_lines(path) as lines:
        assert list(lines) == [line for batch in BATCHES for line in batch]
    if name.endswith(".zst"):
        frames = list(read_frames(path.read_bytes()))
        assert len(frames) == len(BATCHES)
        assert all(isinstance(f, Frame) for f in frames)
        assert whole_frames_length(path) == path.stat().st_size
    else:
        assert path.read_bytes() == b"".join(line for batch in BATCHES for line in batch)


def test_a_frame_cut_short_is_an_error_naming_the_byte_and_its_length_is_known(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.jsonl.zst"
    _write(path)
    whole = path.stat().st_size
    last = list(read_frames(path.read_bytes()))[-1]
    with open(path, "r+b") as file:
        file.truncate(whole - 3)
    assert whole_frames_length(path) == last.start
    cut = f"byte {last.start}: the last frame is cut"
    with pytest.raises(CompressedFileError, match=cut), iter_lines(path) as lines:
        list(lines)


def test_a_corrupt_frame_is_an_error_even_for_the_length(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl.zst"
    _write(path)
    data = bytearray(path.read_bytes())
    second = list(read_frames(bytes(data)))[1]
    data[second.end - 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CompressedFileError, match=f"{path}: byte {second.start}: the frame does"):
        whole_frames_length(path)
    with pytest.raises(CompressedFileError), iter_lines(path) as lines:
        list(lines)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), iter_lines(tmp_path / "absent.jsonl.zst"):
        pass


def test_a_damaged_header_that_seems_to_run_to_the_end_is_not_cut(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl.zst"
    _write(path)
    data = bytearray(path.read_bytes())
    second = list(read_frames(bytes(data)))[1]
    data[second.start + 4] = 0x00  # a descriptor without its checksum flag: the end moves
    data[second.start + 6 : second.start + 9] = b"\xf8\xff\x00"  # a first block past the end
    path.write_bytes(bytes(data))
    with pytest.raises(CompressedFileError, match="a frame that decodes follows a frame cut"):
        whole_frames_length(path)
