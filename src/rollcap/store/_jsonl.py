"""JSONL files that may be compressed: a name ending ``.zst`` holds Zstandard frames (``_frames``).

For rollouts files and their kin, read and written whole or in batches: ``iter_lines`` streams
a file's lines with one frame's bytes held at a time; ``FrameWriter`` appends one complete frame
per batch; ``LineBatches`` writes a file rewritten whole (sorted, reattached) in frames of about
a MiB of lines each; ``whole_frames_length`` says where a file's last whole frame ends, so a
resumed run can cut a frame a crash left half-written, as it cuts a torn line. Every read of a
compressed file is strict: a corrupt frame, or one cut short, raises ``CompressedFileError``
naming the file and the byte, never a silent loss of the lines behind it.

Everything here blocks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from rollcap.store._frames import (
    DEFAULT_LEVEL,
    BadFrame,
    Frame,
    FrameStream,
    encode_frame,
    is_compressed,
    read_frames,
)

__all__ = [
    "CompressedFileError",
    "FrameWriter",
    "LineBatches",
    "iter_lines",
    "whole_frames_length",
]

_CHUNK = 1 << 20
# A compressed file written whole: about this much plain text per frame (a reader holds one).
FRAME_BYTES = 1 << 20


class CompressedFileError(ValueError):
    """A compressed file holds a frame that does not decode, or ends inside one."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


def _contents(path: Path, source: IO[bytes]) -> Iterator[bytes]:
    stream = FrameStream()
    try:
        while chunk := source.read(_CHUNK):
            yield from stream.feed(chunk)
        stream.close()
    except BadFrame as exc:
        raise CompressedFileError(path, exc.offset, exc.reason) from None


def _lines(contents: Iterable[bytes]) -> Iterator[bytes]:
    # A frame holds whole lines: one that ends without a newline is a line of its own.
    for content in contents:
        yield from content.splitlines(keepends=True)


@contextmanager
def iter_lines(path: str | os.PathLike[str]) -> Iterator[Iterator[bytes]]:
    """The file's lines, newline kept, plain or compressed; raises ``FileNotFoundError``.

    Use as ``with iter_lines(path) as lines: for line in lines``. A compressed file's last
    line of a frame that lacks a newline is yielded as it is, as a plain file's torn last line
    is; a bad frame raises ``CompressedFileError`` when the read reaches it.
    """
    file = Path(path)
    with open(file, "rb") as source:
        if is_compressed(file.name):
            yield _lines(_contents(file, source))
        else:
            yield iter(source)


def whole_frames_length(path: str | os.PathLike[str]) -> int:
    """The length of the compressed file's whole frames from its start: its size, unless a
    crash left its last frame cut short. A corrupt frame raises ``CompressedFileError``, and so
    does a frame that decodes behind one that seems cut short (a damaged header, not a crash:
    cutting there would lose it); a missing file is ``FileNotFoundError``."""
    file = Path(path)
    stream = FrameStream()
    with open(file, "rb") as source:
        try:
            while chunk := source.read(_CHUNK):
                stream.feed(chunk)
        except BadFrame as exc:
            raise CompressedFileError(file, exc.offset, exc.reason) from None
        source.seek(stream.offset)
        rest = source.read()
    if any(isinstance(part, Frame) for part in read_frames(rest)):
        reason = "a frame that decodes follows a frame cut short: the file is damaged"
        raise CompressedFileError(file, stream.offset, reason)
    return stream.offset


class FrameWriter:
    """Appends batches of lines to a file, each batch one write: a compressed file gets each
    as one complete frame (level ``level``), a plain one gets the lines as they are.

    ``write`` then ``flush`` is the whole of a batch; the file is opened for appending, and
    created, on the first batch.
    """

    def __init__(self, path: str | os.PathLike[str], *, level: int = DEFAULT_LEVEL) -> None:
        self.path = Path(path)
        self.compressed = is_compressed(self.path.name)
        self.level = level
        self._handle: IO[bytes] | None = None

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole lines) and flush it to the file."""
        if not data:
            return
        if self._handle is None:
            self._handle = open(self.path, "ab")  # noqa: SIM115 (closed in close)
        self._handle.write(encode_frame(data, self.level) if self.compressed else data)
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class LineBatches:
    """Whole lines (newline included) written to ``target``: as they come when it is plain; as
    frames of about ``frame_bytes`` of lines each when ``compressed``, a frame always ending at
    a line's end. ``flush`` writes what is pending (the last frame); nothing is fsynced here.
    """

    def __init__(
        self,
        target: IO[bytes],
        *,
        compressed: bool,
        frame_bytes: int = FRAME_BYTES,
        level: int = DEFAULT_LEVEL,
    ) -> None:
        self.target = target
        self.level = level
        self.compressed = compressed
        self.frame_bytes = frame_bytes
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, line: bytes) -> None:
        if not self.compressed:
            self.target.write(line)
            return
        self._pending.append(line)
        self._size += len(line)
        if self._size >= self.frame_bytes:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self.target.write(encode_frame(b"".join(self._pending), self.level))
            self._pending.clear()
            self._size = 0
