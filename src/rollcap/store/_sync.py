"""How a batch of appends is made durable: an ``fsync`` of each file, or one ``syncfs``.

A model server's writer hands the store a batch that touches many rollout files at once. An
``fsync`` per file costs a system call each, and on a journaling filesystem the syncs share one
journal commit anyway; one ``syncfs`` does the same work for the whole filesystem in one call
(bench/store.py measures both). It is only as good as the filesystem's ``sync_fs``: on ext4 and
xfs it writes every dirty file back, commits the journal and flushes the device; on FUSE and
NFS it may stop short of the server. ``auto`` takes ``syncfs`` only where the mount says one of
the former (``_mounts.syncfs_commits``), and ``fsync`` wherever that cannot be told.

``syncfs`` also flushes what other programs left dirty on the filesystem, so a capture
directory on a disk that something else fills (checkpoints) waits for that too: ``fsync`` is
the choice there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Literal

from rollcap.store._mounts import syncfs_commits
from rollcap.store._shared import mount_of

__all__ = ["SYNC_MODES", "SyncMode", "check_sync", "resolve_sync", "syncfs"]

SyncMode = Literal["fsync", "syncfs"]
# What a user may ask for: "auto" resolves to one of the others per capture directory.
SYNC_MODES = ("auto", "fsync", "syncfs")


def _libc_syncfs() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


# A ctypes call releases the GIL, as os.fsync does, so the other threads go on meanwhile.
_SYNCFS = _libc_syncfs()


def syncfs(fd: int) -> None:
    """Sync the whole filesystem ``fd`` is on; ``OSError`` on failure (a writeback error
    anywhere on it since ``fd`` was opened included, as Linux reports it)."""
    if _SYNCFS is None:
        raise OSError(95, "syncfs is not available on this system")  # EOPNOTSUPP
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def check_sync(mode: object, name: str = "sync") -> str:
    """``mode`` if it is one of ``SYNC_MODES``; else ``ValueError`` naming the setting."""
    if mode not in SYNC_MODES:
        raise ValueError(f"{name} must be one of {', '.join(SYNC_MODES)}, got {mode!r}")
    assert isinstance(mode, str)
    return mode


def resolve_sync(mode: str, directory: str | os.PathLike[str]) -> SyncMode:
    """The sync a store on ``directory`` uses for ``mode`` (one of ``SYNC_MODES``).

    ``syncfs`` asked for where the system has none is a ``ValueError``; ``auto`` is ``syncfs``
    only on a filesystem known to commit everything with it, else ``fsync``.
    """
    if check_sync(mode) == "fsync":
        return "fsync"
    if _SYNCFS is None:
        if mode == "syncfs":
            raise ValueError("capture sync syncfs needs Linux's syncfs(2), which is missing here")
        return "fsync"
    if mode == "syncfs":
        return "syncfs"
    path = Path(directory)
    # The directory may not exist yet: its nearest existing parent is on the same mount.
    while not path.exists() and path.parent != path:
        path = path.parent
    mount = mount_of(path)
    return "syncfs" if mount is not None and syncfs_commits(mount) else "fsync"
