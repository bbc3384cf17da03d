"""The payload budget: how many bytes of payloads a report file may embed (pure)."""

from __future__ import annotations

import re

__all__ = ["DEFAULT_PAYLOAD_BUDGET", "Budget", "parse_size"]

DEFAULT_PAYLOAD_BUDGET = 64 * 1024**2

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*\Z", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str) -> int:
    """Bytes from ``1234``, ``500KB``, ``64MiB``, ``1.5G`` (``K`` = 1000, ``Ki`` = 1024).

    ``ValueError`` for anything else.
    """
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"invalid size {text!r}: expected a number with an optional unit (64MiB)")
    number, unit, binary = match.groups()
    if binary and not unit:
        raise ValueError(f"invalid size {text!r}: 'i' needs a unit before it (KiB, MiB)")
    base = 1024 if binary else 1000
    return int(float(number) * base ** _POWERS[unit.upper()])


class Budget:
    """Bytes to spend on blobs, in the order they are offered.

    An optional blob (a raw stream) takes what is left; an essential one (a rollout's
    payload) that does not fit first pushes out optional blobs, the most recent first. What
    was pushed out is collected by ``evicted()``; ``left_out`` counts every blob offered that
    is not in the budget now.
    """

    def __init__(self, total: int) -> None:
        if total < 0:
            raise ValueError("a budget cannot be negative")
        self.total = total
        self.left = total
        self.left_out = 0
        self._optional: list[tuple[tuple[str, str], int]] = []
        self._optional_bytes = 0
        self._evicted: list[tuple[str, str]] = []

    def take(self, key: tuple[str, str], size: int, *, optional: bool = False) -> bool:
        """Place a blob of ``size`` bytes; False (and counted) when it does not fit."""
        if not optional and size <= self.left + self._optional_bytes:
            # Pushing out only helps when the blob then fits.
            while size > self.left:
                dropped, dropped_size = self._optional.pop()
                self.left += dropped_size
                self._optional_bytes -= dropped_size
                self._evicted.append(dropped)
                self.left_out += 1
        if size > self.left:
            self.left_out += 1
            return False
        self.left -= size
        if optional:
            self._optional.append((key, size))
            self._optional_bytes += size
        return True

    def evicted(self) -> list[tuple[str, str]]:
        """The optional blobs pushed out since the last call."""
        out, self._evicted = self._evicted, []
        return out
