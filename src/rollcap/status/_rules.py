"""The live states of a model call and of a rollout, one rule each (pure).

A call open on a model server (``GET /inflight``) is, in this order of precedence:

- ``cancelled``: its client went away before the answer was whole (the call stays listed so
  for ``cancelled_linger_s`` after it ends, then is gone);
- ``stalled``: no byte from upstream for ``stalled_upstream_s`` while the answer is awaited
  (since the call started, when none came yet);
- ``retrying``: the call before it, of the same rollout on the same server, failed;
- ``active``: anything else.

A running rollout (a collection's status) is, in this order:

- ``stalled``: one of its calls is stalled, or no call of it is open and none was for
  ``stalled_between_calls_s`` (since its last call ended, or since it started): the agent or a
  tool is stuck;
- ``cancelled``: its last call was given up by its client, and no call opened since;
- ``retrying``: it runs again after its first attempt was lost, or one of its calls is retrying;
- ``slow``: it has run longer than ``slow_factor`` times the p95 of this run's finished
  rollouts (once ``slow_min_finished`` have finished);
- ``active``: anything else.

``finished`` rollouts are counted, not listed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACTIVE",
    "CALL_STATES",
    "CANCELLED",
    "RETRYING",
    "ROLLOUT_STATES",
    "SLOW",
    "STALLED",
    "DurationQuantiles",
    "LiveStatusSettings",
    "call_state",
    "rollout_state",
]

ACTIVE = "active"
SLOW = "slow"
STALLED = "stalled"
RETRYING = "retrying"
CANCELLED = "cancelled"
CALL_STATES = (STALLED, CANCELLED, RETRYING, ACTIVE)
# The order a person reads them in: the ones that need a look first.
ROLLOUT_STATES = (STALLED, CANCELLED, RETRYING, SLOW, ACTIVE)


@dataclass(frozen=True, slots=True)
class LiveStatusSettings:
    """The ``live_status`` block: how often a collection's status is refreshed, and the
    thresholds of the states it and ``/inflight`` give (``rollcap.status``). Seconds, except
    ``slow_factor`` (a multiple) and ``slow_min_finished`` (a count)."""

    interval_s: float = 1.0
    stalled_upstream_s: float = 60.0
    stalled_between_calls_s: float = 300.0
    slow_factor: float = 3.0
    slow_min_finished: int = 10
    cancelled_linger_s: float = 10.0

    def __post_init__(self) -> None:
        for key in (
            "interval_s",
            "stalled_upstream_s",
            "stalled_between_calls_s",
            "slow_factor",
            "cancelled_linger_s",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"live_status.{key} must be a positive number, got {value!r}")
        count = self.slow_min_finished
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(
                f"live_status.slow_min_finished must be a whole number of at least 1, got {count!r}"
            )

    @classmethod
    def from_config(cls, raw: object) -> LiveStatusSettings:
        """The block as configured (``None``: every default); an unknown key is refused."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"live_status must be a mapping, got {raw!r}")
        known = cls.__dataclass_fields__
        unknown = sorted(str(key) for key in raw if key not in known)
        if unknown:
            raise ValueError(
                f"live_status: unknown key(s) {', '.join(unknown)}; expected {', '.join(known)}"
            )
        return cls(**{str(key): value for key, value in raw.items()})

    def to_dict(self) -> dict[str, float | int]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


def call_state(
    settings: LiveStatusSettings,
    *,
    client_gone: bool,
    awaiting_upstream: bool,
    upstream_silence_s: float,
    after_failure: bool,
) -> str:
    """The state of one open call (see the module's rules). ``awaiting_upstream``: the answer
    is still coming (once it is whole, upstream's silence says nothing)."""
    if client_gone:
        return CANCELLED
    if awaiting_upstream and upstream_silence_s >= settings.stalled_upstream_s:
        return STALLED
    if after_failure:
        return RETRYING
    return ACTIVE


def rollout_state(
    settings: LiveStatusSettings,
    *,
    call_states: list[str],
    idle_s: float,
    last_call_cancelled: bool,
    redispatched: bool,
    elapsed_s: float,
    slow_after_s: float | None,
) -> str:
    """The state of one running rollout. ``call_states``: those of its open calls;
    ``idle_s``: how long since its last call ended (or since it started, when none did);
    ``slow_after_s``: the run's slow threshold (``DurationQuantiles.slow_after``), ``None``
    while too few rollouts finished."""
    if STALLED in call_states or (not call_states and idle_s >= settings.stalled_between_calls_s):
        return STALLED
    if not call_states and last_call_cancelled:
        return CANCELLED
    if redispatched or RETRYING in call_states:
        return RETRYING
    if slow_after_s is not None and elapsed_s > slow_after_s:
        return SLOW
    return ACTIVE


class DurationQuantiles:
    """Quantiles of finished rollouts' durations in bounded memory: a histogram of buckets
    that grow by 2% each, so that a quantile is known to within 2% whatever the count."""

    _RATIO = 1.02
    _FLOOR_S = 0.001  # everything shorter is counted in the first bucket

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0

    def add(self, seconds: float) -> None:
        index = 0
        if seconds > self._FLOOR_S:
            index = math.ceil(math.log(seconds / self._FLOOR_S, self._RATIO))
        self._buckets[index] = self._buckets.get(index, 0) + 1
        self.count += 1

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (an upper bound within 2%), ``None`` with no duration yet."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen >= rank:
                return float(self._FLOOR_S * self._RATIO**index)
        raise AssertionError("the ranks add up to the count")  # pragma: no cover

    def slow_after(self, settings: LiveStatusSettings) -> float | None:
        """Past how many seconds a running rollout is slow: ``slow_factor`` x the p95, once
        ``slow_min_finished`` rollouts finished."""
        if self.count < settings.slow_min_finished:
            return None
        p95 = self.quantile(0.95)
        return None if p95 is None else settings.slow_factor * p95
