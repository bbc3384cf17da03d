"""What the store's tests share: records, the open descriptors, a watch on fsyncs."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

import pytest

from tests.test_records import SPEC_RECORD

PAYLOAD = 64 * 1024


def numbered_record(n: int, **extra: object) -> dict[str, object]:
    return {**SPEC_RECORD, "model_call_id": f"{n:032x}", **extra}


def open_descriptors() -> dict[int, str]:
    """This process's descriptors and what they point at (Linux)."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # listdir's own descriptor, gone by now
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    return fds


def open_file_paths() -> list[str]:
    return list(open_descriptors().values())


def watch_fsyncs(
    monkeypatch: pytest.MonkeyPatch, fails: Callable[[str], bool] = lambda name: False
) -> list[str]:
    """The paths synced from now on, in order; syncing a path that ``fails`` raises EIO."""
    real_fsync = os.fsync
    synced: list[str] = []

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if fails(name):
            raise OSError(errno.EIO, "Input/output error")
        synced.append(name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
