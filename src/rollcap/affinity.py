"""Which replica a rollout's calls go to: rendezvous hashing of its rollout id (pure).

Every caller that picks a model server for a rollout (``resolve_model_base_url``, collection
across a cluster, a model server with several upstreams, an agent with several model servers)
picks with ``choose_replica``, so that all of them agree and a rollout's calls, its staging chain
and the engine's prefix cache stay on one replica.

Rendezvous (highest random weight) hashing: each replica scores ``hash(replica, rollout_id)`` and
the highest score wins. When a replica leaves, only the rollouts that were on it move, each to
the replica that scored second for it; the others keep theirs. The hash is BLAKE2b, not Python's
``hash()``, so every process and host computes the same choice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["choose_replica", "replica_order"]


def _score(replica: str, rollout_id: str) -> int:
    # The separator keeps ("ab", "c") and ("a", "bc") apart; neither a URL nor a rollout id
    # holds a NUL.
    digest = hashlib.blake2b(
        f"{replica}\0{rollout_id}".encode(), digest_size=8, usedforsecurity=False
    ).digest()
    return int.from_bytes(digest, "big")


def replica_order(rollout_id: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` from the rollout's first choice to its last (ties broken by name)."""
    return sorted(replicas, key=lambda replica: (-_score(replica, rollout_id), replica))


def choose_replica(rollout_id: str, replicas: Sequence[str]) -> str:
    """The replica (a URL or a name) that ``rollout_id`` sticks to; ``ValueError`` for none.

    The choice depends only on the rollout id and the set of replicas, not on their order.
    """
    if not replicas:
        raise ValueError(f"no replica to choose from for rollout {rollout_id!r}")
    return max(replicas, key=lambda replica: (_score(replica, rollout_id), replica))
