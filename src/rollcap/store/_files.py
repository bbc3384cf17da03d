"""``CaptureStore``: one append-only JSONL file per rollout, durable line by line.

Appends take an exclusive ``flock`` on the rollout's file, write the whole line with one
``write``, release the lock and ``fsync`` before returning, so several model servers (processes,
or hosts on a filesystem with POSIX advisory locks) can append to one rollout without
interleaving, and a record reported as written survives a crash. Readers take a shared lock, so
they never see half a line that is being written; a torn line left by a crash is what
``read_available`` skips.

A store keeps the files it appends to open, and threads appending to one file at the same time
share one write and one fsync (``_group_commit``). A cached descriptor whose file was removed or
replaced under it (another process's ``reset``; on NFS a silly-renamed file, or ``ESTALE``) is
found out under the lock and the record goes to the file at the path instead.

Everything here blocks; async callers run it in a thread (the model server's ``RecordWriter``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollcap.ids import validate_rollout_id
from rollcap.metrics import aggregate_raw
from rollcap.records import ModelCallRecord, RawRecord
from rollcap.store._compaction import Steps, compact_many, expand
from rollcap.store._forms import (
    CaptureConflictError,
    CaptureReadError,
    Moved,
    check_agree,
    frame_entries,
    plain_entries,
    read_shared,
)
from rollcap.store._frames import DEFAULT_LEVEL, ZSTD_SUFFIX, Gap, check_level
from rollcap.store._group_commit import Handle, Pending, Sync, commit, finish
from rollcap.store._shared import on_shared_filesystem
from rollcap.store._sync import SyncMode, check_sync, resolve_sync, syncfs

__all__ = [
    "CAPTURE_SUFFIX",
    "COMPRESSED_CAPTURE_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "AvailableRecords",
    "CaptureConflictError",
    "CaptureReadError",
    "CaptureStore",
    "aggregate_model_call_metrics",
    "read_model_call_records",
]

CAPTURE_SUFFIX = ".capture.jsonl"
COMPRESSED_CAPTURE_SUFFIX = CAPTURE_SUFFIX + ZSTD_SUFFIX
INCOMPLETE_SUFFIX = ".capture.incomplete"
_DIR_MODE = 0o700
_FILE_MODE = 0o600
# How many threads append_many syncs a batch's files in; each syncs its share one by one.
# bench/store.py --sync: 16 beat 4 by 1.3-2.5x for batches of 8 and 64 files, on ext4 and xfs.
_SYNC_LANES = 16
# An append whose file keeps being removed or replaced under it gives up after this many tries;
# so does a read whose files keep being compacted or expanded under it.
_STALE_RETRIES = 8


@dataclass(frozen=True, slots=True)
class AvailableRecords:
    """What a tolerant read found: ``(line_index, record)`` pairs and the count of bad lines."""

    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    bad_lines: int = 0


def _encode_line(record: RawRecord | Mapping[str, Any]) -> bytes:
    obj = record.to_json() if isinstance(record, RawRecord) else record
    if not isinstance(obj, Mapping):
        raise TypeError(f"a capture record must be a JSON object, not {type(obj).__name__}")
    # orjson never emits a raw newline inside a JSON document, so one record is one line. A
    # value JSON has no type for (a Path) is written as its str(), as NeMo Gym's store does.
    return orjson.dumps(obj, default=str, option=orjson.OPT_APPEND_NEWLINE)


def _parse_line(line: bytes) -> dict[str, Any] | tuple[str, int]:
    """The record on ``line``, or the reason it is not one and where in the line it fails."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})", exc.pos
    if not isinstance(value, dict):
        return f"not a JSON object (a {type(value).__name__})", 0
    return value


@dataclass(slots=True)
class _FileBatch:
    """One file's share of an ``append_many`` call: which items, their lines, their fate."""

    path: str
    indexes: list[int]  # the items whose lines these are, in order
    handle: Handle
    created: bool  # by this call: its directory entry is not durable until the directory sync
    pending: Pending  # the items' lines, written with one write
    sync: Sync | None = None  # written, the fsync still to do


def _fail(indexes: list[int], exc: BaseException, results: list[Any]) -> None:
    for i in indexes:
        results[i] = exc


def _finish_lane(
    lane: list[_FileBatch], timed: Callable[[float], None] | None
) -> list[bool | BaseException]:
    """Sync a lane's files one after the other (in one of ``append_many``'s sync threads),
    telling ``timed`` how long each sync took."""
    out: list[bool | BaseException] = []
    for batch in lane:
        assert batch.sync is not None
        started = time.perf_counter()
        out.append(finish(batch.handle, batch.pending, batch.sync))
        if timed is not None:
            timed(time.perf_counter() - started)
    return out


class CaptureStore:
    """The capture directory. Ids are validated before any path is built from them.

    Appends keep up to ``max_open`` rollout files open (least recently used go first);
    ``close()``, or leaving a ``with`` block, closes them, and a later append reopens.

    ``check_identity``: before each write, under the lock, check that a cached descriptor is
    still the file at its path (one ``stat``). On a local filesystem a file removed or replaced
    under a descriptor has no link left, which the write sees anyway; on NFS a file removed on
    this host while open is renamed to ``.nfsXXXX`` and keeps its link. Default: on for a
    filesystem other hosts mount (``on_shared_filesystem``), off otherwise.

    ``sync``: how ``append_many`` makes a batch of several files durable (``_sync``):
    ``"fsync"`` each file, one ``"syncfs"`` for the filesystem, or ``"auto"`` (``syncfs`` on
    ext4 and xfs, else ``fsync``). One file alone (``append``, a batch of one rollout) is
    always synced by its ``fsync``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_open: int = 256,
        suffix: str = CAPTURE_SUFFIX,
        marker_suffix: str = INCOMPLETE_SUFFIX,
        check_identity: bool | None = None,
        sync: str = "auto",
    ) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        if suffix == marker_suffix or not suffix.startswith(".") or "/" in suffix + marker_suffix:
            raise ValueError(f"bad file suffixes {suffix!r}, {marker_suffix!r}")
        self.directory = Path(directory)
        # Other per-rollout JSONL files (the token ledger) reuse the same durable appends.
        self._suffix = suffix
        self._marker_suffix = marker_suffix
        # Appends build paths as strings: pathlib costs more than the syscalls of an append.
        self._prefix = os.path.join(os.fspath(directory), "")
        self._max_open = max_open
        if check_identity is None:
            check_identity = on_shared_filesystem(directory)
        self._check_identity = check_identity
        self._sync_asked = check_sync(sync)
        # Resolved on the first append_many (it reads the mount table): readers never need it.
        self._sync: SyncMode | None = None if sync == "auto" else resolve_sync(sync, directory)
        self._lock = threading.Lock()  # guards _handles
        self._handles: OrderedDict[str, Handle] = OrderedDict()  # least recently used first
        self._sync_pool: ThreadPoolExecutor | None = None  # append_many's syncs, made on use
        # A directory sync for new files failed: their entries may not be durable yet.
        self._directory_unsynced = False
        # Told how long each file sync of ``append_many`` took, in seconds, from its thread.
        self.sync_timed: Callable[[float], None] | None = None
        _STORES.add(self)

    def __repr__(self) -> str:
        return f"CaptureStore({str(self.directory)!r})"

    def __enter__(self) -> CaptureStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Descriptors are plain ints: nothing else would close them with the store. At
        # interpreter exit the process closes them, and module globals may already be gone.
        if hasattr(self, "_handles") and not sys.is_finalizing():
            self.close()

    def close(self) -> None:
        """Close every cached descriptor (an append in flight closes its own when done).

        The store stays usable: a later append opens its file again.
        """
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            handle.retire()

    def _forget_after_fork(self) -> None:
        # A thread of the parent may have held the lock at the fork: replaced, not taken.
        self._lock = threading.Lock()
        self._handles = OrderedDict()
        self._sync_pool = None  # its threads did not survive the fork

    def path_for(self, rollout_id: str) -> Path:
        return Path(self._file(rollout_id))

    def marker_for(self, rollout_id: str) -> Path:
        """Where the rollout's incomplete marker is (or would be)."""
        return Path(self._marker(rollout_id))

    def _file(self, rollout_id: str) -> str:
        return self._prefix + validate_rollout_id(rollout_id) + self._suffix

    def _marker(self, rollout_id: str) -> str:
        return self._prefix + validate_rollout_id(rollout_id) + self._marker_suffix

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

    def _open_for_append(self, path: str, *, sync_new: bool) -> tuple[Handle, bool]:
        """The handle of the rollout's file, and whether the file was created (its directory
        entry then needs a directory sync to be durable: done here when ``sync_new``, else by
        the caller). A rollout compacted already gets its compressed file, each batch then
        appended as a frame; the plain file is created only when neither exists."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # read: the torn-line check
        identity = self._check_identity
        try:
            return Handle(os.open(path, flags), path if identity else None), False
        except FileNotFoundError:
            pass
        packed = path + ZSTD_SUFFIX
        try:
            fd = os.open(packed, flags)
        except FileNotFoundError:
            pass
        else:
            return Handle(fd, packed if identity else None, level=DEFAULT_LEVEL), False
        self._ensure_directory()
        fd = os.open(path, flags | os.O_CREAT, _FILE_MODE)
        if sync_new:
            try:
                self._fsync_directory()
            except BaseException:
                os.close(fd)
                raise
        return Handle(fd, path if identity else None), True

    def _checkout(self, path: str, *, sync_new: bool = True) -> tuple[Handle, bool]:
        """The cached handle of ``path``, opened (and created) if need be; and whether the file
        was created by this call, its directory not yet synced unless ``sync_new``."""
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None and not handle.retired:
                self._handles.move_to_end(path)
                return handle, False
        # Opening may create the file and sync the directory: not under the store-wide lock.
        handle, created = self._open_for_append(path, sync_new=sync_new)
        with self._lock:
            stale = [self._handles.pop(path, None)]  # retired, or opened by a racing thread
            self._handles[path] = handle
            while len(self._handles) > self._max_open:
                stale.append(self._handles.popitem(last=False)[1])
        for old in stale:
            if old is not None:
                old.retire()
        return handle, created

    def _drop(self, path: str, handle: Handle) -> None:
        with self._lock:
            if self._handles.get(path) is handle:
                del self._handles[path]
        handle.retire()

    def append(self, rollout_id: str, record: RawRecord | Mapping[str, Any]) -> None:
        """Append one record durably; returns only after the line is fsynced."""
        path = self._file(rollout_id)
        line = _encode_line(record)
        for _ in range(_STALE_RETRIES):
            handle, _ = self._checkout(path)
            outcome = commit(handle, Pending(line))
            if outcome is True:
                if self._directory_unsynced:  # see append_many
                    self._fsync_directory()
                    self._directory_unsynced = False
                return
            # After a failure the descriptor's state is unknown; after False it is stale.
            self._drop(path, handle)
            if isinstance(outcome, BaseException):
                raise outcome
        raise OSError(
            errno.ESTALE, f"{path} was removed or replaced {_STALE_RETRIES} times while appending"
        )

    def append_many(
        self, items: Sequence[tuple[str, RawRecord | Mapping[str, Any]]]
    ) -> list[BaseException | None]:
        """Append records of many rollouts durably: each file is written, then all are synced.

        For a single writer thread serving many calls: the syncs follow all the writes and
        overlap, so they share the device's flushes (and, on a journaling filesystem, a journal
        commit) instead of paying one each. Returns each item's failure, or None once its line
        is written and synced. One file's failure fails only that file's items.
        """
        results: list[BaseException | None] = [None] * len(items)
        files = self._open_all(items, results)
        # A batch of one file is synced alone: a syncfs costs more than one file's fsync. The
        # syncfs also makes new files' directory entries durable; fsyncs need the directory's.
        whole = len(files) > 1 and self.sync_mode == "syncfs"
        if not whole:
            files = self._sync_new_entries(files, results)
        stale: list[_FileBatch] = []  # unlinked under us: appended again, one by one
        written = self._write_all(files, results, stale)
        if whole:
            self._syncfs_all(written, results, stale)
        else:
            self._sync_all(written, results, stale)
        for batch in stale:
            for i in batch.indexes:
                try:
                    self.append(items[i][0], items[i][1])
                except Exception as exc:
                    results[i] = exc
        return results

    @property
    def sync_mode(self) -> SyncMode:
        """How ``append_many`` makes a batch durable here: ``"fsync"`` or ``"syncfs"``."""
        if self._sync is None:
            self._sync = resolve_sync(self._sync_asked, self.directory)
        return self._sync

    def _open_all(
        self, items: Sequence[tuple[str, RawRecord | Mapping[str, Any]]], results: list[Any]
    ) -> list[_FileBatch]:
        """Each file's lines and its handle open (its directory entry, if it was created, not
        yet durable)."""
        lines: list[bytes] = [b""] * len(items)
        groups: dict[str, list[int]] = {}
        for index, (rollout_id, record) in enumerate(items):
            try:
                path = self._file(rollout_id)
                lines[index] = _encode_line(record)
            except Exception as exc:
                results[index] = exc
                continue
            groups.setdefault(path, []).append(index)
        files: list[_FileBatch] = []
        for path, indexes in groups.items():
            try:
                handle, new = self._checkout(path, sync_new=False)
            except Exception as exc:  # this file only: the other rollouts' records go on
                _fail(indexes, exc, results)
                continue
            pending = Pending(b"".join([lines[i] for i in indexes]))
            for i in indexes:
                lines[i] = b""  # joined: held once, not twice, while the batch is written
            files.append(_FileBatch(path, indexes, handle, new, pending))
        return files

    def _sync_new_entries(self, files: list[_FileBatch], results: list[Any]) -> list[_FileBatch]:
        """Make the directory entries of the files the batch created durable; the files left
        (a new file whose entry could not be synced fails)."""
        created = [batch for batch in files if batch.created]
        if created or self._directory_unsynced:
            # Every file this batch created is in the one directory: one sync makes all
            # their entries durable (a collection run creates a file per rollout).
            try:
                self._fsync_directory()
                self._directory_unsynced = False
            except Exception as exc:
                # The files stay; until a directory sync succeeds, later appends sync it too.
                self._directory_unsynced = True
                for batch in created:
                    self._drop(batch.path, batch.handle)
                    _fail(batch.indexes, exc, results)
                files = [batch for batch in files if not batch.created]
        return files

    def _write_all(
        self, files: list[_FileBatch], results: list[Any], stale: list[_FileBatch]
    ) -> list[_FileBatch]:
        """Write each file's lines, leaving the syncs for later; the files still to sync."""
        written: list[_FileBatch] = []
        for batch in files:
            outcome = commit(batch.handle, batch.pending, defer=True)
            if isinstance(outcome, Sync):
                batch.sync = outcome
                written.append(batch)
            else:
                self._settle(batch, outcome, results, stale)
        return written

    def _sync_all(
        self, files: list[_FileBatch], results: list[Any], stale: list[_FileBatch]
    ) -> None:
        if len(files) == 1:
            self._settle(files[0], _finish_lane(files, self.sync_timed)[0], results, stale)
            return
        # One sync after another would bound the batch's rate by the device's flush time;
        # syncs that overlap share the flush. A few lanes of syncs overlap enough, and a
        # thread per file costs more in thread switches than it saves.
        lanes = [files[i::_SYNC_LANES] for i in range(min(_SYNC_LANES, len(files)))]
        pool = self._syncs()
        finished = [pool.submit(_finish_lane, lane, self.sync_timed) for lane in lanes]
        for lane, future in zip(lanes, finished, strict=True):
            for batch, outcome in zip(lane, future.result(), strict=True):
                self._settle(batch, outcome, results, stale)

    def _syncfs_all(
        self, files: list[_FileBatch], results: list[Any], stale: list[_FileBatch]
    ) -> None:
        """One ``syncfs`` makes every written file durable, and the entries of new ones."""
        # A written file's descriptor stays open until its batch is finished; one whose write
        # failed, or found it stale, may be closed already.
        fd = next((b.sync.fd for b in files if b.sync is not None and b.sync.outcome is True), -1)
        outcome: bool | BaseException = True
        if fd >= 0:
            started = time.perf_counter()
            try:
                syncfs(fd)
            except BaseException as exc:
                # Which file's writeback failed is not told: every record of the batch fails.
                outcome = exc
            if self.sync_timed is not None:
                self.sync_timed(time.perf_counter() - started)
        for batch in files:
            assert batch.sync is not None
            self._settle(
                batch, finish(batch.handle, batch.pending, batch.sync, outcome), results, stale
            )

    def _settle(
        self,
        batch: _FileBatch,
        outcome: bool | BaseException,
        results: list[Any],
        stale: list[_FileBatch],
    ) -> None:
        if outcome is True:
            return
        # As in append: after a failure the descriptor's state is unknown; False: stale.
        self._drop(batch.path, batch.handle)
        if isinstance(outcome, BaseException):
            _fail(batch.indexes, outcome, results)
        else:
            stale.append(batch)

    def _syncs(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._sync_pool is None:
                self._sync_pool = ThreadPoolExecutor(
                    max_workers=_SYNC_LANES, thread_name_prefix="rollcap-sync"
                )
            return self._sync_pool

    def _entries(self, rollout_id: str) -> tuple[str, list[bytes | Gap]]:
        """The file read and its lines (blank ones too), a ``Gap`` for each stretch of a compressed
        file that decodes to none; a rollout with no file has none.

        Read under shared locks. The plain file's lock is held while the compressed one is
        read, and compaction holds it exclusively until the plain file is gone, so the two are
        never read from different sides of one compaction.
        """
        plain = self._file(rollout_id)
        packed = plain + ZSTD_SUFFIX
        for _ in range(_STALE_RETRIES):
            try:
                data = read_shared(plain, then=packed)
            except Moved:
                continue
            if data is not None:
                plain_data, packed_data = data
                if packed_data is not None:
                    check_agree(plain, plain_data, packed, packed_data)
                return plain, plain_entries(plain_data)
            try:
                packed_only = read_shared(packed)
            except Moved:
                continue
            if packed_only is not None:
                return packed, frame_entries(packed_only[0])
            if not os.path.exists(plain):  # else published by an expansion meanwhile
                return plain, []
        raise OSError(
            errno.ESTALE, f"{plain} was compacted or expanded {_STALE_RETRIES} times while read"
        )

    def read(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every record in file order; raises ``CaptureReadError`` on the first bad line.

        A rollout with no file has no records: ``[]``. A blank (whitespace-only) line is no
        record and no error, as in ``read_available`` (and in NeMo Gym's readers); an error
        names the line by its number in the file, blank lines counted. A compressed file reads
        as its plain form; a stretch of it that decodes to nothing is a bad line.
        ``CaptureConflictError`` when both forms exist and differ.
        """
        path, entries = self._entries(rollout_id)
        records: list[dict[str, Any]] = []
        for number, line in enumerate(entries, start=1):
            if not isinstance(line, Gap) and not line.strip():
                continue
            if isinstance(line, Gap):
                reason = f"bytes {line.start}-{line.end} are no frame that decodes ({line.reason})"
                raise CaptureReadError(Path(path), number, reason)
            parsed = _parse_line(line)
            if isinstance(parsed, tuple):
                reason, pos = parsed
                doc = line.decode("utf-8", errors="replace")
                raise CaptureReadError(Path(path), number, reason, doc, pos)
            records.append(parsed)
        return records

    def read_available(self, rollout_id: str) -> AvailableRecords:
        """Every whole record with its 0-based index, skipping (and counting) bad lines.

        A bad line keeps its index, so the records after it keep theirs; a blank line is no
        record at all: it is neither counted nor given an index. A stretch of a compressed file
        that decodes to nothing (a frame cut short by a crash, a corrupt one) is one bad line.
        ``CaptureConflictError`` when both forms exist and differ.
        """
        good: list[tuple[int, dict[str, Any]]] = []
        bad = 0
        entries = self._entries(rollout_id)[1]
        lines = (line for line in entries if isinstance(line, Gap) or line.strip())
        for index, line in enumerate(lines):
            parsed = line if isinstance(line, Gap) else _parse_line(line)
            if isinstance(parsed, dict):
                good.append((index, parsed))
            else:
                bad += 1
        return AvailableRecords(good, bad)

    def file_for(self, rollout_id: str) -> Path:
        """The rollout's capture file as it is now: the plain one, else the compressed one if
        it exists (else the plain one's path, where a first record would go)."""
        plain = self.path_for(rollout_id)
        packed = plain.with_name(plain.name + ZSTD_SUFFIX)
        return packed if not plain.exists() and packed.exists() else plain

    def compact(self, rollout_id: str, *, level: int = DEFAULT_LEVEL) -> bool:
        """Compact the rollout's plain file into ``<file>.zst``: one frame, verified, durable
        (``_compaction``). Appends that come later add frames to the compressed file.

        False, with nothing done, when there is no plain file or it is empty (a rollout with no
        call yet); a failure raises and keeps the plain file (``CaptureConflictError`` when a
        compressed file that disagrees is there).
        """
        outcome = self.compact_many([rollout_id], level=level)[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def compact_many(
        self, rollout_ids: Sequence[str], *, level: int = DEFAULT_LEVEL
    ) -> list[bool | BaseException]:
        """``compact`` for each rollout, the fsyncs of each step shared by all: each one's
        outcome (True, False, or its failure; an invalid id fails only itself)."""
        paths: list[str] = []
        failures: dict[int, BaseException] = {}
        for index, rollout_id in enumerate(rollout_ids):
            try:
                paths.append(self._file(rollout_id))
            except ValueError as exc:
                failures[index] = exc
        done = iter(compact_many(paths, check_level(level), self._steps()))
        return [failures[i] if i in failures else next(done) for i in range(len(rollout_ids))]

    def expand(self, rollout_id: str) -> bool:
        """Undo ``compact`` (``_compaction.expand``): False when there is no compressed file."""
        return expand(self._file(rollout_id), self._steps())

    def _steps(self) -> Steps:
        return Steps(self._fsync_all, self._fsync_directory, self._forget)

    def _fsync_all(self, fds: list[int]) -> list[BaseException | None]:
        """Sync the files together (their syncs overlap, in the sync lanes)."""
        if len(fds) <= 1:
            return [_fsync_one(fd) for fd in fds]
        lanes = [fds[i::_SYNC_LANES] for i in range(min(_SYNC_LANES, len(fds)))]
        pool = self._syncs()
        finished = [pool.submit(_fsync_lane, lane) for lane in lanes]
        outcomes: dict[int, BaseException | None] = {}
        for lane, future in zip(lanes, finished, strict=True):
            outcomes.update(zip(lane, future.result(), strict=True))
        return [outcomes[fd] for fd in fds]

    def _forget(self, path: str) -> None:
        """Retire the cached descriptor of the rollout whose file (either form) is ``path``."""
        key = path[: -len(ZSTD_SUFFIX)] if path.endswith(ZSTD_SUFFIX) else path
        with self._lock:
            handle = self._handles.pop(key, None)
        if handle is not None:
            handle.retire()

    def clear(self, rollout_id: str) -> None:
        """Remove the rollout's file and marker; a missing one is fine, any other error raises."""
        with self._lock:
            handle = self._handles.pop(self._file(rollout_id), None)
        if handle is not None:
            handle.retire()
        # String paths: collection clears and reads a rollout's files on every dispatch, and
        # building Path objects cost more than the system calls.
        plain = self._file(rollout_id)
        for path in (plain, plain + ZSTD_SUFFIX, self._marker(rollout_id)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def reset(self, rollout_id: str) -> None:
        """``clear``, then leave the rollout's file empty: dispatched, no calls recorded yet."""
        self.clear(rollout_id)
        self._touch(self._file(rollout_id))

    def mark_incomplete(self, rollout_id: str) -> None:
        """Leave the empty marker that says a write for this rollout failed."""
        self._touch(self._marker(rollout_id))

    def _touch(self, path: str) -> None:
        """Make sure ``path`` exists (private, its content kept), and the directory with it."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, _FILE_MODE)
        except FileNotFoundError:  # no directory yet
            self._ensure_directory()
            fd = os.open(path, flags, _FILE_MODE)
        os.close(fd)

    def has_capture(self, rollout_id: str) -> bool:
        """Whether the rollout's file (plain or compressed) or its incomplete marker exists (one
        that cannot be looked at counts as absent)."""
        plain = self._file(rollout_id)
        return any(
            os.path.exists(path) for path in (plain, plain + ZSTD_SUFFIX, self._marker(rollout_id))
        )

    def is_incomplete(self, rollout_id: str) -> bool:
        try:
            os.stat(self._marker(rollout_id))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True  # other errors raise: an attachment reports the marker as unreadable

    def rollout_ids(self, *, compressed: bool | None = None) -> list[str]:
        """Ids of the rollouts that have a capture file, plain or compressed, sorted, each once.

        ``compressed``: only those with a compressed file (True) or a plain one (False).
        """
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        packed = self._suffix + ZSTD_SUFFIX
        ids: set[str] = set()
        for name in names:
            if name.endswith(self._suffix) and compressed is not True:
                ids.add(name[: -len(self._suffix)])
            elif name.endswith(packed) and compressed is not False and not name.startswith("."):
                ids.add(name[: -len(packed)])
        return sorted(ids)


_STORES: weakref.WeakSet[CaptureStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Runs after the group commit's own handler has closed the inherited descriptors.
    for store in list(_STORES):
        store._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _fsync_one(fd: int) -> BaseException | None:
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc
    return None


def _fsync_lane(fds: list[int]) -> list[BaseException | None]:
    return [_fsync_one(fd) for fd in fds]


def read_model_call_records(
    store: CaptureStore, rollout_id: str, *, strict: bool = True
) -> list[ModelCallRecord]:
    """The rollout's calls, normalized, in file order; ``call_index`` is the line's index.

    Blank lines are skipped and take no index. ``strict=False`` skips lines that do not parse
    instead of raising ``CaptureReadError``.
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
