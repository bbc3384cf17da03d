"""A collection's live status: its rollouts' counts, and what each running one is doing (pure).

The collector tells the board when a rollout attempt starts and how it ends; every
``interval_s`` the I/O shell (``_live``) asks the model servers what they know of the running
rollouts (``POST /inflight/rollouts``) and hands their answers to ``observe``. ``document``
gives the status as plain data: what the status file holds, the head server serves and
``rollcap status`` shows. Its keys:

- ``run``: ``id`` (the output file), ``agent``, ``started_at``, ``updated_at``, ``elapsed_s``,
  ``finished``;
- ``counts``: ``planned`` (this run), ``skipped`` (an earlier run did them), ``running``,
  ``done`` (ended, failures included), ``failed``, ``lost``, ``retried`` (dispatched again
  after being lost);
- ``states``: running rollouts per state (``rollcap.status`` rules); ``rate_per_s``, ``eta_s``,
  ``slow_after_s``, ``thresholds``;
- ``servers``: each model server asked, and whether it answered;
- ``rollouts``: the running ones that need a look first (stalled, cancelled, retrying, slow,
  then active; oldest first within a state), at most ``limit``: id, indices, attempt,
  ``elapsed_s``, ``calls`` so far, ``state``, and ``doing``: a model call open on a server
  (its phase, state, age and upstream silence), ``between_calls`` (the agent or a tool, for how
  long), or ``unknown`` (no model server was asked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollcap.status._rules import (
    CANCELLED,
    ROLLOUT_STATES,
    DurationQuantiles,
    LiveStatusSettings,
    rollout_state,
)

__all__ = ["DOCUMENT_SCHEMA", "LIST_LIMIT", "RunBoard", "ServerAnswer"]

DOCUMENT_SCHEMA = 1
# Running rollouts listed in a document, at most: those that need a look come first.
LIST_LIMIT = 200


def _s(seconds: float) -> float:
    return round(seconds, 2)


@dataclass(frozen=True, slots=True)
class ServerAnswer:
    """One model server's answer to a poll: its ``rollouts`` (``/inflight/rollouts``), or why
    there is none (``error``)."""

    name: str
    url: str
    rollouts: dict[str, Any] | None = None
    error: str | None = None


@dataclass(slots=True)
class _Running:
    rollout_id: str
    task_index: int
    rollout_index: int
    attempt: int
    started: float  # monotonic
    redispatched: bool
    # What the last poll said (nothing yet: none since it started).
    calls: int = 0
    open_calls: list[dict[str, Any]] = field(default_factory=list)
    last_end: float | None = None  # monotonic, the most recent end of a call on any server
    last_cancelled: bool = False
    seen: bool = False  # a poll answered since it started


class RunBoard:
    """One collection's status. Not thread-safe: the event loop's."""

    def __init__(
        self,
        settings: LiveStatusSettings,
        *,
        run_id: str,
        agent: str,
        planned: int,
        skipped: int,
        started: float,
        started_at: float,
    ) -> None:
        self.settings = settings
        self.run_id = run_id
        self.agent = agent
        self.planned = planned
        self.skipped = skipped
        self.started = started
        self.started_at = started_at
        self.done = self.failed = self.lost = self.retried = 0
        self.finished = False
        self._running: dict[str, _Running] = {}
        self._durations = DurationQuantiles()
        self._servers: list[ServerAnswer] = []

    def running_ids(self) -> list[str]:
        return list(self._running)

    def start(
        self,
        rollout_id: str,
        *,
        task_index: int,
        rollout_index: int,
        attempt: int,
        redispatched: bool,
        now: float,
    ) -> None:
        """An attempt is dispatched; ``redispatched``: the one before it in this run was lost."""
        if redispatched:
            self.retried += 1
        self._running[rollout_id] = _Running(
            rollout_id, task_index, rollout_index, attempt, now, redispatched
        )

    def end(self, rollout_id: str, outcome: str, now: float) -> None:
        """The attempt ended: ``"ok"``, ``"failed"`` or ``"lost"`` (it runs again, or not)."""
        running = self._running.pop(rollout_id, None)
        if outcome == "lost":
            self.lost += 1
            return
        self.done += 1
        self.failed += outcome == "failed"
        if running is not None:
            self._durations.add(now - running.started)

    def observe(self, answers: list[ServerAnswer], now: float) -> None:
        """What the model servers said of the running rollouts at ``now``."""
        self._servers = answers
        known = [a.rollouts for a in answers if a.rollouts is not None]
        if not known:
            return  # nothing new: keep what the last answers said
        for rollout_id, running in self._running.items():
            calls = 0
            open_calls: list[dict[str, Any]] = []
            last_end: float | None = None
            last_cancelled = False
            for answer in answers:
                if answer.rollouts is None:
                    continue
                entry = answer.rollouts.get(rollout_id)
                if entry is None:
                    continue
                calls += int(entry.get("calls_ended", 0))
                for call in entry.get("open_calls", ()):
                    open_calls.append({**call, "server": answer.name})
                ago = entry.get("last_call_ended_ms_ago")
                if isinstance(ago, int | float):
                    end = now - ago / 1000
                    if last_end is None or end > last_end:
                        last_end = end
                        last_cancelled = bool(entry.get("last_call_cancelled"))
            running.calls = calls + len(open_calls)
            running.open_calls = open_calls
            running.last_end = last_end
            running.last_cancelled = last_cancelled
            running.seen = True

    def _state(self, running: _Running, now: float, slow_after: float | None) -> str:
        watched = running.seen and bool(self._servers)
        since = running.started if running.last_end is None else running.last_end
        return rollout_state(
            self.settings,
            call_states=[str(c.get("state")) for c in running.open_calls],
            # Unwatched: nobody said what it does between calls, so it cannot stall there.
            idle_s=now - since if watched else 0.0,
            last_call_cancelled=running.last_cancelled,
            redispatched=running.redispatched,
            elapsed_s=now - running.started,
            slow_after_s=slow_after,
        )

    def _doing(self, running: _Running, now: float) -> dict[str, Any]:
        if running.open_calls:
            call = min(running.open_calls, key=lambda c: c.get("started_at") or 0.0)
            return {
                "kind": "model_call",
                "server": call.get("server"),
                "dialect": call.get("dialect"),
                "phase": call.get("phase"),
                "state": call.get("state"),
                "for_s": _s(float(call.get("age_ms") or 0.0) / 1000),
                "upstream_silence_s": _s(float(call.get("upstream_silence_ms") or 0.0) / 1000),
                "open_calls": len(running.open_calls),
            }
        if not (running.seen and self._servers):
            return {"kind": "unknown"}
        since = running.started if running.last_end is None else running.last_end
        return {"kind": "between_calls", "for_s": _s(now - since)}

    def document(self, now: float, wall: float, *, limit: int = LIST_LIMIT) -> dict[str, Any]:
        """The status at monotonic ``now`` (``wall``: the same instant in epoch seconds)."""
        slow_after = self._durations.slow_after(self.settings)
        states = dict.fromkeys(ROLLOUT_STATES, 0)
        rows: list[tuple[int, float, dict[str, Any]]] = []
        order = {state: i for i, state in enumerate(ROLLOUT_STATES)}
        for running in self._running.values():
            state = self._state(running, now, slow_after)
            states[state] += 1
            rows.append(
                (
                    order[state],
                    running.started,
                    {
                        "rollout_id": running.rollout_id,
                        "task_index": running.task_index,
                        "rollout_index": running.rollout_index,
                        "attempt": running.attempt,
                        "state": state,
                        "elapsed_s": _s(now - running.started),
                        "calls": running.calls,
                        "doing": self._doing(running, now),
                        **({"last_call": CANCELLED} if running.last_cancelled else {}),
                    },
                )
            )
        rows.sort(key=lambda row: (row[0], row[1]))
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        remaining = self.planned - self.done
        return {
            "schema": DOCUMENT_SCHEMA,
            "run": {
                "id": self.run_id,
                "agent": self.agent,
                "started_at": self.started_at,
                "updated_at": wall,
                "elapsed_s": _s(elapsed),
                "finished": self.finished,
            },
            "counts": {
                "planned": self.planned,
                "skipped": self.skipped,
                "running": len(self._running),
                "done": self.done,
                "failed": self.failed,
                "lost": self.lost,
                "retried": self.retried,
            },
            "states": states,
            "rate_per_s": round(rate, 3),
            "eta_s": None if rate <= 0 or self.finished else _s(max(remaining, 0) / rate),
            "slow_after_s": None if slow_after is None else _s(slow_after),
            "thresholds": self.settings.to_dict(),
            "servers": [
                {"name": a.name, "url": a.url, "ok": a.error is None, "error": a.error}
                for a in self._servers
            ],
            "rollouts": [row[2] for row in rows[:limit]],
        }
