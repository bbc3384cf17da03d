"""A disk whose write cache is lost at a power cut: one image file served over FUSE.

    python tests/store/_volatile_disk.py STATE_DIR MOUNT_POINT SIZE_BYTES

The mount shows a file ``disk.img`` of SIZE_BYTES, meant to back a loop device with a real
filesystem on it (ext4, xfs). Every write lands in ``STATE_DIR/live.img``, which reads are
served from, and is also kept in memory until the image is synced: an ``fsync`` of the image
(the loop device's flush, which is how the filesystem above asks for its writes to be
durable) applies the kept writes to ``STATE_DIR/durable.img``. A write to the mount's other
file, ``power``, cuts the power before it returns: from then on nothing reaches
``durable.img``, which holds what a disk with a volatile write cache would have kept. Writes
still go to the live image after the cut, so the filesystem above goes on without errors until
it is unmounted.

Only the image's flushes count, never the host's: its own files are not synced (a test reads
``durable.img`` back on this host).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time
from typing import Any

import mfusepy

IMAGE = "/disk.img"
POWER = "/power"


class VolatileDisk(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True  # times as nanoseconds: the float form is deprecated

    def __init__(self, state: str, size: int) -> None:
        self.state = state
        self.size = size
        self.guard = threading.Lock()
        self.pending: list[tuple[int, bytes]] = []  # writes since the last flush, in order
        self.cut = False
        self.live = os.open(os.path.join(state, "live.img"), os.O_RDWR | os.O_CREAT, 0o600)
        self.durable = os.open(os.path.join(state, "durable.img"), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self.live, size)
        os.ftruncate(self.durable, size)

    def power_cut(self) -> None:
        with self.guard:
            self.cut = True
            self.pending.clear()

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        now = time.time_ns()
        if path == "/":
            mode = stat.S_IFDIR | 0o755
            return {"st_mode": mode, "st_nlink": 2, "st_ctime": now, "st_mtime": now}
        if path == IMAGE:
            mode = stat.S_IFREG | 0o600
            return {"st_mode": mode, "st_nlink": 1, "st_size": self.size, "st_ctime": now,
                    "st_mtime": now}  # fmt: skip
        if path == POWER:
            return {"st_mode": stat.S_IFREG | 0o200, "st_nlink": 1, "st_size": 0}
        raise mfusepy.FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", IMAGE[1:], POWER[1:]]

    def open(self, path: str, flags: int) -> int:
        if path not in (IMAGE, POWER):
            raise mfusepy.FuseOSError(errno.ENOENT)
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        return os.pread(self.live, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        if path == POWER:
            self.power_cut()
            return len(data)
        if offset + len(data) > self.size:
            raise mfusepy.FuseOSError(errno.ENOSPC)
        data = bytes(data)
        with self.guard:
            os.pwrite(self.live, data, offset)
            if not self.cut:
                self.pending.append((offset, data))
        return len(data)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        if path == IMAGE and length != self.size:
            raise mfusepy.FuseOSError(errno.EPERM)

    def fsync(self, path: str, datasync: int, fh: Any) -> int:
        with self.guard:
            if not self.cut:
                for offset, data in self.pending:
                    os.pwrite(self.durable, data, offset)
                self.pending.clear()
        return 0

    def flush(self, path: str, fh: Any) -> int:
        return 0  # close(2), not a sync: the kept writes stay volatile

    def release(self, path: str, fh: Any) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": self.size // 4096,
                "f_bfree": 0, "f_bavail": 0, "f_namemax": 255}  # fmt: skip


def main() -> None:
    state, mount_point, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    disk = VolatileDisk(state, size)
    # Threads: the loop device's reads and writes come from several kernel workers at once.
    mfusepy.FUSE(disk, mount_point, foreground=True, nothreads=False)


if __name__ == "__main__":
    main()
