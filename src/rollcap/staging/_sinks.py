"""Staging sinks: where a staged call becomes durable, and where it is read back.

A sink's contract: when ``stage`` returns, the record and every attachment are durable and
visible together; when it raises, none of them is visible. A staging key is written once.

``DirectoryStagingSink`` layout (one directory per call, committed by one rename)::

    <root>/<rollout_id>/<model_call_id>/record.json
    <root>/<rollout_id>/<model_call_id>/attachments/<name>      (only when there are some)
    <root>/<rollout_id>/.tmp-<model_call_id>-<random>/           (in progress; never read)

Everything here blocks; async callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from rollcap.ids import validate_rollout_id
from rollcap.staging._records import (
    MODEL_CALL_ID_PATTERN,
    StagedCallRecord,
    StagedRecordError,
    staging_key,
    validate_model_call_id,
)

__all__ = [
    "ATTACHMENT_NAME_PATTERN",
    "RECORD_FILE",
    "DirectoryStagingSink",
    "InMemoryStagingSink",
    "StagingSink",
    "StagingSource",
    "split_staging_key",
]

RECORD_FILE = "record.json"
ATTACHMENTS_DIR = "attachments"
_TEMP_PREFIX = ".tmp-"
# Attachment names become file names: no separators, no leading dot, nothing to escape with.
ATTACHMENT_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z", re.ASCII)
_DIR_MODE = 0o700
_FILE_MODE = 0o600


@runtime_checkable
class StagingSink(Protocol):
    """Makes one staged call durable.

    ``stage`` returns only once the record (and its attachments, when given) are durable and
    visible together, and raises, leaving nothing visible, when it cannot. Attachments are
    opaque bytes stored beside the record; they are never part of the record or its digests.
    """

    def stage(
        self,
        record: StagedCallRecord,
        *,
        attachments: Mapping[str, Any] | None = None,
    ) -> None: ...


@runtime_checkable
class StagingSource(Protocol):
    """Reads staged calls back (what ``linearize`` reads from)."""

    def read(self, rollout_id: str) -> list[StagedCallRecord]: ...

    def read_attachments(self, staging_key: str) -> dict[str, bytes]: ...


def split_staging_key(key: str) -> tuple[str, str]:
    """``(rollout_id, model_call_id)`` of a valid staging key, else ``ValueError``."""
    if not isinstance(key, str) or key.count("/") != 1:
        raise ValueError(f"invalid staging key {key!r}: must be <rollout_id>/<model_call_id>")
    rollout_id, model_call_id = key.split("/")
    return validate_rollout_id(rollout_id), validate_model_call_id(model_call_id)


def _attachment_bytes(attachments: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Check every attachment before anything is written: a bad one fails the whole stage."""
    if attachments is None:
        return {}
    if not isinstance(attachments, Mapping):
        raise TypeError(f"attachments must be a mapping, not {type(attachments).__name__}")
    out: dict[str, bytes] = {}
    for name, value in attachments.items():
        if not isinstance(name, str) or ATTACHMENT_NAME_PATTERN.match(name) is None:
            raise ValueError(
                f"invalid attachment name {name!r}: must match {ATTACHMENT_NAME_PATTERN.pattern}",
            )
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(
                f"attachment {name!r} is a {type(value).__name__}; attachments must be bytes-like",
            )
        out[name] = bytes(value)
    return out


def _checked(record: object, attachments: Mapping[str, Any] | None) -> dict[str, bytes]:
    """What every sink refuses before it stores anything; the attachments as bytes."""
    if not isinstance(record, StagedCallRecord):
        raise TypeError(f"record must be a StagedCallRecord, not {type(record).__name__}")
    return _attachment_bytes(attachments)


class InMemoryStagingSink:
    """The in-memory twin of ``DirectoryStagingSink``, for tests: same checks, no files."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, StagedCallRecord] = {}
        self._attachments: dict[str, dict[str, bytes]] = {}

    def stage(
        self,
        record: StagedCallRecord,
        *,
        attachments: Mapping[str, Any] | None = None,
    ) -> None:
        stored = _checked(record, attachments)
        with self._lock:
            if record.staging_key in self._records:
                raise FileExistsError(f"staging key {record.staging_key} is already staged")
            self._records[record.staging_key] = record
            self._attachments[record.staging_key] = stored

    @property
    def records(self) -> list[StagedCallRecord]:
        """Every staged record, in staging order."""
        with self._lock:
            return list(self._records.values())

    def read(self, rollout_id: str) -> list[StagedCallRecord]:
        validate_rollout_id(rollout_id)
        with self._lock:
            return [r for r in self._records.values() if r.rollout_id == rollout_id]

    def read_attachments(self, staging_key: str) -> dict[str, bytes]:
        split_staging_key(staging_key)
        with self._lock:
            if staging_key not in self._attachments:
                raise KeyError(staging_key)
            return dict(self._attachments[staging_key])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """Create ``path`` (never overwrite), write all of ``data`` and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir_durable(path: Path) -> None:
    """Create ``path`` and its missing parents, fsyncing each new entry's parent."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=_DIR_MODE)
        _fsync_dir(directory.parent)


class DirectoryStagingSink:
    """The reference sink: one directory per staged call, committed atomically and durably.

    A call is written into a temporary directory beside its final place (record, then each
    attachment, each fsynced), the temporary directory is fsynced, renamed to
    ``<root>/<rollout_id>/<model_call_id>``, and the rollout directory is fsynced. A failure at
    any step removes the temporary directory, so a reader sees the whole call or nothing.
    Several processes may stage into one root; a staging key that exists is refused.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _rollout_dir(self, rollout_id: str) -> Path:
        return self.root / validate_rollout_id(rollout_id)

    def _call_dir(self, rollout_id: str, model_call_id: str) -> Path:
        return self._rollout_dir(rollout_id) / validate_model_call_id(model_call_id)

    def stage(
        self,
        record: StagedCallRecord,
        *,
        attachments: Mapping[str, Any] | None = None,
    ) -> None:
        stored = _checked(record, attachments)
        final = self._call_dir(record.rollout_id, record.model_call_id)
        if final.exists():
            raise FileExistsError(f"staging key {record.staging_key} is already staged")
        rollout_dir = final.parent
        _mkdir_durable(rollout_dir)
        temp = rollout_dir / f"{_TEMP_PREFIX}{record.model_call_id}-{secrets.token_hex(8)}"
        temp.mkdir(mode=_DIR_MODE)
        try:
            _write_file(temp / RECORD_FILE, orjson.dumps(record.to_json()))
            if stored:
                attachment_dir = temp / ATTACHMENTS_DIR
                attachment_dir.mkdir(mode=_DIR_MODE)
                for name, data in stored.items():
                    _write_file(attachment_dir / name, data)
                _fsync_dir(attachment_dir)
            _fsync_dir(temp)
            # rename(2) onto a non-empty directory fails, so two writers of one key cannot
            # both win even when both passed the exists() check above.
            try:
                os.rename(temp, final)
            except OSError as exc:
                if final.exists():
                    raise FileExistsError(
                        f"staging key {record.staging_key} is already staged",
                    ) from exc
                raise
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        _fsync_dir(rollout_dir)

    def read(self, rollout_id: str) -> list[StagedCallRecord]:
        """Every staged record of the rollout, ordered by model call id; [] when none.

        ``StagedRecordError`` (naming the call) for a record that cannot be read or does not
        belong where it is stored. Digests are not checked here: ``linearize`` does that.
        """
        rollout_dir = self._rollout_dir(rollout_id)
        try:
            names = sorted(os.listdir(rollout_dir))
        except FileNotFoundError:
            return []
        records: list[StagedCallRecord] = []
        for name in names:
            if name.startswith(_TEMP_PREFIX):
                continue
            key = staging_key(rollout_id, name)
            if MODEL_CALL_ID_PATTERN.match(name) is None:
                raise StagedRecordError(
                    f"unexpected entry {name!r} in staged rollout {rollout_id}",
                    model_call_id=None,
                    staging_key=None,
                )
            records.append(self._read_record(rollout_dir / name, rollout_id, name, key))
        return records

    @staticmethod
    def _read_record(
        call_dir: Path,
        rollout_id: str,
        model_call_id: str,
        key: str,
    ) -> StagedCallRecord:
        def fail(why: str) -> StagedRecordError:
            return StagedRecordError(
                f"staged call {model_call_id} ({key}): {why}",
                model_call_id=model_call_id,
                staging_key=key,
            )

        try:
            data = (call_dir / RECORD_FILE).read_bytes()
        except OSError as exc:
            raise fail(f"cannot read {RECORD_FILE}: {exc}") from None
        try:
            record = StagedCallRecord.from_json(orjson.loads(data))
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise fail(f"malformed {RECORD_FILE}: {exc}") from None
        if record.rollout_id != rollout_id or record.model_call_id != model_call_id:
            raise fail(f"{RECORD_FILE} belongs to {record.staging_key}")
        return record

    def read_attachments(self, staging_key: str) -> dict[str, bytes]:
        """The attachments staged with the call; ``KeyError`` when the call is not staged."""
        rollout_id, model_call_id = split_staging_key(staging_key)
        call_dir = self._call_dir(rollout_id, model_call_id)
        if not (call_dir / RECORD_FILE).is_file():
            raise KeyError(staging_key)
        attachment_dir = call_dir / ATTACHMENTS_DIR
        if not attachment_dir.is_dir():
            return {}
        return {p.name: p.read_bytes() for p in sorted(attachment_dir.iterdir()) if p.is_file()}
