"""Zstandard frames holding JSON lines: encode one, find where each ends, decode them (pure).

A compressed JSONL file (``.capture.jsonl.zst``, a rollouts file ending ``.jsonl.zst``) is
complete Zstandard frames one after another; each frame holds whole lines of the plain form.
Appending is appending a frame, so a writer never rewrites what is there, and ``zstdcat``
reads the file as the plain form.

A frame's extent is read from its header and block headers (RFC 8878), without decompressing:
readers find every frame's boundaries at the cost of a few bytes per block, and a frame cut
short by a crash, or a corrupt one, is known by its offset. Every frame rollcap writes carries
its content checksum, so a corrupt frame never decodes to wrong bytes.

``read_frames`` is the tolerant read of a whole file: each frame's content, and each stretch
that is no frame (torn, corrupt, garbage) as a ``Gap`` up to the next frame that decodes.
``FrameStream`` is the strict incremental one, for files read in chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import zstandard

__all__ = [
    "DEFAULT_LEVEL",
    "MAGIC",
    "MAX_LEVEL",
    "ZSTD_SUFFIX",
    "BadFrame",
    "Frame",
    "FrameStream",
    "Gap",
    "NeedMore",
    "check_level",
    "decode_frame",
    "encode_frame",
    "frame_end",
    "is_compressed",
    "join_contents",
    "plain_name",
    "read_frames",
]

ZSTD_SUFFIX = ".zst"
MAGIC = b"\x28\xb5\x2f\xfd"  # 0xFD2FB528, little-endian
# Skippable frames (0x184D2A50..0x184D2A5F) carry no content; other tools may write them.
_SKIPPABLE_LOW = 0x184D2A50
DEFAULT_LEVEL = 3
MAX_LEVEL = 22
_BLOCK_RAW, _BLOCK_RLE, _BLOCK_COMPRESSED = 0, 1, 2
_Bytes = bytes | bytearray | memoryview


class NeedMore(Exception):
    """The bytes end inside a frame: more are needed to find its end (at the end of a file,
    a frame cut short)."""


class BadFrame(ValueError):
    """What starts at ``offset`` is not a frame that decodes; ``reason`` says why."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame that decoded: its bytes ``[start, end)`` in the file and its content."""

    start: int
    end: int
    content: bytes


@dataclass(frozen=True, slots=True)
class Gap:
    """Bytes ``[start, end)`` that hold no frame that decodes: ``reason`` is the first's why."""

    start: int
    end: int
    reason: str


def is_compressed(name: str) -> bool:
    """Whether the file name (or path) ``name`` names a compressed file: it ends ``.zst``."""
    return name.endswith(ZSTD_SUFFIX)


def plain_name(name: str) -> str:
    """``name`` without its ``.zst``: what a compressed file's sidecars are named after."""
    return name[: -len(ZSTD_SUFFIX)] if is_compressed(name) else name


def check_level(level: int) -> int:
    """``level`` if it is a Zstandard compression level rollcap writes (1..22), else
    ``ValueError``."""
    if type(level) is not int or not 1 <= level <= MAX_LEVEL:
        raise ValueError(f"a compression level is an int from 1 to {MAX_LEVEL}, not {level!r}")
    return level


def encode_frame(data: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """One complete frame holding ``data``, with its size and content checksum."""
    compressor = zstandard.ZstdCompressor(
        level=check_level(level), write_checksum=True, write_content_size=True
    )
    frame: bytes = compressor.compress(data)
    return frame


def frame_end(data: _Bytes, start: int) -> int:
    """Where the frame (or skippable frame) that starts at ``start`` ends.

    ``NeedMore`` when ``data`` ends first; ``BadFrame`` when the bytes there are no frame.
    """
    view = memoryview(data)
    magic = _need(view, start, 4)
    number = int.from_bytes(magic, "little")
    if number & 0xFFFFFFF0 == _SKIPPABLE_LOW:
        size = int.from_bytes(_need(view, start + 4, 4), "little")
        _need(view, start + 8, size)
        return start + 8 + size
    if magic != MAGIC:
        raise BadFrame(start, "no Zstandard frame starts here")
    descriptor = _need(view, start + 4, 1)[0]
    if descriptor & 0x08:
        raise BadFrame(start, "the frame header's reserved bit is set")
    single_segment = bool(descriptor & 0x20)
    size_flag = descriptor >> 6
    content_size = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    header = 1 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03] + content_size
    position = start + 4 + header
    while True:
        block = int.from_bytes(_need(view, position, 3), "little")
        kind = (block >> 1) & 0x03
        size = block >> 3
        if kind == _BLOCK_RLE:
            size = 1
        elif kind not in (_BLOCK_RAW, _BLOCK_COMPRESSED):
            raise BadFrame(start, f"a block of the reserved type at byte {position}")
        position += 3 + size
        if block & 0x01:  # the last block
            break
    if descriptor & 0x04:
        position += 4  # the content checksum
    _need(view, start, position - start)
    return position


def _need(view: memoryview, start: int, count: int) -> memoryview:
    if start + count > len(view):
        raise NeedMore
    return view[start : start + count]


def decode_frame(data: _Bytes, start: int = 0, end: int | None = None) -> bytes:
    """The content of the one frame ``data[start:end]`` (a skippable frame's is ``b""``).

    ``BadFrame`` (at ``start``) when it does not decode, its checksum does not match, or bytes
    follow it.
    """
    view = memoryview(data)[start:end]
    if len(view) >= 4 and int.from_bytes(view[:4], "little") & 0xFFFFFFF0 == _SKIPPABLE_LOW:
        return b""
    decoder = zstandard.ZstdDecompressor().decompressobj()
    try:
        content: bytes = decoder.decompress(view)
    except zstandard.ZstdError as exc:
        raise BadFrame(start, f"the frame does not decode ({exc})") from None
    if not decoder.eof:
        raise BadFrame(start, "the frame is cut short")
    if decoder.unused_data:
        raise BadFrame(start, "bytes follow the frame's end")
    return content


def read_frames(data: bytes) -> Iterator[Frame | Gap]:
    """Every frame of a whole file in order, and a ``Gap`` for each stretch between them that
    is no frame: a frame cut short at the end, a corrupt one, bytes that are no frame.

    After a gap the read goes on at the next place a frame starts and decodes (its magic
    number, then its checksum, make a false start there vanishingly unlikely), so a damaged
    frame costs only itself.
    """
    view = memoryview(data)
    position = 0
    gap: tuple[int, str] | None = None  # where the current gap started, and why
    while position < len(view):
        try:
            end = frame_end(view, position)
            content = decode_frame(view, position, end)
        except (NeedMore, BadFrame) as exc:
            if gap is None:
                gap = (position, exc.reason if isinstance(exc, BadFrame) else "cut short")
            found = data.find(MAGIC, position + 1)
            position = len(view) if found < 0 else found
            continue
        if gap is not None:
            yield Gap(gap[0], position, gap[1])
            gap = None
        yield Frame(position, end, content)
        position = end
    if gap is not None:
        yield Gap(gap[0], len(view), gap[1])


def join_contents(contents: list[bytes]) -> bytes:
    """The plain form of frames' contents: each frame holds whole lines, so one that ends
    without a newline (a torn line, kept as it was) is ended before the next frame's."""
    parts: list[bytes] = []
    for content in contents:
        if parts and not parts[-1].endswith(b"\n"):
            parts.append(b"\n")
        parts.append(content)
    return b"".join(parts)


class FrameStream:
    """The strict incremental reading of frames (sans-I/O): bytes in, frames' contents out.

    ``feed`` takes the file's next bytes and returns the contents of the frames they complete;
    ``offset`` is where the bytes not yet part of a whole frame begin, so a caller that stops
    at any point knows the length of the file's whole frames. ``close`` raises ``BadFrame``
    when the file ended inside a frame. Only one frame's bytes are held at a time.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.offset = 0  # of the file's first byte not in a whole frame

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        contents: list[bytes] = []
        position = 0
        while position < len(self._buffer):
            try:
                end = frame_end(self._buffer, position)
            except NeedMore:
                break
            except BadFrame as exc:
                raise BadFrame(self.offset + position, exc.reason) from None
            try:
                contents.append(decode_frame(self._buffer, position, end))
            except BadFrame as exc:
                raise BadFrame(self.offset + position, exc.reason) from None
            position = end
        if position:
            del self._buffer[:position]
            self.offset += position
        return contents

    def close(self) -> None:
        if self._buffer:
            raise BadFrame(self.offset, f"the last frame is cut short ({len(self._buffer)} bytes)")
