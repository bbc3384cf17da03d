"""The driver's dispatch of one rollout attempt to the cluster (a ``rollcap.collect.Dispatch``).

For each attempt: the replica it sticks to (``ReplicaSet.choose``, over the live replicas),
the least busy worker on that replica's node (else anywhere), one ``POST /rollout`` to it
(``_wire``), its outcome. Nothing retries it. What ends it without an outcome is a *lost*
outcome, written nowhere, and ``collect`` runs the rollout again under the next attempt id:

- the connection to the worker breaks (its process or node died): Ray's verdict on the worker,
  and on the replica of its node, is awaited first, so the next attempt is not sent to the same
  dying node;
- Ray declares the worker or the rollout's replica dead while the attempt runs (a node that
  stopped answering but whose processes, and connections, live on): the attempt is given up;
- the agent could not reach its replica, and the replica is found dead (else that is the
  failure the agent reported).

Without replicas (``--no-serve``) every attempt goes to the environment's agent and only a
worker's death loses it.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from rollcap.cluster._actors import Member, error_text, verdict
from rollcap.cluster._replicas import ReplicaSet
from rollcap.cluster._wire import ROLLOUT_PATH, decode_outcome, encode_request
from rollcap.cluster._workers import AGENT_TARGET, REPLICA_TARGET, WorkerPool
from rollcap.collect import Rollout, RolloutOutcome, failure_line

__all__ = ["RayDispatch"]

log = logging.getLogger("rollcap.cluster")
_CONNECT_TIMEOUT_S = 30.0


class RayDispatch:
    """``await dispatch(rollout)``: run one attempt on the cluster; its ``RolloutOutcome``.

    Use on one event loop; ``await close()`` at the end.
    """

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
        # The attempts in flight per worker and per replica, to give up when one dies.
        self._in_flight: dict[str, set[asyncio.Future[RolloutOutcome]]] = {}
        self._session: aiohttp.ClientSession | None = None
        self.dispatched = 0
        self.lost = 0
        for member in workers.members:
            member.on_death = self._died
        if replicas is not None:
            replicas.on_death(self._died)

    def _died(self, member: Member) -> None:
        calls = self._in_flight.pop(member.name, set())
        if calls:
            log.warning("%s died: giving up its %d rollouts in flight", member.name, len(calls))
        for call in calls:
            call.cancel()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No total timeout: a rollout takes as long as it takes; a dead worker is Ray's call.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=timeout
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, worker: Member, body: bytes) -> RolloutOutcome:
        async with self._client().post(
            worker.url + ROLLOUT_PATH, data=body, headers={"content-type": "application/json"}
        ) as answer:
            data = await answer.read()
            if answer.status != 200:
                raise ValueError(f"{worker.name} answered {answer.status}: {data[:200]!r}")
            return decode_outcome(answer.headers, data)

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
        call = asyncio.ensure_future(
            self._post(worker, encode_request(rollout, target_kind, target))
        )
        holders = [worker] if replica is None else [worker, replica]
        for holder in holders:
            self._in_flight.setdefault(holder.name, set()).add(call)
        worker.in_flight += 1
        self.dispatched += 1
        try:
            # wait() leaves the call's own cancellation (a death) to be read below, while this
            # task's cancellation still ends the wait.
            await asyncio.wait({call})
        finally:
            if not call.done():
                call.cancel()
            worker.in_flight -= 1
            for holder in holders:
                self._in_flight.get(holder.name, set()).discard(call)
        if call.cancelled():
            dead = ", ".join(m.name for m in holders if not m.alive)
            await self._settle_node(holders)
            return self._lose(f"{dead or worker.name} died while it ran")
        error = call.exception()
        if isinstance(error, aiohttp.ClientError | OSError):
            reason = f"{worker.name}: {error_text(error)}"
            alive = await verdict(worker)
            if not alive and replica is not None and replica.node_id == worker.node_id:
                await verdict(replica)
            return self._lose(reason)
        if isinstance(error, ValueError):
            line = failure_line(rollout, "worker_error", str(error))
            return RolloutOutcome(
                RolloutOutcome.FAILED, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
            )
        if error is not None:
            raise error
        outcome = call.result()
        if (
            outcome.kind == RolloutOutcome.FAILED
            and outcome.model_unreachable
            and replica is not None
            and not await verdict(replica)
        ):
            return self._lose(f"its model-server replica {replica.name} died")
        return outcome

    @staticmethod
    async def _settle_node(holders: list[Member]) -> None:
        """Ask Ray about each holder still thought alive on the node of one that died.

        A node's death is learnt actor by actor: without this, the attempt given up when its
        worker was found dead would run again through the same node's replica, not yet found
        dead, and be lost a second time when it is.
        """
        dead_nodes = {m.node_id for m in holders if not m.alive}
        for member in holders:
            if member.alive and member.node_id in dead_nodes:
                await verdict(member)

    def _lose(self, reason: str) -> RolloutOutcome:
        self.lost += 1
        return RolloutOutcome.lost(reason)
