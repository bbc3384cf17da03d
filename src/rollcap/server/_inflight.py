"""The model server's open calls, as ``GET /inflight`` shows them (pure).

Every dialect call is registered when its request arrives and removed when the server is done
with it, whether capture is on or off. Of each, only what says where it is: its rollout id and
attempt, model call id (with capture on), dialect, whether it streams, when it started, when the
first upstream byte came, bytes from upstream and to the client, how long since the last of each,
and its phase:

- ``waiting_upstream``: no byte of the answer yet;
- ``streaming`` / ``receiving``: the answer is coming (a stream is relayed as it comes; a body is
  read whole first);
- ``writing_record``: the call's record is being built and handed to the writer;
- ``held_until_durable``: the end of the answer waits until the record is durable.

No request or answer byte and no header is kept, so nothing here can hold a payload or a
credential. Times are ``time.monotonic()`` values, turned into ages when shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollcap.ids import attempt_of

__all__ = [
    "DEFAULT_LIMIT",
    "HELD",
    "RECEIVING",
    "STREAMING",
    "WAITING",
    "WRITING",
    "InflightCalls",
    "OpenCall",
]

WAITING = "waiting_upstream"
STREAMING = "streaming"
RECEIVING = "receiving"
WRITING = "writing_record"
HELD = "held_until_durable"
DEFAULT_LIMIT = 1000


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


@dataclass(slots=True, eq=False)
class OpenCall:
    """One open call; the server's I/O shells tell it what happens."""

    rollout_id: str | None
    dialect: str
    started_at: float  # epoch seconds
    started: float  # monotonic
    model_call_id: str | None = None
    streamed: bool | None = None
    phase: str = WAITING
    first_upstream_byte: float | None = None
    last_upstream_byte: float | None = None
    bytes_from_upstream: int = 0
    bytes_to_client: int = 0
    last_client_write: float | None = None

    @property
    def attempt(self) -> int | None:
        """The attempt index of its rollout id (``attempt_of``); ``None`` without an id."""
        return None if self.rollout_id is None else attempt_of(self.rollout_id)

    def answer_started(self, streamed: bool) -> None:
        """The answer's headers went to the client."""
        self.streamed = streamed

    def upstream_bytes(self, mono: float, size: int) -> None:
        """``size`` bytes of the answer came from upstream (an ``Observer``, as the recorder)."""
        if self.first_upstream_byte is None:
            self.first_upstream_byte = mono
        self.last_upstream_byte = mono
        self.bytes_from_upstream += size
        if self.phase == WAITING:
            self.phase = STREAMING if self.streamed else RECEIVING

    def upstream_failed(self, category: object) -> None:
        """Nothing to show: a failed upstream ends the call, which closes it."""

    def client(self, mono: float, size: int) -> None:
        """``size`` bytes went to the client (the send returned: the client took them)."""
        self.bytes_to_client += size
        self.last_client_write = mono

    def view(self, now: float) -> dict[str, Any]:
        """What ``/inflight`` shows of it at monotonic time ``now``."""
        first = self.first_upstream_byte
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "model_call_id": self.model_call_id,
            "dialect": self.dialect,
            "streamed": self.streamed,
            "phase": self.phase,
            "started_at": self.started_at,
            "age_ms": _ms(now - self.started),
            "first_upstream_byte_ms": None if first is None else _ms(first - self.started),
            "upstream_bytes": self.bytes_from_upstream,
            "client_bytes": self.bytes_to_client,
            # Since the last upstream byte, or since the call started when none came yet.
            "upstream_silence_ms": _ms(now - (self.last_upstream_byte or self.started)),
            "client_idle_ms": _ms(now - (self.last_client_write or self.started)),
        }


class InflightCalls:
    """The open calls of one server, oldest first. Not thread-safe: the event loop's."""

    def __init__(self) -> None:
        # Insertion order is arrival order: the oldest call first.
        self._open: dict[int, OpenCall] = {}

    def open(
        self,
        rollout_id: str | None,
        dialect: str,
        *,
        started_at: float,
        started: float,
        model_call_id: str | None = None,
    ) -> OpenCall:
        call = OpenCall(rollout_id, dialect, started_at, started, model_call_id)
        self._open[id(call)] = call
        return call

    def close(self, call: OpenCall) -> None:
        self._open.pop(id(call), None)

    def snapshot(self, now: float, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """``{"open", "calls", "truncated"}``: the oldest ``limit`` calls and how many are open."""
        calls: list[dict[str, Any]] = []
        for call in self._open.values():
            if len(calls) == limit:
                break
            calls.append(call.view(now))
        return {"open": len(self._open), "calls": calls, "truncated": len(self._open) > limit}
