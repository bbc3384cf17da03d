"""Rollouts files that may be compressed: streamed line by line, written a frame a batch."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rollcap.store import (
    CompressedFileError,
    FrameWriter,
    LineBatches,
    iter_lines,
    whole_frames_length,
)
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


def test_line_batches_write_a_plain_file_as_it_comes() -> None:
    target = io.BytesIO()
    out = LineBatches(target, compressed=False)
    out.write(b'{"a": 1}\n')
    assert target.getvalue() == b'{"a": 1}\n'  # nothing held back
    out.flush()
    assert target.getvalue() == b'{"a": 1}\n'


def test_line_batches_write_frames_of_whole_lines_about_frame_bytes_each() -> None:
    target = io.BytesIO()
    out = LineBatches(target, compressed=True, frame_bytes=20)
    lines = [b'{"n": %d, "pad": "xx"}\n' % n for n in range(5)]  # 21 bytes each
    for line in lines[:4]:
        out.write(line)
    out.write(lines[4][:10])  # a frame ends where the lines it was given end
    assert len(list(read_frames(target.getvalue()))) == 4
    out.flush()
    out.flush()  # nothing pending: no empty frame
    frames = list(read_frames(target.getvalue()))
    assert all(isinstance(frame, Frame) for frame in frames)
    contents = [frame.content for frame in frames if isinstance(frame, Frame)]
    assert contents == [*lines[:4], lines[4][:10]]
