from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from rollcap.affinity import choose_replica, replica_order

REPLICAS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
IDS = [f"{task}-{rollout}" for task in range(500) for rollout in range(2)]


def test_the_choice_ignores_the_order_of_the_replicas() -> None:
    for rollout_id in IDS[:50]:
        first = choose_replica(rollout_id, REPLICAS)
        assert choose_replica(rollout_id, list(reversed(REPLICAS))) == first
        assert replica_order(rollout_id, REPLICAS)[0] == first


def test_rollouts_spread_over_the_replicas() -> None:
    counts = Counter(choose_replica(rollout_id, REPLICAS) for rollout_id in IDS)
    assert set(counts) == set(REPLICAS)
    # 1000 ids over 4 replicas: 250 each on average; a skewed hash would leave one far off.
    assert min(counts.values()) > 180, counts


def test_a_replica_leaving_moves_only_its_own_rollouts() -> None:
    before = {rollout_id: choose_replica(rollout_id, REPLICAS) for rollout_id in IDS}
    gone = REPLICAS[1]
    rest = [r for r in REPLICAS if r != gone]
    for rollout_id, replica in before.items():
        after = choose_replica(rollout_id, rest)
        if replica == gone:
            # Where it moves is its second choice.
            assert after == replica_order(rollout_id, REPLICAS)[1]
        else:
            assert after == replica


def test_every_process_makes_the_same_choice() -> None:
    # Python's own hash() is salted per process; the choice must not be.
    code = (
        "from rollcap.affinity import choose_replica\n"
        f"print([choose_replica(i, {REPLICAS!r}) for i in {IDS[:20]!r}])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == repr([choose_replica(i, REPLICAS) for i in IDS[:20]])


def test_no_replica_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no replica"):
        choose_replica("0-0", [])
