"""Compaction of rollout files into their compressed form, and expansion back, without loss.

A compaction holds the plain file's exclusive ``flock`` (appends wait) from its read to the
plain file's removal: the bytes are compressed into one frame, written to a hidden temporary
with the plain file's permissions, fsynced, read back and decompressed and compared byte for
byte, renamed over the compressed name and the directory synced; only then is the plain file
removed (and the directory synced again). A failure at any step raises for that rollout and
keeps its plain file; a process that dies at any step leaves each record readable once (a
temporary is named by no reader, and a compressed file whose content starts the plain one's is
read as the plain one's leftover, ``_forms.check_agree``).

``compact_many`` does a batch of rollouts with the fsyncs of each step together: the files'
syncs overlap and the directory is synced once a step, not once a rollout. Expansion is the
same steps the other way, one rollout at a time (``capture decompress``).

Everything here blocks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollcap.store._forms import (
    TMP_SUFFIX,
    check_agree,
    decode_whole,
    read_all,
    read_shared,
    read_unlocked,
    strict_content,
)
from rollcap.store._frames import ZSTD_SUFFIX, encode_frame

__all__ = ["BATCH_BYTES", "Steps", "compact_many", "expand"]

# The most plain bytes one batch holds at once (a rollout larger than this is a batch alone).
BATCH_BYTES = 64 << 20
_TMP_MODE = 0o600


@dataclass(frozen=True, slots=True)
class Steps:
    """What compaction needs of its store: syncing files together (each one's failure or
    None), syncing the directory, and forgetting a cached descriptor of a path it removes."""

    fsync_all: Callable[[list[int]], list[BaseException | None]]
    fsync_directory: Callable[[], None]
    forget: Callable[[str], None]


@dataclass(slots=True)
class _Job:
    index: int
    source: str  # the file read, locked exclusively through ``fd``
    target: str  # the file published
    fd: int
    data: bytes  # what the target must decode to
    mode: int
    tmp: str = ""
    tmp_fd: int = -1
    written: int = 0  # bytes of the temporary


def compact_many(plains: Sequence[str], level: int, steps: Steps) -> list[bool | BaseException]:
    """Compact each plain file (``<path>`` into ``<path>.zst``): True once compacted, False when
    there was nothing to do (no file, an empty one, compacted meanwhile), else the failure."""
    results: list[bool | BaseException] = [False] * len(plains)
    jobs: list[_Job] = []
    held = 0
    try:
        for index, plain in enumerate(plains):
            try:
                job = _lock_plain(index, plain, plain + ZSTD_SUFFIX)
            except Exception as exc:
                results[index] = exc
                continue
            if job is None:
                continue
            jobs.append(job)
            try:
                _write_tmp(job, encode_frame(job.data, level))
            except Exception as exc:
                results[index] = exc
            held += len(job.data)
            if held >= BATCH_BYTES:
                _publish_all(jobs, results, steps)
                jobs, held = [], 0
        _publish_all(jobs, results, steps)
        jobs = []
    finally:
        for job in jobs:
            _release(job)
    return results


def expand(plain: str, steps: Steps) -> bool:
    """Expand ``<plain>.zst`` into ``plain`` (True), or False when there is no compressed file.

    A compressed file with a stretch that decodes to nothing raises ``CaptureReadError`` and is
    left as it is (its plain form would lose that stretch). A plain file there already that the
    compressed one's content starts is kept, and only the compressed file removed; one that
    disagrees raises ``CaptureConflictError``.
    """
    packed = plain + ZSTD_SUFFIX
    try:
        fd = os.open(packed, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    job = _Job(0, packed, plain, fd, b"", 0)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        if st.st_nlink == 0:
            return False
        packed_data = read_all(fd)
        job.data, job.mode = strict_content(packed, packed_data), st.st_mode
        # Read without its lock: locks are taken plain first, compressed second, and a plain
        # file beside the compressed one is a leftover that only grows.
        existing = read_unlocked(plain)
        if existing is not None:
            check_agree(plain, existing, packed, packed_data)
        else:
            results: list[bool | BaseException] = [False]
            _write_tmp(job, job.data)
            _publish_all([job], results, steps, decode=bytes)
            if isinstance(results[0], BaseException):
                raise results[0]
            return True
        steps.forget(plain)
        os.unlink(packed)
        steps.fsync_directory()
    finally:
        _release(job)
    return True


def _lock_plain(index: int, plain: str, packed: str) -> _Job | None:
    try:
        fd = os.open(plain, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        if st.st_nlink == 0 or st.st_size == 0:
            os.close(fd)  # compacted or cleared meanwhile, or nothing to compact
            return None
        data = read_all(fd)
        existing = read_shared(packed)
        if existing is not None:
            check_agree(plain, data, packed, existing[0])
    except BaseException:
        os.close(fd)
        raise
    return _Job(index, plain, packed, fd, data, st.st_mode)


def _write_tmp(job: _Job, payload: bytes) -> None:
    directory, name = os.path.split(job.target)
    job.tmp = os.path.join(directory, f".{name}{TMP_SUFFIX}")
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    job.tmp_fd = os.open(job.tmp, flags, _TMP_MODE)
    os.fchmod(job.tmp_fd, stat.S_IMODE(job.mode))
    view = memoryview(payload)
    while view:
        view = view[os.write(job.tmp_fd, view) :]
    job.written = len(payload)


def _publish_all(
    jobs: list[_Job],
    results: list[bool | BaseException],
    steps: Steps,
    *,
    decode: Callable[[bytes], bytes] = decode_whole,
) -> None:
    """Sync, verify and publish each written job's temporary, then remove its source; every
    job is released. A job that fails keeps its source and loses its temporary."""
    try:
        ready = [job for job in jobs if job.tmp_fd >= 0 and results[job.index] is False]
        for job, failure in zip(ready, steps.fsync_all([job.tmp_fd for job in ready]), strict=True):
            if failure is None:
                failure = _verify(job, decode)
            if failure is not None:
                results[job.index] = failure
        ready = [job for job in ready if results[job.index] is False]
        for job in ready:
            try:
                os.replace(job.tmp, job.target)
            except OSError as exc:
                results[job.index] = exc
            else:
                job.tmp = ""
        published = [job for job in ready if not job.tmp]
        if not published:
            return
        try:
            steps.fsync_directory()
        except OSError as exc:
            # Not known durable: each source stays, which reads the same (both forms agree).
            for job in published:
                results[job.index] = exc
            return
        for job in published:
            steps.forget(job.source)
            try:
                os.unlink(job.source)
            except OSError as exc:
                results[job.index] = exc  # both forms stay, and agree
            else:
                results[job.index] = True
        # A removal lost in a crash leaves both forms, which agree: a failure here loses nothing.
        with contextlib.suppress(OSError):
            steps.fsync_directory()
    finally:
        for job in jobs:
            _release(job)


def _verify(job: _Job, decode: Callable[[bytes], bytes]) -> BaseException | None:
    """None when the temporary, read back from the disk, decodes to exactly the job's data."""
    try:
        written = os.pread(job.tmp_fd, job.written + 1, 0)
    except OSError as exc:
        return exc
    if len(written) != job.written or decode(written) != job.data:
        return OSError(errno.EIO, f"{job.tmp} does not read back as what was written")
    return None


def _release(job: _Job) -> None:
    """Close the job's descriptors (the source's lock goes with its), and remove a temporary
    that was not published."""
    if job.tmp_fd >= 0:
        os.close(job.tmp_fd)
        job.tmp_fd = -1
    if job.tmp:
        with contextlib.suppress(OSError):
            os.unlink(job.tmp)
        job.tmp = ""
    if job.fd >= 0:
        os.close(job.fd)
        job.fd = -1
