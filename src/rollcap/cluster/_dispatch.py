"""The driver's dispatch of one rollout attempt to the cluster (a ``rollcap.collect.Dispatch``).

For each attempt: the replica it sticks to (``ReplicaSet.choose``, over the live replicas),
the least busy worker on that replica's node (else anywhere), one actor call, its outcome. Ray
never retries the call (``max_task_retries=0``). Whatever Ray reports instead of an answer
(the worker, its node or the call died, or was cancelled) is a *lost* outcome: written nowhere,
and ``collect`` runs the rollout again under the next attempt id.

A replica's death is lost work too: its rollouts in flight are cancelled when Ray declares it
dead, and a rollout whose agent could not reach its replica is lost once the replica is found
dead (else it is the failure the agent reported). Without replicas (``--no-serve``) every
attempt goes to the environment's agent and only a worker's death loses it.

Before a lost outcome returns, Ray's verdict on the worker (and on the replica of its node) is
awaited, so the next attempt goes to what is still alive rather than to the same dying node.
"""

from __future__ import annotations

import contextlib
import logging

import orjson
import ray

from rollcap.cluster._actors import Member, error_text, verdict
from rollcap.cluster._replicas import ReplicaSet
from rollcap.cluster._workers import AGENT_TARGET, REPLICA_TARGET, WorkerPool
from rollcap.collect import Rollout, RolloutOutcome, failure_line

__all__ = ["RayDispatch"]

log = logging.getLogger("rollcap.cluster")


class RayDispatch:
    """``await dispatch(rollout)``: run one attempt on the cluster; its ``RolloutOutcome``."""

    def __init__(
        self,
        workers: WorkerPool,
        replicas: ReplicaSet | None = None,
        agent_url: str | None = None,
    ) -> None:
        if (replicas is None) == (agent_url is None):
            raise ValueError("RayDispatch needs replicas or an agent URL, not both")
        self.workers = workers
        self.replicas = replicas
        self.agent_url = agent_url
        # The calls in flight per replica, to cancel when it dies.
        self._in_flight: dict[str, set[ray.ObjectRef[RolloutOutcome]]] = {}
        self.dispatched = 0
        self.lost = 0
        if replicas is not None:
            replicas.on_death(self._replica_died)

    def _replica_died(self, member: Member) -> None:
        refs = self._in_flight.pop(member.name, set())
        if refs:
            log.warning("%s died: giving up its %d rollouts in flight", member.name, len(refs))
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref)

    async def __call__(self, rollout: Rollout) -> RolloutOutcome:
        replica: Member | None = None
        if self.replicas is not None:
            replica = self.replicas.choose(rollout.rollout_id)
            if replica is None:
                raise RuntimeError("every model-server replica died: no rollout can run")
            target_kind, target = REPLICA_TARGET, replica.url
        else:
            assert self.agent_url is not None
            target_kind, target = AGENT_TARGET, self.agent_url
        worker = self.workers.pick(None if replica is None else replica.node_id)
        ref = worker.handle.run.remote(rollout, target_kind, target)
        flying = None if replica is None else self._in_flight.setdefault(replica.name, set())
        if flying is not None:
            flying.add(ref)
        worker.in_flight += 1
        self.dispatched += 1
        try:
            outcome: RolloutOutcome = await ref
        except ray.exceptions.RayTaskError as exc:
            # The worker's own code raised past its guard: a failure of this rollout, not a death.
            line = failure_line(rollout, "worker_error", error_text(exc))
            return RolloutOutcome(
                RolloutOutcome.FAILED, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
            )
        except ray.exceptions.RayError as exc:
            self.lost += 1
            reason = f"{worker.name}: {error_text(exc)}"
            alive = await verdict(worker)
            if not alive and replica is not None and replica.node_id == worker.node_id:
                await verdict(replica)
            return RolloutOutcome.lost(reason)
        finally:
            worker.in_flight -= 1
            if flying is not None:
                flying.discard(ref)
        if (
            outcome.kind == RolloutOutcome.FAILED
            and outcome.model_unreachable
            and replica is not None
            and self.replicas is not None
            and not await self.replicas.is_alive(replica)
        ):
            self.lost += 1
            return RolloutOutcome.lost(f"its model-server replica {replica.name} died")
        return outcome
