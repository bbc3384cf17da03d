"""The model server's open calls and its rollouts' recent activity, as ``/inflight`` shows them
(pure).

Every dialect call is registered when its request arrives and closed when the server is done
with it, whether capture is on or off. Of each, only what says where it is: its rollout id and
attempt, model call id (with capture on), dialect, whether it streams, when it started, when the
first upstream byte came, bytes from upstream and to the client, how long since the last of each,
its state (``rollcap.status``: active, stalled, retrying, cancelled) and its phase:

- ``waiting_upstream``: no byte of the answer yet;
- ``streaming`` / ``receiving``: the answer is coming (a stream is relayed as it comes; a body is
  read whole first);
- ``writing_record``: the call's record is being built and handed to the writer;
- ``held_until_durable``: the end of the answer waits until the record is durable.

A call whose client went away stays listed, ``cancelled``, for ``cancelled_linger_s`` after it
closes, so that a person looking sees what became of it. Of each rollout the server saw, a few
numbers (calls ended, failed, when the last ended and how), kept for the most recent
``ACTIVITY_ROLLOUTS`` rollouts: what a collection asks for to tell an agent stuck between calls.

No request or answer byte and no header is kept, so nothing here can hold a payload or a
credential. Times are ``time.monotonic()`` values, turned into ages when shown.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rollcap.ids import attempt_of
from rollcap.status._rules import LiveStatusSettings, call_state

__all__ = [
    "ACTIVITY_ROLLOUTS",
    "DEFAULT_LIMIT",
    "HELD",
    "NO_ERROR",
    "PHASES",
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
PHASES = (WAITING, RECEIVING, STREAMING, WRITING, HELD)
DEFAULT_LIMIT = 1000
# A call's error category when its record has none (and the metrics' label for it).
NO_ERROR = "none"
# Rollouts whose activity is kept; the least recently active is forgotten first.
ACTIVITY_ROLLOUTS = 65_536
# Cancelled calls kept listed after they closed, at most (the newest).
_GONE_KEPT = 1000


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
    longest_silence: float = 0.0  # between two upstream bytes, once the answer started
    bytes_from_upstream: int = 0
    bytes_to_client: int = 0
    last_client_write: float | None = None
    after_failure: bool = False  # the rollout's call before it on this server failed
    status: int | None = None  # what the client was answered
    answered: bool = False  # the client got the whole answer
    client_gone: float | None = None  # when the client went away
    ended: float | None = None
    # The record's (``NO_ERROR`` when it has none), with capture on, once it is built.
    error_category: str | None = None

    @property
    def attempt(self) -> int | None:
        """The attempt index of its rollout id (``attempt_of``); ``None`` without an id."""
        return None if self.rollout_id is None else attempt_of(self.rollout_id)

    @property
    def failed(self) -> bool:
        """It ended without a whole 2xx answer reaching the client."""
        return not (self.answered and self.status is not None and 200 <= self.status < 300)

    def answer_started(self, status: int, streamed: bool) -> None:
        """The answer's headers went to the client."""
        self.status = status
        self.streamed = streamed

    def upstream_bytes(self, mono: float, size: int) -> None:
        """``size`` bytes of the answer came from upstream (an ``Observer``, as the recorder)."""
        if self.first_upstream_byte is None:
            self.first_upstream_byte = mono
        elif self.last_upstream_byte is not None:
            self.longest_silence = max(self.longest_silence, mono - self.last_upstream_byte)
        self.last_upstream_byte = mono
        self.bytes_from_upstream += size
        if self.phase == WAITING:
            self.phase = STREAMING if self.streamed else RECEIVING

    def upstream_failed(self, category: object) -> None:
        """Nothing to show: a failed upstream ends the call, which closes it."""

    def client(self, mono: float, size: int, *, last: bool) -> None:
        """``size`` bytes went to the client (the send returned: the client took them);
        ``last``: they ended the answer."""
        self.bytes_to_client += size
        self.last_client_write = mono
        if last:
            self.answered = True

    def client_left(self, mono: float) -> None:
        """The client went away before the answer was whole."""
        if self.client_gone is None and not self.answered:
            self.client_gone = mono

    def state(self, settings: LiveStatusSettings, now: float) -> str:
        return call_state(
            settings,
            client_gone=self.client_gone is not None,
            awaiting_upstream=self.phase in (WAITING, RECEIVING, STREAMING) and self.ended is None,
            upstream_silence_s=now - (self.last_upstream_byte or self.started),
            after_failure=self.after_failure,
        )

    def view(self, now: float, settings: LiveStatusSettings) -> dict[str, Any]:
        """What ``/inflight`` shows of it at monotonic time ``now``."""
        first = self.first_upstream_byte
        end = now if self.ended is None else self.ended
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "model_call_id": self.model_call_id,
            "dialect": self.dialect,
            "streamed": self.streamed,
            "state": self.state(settings, now),
            "phase": self.phase,
            "started_at": self.started_at,
            "age_ms": _ms(end - self.started),
            "first_upstream_byte_ms": None if first is None else _ms(first - self.started),
            "upstream_bytes": self.bytes_from_upstream,
            "client_bytes": self.bytes_to_client,
            # Since the last upstream byte, or since the call started when none came yet.
            "upstream_silence_ms": _ms(end - (self.last_upstream_byte or self.started)),
            "client_idle_ms": _ms(end - (self.last_client_write or self.started)),
            "ended_ms_ago": None if self.ended is None else _ms(now - self.ended),
        }


@dataclass(slots=True)
class _Activity:
    calls: int = 0
    failed: int = 0
    last_end: float = 0.0
    last_failed: bool = False
    last_cancelled: bool = False


class InflightCalls:
    """The open calls of one server, oldest first, and its rollouts' activity. Not
    thread-safe: the event loop's."""

    def __init__(
        self,
        settings: LiveStatusSettings | None = None,
        *,
        activity_rollouts: int = ACTIVITY_ROLLOUTS,
    ) -> None:
        self.settings = settings or LiveStatusSettings()
        # Insertion order is arrival order: the oldest call first.
        self._open: dict[int, OpenCall] = {}
        self._gone: deque[OpenCall] = deque(maxlen=_GONE_KEPT)
        self._activity: OrderedDict[str, _Activity] = OrderedDict()
        self._activity_rollouts = activity_rollouts

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
        if rollout_id is not None:
            activity = self._activity.get(rollout_id)
            call.after_failure = activity is not None and activity.last_failed
        self._open[id(call)] = call
        return call

    def close(self, call: OpenCall, now: float) -> None:
        """The server is done with ``call``; a second close is harmless."""
        if self._open.pop(id(call), None) is None:
            return
        call.ended = now
        if call.client_gone is not None:
            self._gone.append(call)
        if call.rollout_id is None:
            return
        activity = self._activity.get(call.rollout_id)
        if activity is None:
            activity = self._activity[call.rollout_id] = _Activity()
            if len(self._activity) > self._activity_rollouts:
                self._activity.popitem(last=False)
        else:
            self._activity.move_to_end(call.rollout_id)
        failed = call.failed
        activity.calls += 1
        activity.failed += failed
        activity.last_end = now
        activity.last_failed = failed
        activity.last_cancelled = call.client_gone is not None

    def _lingering(self, now: float) -> list[OpenCall]:
        """The cancelled calls still shown, oldest first; those past their time are let go."""
        linger = self.settings.cancelled_linger_s
        while self._gone and now - (self._gone[0].ended or now) > linger:
            self._gone.popleft()
        return list(self._gone)

    def snapshot(self, now: float, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """``{"open", "calls", "truncated", "cancelled"}``: the oldest ``limit`` open calls,
        how many are open, and the calls cancelled within ``cancelled_linger_s``."""
        calls: list[dict[str, Any]] = []
        for call in self._open.values():
            if len(calls) == limit:
                break
            calls.append(call.view(now, self.settings))
        gone = [call.view(now, self.settings) for call in self._lingering(now)[-limit:]]
        return {
            "open": len(self._open),
            "calls": calls,
            "truncated": len(self._open) > limit,
            "cancelled": gone,
        }

    def rollouts(self, rollout_ids: Iterable[str], now: float) -> dict[str, dict[str, Any]]:
        """Of each of ``rollout_ids`` the server knows: its calls ended and failed, how long
        since the last ended (``None``: none did) and whether it was cancelled, and its open
        calls' views. An id it never saw (or forgot) is left out."""
        wanted = set(rollout_ids)
        open_by: dict[str, list[dict[str, Any]]] = {}
        for call in self._open.values():
            if call.rollout_id in wanted:
                open_by.setdefault(call.rollout_id, []).append(call.view(now, self.settings))
        out: dict[str, dict[str, Any]] = {}
        for rollout_id in wanted:
            activity = self._activity.get(rollout_id)
            calls = open_by.get(rollout_id, [])
            if activity is None and not calls:
                continue
            if activity is None:
                activity = _Activity()
                ago = None
            else:
                ago = _ms(now - activity.last_end)
            out[rollout_id] = {
                "calls_ended": activity.calls,
                "calls_failed": activity.failed,
                "last_call_ended_ms_ago": ago,
                "last_call_cancelled": activity.last_cancelled,
                "open_calls": calls,
            }
        return out

    def by_phase(self) -> dict[str, int]:
        """How many calls are open in each phase (every phase listed)."""
        counts = dict.fromkeys(PHASES, 0)
        for call in self._open.values():
            counts[call.phase] += 1
        return counts
