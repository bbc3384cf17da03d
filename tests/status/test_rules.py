"""The states' rules, one at a time, and the bounded quantiles the slow rule reads."""

from __future__ import annotations

import random

import pytest

from rollcap.status import (
    ACTIVE,
    CANCELLED,
    RETRYING,
    SLOW,
    STALLED,
    DurationQuantiles,
    LiveStatusSettings,
    call_state,
    rollout_state,
)

SETTINGS = LiveStatusSettings(stalled_upstream_s=10, stalled_between_calls_s=30, slow_factor=2)


def _call(**changes: object) -> str:
    facts: dict[str, object] = {
        "client_gone": False,
        "awaiting_upstream": True,
        "upstream_silence_s": 0.0,
        "after_failure": False,
    }
    facts.update(changes)
    return call_state(SETTINGS, **facts)  # type: ignore[arg-type]


def test_a_call_is_stalled_only_while_it_waits_on_a_silent_upstream() -> None:
    assert _call() == ACTIVE
    assert _call(upstream_silence_s=9.9) == ACTIVE
    assert _call(upstream_silence_s=10.0) == STALLED
    # Once the answer is whole (writing its record), upstream's silence says nothing.
    assert _call(upstream_silence_s=100.0, awaiting_upstream=False) == ACTIVE


def test_a_calls_states_come_in_their_order() -> None:
    assert _call(after_failure=True) == RETRYING
    assert _call(after_failure=True, upstream_silence_s=11.0) == STALLED
    assert _call(client_gone=True, upstream_silence_s=11.0, after_failure=True) == CANCELLED


def _rollout(**changes: object) -> str:
    facts: dict[str, object] = {
        "call_states": [],
        "idle_s": 0.0,
        "last_call_cancelled": False,
        "redispatched": False,
        "elapsed_s": 1.0,
        "slow_after_s": None,
    }
    facts.update(changes)
    return rollout_state(SETTINGS, **facts)  # type: ignore[arg-type]


def test_a_rollout_stalls_in_a_call_or_between_calls() -> None:
    assert _rollout() == ACTIVE
    assert _rollout(call_states=[ACTIVE, STALLED]) == STALLED
    assert _rollout(idle_s=29.0) == ACTIVE
    assert _rollout(idle_s=30.0) == STALLED  # the agent or a tool is stuck
    # A call open: its own silence decides, not the time since the last one ended.
    assert _rollout(idle_s=300.0, call_states=[ACTIVE]) == ACTIVE


def test_a_rollouts_other_states_and_their_order() -> None:
    assert _rollout(last_call_cancelled=True) == CANCELLED
    assert _rollout(last_call_cancelled=True, call_states=[ACTIVE]) == ACTIVE  # a new call
    assert _rollout(redispatched=True) == RETRYING
    assert _rollout(call_states=[RETRYING]) == RETRYING
    assert _rollout(elapsed_s=10.0, slow_after_s=9.0) == SLOW
    assert _rollout(elapsed_s=10.0, slow_after_s=None) == ACTIVE  # too few finished to tell
    everything = {
        "call_states": [STALLED, RETRYING],
        "last_call_cancelled": True,
        "redispatched": True,
        "elapsed_s": 100.0,
        "slow_after_s": 1.0,
    }
    assert _rollout(**everything) == STALLED
    assert _rollout(**{**everything, "call_states": []}) == CANCELLED
    assert _rollout(**{**everything, "call_states": [], "last_call_cancelled": False}) == RETRYING


def test_quantiles_are_within_two_percent_in_bounded_memory() -> None:
    quantiles = DurationQuantiles()
    assert quantiles.quantile(0.95) is None
    rng = random.Random(7)
    values = [rng.lognormvariate(2, 1) for _ in range(20_000)]
    for value in values:
        quantiles.add(value)
    exact = sorted(values)[int(0.95 * len(values)) - 1]
    got = quantiles.quantile(0.95)
    assert got is not None
    assert exact <= got <= exact * 1.021
    assert len(quantiles._buckets) < 1000  # buckets, not values
    quantiles.add(0.0)  # shorter than the floor: the first bucket
    assert quantiles.quantile(0.0) == pytest.approx(0.001)


def test_slow_needs_enough_finished_rollouts() -> None:
    settings = LiveStatusSettings(slow_factor=3, slow_min_finished=5)
    quantiles = DurationQuantiles()
    for _ in range(4):
        quantiles.add(10.0)
    assert quantiles.slow_after(settings) is None
    quantiles.add(10.0)
    after = quantiles.slow_after(settings)
    assert after is not None
    assert 30.0 <= after <= 30.0 * 1.021


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"stalled_upstream_s": 0}, "live_status.stalled_upstream_s must be a positive number"),
        ({"interval_s": "1"}, "live_status.interval_s must be a positive number"),
        ({"slow_min_finished": 0}, "live_status.slow_min_finished must be a whole number"),
        ({"stall": 1}, "live_status: unknown key(s) stall"),
        ([1], "live_status must be a mapping"),
    ],
)
def test_bad_thresholds_are_refused_by_name(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LiveStatusSettings.from_config(raw)


def test_thresholds_come_from_configuration() -> None:
    settings = LiveStatusSettings.from_config({"stalled_upstream_s": 2, "slow_factor": 1.5})
    assert (settings.stalled_upstream_s, settings.slow_factor) == (2, 1.5)
    assert settings.stalled_between_calls_s == LiveStatusSettings().stalled_between_calls_s
    assert LiveStatusSettings.from_config(None) == LiveStatusSettings()
    assert set(settings.to_dict()) == set(LiveStatusSettings.__dataclass_fields__)
