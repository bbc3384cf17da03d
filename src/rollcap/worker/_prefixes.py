"""The last staged call of each recent rollout, with its full ids: a continuation's prefix
without reading its whole chain back.

A continuation's prefix is its chain's deltas, root first. Fetched and verified from the
staging directory, that is every earlier record of the rollout parsed again (their digests
recomputed) on every call: work that grows with the context. Staged records never change
(a key is written once), so the ids of the call this worker just staged, under its staging key
and chain hash, are the next call's prefix whenever the gate names that call as the parent with
that chain hash and that length. Anything else (another parent, a restart, an evicted rollout)
falls back to the fetch.

Bounded: one entry per rollout, the least recently used dropped while the entries hold more than
``max_ids`` ids in all (8 bytes an id).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from rollcap.staging import CaptureAdmission

__all__ = ["PrefixCache"]


@dataclass(frozen=True, slots=True)
class _Last:
    model_call_id: str
    staging_key: str
    chain_hash: str
    ids: array[int]


class PrefixCache:
    """Thread-safe: calls are completed in worker threads."""

    def __init__(self, max_ids: int) -> None:
        if max_ids < 0:
            raise ValueError("max_ids must be >= 0")
        self._max = max_ids
        self._held = 0
        self._last: OrderedDict[str, _Last] = OrderedDict()
        self._lock = threading.Lock()

    def prefix(self, admission: CaptureAdmission) -> list[int] | None:
        """The admission's prefix when its parent is the rollout's last call seen here (the same
        call, staging key, chain hash and length); else None (fetch it)."""
        chain = admission.staging_chain
        if not chain:
            return None
        with self._lock:
            last = self._last.get(admission.rollout_id)
            if last is None:
                return None
            self._last.move_to_end(admission.rollout_id)
        if (
            last.model_call_id != admission.parent_call_id
            or last.staging_key != chain[-1]
            or last.chain_hash != admission.parent_chain_hash
            or len(last.ids) != admission.prev_len
        ):
            return None
        return last.ids.tolist()

    def remember(
        self,
        rollout_id: str,
        model_call_id: str,
        staging_key: str,
        chain_hash: str,
        ids: Sequence[int],
    ) -> None:
        """Keep ``ids`` (a staged call's prefix then delta) as the rollout's last call."""
        if len(ids) > self._max:
            return
        entry = _Last(model_call_id, staging_key, chain_hash, array("Q", ids))
        with self._lock:
            old = self._last.pop(rollout_id, None)
            if old is not None:
                self._held -= len(old.ids)
            self._last[rollout_id] = entry
            self._held += len(entry.ids)
            while self._held > self._max:
                _, dropped = self._last.popitem(last=False)
                self._held -= len(dropped.ids)

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)

    @property
    def held_ids(self) -> int:
        with self._lock:
            return self._held
