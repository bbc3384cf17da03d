"""Giving memory back to the system after a burst of big calls.

A call that kept megabytes (a long stream's text, its rebuilt answer, its record) frees them when
it ends, but glibc's allocator keeps most of what it freed in its heap: the many small pieces of
a rebuilt answer leave it too fragmented to shrink on its own, so after a burst of long streams
the server's RSS stays near its peak although the memory is free. ``malloc_trim(0)`` hands the
free pages back. ``MemoryReleaser`` calls it once a burst is over: after calls that kept enough
between them, once no such call has ended for a while, in a thread (it takes the allocator's
locks for tens of milliseconds on a heap of hundreds of megabytes, never on a call's path).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

__all__ = ["MemoryReleaser", "release_free_memory"]

log = logging.getLogger("rollcap.memory")


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Hand the allocator's free pages back to the system; False where it cannot be done.

    Blocking (tens of milliseconds on a big heap; ctypes lets go of the interpreter lock
    meanwhile): call it from a thread.
    """
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class MemoryReleaser:
    """``note(kept)`` as each call ends; ``release_free_memory`` runs in a thread once calls
    that kept ``threshold`` bytes between them have ended and none has for ``quiet_s``."""

    def __init__(self, *, threshold: int = 64 * 1024 * 1024, quiet_s: float = 1.0) -> None:
        self.threshold = threshold
        self.quiet_s = quiet_s
        self.releases = 0
        self._pending = 0
        self._timer: asyncio.TimerHandle | None = None

    def note(self, kept: int) -> None:
        """A call that kept ``kept`` bytes has ended (on the event loop)."""
        self._pending += kept
        if self._pending < self.threshold:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._release)

    def _release(self) -> None:
        self._timer = None
        self._pending = 0
        self.releases += 1
        future = asyncio.get_running_loop().run_in_executor(None, release_free_memory)
        future.add_done_callback(_log_failure)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _log_failure(future: asyncio.Future[bool]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("could not hand free memory back: %s", future.exception())
