"""The start-up check of a capture directory: does ``flock`` really exclude another writer?

Every guarantee of the store rests on ``flock``. ``check_capture_dir`` runs before a model
server, a collector or a cluster worker starts using a directory:

1. The mount's options (``_mounts.judge``): with ``shared=True`` (several hosts use the
   directory: a Ray cluster), a mount whose ``flock`` stays on each host is refused
   (``CaptureDirError``); a local filesystem is only warned about, since every node may be this
   host. Soft and async NFS mounts are warned about either way.
2. A lock probe: this process takes ``LOCK_EX`` on a probe file of its own in the directory
   (``.rollcap-lock-probe-<pid>-<random>``, removed after), and another process (a child here,
   or, through ``try_lock``, one on another host) must be refused ``LOCK_EX | LOCK_NB``. A
   filesystem that grants it is refused whatever its options say.

Everything here blocks.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from rollcap.store._mounts import Mount, judge, mount_for, parse_mountinfo

__all__ = [
    "LOCK_PROBE_NAME",
    "CaptureDirError",
    "check_capture_dir",
    "mount_of",
    "on_shared_filesystem",
    "probe_lock",
    "try_lock",
]

LOCK_PROBE_NAME = ".rollcap-lock-probe-"  # the probe files' prefix
_MOUNTINFO = "/proc/self/mountinfo"
_CHILD_TIMEOUT_S = 60.0
# The child's exit codes: it was refused the lock (what must happen), it was granted it.
_REFUSED, _GRANTED = 3, 4
_CHILD = f"""
import errno, fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CLOEXEC)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as exc:
    sys.exit({_REFUSED} if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else exc.errno)
sys.exit({_GRANTED})
"""


class CaptureDirError(ValueError):
    """A capture directory where appends from several writers could interleave."""


def try_lock(path: str) -> bool:
    """Whether this process is granted ``LOCK_EX | LOCK_NB`` on ``path`` (released at once).

    What the probe asks of another process; a cluster worker on another host answers it too.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def _try_lock_in_child(path: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _CHILD, path],
        capture_output=True,
        timeout=_CHILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode == _REFUSED:
        return False
    if done.returncode == _GRANTED:
        return True
    raise CaptureDirError(
        f"the lock probe's child process failed on {path} (exit {done.returncode}): "
        f"{done.stderr.decode(errors='replace').strip()[-500:]}"
    )


def probe_lock(directory: Path, other: Callable[[str], bool] | None = None) -> None:
    """Hold ``LOCK_EX`` on the probe file while ``other`` (default: a child process) tries it.

    ``CaptureDirError`` when the other process is granted the lock as well.
    """
    # A file of its own: probes of several processes never wait on each other, and the
    # directory is left as it was.
    name = f"{LOCK_PROBE_NAME}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            granted = (other or _try_lock_in_child)(path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
        os.unlink(path)
    if granted:
        raise CaptureDirError(
            f"{directory}: flock does not keep another process out (a second process was granted "
            "the lock this one held), so appends from several model servers could interleave; "
            "see docs/scale-out.md for the filesystems and mount options that lock"
        )


def mount_of(directory: Path, mountinfo: str = _MOUNTINFO) -> Mount | None:
    """The mount ``directory`` is on; None when that cannot be read (not Linux, no /proc)."""
    try:
        text = Path(mountinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None  # not Linux, or no /proc: nothing to read the options from
    return mount_for(os.path.realpath(directory), parse_mountinfo(text))


def on_shared_filesystem(directory: str | os.PathLike[str], mountinfo: str = _MOUNTINFO) -> bool:
    """Whether ``directory`` is on a filesystem other hosts mount (NFS, Lustre, GPFS, ...);
    False when that cannot be told."""
    mount = mount_of(Path(directory), mountinfo)
    return mount is not None and judge(mount).cross_host


def check_capture_dir(
    directory: str | os.PathLike[str],
    *,
    shared: bool = False,
    other: Callable[[str], bool] | None = None,
    mountinfo: str = _MOUNTINFO,
) -> list[str]:
    """Check a capture directory before use (created if absent); its warnings, to be logged.

    ``shared``: several hosts will append to it. ``other``: how another process tries the
    probe's lock (default: a child process on this host). Raises ``CaptureDirError``.
    """
    path = Path(directory)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    warnings: list[str] = []
    mount = mount_of(path, mountinfo)
    if mount is not None:
        verdict = judge(mount)
        if shared and verdict.refusals:
            raise CaptureDirError(f"{path}: " + "; ".join(verdict.refusals))
        warnings += verdict.warnings
        if shared and not verdict.cross_host:
            warnings.append(
                f"{path} is on {mount.fs_type} ({mount.mount_point}), a filesystem of this host "
                "only: every node must run on this host, or the capture directory must be on a "
                "shared filesystem that locks across hosts (docs/scale-out.md)"
            )
    probe_lock(path, other)
    return warnings
