"""Staging sinks and sources: where a staged call becomes durable, and where it is read back.

A sink (``StagingSink``, STAGING §5.1) answers every ``stage`` with a ``StageResult``: ``ok``
means the record and every attachment it was given are durable together, under the returned
staging key; ``ok: false`` (with the reason in ``error``) means none of them is visible. A key
is written once: the same record and attachments again is an idempotent success, different
content for it is refused (``"conflicting record for key ..."``). Attachments are a mapping of
names to bytes-like values (anything the buffer protocol exposes); a name must be a safe file
name (``[A-Za-z0-9._-]``, not starting with ``.``, at most 255 bytes). They are opaque: never in
the record, its extras or any digest. A source (``StagingSource``) returns one base snapshot
(the record without its extras) per key asked, in the order asked.

Staging keys: ``<rollout_id>/<model_call_id>`` (the default key, ``staging_key``) whenever the
rollout id has no ``/``. Since ids are any non-empty strings, a rollout id with a ``/`` would
make that key ambiguous, so such a call's key is ``/<escaped rollout id>/<model_call_id>``
(see below; a default key never starts with ``/``). Keys are opaque to the gate and the trainer.

``DirectoryStagingSink`` layout, one directory per staged call, committed by one rename::

    <root>/<rollout>/<call>/record.json              the record's JSON (model_dump(mode="json"))
    <root>/<rollout>/<call>/attachments/<name>       one file per attachment, when there are some
    <root>/<rollout>/.staging-<host>-<pid>-<random>/  a write in progress or left by a crash

``<rollout>`` and ``<call>`` are the ids mapped to file names reversibly: an id matching
``[A-Za-z0-9_-][A-Za-z0-9._-]*`` is used as it is; any other id is ``%`` followed by its UTF-8
bytes with every byte outside ``[A-Za-z0-9._-]`` written ``%XX`` (upper-case hex), so ``a/b``
is ``%a%2Fb`` and ``.x`` is ``%.x``. An escaped name always starts with ``%``, which a kept id
never contains, so no two ids share a name, and no name starts with ``.``: readers skip every
dot entry, temporary directories included. A name is at most 255 bytes; a longer id cannot
be staged here (``ok: false``). (The mapping is case-sensitive: the root must be on a
case-sensitive file system.)

Committing: the record and its attachments are written into a temporary directory beside the
final one, each file and the directories fsync'd; the directory is renamed into place and the
rollout directory fsync'd. A reader sees the whole call or nothing; a crash leaves only a
temporary directory, which a later ``stage`` into that rollout removes once the process that
made it (same host) is gone. Everything here blocks (async callers run it in a thread) and is
safe to call from several threads and processes at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from rollcap.staging._records import (
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedRecordError,
    StageResult,
    parse_staged_record,
    staging_key,
)

__all__ = [
    "ATTACHMENTS_DIR",
    "RECORD_FILE",
    "DirectoryStagingSink",
    "InMemoryStagingSink",
    "StagingSink",
    "StagingSource",
    "decode_path_component",
    "encode_path_component",
]

RECORD_FILE = "record.json"
_MAX_SWEPT = 4096
ATTACHMENTS_DIR = "attachments"
_TEMP_PREFIX = ".staging-"
_NAME_MAX = 255
_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\Z")
_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_ESCAPE = "%"
_HEX_UPPER = frozenset("0123456789ABCDEF")
_HEX_LOWER = frozenset("0123456789abcdef")

# Temporary directories this process is writing right now, by absolute path, across every
# sink instance: a sweep by one instance must never remove another's write in progress.
_IN_FLIGHT: set[str] = set()
_IN_FLIGHT_LOCK = threading.Lock()


@runtime_checkable
class StagingSink(Protocol):
    """Makes one staged call durable (STAGING §5.1); thread-safe, called concurrently."""

    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> StageResult:
        """``ok`` with the staging key once the record (and every attachment) is durable;
        ``ok: false`` with the reason otherwise, nothing of it visible."""
        ...


@runtime_checkable
class StagingSource(Protocol):
    """Reads staged calls back by key (STAGING §5.1)."""

    def fetch(self, staging_keys: list[str]) -> list[StagedCallBaseSnapshot]:
        """Exactly one base snapshot (no extras) per key, in the order asked."""
        ...


def encode_path_component(value: str) -> str:
    """The file name of one id (see the module doc): kept, or ``%``-escaped; reversible.

    ``ValueError`` for an empty id or one whose name would exceed 255 bytes.
    """
    if not isinstance(value, str) or not value:
        raise ValueError("an id must be a non-empty string")
    if _SAFE.match(value):
        name = value
    else:
        name = _ESCAPE + "".join(
            chr(byte) if byte in _SAFE_BYTES else f"%{byte:02X}" for byte in value.encode("utf-8")
        )
    if len(name) > _NAME_MAX:
        raise ValueError(f"id {value[:40]!r}... is too long for a file name ({len(name)} bytes)")
    return name


def decode_path_component(name: str) -> str:
    """The id a file name stands for; ``ValueError`` for a name ``encode_path_component``
    never produces (a dot entry, a malformed or non-canonical escape)."""
    if not name.startswith(_ESCAPE):
        if not _SAFE.match(name):
            raise ValueError(f"{name!r} is not a staging file name")
        return name
    out = bytearray()
    index = 1
    while index < len(name):
        char = name[index]
        if char == _ESCAPE:
            digits = name[index + 1 : index + 3]
            if len(digits) != 2 or not _HEX_UPPER.issuperset(digits):
                raise ValueError(f"{name!r} has a malformed escape")
            out.append(int(digits, 16))
            index += 3
        else:
            out.append(ord(char))
            index += 1
    try:
        value = out.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name!r} does not escape UTF-8") from None
    # Only the canonical spelling is a name of ours: one id, one name.
    if encode_path_component(value) != name:
        raise ValueError(f"{name!r} is not the canonical name of {value!r}")
    return value


def _key_for(rollout_id: str, model_call_id: str) -> str:
    """This module's staging key for a call (the default key unless the rollout id has a /)."""
    if "/" in rollout_id:
        return f"/{encode_path_component(rollout_id)}/{model_call_id}"
    return staging_key(rollout_id, model_call_id)


def _ids_of(key: object) -> tuple[str, str]:
    """``(rollout_id, model_call_id)`` of a key ``_key_for`` makes; ``KeyError`` for others."""
    if not isinstance(key, str):
        raise TypeError(f"a staging key is a string, not {type(key).__name__}")
    if key.startswith("/"):
        name, _, call = key[1:].partition("/")
        try:
            rollout = decode_path_component(name)
        except ValueError:
            raise KeyError(f"no staged record for key {key!r}") from None
        if "/" not in rollout:
            raise KeyError(f"no staged record for key {key!r}")
    else:
        rollout, _, call = key.partition("/")
    if not rollout or not call:
        raise KeyError(f"no staged record for key {key!r}")
    return rollout, call


def _refused(error: str) -> StageResult:
    return StageResult(ok=False, error=error or "refused")


def _conflict(key: str) -> StageResult:
    return _refused(
        f"conflicting record for key {key!r}: a different record or attachment set is "
        "already staged under it"
    )


@dataclass(frozen=True, slots=True)
class _Prepared:
    key: str
    rollout_id: str
    data: bytes
    attachments: dict[str, bytes]


def _prepare(record: object, attachments: object) -> _Prepared:
    """Check and serialize what one ``stage`` was given; ``TypeError``/``ValueError`` if bad."""
    if not isinstance(record, StagedCallRecord):
        raise TypeError(f"record must be a StagedCallRecord, not {type(record).__name__}")
    data = orjson.dumps(record.model_dump(mode="json"))
    # What is stored must read back: a record built without validation is refused here,
    # not discovered by the trainer.
    if orjson.dumps(parse_staged_record(data).model_dump(mode="json")) != data:
        raise ValueError("the record does not read back as itself")
    blobs: dict[str, bytes] = {}
    if attachments is not None:
        if not isinstance(attachments, Mapping):
            raise TypeError(f"attachments must be a mapping, not {type(attachments).__name__}")
        for name, value in attachments.items():
            if not isinstance(name, str) or not _SAFE.match(name) or len(name) > _NAME_MAX:
                raise ValueError(
                    f"attachment name {name!r} is not a safe file name ([A-Za-z0-9._-], not "
                    "starting with '.', at most 255 bytes)"
                )
            if isinstance(value, bytes):
                blobs[name] = value
                continue
            try:
                blobs[name] = memoryview(value).tobytes()
            except TypeError:
                raise TypeError(
                    f"attachment {name!r} must be bytes-like, not {type(value).__name__}"
                ) from None
    key = _key_for(record.rollout_id, record.model_call_id)
    return _Prepared(key, record.rollout_id, data, blobs)


@dataclass(frozen=True, slots=True)
class _Entry:
    rollout_id: str
    data: bytes
    attachments: dict[str, bytes]


class InMemoryStagingSink:
    """A sink and source in this process's memory (tests, single-process demos).

    It follows ``DirectoryStagingSink``'s rules (keys, attachment names, idempotent re-stage,
    conflicts) and keeps each record as its serialized JSON, so what is fetched is a fresh
    parse, independent of the objects that were staged. It keeps everything it is given.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> StageResult:
        """Keep the record and attachments; see the module doc for the result."""
        try:
            prepared = _prepare(record, attachments)
        except (TypeError, ValueError) as exc:
            return _refused(str(exc))
        entry = _Entry(prepared.rollout_id, prepared.data, prepared.attachments)
        with self._lock:
            existing = self._entries.setdefault(prepared.key, entry)
        if existing is not entry and existing != entry:
            return _conflict(prepared.key)
        return StageResult(ok=True, staging_key=prepared.key)

    def _entry(self, key: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"no staged record for key {key!r}")
        return entry

    def fetch(self, staging_keys: list[str]) -> list[StagedCallBaseSnapshot]:
        """One base snapshot per key, in order; ``KeyError`` naming a missing key."""
        return [record.base() for record in self.fetch_records(staging_keys)]

    def fetch_records(self, staging_keys: list[str]) -> list[StagedCallRecord]:
        """One full record (with extras) per key, in order; ``KeyError`` for a missing key."""
        return [self.fetch_record(key) for key in _key_list(staging_keys)]

    def fetch_record(self, key: str) -> StagedCallRecord:
        """The full record staged under ``key``; ``KeyError`` when there is none."""
        return parse_staged_record(self._entry(key).data)

    def attachments(self, key: str) -> dict[str, bytes]:
        """The attachments staged with ``key`` (``{}`` when none); ``KeyError`` for no record."""
        return dict(self._entry(key).attachments)

    def rollout_keys(self, rollout_id: str) -> list[str]:
        """The keys of the rollout's staged calls, sorted."""
        with self._lock:
            return sorted(k for k, e in self._entries.items() if e.rollout_id == rollout_id)

    def rollouts(self) -> list[str]:
        """The ids of the rollouts with at least one staged call, sorted."""
        with self._lock:
            return sorted({entry.rollout_id for entry in self._entries.values()})


def _key_list(staging_keys: Iterable[str]) -> list[str]:
    # A single key passed where a list belongs would otherwise be read one character a key.
    if isinstance(staging_keys, str):
        raise TypeError("staging_keys must be a list of keys, not one string")
    return list(staging_keys)


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    # A rename or a new entry is durable only once the directory holding it is synced.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_token(text: str) -> bool:
    return len(text) == 32 and _HEX_LOWER.issuperset(text)


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        # Alive under another user, or a number no process has: keep it (the conservative
        # side of a cleanup is a leftover directory, never a removed live write).
        return False
    return False


class DirectoryStagingSink:
    """The durable sink and source: one directory per staged call under ``root``.

    See the module doc for the layout, the id-to-name mapping, the keys and how a call is
    committed. ``root`` is created when missing. Besides ``stage`` and ``fetch``:
    ``fetch_records`` / ``fetch_record`` (with extras), ``attachments``, ``rollout_keys`` and
    ``rollouts``. A record that cannot be read or is not a valid schema-2 record raises
    ``StagedRecordError`` (a schema-1 record, rollcap's earlier format, is named as such).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(os.path.abspath(root))
        self._root.mkdir(parents=True, exist_ok=True)
        # Host and pid name this process's temporary directories, so a sweep can tell a
        # crashed writer's leftovers from a live write.
        try:
            host = encode_path_component(socket.gethostname() or "host")[:64]
        except ValueError:
            host = "host"
        self._temp_stem = f"{_TEMP_PREFIX}{host}-"
        # Rollout directories already swept by this process: a crashed writer's leftovers are
        # there before this process first stages into one, so once each is enough (bounded: an
        # evicted one is swept again, which is only wasted work).
        self._swept: OrderedDict[str, None] = OrderedDict()
        self._swept_lock = threading.Lock()

    @property
    def root(self) -> Path:
        return self._root

    def _call_dir(self, rollout_id: str, model_call_id: str) -> Path:
        return self._root / encode_path_component(rollout_id) / encode_path_component(model_call_id)

    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> StageResult:
        """Commit the record and attachments in one rename; see the module doc.

        If syncing the rollout directory fails after the rename, the call is visible but
        reported ``ok: false``; staging it again then succeeds idempotently.
        """
        try:
            prepared = _prepare(record, attachments)
            final = self._call_dir(record.rollout_id, record.model_call_id)
        except (TypeError, ValueError) as exc:
            return _refused(str(exc))
        try:
            return self._commit(prepared, final)
        except OSError as exc:
            return _refused(f"staging {prepared.key!r} failed: {exc}")

    def _commit(self, prepared: _Prepared, final: Path) -> StageResult:
        existing = self._compare(prepared, final)
        if existing is not None:
            return existing
        rollout_dir = final.parent
        try:
            os.mkdir(rollout_dir, 0o755)
        except FileExistsError:
            pass
        else:
            try:
                _fsync_dir(self._root)
            except OSError:
                # Undone so that the next stage creates it again and retries the sync: a
                # later stage that finds it would not know the entry may not be durable.
                with contextlib.suppress(OSError):
                    os.rmdir(rollout_dir)
                raise
        self._sweep_once(rollout_dir)
        temp = rollout_dir / f"{self._temp_stem}{os.getpid()}-{uuid.uuid4().hex}"
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.add(str(temp))
        committed = False
        try:
            os.mkdir(temp, 0o755)
            _write_file(temp / RECORD_FILE, prepared.data)
            if prepared.attachments:
                folder = temp / ATTACHMENTS_DIR
                os.mkdir(folder, 0o755)
                for name, blob in prepared.attachments.items():
                    _write_file(folder / name, blob)
                _fsync_dir(folder)
            _fsync_dir(temp)
            try:
                os.rename(temp, final)
            except OSError:
                # Another writer committed the key first: the same content is a success.
                raced = self._compare(prepared, final)
                if raced is not None:
                    return raced
                raise
            committed = True
        finally:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.discard(str(temp))
            if not committed:
                shutil.rmtree(temp, ignore_errors=True)
        _fsync_dir(rollout_dir)
        return StageResult(ok=True, staging_key=prepared.key)

    def _compare(self, prepared: _Prepared, final: Path) -> StageResult | None:
        """None when nothing is committed at ``final``; else the result of staging again."""
        try:
            stored = (final / RECORD_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stored != prepared.data or _read_attachments(final) != prepared.attachments:
            return _conflict(prepared.key)
        return StageResult(ok=True, staging_key=prepared.key)

    def _sweep_once(self, rollout_dir: Path) -> None:
        key = str(rollout_dir)
        with self._swept_lock:
            if key in self._swept:
                self._swept.move_to_end(key)
                return
            self._swept[key] = None
            while len(self._swept) > _MAX_SWEPT:
                self._swept.popitem(last=False)
        self._sweep(rollout_dir)

    def _sweep(self, rollout_dir: Path) -> None:
        """Remove the temporary directories crashed writers of this host left."""
        pid_now = os.getpid()
        try:
            entries = list(os.scandir(rollout_dir))
        except OSError:
            return
        for entry in entries:
            if not entry.name.startswith(self._temp_stem):
                continue
            # Exactly "<pid>-<32 hex>" after the stem: another host whose name merely
            # starts like ours is never mistaken for this one.
            pid_text, _, token = entry.name[len(self._temp_stem) :].partition("-")
            if not (pid_text.isascii() and pid_text.isdigit()) or not _is_token(token):
                continue
            with _IN_FLIGHT_LOCK:
                if entry.path in _IN_FLIGHT:
                    continue
            pid = int(pid_text)
            if pid == pid_now or _process_gone(pid):
                shutil.rmtree(entry.path, ignore_errors=True)

    def fetch(self, staging_keys: list[str]) -> list[StagedCallBaseSnapshot]:
        """One base snapshot per key, in the order asked; ``KeyError`` naming a missing key,
        ``StagedRecordError`` for an unreadable or invalid record."""
        return [record.base() for record in self.fetch_records(staging_keys)]

    def fetch_records(self, staging_keys: list[str]) -> list[StagedCallRecord]:
        """One full record (with extras) per key, in order; errors as ``fetch``."""
        return [self.fetch_record(key) for key in _key_list(staging_keys)]

    def fetch_record(self, key: str) -> StagedCallRecord:
        """The full record staged under ``key``; errors as ``fetch``."""
        folder = self._folder_of(key)
        try:
            data = (folder / RECORD_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(f"no staged record for key {key!r}") from None
        except OSError as exc:
            raise StagedRecordError(f"staged record {key!r} cannot be read: {exc}") from exc
        try:
            record = parse_staged_record(data)
        except StagedRecordError as exc:
            raise StagedRecordError(f"staged record {key!r}: {exc}") from None
        if _key_for(record.rollout_id, record.model_call_id) != key:
            raise StagedRecordError(
                f"staged record {key!r} holds call {record.model_call_id!r} of rollout "
                f"{record.rollout_id!r}"
            )
        return record

    def _folder_of(self, key: str) -> Path:
        rollout_id, model_call_id = _ids_of(key)
        try:
            return self._call_dir(rollout_id, model_call_id)
        except ValueError:
            raise KeyError(f"no staged record for key {key!r}") from None

    def attachments(self, key: str) -> dict[str, bytes]:
        """The attachments staged with ``key`` (``{}`` when none); ``KeyError`` for no record."""
        folder = self._folder_of(key)
        if not (folder / RECORD_FILE).is_file():
            raise KeyError(f"no staged record for key {key!r}")
        return _read_attachments(folder)

    def rollout_keys(self, rollout_id: str) -> list[str]:
        """The keys of the rollout's committed calls, sorted (``[]`` for an unknown rollout)."""
        try:
            rollout_dir = self._root / encode_path_component(rollout_id)
            entries = list(os.scandir(rollout_dir))
        except (ValueError, FileNotFoundError, NotADirectoryError):
            return []
        keys = []
        for entry in entries:
            try:
                model_call_id = decode_path_component(entry.name)
            except ValueError:
                continue  # a temporary directory, or nothing of ours
            if os.path.isfile(os.path.join(entry.path, RECORD_FILE)):
                keys.append(_key_for(rollout_id, model_call_id))
        return sorted(keys)

    def rollouts(self) -> list[str]:
        """The ids of the rollouts with at least one committed call, sorted."""
        found = []
        for entry in os.scandir(self._root):
            try:
                rollout_id = decode_path_component(entry.name)
            except ValueError:
                continue
            if self.rollout_keys(rollout_id):
                found.append(rollout_id)
        return sorted(found)


def _read_attachments(folder: Path) -> dict[str, bytes]:
    try:
        entries = sorted(os.scandir(folder / ATTACHMENTS_DIR), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {entry.name: Path(entry.path).read_bytes() for entry in entries if entry.is_file()}
