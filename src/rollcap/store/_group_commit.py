"""Group commit: threads appending to one rollout file share one write and one fsync.

``flock`` locks belong to the open file description, so they keep other processes' lines from
interleaving with ours but not this process's threads, which share the store's descriptor.
Threads appending to one file at the same time queue their lines on its ``Handle`` instead. The
first to queue leads: it takes the whole queue, writes it with one ``write`` under the flock,
hands the lead to the first thread that queued meanwhile, then fsyncs, so one batch is written
while the one before it is being synced, and every follower wakes with its batch's outcome.

``commit(handle, pending)`` is the whole of it for one line; ``defer=True`` returns the leader's
``Sync`` after the write, for ``finish`` to sync later (``CaptureStore.append_many`` writes every
file of a batch before it syncs any). Under many threads the cost of an append is then mostly
the number of system calls that release the GIL, not the system calls themselves.

A cached descriptor can outlive its file: another process (the collector's ``reset``) removes or
replaces it. Under the lock, the write checks that the file still has a link and, for a handle
given its path (the store does so on a shared filesystem), that the descriptor is still the file
at that path (device and inode of both: on NFS a file removed on this host while open is only
renamed to ``.nfsXXXX`` and still has a link). ``ESTALE`` (removed on another NFS host) is
treated the same way: the outcome is False, "stale", and the caller appends again through a
fresh descriptor.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import weakref
from dataclasses import dataclass

from rollcap.store._frames import encode_frame

__all__ = ["Handle", "Pending", "Sync", "commit", "finish"]


class Handle:
    """One cached descriptor of a rollout file, shared by this process's threads.

    flock locks belong to the open file description, so they do not keep this process's
    threads apart. Threads appending at the same time queue their lines instead; one of them,
    the leader, writes the whole queue with one write under the flock, hands the lead to the
    first thread that queued meanwhile, then syncs, so one batch is written while the one
    before it is being synced (group commit).
    """

    __slots__ = (
        "__weakref__",
        "end",
        "fd",
        "leading",
        "level",
        "lock",
        "path",
        "queue",
        "retired",
        "syncing",
    )

    def __init__(self, fd: int, path: str | None = None, *, level: int | None = None) -> None:
        self.fd = fd
        # The file fd must still be, checked under the lock before a write (None: not checked).
        self.path = path
        # A compressed file's handle: each batch is written as one frame of this level.
        self.level = level
        self.lock = threading.Lock()  # guards every field but ``end``, which only leaders use
        self.queue: list[Pending] = []  # lines no leader has taken yet
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

    def pass_lead(self) -> Pending | None:
        """Under ``lock``: the queued line whose thread is to lead next, or None."""
        if not self.queue:
            self.leading = False
            return None
        successor = self.queue[0]
        successor.lead = True
        return successor

    def withdraw(self, pending: Pending) -> None:
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


class Pending:
    """One line on its way to the file, and how its thread learns its fate."""

    __slots__ = ("lead", "line", "outcome", "wake")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.lead = False  # its thread is to lead the next batch
        # True: written and synced. False: not durable in the file at its path, the descriptor
        # went stale (the file was removed or replaced, ESTALE, the descriptor closed): append
        # again through a fresh one. Else the failure.
        self.outcome: bool | BaseException = False
        self.wake = threading.Lock()  # released once lead or outcome is set
        self.wake.acquire()


@dataclass(frozen=True, slots=True)
class Sync:
    """A leader's batch after its write: what its sync must settle."""

    fd: int
    batch: list[Pending]
    outcome: bool | BaseException


def commit(handle: Handle, pending: Pending, *, defer: bool = False) -> bool | BaseException | Sync:
    """Have ``pending`` written and synced, by leading a batch or by following; its outcome.

    ``defer``: a leader returns its ``Sync`` after the write, and ``finish`` syncs.
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
        return _copy_for_follower(pending.outcome)
    sync = _lead(handle)
    return sync if defer else finish(handle, pending, sync)


def _lead(handle: Handle) -> Sync:
    # Failures, KeyboardInterrupt included, are caught until the lead is passed on and every
    # follower is woken (by ``finish``): a leader that left early would leave them waiting.
    with handle.lock:
        batch, handle.queue = handle.queue, []
        fd = handle.fd  # -1: closed between our checkout and now; the lines go elsewhere
    outcome: bool | BaseException = False
    if fd >= 0:
        try:
            outcome = _write(handle, fd, batch)
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
    return Sync(fd, batch, outcome)


def finish(
    handle: Handle, own: Pending, sync: Sync, synced: bool | BaseException | None = None
) -> bool | BaseException:
    """The leader's fsync of its batch, then every line of the batch learns its outcome.

    This is where a capture record becomes durable: ``True`` only once ``os.fsync`` returned.
    ``synced``: the file's whole filesystem was synced after the write (one ``syncfs`` for
    many files), with this outcome, and the file is not synced again.
    """
    outcome = sync.outcome
    if outcome is True:
        if synced is not None:
            outcome = synced
        else:
            # Syncing without the lead lets the next batch be written meanwhile, and the
            # filesystem folds syncs that overlap into one journal commit.
            try:
                os.fsync(sync.fd)
            except OSError as exc:
                # ESTALE: the file went away on the server, and the lines with it.
                outcome = False if exc.errno == errno.ESTALE else exc
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


def _write(handle: Handle, fd: int, batch: list[Pending]) -> bool:
    """Write the batch's lines under the flock; False if the descriptor is no longer the file at
    its path (removed, replaced, ``ESTALE``): the lines belong in the file there now."""
    try:
        return _write_locked(handle, fd, batch)
    except OSError as exc:
        if exc.errno == errno.ESTALE:
            return False
        raise


def _is_file_at_path(st: os.stat_result, path: str) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    return (at_path.st_dev, at_path.st_ino) == (st.st_dev, st.st_ino)


def _write_locked(handle: Handle, fd: int, batch: list[Pending]) -> bool:
    data = batch[0].line if len(batch) == 1 else b"".join([p.line for p in batch])
    if handle.level is not None:
        # Compressed before the lock is taken: other writers wait only for the write. A torn
        # frame before this one costs a reader only itself (``read_frames``).
        data = encode_frame(data, handle.level)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        st = os.fstat(fd)
        # Cleared by another process, or replaced: the lines belong in the file at the path.
        # A link count of 0 says so on a local filesystem; on NFS a file removed while open
        # here is renamed instead and keeps its link, and only its inode tells.
        if st.st_nlink == 0 or (handle.path is not None and not _is_file_at_path(st, handle.path)):
            return False
        size = st.st_size
        torn_check = handle.level is None and size and size != handle.end
        if torn_check and os.pread(fd, 1, size - 1) != b"\n":
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


def _copy_for_follower(outcome: bool | BaseException) -> bool | BaseException:
    """A follower's copy of the leader's failure, so threads never raise one shared object."""
    if not isinstance(outcome, BaseException):
        return outcome
    if isinstance(outcome, OSError):
        copy = OSError(*outcome.args)  # (errno, strerror) picks the same subclass
    else:
        copy = OSError(errno.EIO, f"the write carrying this line failed: {outcome!r}")
    copy.__cause__ = outcome
    return copy


_HANDLES: weakref.WeakSet[Handle] = weakref.WeakSet()  # cached or still in use


def _after_fork_in_child() -> None:
    # The child shares the parent's open file descriptions, and with them the parent's flock
    # locks: its appends through them would not be excluded from the parent's. This runs at the
    # fork itself, before the child can reuse the inherited descriptor numbers, and before the
    # stores forget their caches (registered first, since the store module imports this one).
    for handle in list(_HANDLES):
        if handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1


os.register_at_fork(after_in_child=_after_fork_in_child)
