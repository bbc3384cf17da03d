"""What a call draws from the world: fresh ids and clock readings.

Kept apart so that the rest of the capture path stays pure: the recorder, the translation glue
and the records are handed ids and clock readings, and never read a clock or draw randomness.
"""

from __future__ import annotations

import random
import time

from rollcap.server._recorder import Clock

__all__ = ["new_model_call_id", "now"]


def new_model_call_id() -> str:
    """A random (version 4) UUID as 32 hex digits.

    Drawn from the process's PRNG (reseeded at fork) rather than ``os.urandom``: the id needs to
    be unique, not secret, and on a busy server the system call behind ``uuid4`` releases the
    GIL on every call. The version and variant bits are set on the integer, without building a
    ``uuid.UUID`` only to read its hex.
    """
    return f"{random.getrandbits(128) & _UUID4_KEEP | _UUID4_SET:032x}"


# Version 4 (bits 76-79 = 0100) and the RFC 4122 variant (bits 62-63 = 10).
_UUID4_KEEP = ~((0xF << 76) | (0x3 << 62)) & ((1 << 128) - 1)
_UUID4_SET = (0x4 << 76) | (0x2 << 62)


def now() -> Clock:
    """One reading of both clocks: wall time for timestamps, monotonic time for latencies."""
    return Clock(time.time(), time.monotonic())
