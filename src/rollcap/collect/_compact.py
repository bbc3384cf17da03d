"""Compaction of each rollout's capture during collection, once its line is built.

Rollouts finish a few at a time under concurrency; one thread of the collector compacts all
that are waiting in one ``CaptureStore.compact_many``, so their fsyncs are shared instead of
paid one rollout after another. A rollout waits for its own compaction (so a slow disk holds
collection back instead of queueing without bound), but a compaction that fails only warns:
the line is built, and the plain file stays as it was.
"""

from __future__ import annotations

import logging

from rollcap._runtime.batch import BatchThread
from rollcap.store import CaptureStore, check_level

__all__ = ["CaptureCompactor"]

log = logging.getLogger("rollcap.collect")


class CaptureCompactor:
    """``await compactor.compact(rollout_id)``: the rollout's capture compacted at ``level``
    (in this compactor's thread, batched with the others waiting); ``close`` ends the thread."""

    def __init__(self, store: CaptureStore, level: int) -> None:
        self.store = store
        self.level = check_level(level)
        self._thread: BatchThread[str, None] = BatchThread(self._compact_all, "rollcap-compact")

    async def compact(self, rollout_id: str) -> None:
        await self._thread.submit(rollout_id)

    def close(self) -> None:
        """Blocks until the compactions under way are done."""
        self._thread.close()

    def _compact_all(self, rollout_ids: list[str]) -> list[None]:
        outcomes = self.store.compact_many(rollout_ids, level=self.level)
        for rollout_id, outcome in zip(rollout_ids, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning(
                    "rollout %s: its capture was not compacted (%s: %s); the plain file stays",
                    rollout_id,
                    type(outcome).__name__,
                    outcome,
                )
        return [None] * len(rollout_ids)
