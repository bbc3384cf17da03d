"""``CaptureStore``: one append-only JSONL file per rollout, durable line by line.

Appends take an exclusive ``flock`` on the rollout's file, write the whole line with one
``write``, release the lock and ``fsync`` before returning, so several model servers (processes,
or hosts on a filesystem with POSIX advisory locks) can append to one rollout without
interleaving, and a record reported as written survives a crash. Readers take a shared lock, so
they never see half a line that is being written; a torn line left by a crash is what
``read_available`` skips.

Everything here blocks; async callers run it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollcap.ids import validate_rollout_id
from rollcap.metrics import (
    GAP_INCOMPLETE,
    GAP_NO_RECORDS,
    GAP_RECORDS_UNREADABLE,
    GAP_UNREADABLE,
    Gap,
    aggregate_raw,
    build_attachment,
)
from rollcap.records import ModelCallRecord, RawRecord

__all__ = [
    "CAPTURE_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "AvailableRecords",
    "CaptureReadError",
    "CaptureStore",
    "aggregate_model_call_metrics",
    "capture_attachment",
    "read_model_call_records",
]

CAPTURE_SUFFIX = ".capture.jsonl"
INCOMPLETE_SUFFIX = ".capture.incomplete"
_DIR_MODE = 0o700
_FILE_MODE = 0o600


class CaptureReadError(ValueError):
    """A capture file holds a line that is not one JSON object (strict reads only)."""

    def __init__(self, path: Path, line_number: int, reason: str) -> None:
        super().__init__(f"{path}: line {line_number}: {reason}")
        self.path = path
        self.line_number = line_number


@dataclass(frozen=True, slots=True)
class AvailableRecords:
    """What a tolerant read found: ``(line_index, record)`` pairs and the count of bad lines."""

    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    bad_lines: int = 0


def _encode_line(record: RawRecord | Mapping[str, Any]) -> bytes:
    obj = record.to_json() if isinstance(record, RawRecord) else record
    if not isinstance(obj, Mapping):
        raise TypeError(f"a capture record must be a JSON object, not {type(obj).__name__}")
    # orjson never emits a raw newline inside a JSON document, so one record is one line.
    return orjson.dumps(obj) + b"\n"


def _parse_line(line: bytes) -> dict[str, Any] | str:
    """The record on ``line``, or the reason it is not one."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return f"not a JSON object (a {type(value).__name__})"
    return value


class CaptureStore:
    """The capture directory. Ids are validated before any path is built from them."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        # Appends build paths as strings: pathlib costs more than the syscalls of an append.
        self._prefix = os.path.join(os.fspath(directory), "")

    def __repr__(self) -> str:
        return f"CaptureStore({str(self.directory)!r})"

    def path_for(self, rollout_id: str) -> Path:
        return Path(self._file(rollout_id))

    def _file(self, rollout_id: str) -> str:
        return self._prefix + validate_rollout_id(rollout_id) + CAPTURE_SUFFIX

    def marker_for(self, rollout_id: str) -> Path:
        return self.directory / (validate_rollout_id(rollout_id) + INCOMPLETE_SUFFIX)

    def _ensure_directory(self) -> None:
        # mkdir's mode is masked by the umask, which is what a user expects for parents; the
        # capture directory itself holds prompts and answers and is kept private explicitly.
        if not self.directory.is_dir():
            self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            with contextlib.suppress(PermissionError):
                os.chmod(self.directory, _DIR_MODE)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _open_for_append(self, path: str) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # read: the torn-line check
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        self._ensure_directory()
        fd = os.open(path, flags | os.O_CREAT, _FILE_MODE)
        # A new directory entry is only durable once the directory itself is synced.
        try:
            self._fsync_directory()
        except BaseException:
            os.close(fd)
            raise
        return fd

    def append(self, rollout_id: str, record: RawRecord | Mapping[str, Any]) -> None:
        """Append one record durably; returns only after the line is fsynced."""
        path = self._file(rollout_id)
        line = _encode_line(record)
        fd = self._open_for_append(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # A crash tore the last line. Without this newline the new record would be glued
                # onto the torn one and lost with it.
                line = b"\n" + line
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            # The lock only has to keep lines from interleaving. Syncing after releasing it lets
            # the filesystem fold concurrent writers' syncs into one journal commit instead of
            # serialising one fsync per record behind the lock.
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _read_lines(self, path: str | Path) -> list[bytes]:
        """The file's lines under a shared lock; a missing file has none."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        lines = b"".join(chunks).split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        return lines

    def read(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every record in file order; raises ``CaptureReadError`` on the first bad line.

        A rollout with no file has no records: ``[]``.
        """
        path = self.path_for(rollout_id)
        records: list[dict[str, Any]] = []
        for number, line in enumerate(self._read_lines(path), start=1):
            parsed = _parse_line(line)
            if isinstance(parsed, str):
                raise CaptureReadError(path, number, parsed)
            records.append(parsed)
        return records

    def read_available(self, rollout_id: str) -> AvailableRecords:
        """Every whole record with its 0-based line index, skipping (and counting) bad lines."""
        good: list[tuple[int, dict[str, Any]]] = []
        bad = 0
        for index, line in enumerate(self._read_lines(self.path_for(rollout_id))):
            parsed = _parse_line(line)
            if isinstance(parsed, str):
                bad += 1
            else:
                good.append((index, parsed))
        return AvailableRecords(good, bad)

    def clear(self, rollout_id: str) -> None:
        """Remove the rollout's file and marker; a missing one is fine, any other error raises."""
        for path in (self.path_for(rollout_id), self.marker_for(rollout_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def mark_incomplete(self, rollout_id: str) -> None:
        """Leave the empty marker that says a write for this rollout failed."""
        path = self.marker_for(rollout_id)
        self._ensure_directory()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        os.close(fd)

    def is_incomplete(self, rollout_id: str) -> bool:
        return self.marker_for(rollout_id).exists()

    def rollout_ids(self) -> list[str]:
        """Ids of the rollouts that have a capture file, sorted."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(
            name[: -len(CAPTURE_SUFFIX)] for name in names if name.endswith(CAPTURE_SUFFIX)
        )


def read_model_call_records(
    store: CaptureStore, rollout_id: str, *, strict: bool = True
) -> list[ModelCallRecord]:
    """The rollout's calls, normalized, in file order; ``call_index`` is the line's index.

    ``strict=False`` skips lines that do not parse instead of raising.
    """
    if strict:
        return [
            ModelCallRecord.from_raw(raw, index) for index, raw in enumerate(store.read(rollout_id))
        ]
    return [
        ModelCallRecord.from_raw(raw, index)
        for index, raw in store.read_available(rollout_id).records
    ]


def aggregate_model_call_metrics(store: CaptureStore, rollout_id: str) -> dict[str, Any]:
    """Aggregate metrics of the rollout's calls (see ``rollcap.metrics.aggregate``).

    Strict, like ``read_model_call_records``: a bad line raises ``CaptureReadError``.
    """
    return aggregate_raw(store.read(rollout_id))


def capture_attachment(
    store: CaptureStore, rollout_id: str, *, payloads: bool = True
) -> dict[str, Any]:
    """The ``ng_model_call_capture`` object for one rollout, reading tolerantly.

    Whatever cannot be read becomes a gap rather than an error: the attachment is evidence about
    a rollout, and a damaged capture must not lose the rollout's own result.
    """
    gaps: list[Gap] = []
    records: list[ModelCallRecord] = []
    try:
        available = store.read_available(rollout_id)
    except OSError as exc:
        gaps.append(Gap(GAP_UNREADABLE, f"{type(exc).__name__}: {exc.strerror or exc}"))
    else:
        records = [ModelCallRecord.from_raw(raw, index) for index, raw in available.records]
        if available.bad_lines:
            gaps.append(Gap(GAP_RECORDS_UNREADABLE, f"count={available.bad_lines}"))
        if not records:
            gaps.append(Gap(GAP_NO_RECORDS))
    try:
        if store.is_incomplete(rollout_id):
            gaps.append(Gap(GAP_INCOMPLETE))
    except OSError as exc:
        gaps.append(Gap(GAP_UNREADABLE, f"{type(exc).__name__}: {exc.strerror or exc}"))
    return build_attachment(rollout_id, records, gaps, payloads=payloads)
