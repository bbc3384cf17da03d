"""A rollout's file in its two forms, plain and compressed: reading them, and whether they agree.

A rollout's capture is ``<id><suffix>`` (JSON lines) or ``<id><suffix>.zst`` (Zstandard frames of
them, ``_frames``). Both present is the state a compaction or an expansion leaves when it stops
between publishing one and removing the other, and then the compressed file's content is the
start of the plain one's (``check_agree``); anything else is a conflict no read resolves.

Reads take shared ``flock`` locks, always the plain file's before the compressed one's.
Everything here blocks.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import orjson

from rollcap.store._frames import BadFrame, Frame, Gap, decode_frame, join_contents, read_frames

__all__ = [
    "TMP_SUFFIX",
    "CaptureConflictError",
    "CaptureReadError",
    "Moved",
    "check_agree",
    "decode_whole",
    "frame_entries",
    "plain_entries",
    "read_all",
    "read_shared",
    "read_unlocked",
    "strict_content",
]

# A compaction's or expansion's file before it is renamed into place: hidden, and named by no
# reader's suffix.
TMP_SUFFIX = ".tmp"


class CaptureReadError(orjson.JSONDecodeError):
    """A capture file holds a line that is not one JSON object (strict reads only).

    Also an ``orjson.JSONDecodeError`` (so a ``json.JSONDecodeError`` and a ``ValueError``):
    code written for NeMo Gym, whose strict read lets orjson's error through, catches it as
    that. Its text is ``<path>: line <n>: <reason>``; ``doc`` is the bad line, ``pos`` the
    offset in it where parsing failed, and ``lineno`` and ``colno`` place that in the file.
    """

    def __init__(
        self, path: Path, line_number: int, reason: str, doc: str = "", pos: int = 0
    ) -> None:
        message = f"{path}: line {line_number}: {reason}"
        super().__init__(message, doc, pos)
        # JSONDecodeError words its own text from doc and pos, which name the line, not the file.
        self.args = (message,)
        self.lineno = line_number
        self.path = path
        self.line_number = line_number
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # JSONDecodeError's would rebuild it from (msg, doc, pos), which are not our arguments.
        return (type(self), (self.path, self.line_number, self.reason, self.doc, self.pos))


class CaptureConflictError(OSError):
    """A rollout has a plain and a compressed capture file that disagree: rollcap never merges
    them, and every read of the rollout raises this (``errno.EEXIST``) until one is removed.

    They agree when the compressed file's content is the start of the plain one's: a
    compaction or an expansion stopped between publishing one and removing the other, and the
    plain file is read.
    """

    def __init__(self, plain: str, compressed: str) -> None:
        super().__init__(
            errno.EEXIST,
            f"{plain} and {compressed} both exist and differ; rollcap reads neither and never "
            "merges them: keep the one that holds the rollout and remove the other",
        )
        self.plain = plain
        self.compressed = compressed


class Moved(Exception):
    """The file was removed between being opened and locked (compacted, expanded, cleared)."""


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def read_unlocked(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_all(fd)
    finally:
        os.close(fd)


def read_shared(path: str, *, then: str | None = None) -> tuple[bytes, bytes | None] | None:
    """``path``'s bytes under a shared lock (None: no such file), and, read while that lock is
    still held, ``then``'s (None: none). ``Moved`` when ``path`` was removed before the lock
    was taken."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0:
            raise Moved
        data = read_all(fd)
        other = None if then is None else read_shared(then)
    finally:
        os.close(fd)
    return data, None if other is None else other[0]


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def plain_entries(data: bytes) -> list[bytes | Gap]:
    return list(_lines(data))


def frame_entries(data: bytes) -> list[bytes | Gap]:
    entries: list[bytes | Gap] = []
    for part in read_frames(data):
        if isinstance(part, Frame):
            # Each frame holds whole lines: a torn one at a frame's end stays a line of its own.
            entries.extend(_lines(part.content))
        else:
            entries.append(part)
    return entries


def strict_content(path: str, data: bytes) -> bytes:
    """The plain form of a compressed file; ``CaptureReadError`` at its first bad stretch."""
    contents: list[bytes] = []
    for part in read_frames(data):
        if isinstance(part, Gap):
            reason = f"bytes {part.start}-{part.end} are no frame that decodes ({part.reason})"
            raise CaptureReadError(Path(path), len(contents) + 1, reason)
        contents.append(part.content)
    return join_contents(contents)


def decode_whole(data: bytes) -> bytes:
    try:
        return decode_frame(data)
    except BadFrame:
        return b""  # never what was compressed (an empty file is never compacted)


def check_agree(plain: str, plain_data: bytes, packed: str, packed_data: bytes) -> None:
    """Raise ``CaptureConflictError`` unless the compressed file's content starts the plain
    one's: what a compaction or expansion leaves when it stops between its two steps."""
    try:
        content = strict_content(packed, packed_data)
    except CaptureReadError:
        raise CaptureConflictError(plain, packed) from None
    if not plain_data.startswith(content):
        raise CaptureConflictError(plain, packed)
