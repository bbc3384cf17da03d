"""Zstandard frames: our frames against the zstd tool's, and every way a file can be damaged."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcap.store._frames import (
    BadFrame,
    Frame,
    FrameStream,
    Gap,
    NeedMore,
    check_level,
    decode_frame,
    encode_frame,
    frame_end,
    is_compressed,
    join_contents,
    plain_name,
    read_frames,
)

LINES = [b'{"call": %d, "text": "%s"}\n' % (i, b"x" * i) for i in range(50)]
needs_zstd = pytest.mark.skipif(shutil.which("zstd") is None, reason="no zstd (make zstd)")


def test_a_frame_holds_its_bytes_and_its_extent_is_read_from_its_headers() -> None:
    data = b"".join(LINES)
    frame = encode_frame(data)
    assert len(frame) < len(data) / 3
    assert frame_end(frame + b"tail", 0) == len(frame)
    assert decode_frame(frame) == data
    with pytest.raises(BadFrame, match="bytes follow"):
        decode_frame(frame + frame)


@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=9))
def test_any_bytes_round_trip_at_any_level(data: bytes, level: int) -> None:
    frame = encode_frame(data, level)
    assert frame_end(frame, 0) == len(frame)
    assert decode_frame(frame) == data


def test_a_frame_cut_anywhere_needs_more_bytes() -> None:
    frame = encode_frame(b"".join(LINES))
    for cut in range(len(frame)):
        with pytest.raises((NeedMore, BadFrame)):
            decode_frame(frame[:cut], 0, frame_end(frame[:cut], 0))


def test_bytes_that_are_no_frame_are_said_to_be_so() -> None:
    with pytest.raises(BadFrame, match="no Zstandard frame"):
        frame_end(b"not a frame at all", 0)
    frame = bytearray(encode_frame(b"abc\n"))
    frame[4] |= 0x08  # the reserved bit of the header
    with pytest.raises(BadFrame, match="reserved bit"):
        frame_end(bytes(frame), 0)


def test_read_frames_gives_each_frame_and_a_gap_for_each_damaged_stretch() -> None:
    first, second, third = (encode_frame(line) for line in LINES[:3])
    torn = second[:-3]
    corrupt = bytearray(encode_frame(b"".join(LINES[10:20])))
    corrupt[len(corrupt) // 2] ^= 0xFF
    data = first + torn + third + bytes(corrupt) + b"junk" + first + third[:5]
    parts = list(read_frames(data))
    kinds = [type(part).__name__ for part in parts]
    assert kinds == ["Frame", "Gap", "Frame", "Gap", "Frame", "Gap"]
    frames = [part for part in parts if isinstance(part, Frame)]
    assert [f.content for f in frames] == [LINES[0], LINES[2], LINES[0]]
    gaps = [part for part in parts if isinstance(part, Gap)]
    assert gaps[0].start == len(first)
    assert gaps[-1].end == len(data)
    # Every byte is in exactly one part, in order.
    assert parts[0].start == 0
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))


def test_skippable_frames_are_skipped() -> None:
    skippable = (0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    data = skippable + encode_frame(b"x\n")
    assert [p.content for p in read_frames(data) if isinstance(p, Frame)] == [b"", b"x\n"]


def test_the_stream_reads_byte_by_byte_and_knows_where_whole_frames_end() -> None:
    frames = [encode_frame(b"".join(LINES[i : i + 5])) for i in range(0, 50, 5)]
    data = b"".join(frames)
    stream = FrameStream()
    out = [content for i in range(len(data)) for content in stream.feed(data[i : i + 1])]
    assert b"".join(out) == b"".join(LINES)
    stream.close()
    cut = FrameStream()
    cut.feed(data[:-4])
    assert cut.offset == len(data) - len(frames[-1])
    with pytest.raises(BadFrame, match="cut short") as caught:
        cut.close()
    assert caught.value.offset == cut.offset


def test_the_stream_names_the_byte_of_a_corrupt_frame() -> None:
    good = encode_frame(b"a\n")
    bad = bytearray(encode_frame(b"".join(LINES)))
    bad[-2] ^= 0xFF  # in the checksum
    with pytest.raises(BadFrame, match="does not decode") as caught:
        FrameStream().feed(good + bytes(bad))
    assert caught.value.offset == len(good)


def test_contents_join_as_lines_each_frame_its_own() -> None:
    assert join_contents([b"a\n", b"torn", b"b\n"]) == b"a\ntorn\nb\n"
    assert join_contents([b"a\nb"]) == b"a\nb"


def test_levels_and_names() -> None:
    assert check_level(19) == 19
    for bad in (0, 23, True, "3"):
        with pytest.raises(ValueError, match="1 to 22"):
            check_level(bad)  # type: ignore[arg-type]
    assert is_compressed("x.jsonl.zst")
    assert not is_compressed("x.jsonl")
    assert plain_name("x.jsonl.zst") == "x.jsonl"
    assert plain_name("x.jsonl") == "x.jsonl"


@needs_zstd
def test_the_zstd_tool_reads_our_frames_and_we_read_its(tmp_path: Path) -> None:
    ours = tmp_path / "ours.zst"
    ours.write_bytes(b"".join(encode_frame(line) for line in LINES))
    assert subprocess.run(["zstd", "-dc", ours], capture_output=True, check=True).stdout == (
        b"".join(LINES)
    )
    subprocess.run(["zstd", "-t", ours], capture_output=True, check=True)
    theirs = []
    for index, level in enumerate(("-1", "-19", "--ultra")):
        plain = tmp_path / f"p{index}"
        plain.write_bytes(b"".join(LINES[index * 10 : index * 10 + 10]))
        args = ["zstd", "-q", level, *(["-22"] if level == "--ultra" else []), "-c", str(plain)]
        theirs.append(subprocess.run(args, capture_output=True, check=True).stdout)
    contents = [p.content for p in read_frames(b"".join(theirs)) if isinstance(p, Frame)]
    assert b"".join(contents) == b"".join(LINES[:30])
