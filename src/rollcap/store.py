"""``CaptureStore``: one append-only JSONL file per rollout, durable line by line.

Appends take an exclusive ``flock`` on the rollout's file, write the whole line with one
``write``, release the lock and ``fsync`` before returning, so several model servers (processes,
or hosts on a filesystem with POSIX advisory locks) can append to one rollout without
interleaving, and a record reported as written survives a crash. Readers take a shared lock, so
they never see half a line that is being written; a torn line left by a crash is what
``read_available`` skips.

A store keeps the files it appends to open, and threads appending to one file at the same time
share one write and one fsync (group commit): under many threads the cost of an append is
mostly the number of syscalls that release the GIL, not the syscalls themselves.

Everything here blocks; async callers run it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollcap.ids import validate_rollout_id
from rollcap.metrics import aggregate_raw, build_attachment
from rollcap.records import ModelCallRecord, RawRecord, capture_gaps

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
# Threads append_many syncs a batch's files in, each its share one after another.
_SYNC_LANES = 4


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
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def _parse_line(line: bytes) -> dict[str, Any] | str:
    """The record on ``line``, or the reason it is not one."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return f"not a JSON object (a {type(value).__name__})"
    return value


class _Handle:
    """One cached descriptor of a rollout file, shared by this process's threads.

    flock locks belong to the open file description, so they do not keep this process's
    threads apart. Threads appending at the same time queue their lines instead; one of them,
    the leader, writes the whole queue with one write under the flock, hands the lead to the
    first thread that queued meanwhile, then syncs, so one batch is written while the one
    before it is being synced (group commit).
    """

    __slots__ = ("__weakref__", "end", "fd", "leading", "lock", "queue", "retired", "syncing")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()  # guards every field but ``end``, which only leaders use
        self.queue: list[_Pending] = []  # lines no leader has taken yet
        self.leading = False  # a leader is writing, or is chosen; always so while queue is not []
        self.syncing = 0  # threads in fsync(fd)
        # Out of the cache: lines queued already still go through fd, which is closed once no
        # leader and no sync uses it.
        self.retired = False
        # The file's size right after the last write through fd (-1: unknown). While the size
        # still equals it, the last byte is known to be our newline.
        self.end = -1
        _HANDLES.add(self)

    def retire(self) -> None:
        with self.lock:
            self.retired = True
            fd = self.take_unused_fd()
        if fd >= 0:
            os.close(fd)

    def take_unused_fd(self) -> int:
        """Under ``lock``: the descriptor, to be closed by the caller, once retired and unused."""
        if not self.retired or self.leading or self.syncing or self.fd < 0:
            return -1
        fd, self.fd = self.fd, -1
        return fd

    def pass_lead(self) -> _Pending | None:
        """Under ``lock``: the queued line whose thread is to lead next, or None."""
        if not self.queue:
            self.leading = False
            return None
        successor = self.queue[0]
        successor.lead = True
        return successor

    def withdraw(self, pending: _Pending) -> None:
        """An interrupted thread leaves before leading: its line is taken back, its lead passed."""
        with self.lock:
            if pending not in self.queue:
                return  # a leader has it: it is written or failed anyway
            self.queue.remove(pending)
            successor = self.pass_lead() if pending.lead else None
            fd = self.take_unused_fd()
        if successor is not None:
            successor.wake.release()
        if fd >= 0:
            os.close(fd)


class _Pending:
    """One line on its way to the file, and how its thread learns its fate."""

    __slots__ = ("lead", "line", "outcome", "wake")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.lead = False  # its thread is to lead the next batch
        # True: written and synced. False: not written, the descriptor went stale (the file
        # was unlinked, the descriptor closed): try again with a fresh one. Else the failure.
        self.outcome: bool | BaseException = False
        self.wake = threading.Lock()  # released once lead or outcome is set
        self.wake.acquire()


@dataclass(frozen=True, slots=True)
class _Sync:
    """A leader's batch after its write: what its sync must settle."""

    fd: int
    batch: list[_Pending]
    outcome: bool | BaseException


class CaptureStore:
    """The capture directory. Ids are validated before any path is built from them.

    Appends keep up to ``max_open`` rollout files open (least recently used go first);
    ``close()``, or leaving a ``with`` block, closes them, and a later append reopens.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_open: int = 256,
        suffix: str = CAPTURE_SUFFIX,
        marker_suffix: str = INCOMPLETE_SUFFIX,
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
        self._lock = threading.Lock()  # guards _handles
        self._handles: OrderedDict[str, _Handle] = OrderedDict()  # least recently used first
        self._sync_pool: ThreadPoolExecutor | None = None  # append_many's syncs, made on use
        # A directory sync for new files failed: their entries may not be durable yet.
        self._directory_unsynced = False
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

    def _file(self, rollout_id: str) -> str:
        return self._prefix + validate_rollout_id(rollout_id) + self._suffix

    def marker_for(self, rollout_id: str) -> Path:
        return Path(self._marker(rollout_id))

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

    def _open_for_append(self, path: str, *, sync_new: bool) -> tuple[int, bool]:
        """The descriptor, and whether the file was created (its directory entry then needs a
        directory sync to be durable: done here when ``sync_new``, else by the caller)."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # read: the torn-line check
        try:
            return os.open(path, flags), False
        except FileNotFoundError:
            pass
        self._ensure_directory()
        fd = os.open(path, flags | os.O_CREAT, _FILE_MODE)
        if sync_new:
            try:
                self._fsync_directory()
            except BaseException:
                os.close(fd)
                raise
        return fd, True

    def _checkout(self, path: str, *, sync_new: bool = True) -> tuple[_Handle, bool]:
        """The cached handle of ``path``, opened (and created) if need be; and whether the file
        was created by this call, its directory not yet synced unless ``sync_new``."""
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None and not handle.retired:
                self._handles.move_to_end(path)
                return handle, False
        # Opening may create the file and sync the directory: not under the store-wide lock.
        fd, created = self._open_for_append(path, sync_new=sync_new)
        handle = _Handle(fd)
        with self._lock:
            stale = [self._handles.pop(path, None)]  # retired, or opened by a racing thread
            self._handles[path] = handle
            while len(self._handles) > self._max_open:
                stale.append(self._handles.popitem(last=False)[1])
        for old in stale:
            if old is not None:
                old.retire()
        return handle, created

    def _drop(self, path: str, handle: _Handle) -> None:
        with self._lock:
            if self._handles.get(path) is handle:
                del self._handles[path]
        handle.retire()

    def append(self, rollout_id: str, record: RawRecord | Mapping[str, Any]) -> None:
        """Append one record durably; returns only after the line is fsynced."""
        path = self._file(rollout_id)
        line = _encode_line(record)
        while True:
            handle, _ = self._checkout(path)
            outcome = self._commit(handle, _Pending(line))
            if outcome is True:
                if self._directory_unsynced:  # see append_many
                    self._fsync_directory()
                    self._directory_unsynced = False
                return
            # After a failure the descriptor's state is unknown; after False it is stale.
            self._drop(path, handle)
            if isinstance(outcome, BaseException):
                raise outcome

    def append_many(
        self, items: Sequence[tuple[str, RawRecord | Mapping[str, Any]]]
    ) -> list[BaseException | None]:
        """Append records of many rollouts durably: each file is written, then all are synced.

        For a single writer thread serving many calls: the syncs follow all the writes and
        overlap, so they share the device's flushes (and, on a journaling filesystem, a journal
        commit) instead of paying one each. Returns each item's failure, or None once its line
        is written and synced.
        """
        results: list[BaseException | None] = [None] * len(items)
        groups: dict[str, list[int]] = {}
        lines: list[bytes] = [b""] * len(items)
        for index, (rollout_id, record) in enumerate(items):
            try:
                path = self._file(rollout_id)
                lines[index] = _encode_line(record)
            except Exception as exc:
                results[index] = exc
                continue
            groups.setdefault(path, []).append(index)
        deferred: list[tuple[str, list[int], _Handle, _Pending, _Sync]] = []
        retry: list[tuple[str, list[int]]] = []

        def settle(path: str, indexes: list[int], handle: _Handle, outcome: object) -> None:
            if outcome is True:
                return
            # As in append: after a failure the descriptor's state is unknown; False: stale.
            self._drop(path, handle)
            if isinstance(outcome, BaseException):
                for i in indexes:
                    results[i] = outcome
            else:
                retry.append((path, indexes))

        opened: list[tuple[str, list[int], _Handle]] = []
        created: list[tuple[str, list[int], _Handle]] = []
        for path, indexes in groups.items():
            try:
                handle, new = self._checkout(path, sync_new=False)
            except Exception as exc:  # this file only: the other rollouts' records go on
                for i in indexes:
                    results[i] = exc
                continue
            opened.append((path, indexes, handle))
            if new:
                created.append((path, indexes, handle))
        if created or self._directory_unsynced:
            # Every file this batch created is in the one directory: one sync makes all
            # their entries durable (a collection run creates a file per rollout).
            try:
                self._fsync_directory()
                self._directory_unsynced = False
            except Exception as exc:
                # The files stay; until a directory sync succeeds, later appends sync it too.
                self._directory_unsynced = True
                failed = {path for path, _, _ in created}
                for path, indexes, handle in created:
                    self._drop(path, handle)
                    for i in indexes:
                        results[i] = exc
                opened = [entry for entry in opened if entry[0] not in failed]
        for path, indexes, handle in opened:
            pending = _Pending(b"".join([lines[i] for i in indexes]))
            outcome = self._commit(handle, pending, defer=True)
            if isinstance(outcome, _Sync):
                deferred.append((path, indexes, handle, pending, outcome))
            else:
                settle(path, indexes, handle, outcome)
        if len(deferred) == 1:
            path, indexes, handle, pending, sync = deferred[0]
            settle(path, indexes, handle, self._finish(handle, pending, sync))
        elif deferred:
            # One sync after another would bound the batch's rate by the device's flush time;
            # syncs that overlap share the flush. A few lanes of syncs overlap enough, and a
            # thread per file cost more in thread switches than it saved (bench/proxy.py).
            lanes = [deferred[i::_SYNC_LANES] for i in range(min(_SYNC_LANES, len(deferred)))]
            pool = self._syncs()
            finished = [pool.submit(self._finish_lane, lane) for lane in lanes]
            for lane, future in zip(lanes, finished, strict=True):
                for (path, indexes, handle, _, _), outcome in zip(
                    lane, future.result(), strict=True
                ):
                    settle(path, indexes, handle, outcome)
        for _path, indexes in retry:  # the file went away under us: one by one, as append does
            for i in indexes:
                try:
                    self.append(items[i][0], items[i][1])
                except Exception as exc:
                    results[i] = exc
        return results

    def _finish_lane(
        self, lane: list[tuple[str, list[int], _Handle, _Pending, _Sync]]
    ) -> list[bool | BaseException]:
        return [self._finish(handle, pending, sync) for _, _, handle, pending, sync in lane]

    def _syncs(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._sync_pool is None:
                self._sync_pool = ThreadPoolExecutor(
                    max_workers=_SYNC_LANES, thread_name_prefix="rollcap-sync"
                )
            return self._sync_pool

    def _commit(
        self, handle: _Handle, pending: _Pending, *, defer: bool = False
    ) -> bool | BaseException | _Sync:
        """Have ``pending`` written and synced, by leading a batch or by following; its outcome.

        ``defer``: a leader returns after the write, and ``_finish`` syncs.
        """
        try:
            with handle.lock:
                handle.queue.append(pending)
                pending.lead = not handle.leading
                handle.leading = True
            if not pending.lead:
                pending.wake.acquire()
        except BaseException:  # KeyboardInterrupt while waiting: leave without stranding others
            handle.withdraw(pending)
            raise
        if not pending.lead:
            return _own(pending.outcome)
        sync = self._lead(handle)
        return sync if defer else self._finish(handle, pending, sync)

    def _lead(self, handle: _Handle) -> _Sync:
        # Failures, KeyboardInterrupt included, are caught until the lead is passed on and every
        # follower is woken (by ``_finish``): a leader that left early would leave them waiting.
        with handle.lock:
            batch, handle.queue = handle.queue, []
            fd = handle.fd  # -1: closed between our checkout and now; the lines go elsewhere
        outcome: bool | BaseException = False
        if fd >= 0:
            try:
                outcome = self._write(handle, fd, batch)
            except BaseException as exc:
                outcome = exc
        with handle.lock:
            if outcome is True:
                handle.syncing += 1
            else:
                handle.retired = True
            successor = handle.pass_lead()
            unused = handle.take_unused_fd()
        if successor is not None:
            successor.wake.release()
        if unused >= 0:
            os.close(unused)
        return _Sync(fd, batch, outcome)

    def _finish(self, handle: _Handle, own: _Pending, sync: _Sync) -> bool | BaseException:
        outcome = sync.outcome
        if outcome is True:
            # Syncing without the lead lets the next batch be written meanwhile, and the
            # filesystem folds syncs that overlap into one journal commit.
            try:
                os.fsync(sync.fd)
            except BaseException as exc:
                outcome = exc
            with handle.lock:
                handle.syncing -= 1
                if outcome is not True:
                    handle.retired = True
                unused = handle.take_unused_fd()
            if unused >= 0:
                os.close(unused)
        for pending in sync.batch:
            pending.outcome = outcome
            if pending is not own:
                pending.wake.release()
        return outcome

    def _write(self, handle: _Handle, fd: int, batch: list[_Pending]) -> bool:
        """Write the batch's lines under the flock; False if the file was unlinked under us."""
        data = batch[0].line if len(batch) == 1 else b"".join([p.line for p in batch])
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = os.fstat(fd)
            if st.st_nlink == 0:  # cleared by another process: the lines belong in a new file
                return False
            size = st.st_size
            if size and size != handle.end and os.pread(fd, 1, size - 1) != b"\n":
                # A crash tore the last line. Without this newline the new record would be
                # glued onto the torn one and lost with it.
                data = b"\n" + data
            handle.end = -1
            written = os.write(fd, data)
            if written < len(data):  # rare (a signal, a full disk): write the rest, still locked
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view) :]
            handle.end = size + len(data)
        finally:
            # The lock only has to keep lines from interleaving. Syncing after releasing it
            # lets the filesystem fold other processes' syncs into one journal commit.
            fcntl.flock(fd, fcntl.LOCK_UN)
        return True

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
        """Every whole record with its 0-based index, skipping (and counting) bad lines.

        A bad line keeps its index, so the records after it keep theirs; a blank line is no
        record at all: it is neither counted nor given an index.
        """
        good: list[tuple[int, dict[str, Any]]] = []
        bad = 0
        lines = (line for line in self._read_lines(self._file(rollout_id)) if line.strip())
        for index, line in enumerate(lines):
            parsed = _parse_line(line)
            if isinstance(parsed, str):
                bad += 1
            else:
                good.append((index, parsed))
        return AvailableRecords(good, bad)

    def clear(self, rollout_id: str) -> None:
        """Remove the rollout's file and marker; a missing one is fine, any other error raises."""
        with self._lock:
            handle = self._handles.pop(self._file(rollout_id), None)
        if handle is not None:
            handle.retire()
        # String paths: collection clears and reads a rollout's files on every dispatch, and
        # building Path objects cost more than the system calls.
        for path in (self._file(rollout_id), self._marker(rollout_id)):
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
        """Whether the rollout's file or its incomplete marker exists (one that cannot be
        looked at counts as absent)."""
        return os.path.exists(self._file(rollout_id)) or os.path.exists(self._marker(rollout_id))

    def is_incomplete(self, rollout_id: str) -> bool:
        try:
            os.stat(self._marker(rollout_id))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True  # other errors raise: an attachment reports the marker as unreadable

    def rollout_ids(self) -> list[str]:
        """Ids of the rollouts that have a capture file, sorted."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(name[: -len(self._suffix)] for name in names if name.endswith(self._suffix))


def _own(outcome: bool | BaseException) -> bool | BaseException:
    """A follower's copy of the leader's failure, so threads never raise one shared object."""
    if not isinstance(outcome, BaseException):
        return outcome
    if isinstance(outcome, OSError):
        copy = OSError(*outcome.args)  # (errno, strerror) picks the same subclass
    else:
        copy = OSError(errno.EIO, f"the write carrying this line failed: {outcome!r}")
    copy.__cause__ = outcome
    return copy


_STORES: weakref.WeakSet[CaptureStore] = weakref.WeakSet()
_HANDLES: weakref.WeakSet[_Handle] = weakref.WeakSet()  # cached or still in use


def _after_fork_in_child() -> None:
    # The child shares the parent's open file descriptions, and with them the parent's flock
    # locks: its appends through them would not be excluded from the parent's. This runs at the
    # fork itself, before the child can reuse the inherited descriptor numbers.
    for handle in list(_HANDLES):  # first: forgetting a store's cache can free its handles
        if handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1
    for store in list(_STORES):
        store._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
    records: list[ModelCallRecord] = []
    bad_lines = 0
    read_failed = incomplete = False
    try:
        available = store.read_available(rollout_id)
    except OSError:
        read_failed = True
    else:
        records = [ModelCallRecord.from_raw(raw, index) for index, raw in available.records]
        bad_lines = available.bad_lines
    try:
        incomplete = store.is_incomplete(rollout_id)
    except OSError:
        read_failed = True
    gaps = capture_gaps(
        store_found=store.has_capture(rollout_id),
        read_failed=read_failed,
        bad_lines=bad_lines,
        incomplete=incomplete,
        num_calls=len(records),
    )
    return build_attachment(rollout_id, records, gaps, payloads=payloads)
