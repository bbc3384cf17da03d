"""Rollout workers: long-lived async Ray actors that run rollouts on their node.

A ``RolloutWorker`` is handed ``(rollout, target)`` by the driver and answers a
``RolloutOutcome``: it POSTs ``/run`` to an agent and builds the rollout's line there, on its
node (``rollcap.collect.run_rollout``: reading the capture, projecting it, encoding it), so the
driver keeps only planning, the journal and the one output writer. Failures come back as plain
data (a failures line), never as an exception.

The hand-off is HTTP, not a Ray call: each worker serves ``POST /rollout`` (``_wire``) on its
node's address, and the driver posts to it. A Ray call per rollout cost the driver more CPU than
running the rollout without Ray did, and would carry capture records through Ray; Ray places,
starts and watches the workers, and tells the driver when one died.

The target is either an agent's URL (``eval run --no-serve --ray``: the environment's agent)
or a model-server replica's URL: the worker then runs the configured agent itself, one agent
per replica, called in-process (``_inprocess``), next to the environment's resources servers
(on ``127.0.0.1`` of its node), so each rollout's calls go to exactly the replica the driver
chose for it.

``WorkerPool`` is the driver's side: it starts the workers (``workers_per_node`` on each node,
pinned), picks one for a rollout (the least busy on its replica's node, else the least busy
anywhere) and knows which died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import ray
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.batch import BatchThread, call_each
from rollcap._runtime.heap import freeze_startup
from rollcap._runtime.serving import serving
from rollcap.cluster._actors import (
    ACTOR_OPTIONS,
    ActorGroup,
    Lifecycle,
    Member,
    current_node,
    in_actor,
    node_address,
    placed_on,
)
from rollcap.cluster._inprocess import asgi_caller, lifespan
from rollcap.cluster._wire import ROLLOUT_PATH, decode_request, outcome_headers
from rollcap.collect import (
    AgentCall,
    CaptureCompactor,
    Rollout,
    RolloutOutcome,
    failure_line,
    http_agent,
    run_rollout,
)
from rollcap.store import CaptureStore, check_capture_dir, try_lock
from rollcap.workflow._env import ServerInfo, ServerPlan, plan_servers

__all__ = ["AGENT_TARGET", "REPLICA_TARGET", "WORKER_OPTIONS", "RolloutWorker", "WorkerPool"]

log = logging.getLogger("rollcap.cluster")

AGENT_TARGET = "agent"
REPLICA_TARGET = "replica"
# Through Ray come only start, stop, the death watch and the lock probe: rollouts come by HTTP.
WORKER_OPTIONS: dict[str, Any] = {**ACTOR_OPTIONS, "max_concurrency": 16}
_LOCAL = "127.0.0.1"


class RolloutWorker(Lifecycle):
    """Runs rollouts on its node. Its methods answer plain data, never raise."""

    def __init__(
        self,
        capture_dir: str | None,
        plan_config: Mapping[str, Any] | None,
        plan_args: Mapping[str, Any],
        agent: str | None,
        request_timeout: float | None,
        host: str | None = None,
        compress_capture_level: int | None = None,
    ) -> None:
        self.host = host
        self.capture_dir = capture_dir
        self.compress_capture_level = compress_capture_level
        self.plan_config = plan_config
        self.plan_args = dict(plan_args)
        self.agent_name = agent
        self.request_timeout = request_timeout
        self.stack = contextlib.AsyncExitStack()
        self.plan: ServerPlan | None = None
        self.resources: list[ServerInfo] = []
        self.agents: dict[str, asyncio.Task[AgentCall]] = {}  # replica URL -> its agent
        self.session: aiohttp.ClientSession | None = None
        self.store: CaptureStore | None = None
        self.io: BatchThread[Any, Any] | None = None
        self.compactor: CaptureCompactor | None = None

    async def start(self) -> dict[str, Any]:
        """``{"url", "node_id", "warnings"}`` once it serves ``POST /rollout``, or
        ``{"error"}``."""
        self.stopped = asyncio.Event()
        try:
            warnings: list[str] = []
            if self.capture_dir is not None:
                warnings = await asyncio.to_thread(check_capture_dir, self.capture_dir, shared=True)
                self.store = CaptureStore(self.capture_dir)
                if self.compress_capture_level is not None:
                    self.compactor = CaptureCompactor(self.store, self.compress_capture_level)
            if self.plan_config is not None:
                self.plan = plan_servers(self.plan_config, **self.plan_args)
                assert self.agent_name is not None
                self.plan.agent(self.agent_name)  # a clear error now rather than per rollout
                self.resources = await self.plan.serve_resources(self.stack, _LOCAL)
            timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=30)
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=timeout
            )
            self.io = BatchThread(call_each, "rollcap-worker-io")
            app = Starlette(routes=[Route(ROLLOUT_PATH, self._serve_rollout, methods=["POST"])])
            url = await self.stack.enter_async_context(serving(app, self.host or node_address()))
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        if in_actor():  # its own process: serve with the collector set as the commands do
            freeze_startup()
        return {"url": url, "node_id": current_node(), "warnings": warnings}

    async def _serve_rollout(self, request: Request) -> Response:
        try:
            rollout, kind, target = decode_request(await request.body())
        except ValueError as exc:
            return Response(str(exc).encode(), 400, media_type="text/plain")
        outcome = await self.run(rollout, kind, target)
        return Response(outcome.line, headers=outcome_headers(outcome))

    async def _agent_for(self, replica_url: str) -> AgentCall:
        task = self.agents.get(replica_url)
        if task is None or (task.done() and task.exception() is not None):
            # Started once, shared by the rollouts that wait meanwhile; one that failed to
            # start is tried again by the next rollout.
            task = asyncio.ensure_future(self._start_agent(replica_url))
            self.agents[replica_url] = task
        return await asyncio.shield(task)

    async def _start_agent(self, replica_url: str) -> AgentCall:
        assert self.plan is not None
        assert self.agent_name is not None
        agent = self.plan.agent(self.agent_name)
        app = self.plan.agent_app(agent, replica_url, self.resources)
        await self.stack.enter_async_context(lifespan(app))
        return asgi_caller(app, "/run")

    async def run(self, rollout: Rollout, kind: str, target: str) -> RolloutOutcome:
        """Run one rollout attempt against ``target`` (an agent, or a replica for the
        worker's own agent); its outcome with the line built."""
        try:
            assert self.session is not None
            assert self.io is not None
            if kind == AGENT_TARGET:
                agent = http_agent(self.session, target.rstrip("/") + "/run")
            else:
                agent = await self._agent_for(target)
            return await run_rollout(agent, rollout, self.store, self.io, compactor=self.compactor)
        except Exception as exc:
            line = failure_line(rollout, "worker_error", f"{type(exc).__name__}: {exc}")
            data = orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
            return RolloutOutcome(RolloutOutcome.FAILED, data)

    async def try_lock(self, path: str) -> bool:
        """Whether this process, on this node, is granted the lock on ``path`` (the capture
        directory's lock probe, from another host)."""
        return await asyncio.to_thread(try_lock, path)

    async def stop(self) -> None:
        for task in self.agents.values():
            task.cancel()
        await self.stack.aclose()
        if self.session is not None:
            await self.session.close()
        if self.io is not None:
            await asyncio.to_thread(self.io.close)
        if self.compactor is not None:
            await asyncio.to_thread(self.compactor.close)
        if self.store is not None:
            self.store.close()
        if self.stopped is not None:
            self.stopped.set()


class WorkerPool(ActorGroup):
    """The rollout workers, as the driver sees them. Use on one event loop."""

    @classmethod
    async def start(
        cls,
        nodes: Sequence[str],
        per_node: int,
        *,
        capture_dir: Path | None,
        compress_capture_level: int | None = None,
        plan_config: Mapping[str, Any] | None = None,
        plan_args: Mapping[str, Any] | None = None,
        agent: str | None = None,
        request_timeout: float | None = None,
        host: str | None = None,
    ) -> WorkerPool:
        """Start ``per_node`` workers on each of ``nodes``; all or none (``RuntimeError``).

        With ``plan_config`` the workers run the plan's ``agent`` themselves against the replica
        each rollout is given; without, they call the agent URL each rollout is given. With
        ``compress_capture_level`` they compact each rollout's capture once its line is built.
        """
        if not nodes:
            raise RuntimeError("no alive Ray node to place rollout workers on")
        actor = ray.remote(RolloutWorker)
        options = WORKER_OPTIONS
        members = []
        for node_id in nodes:
            for index in range(per_node):
                handle = actor.options(**options, scheduling_strategy=placed_on(node_id)).remote(
                    None if capture_dir is None else str(capture_dir),
                    plan_config,
                    plan_args or {},
                    agent,
                    request_timeout,
                    host,
                    compress_capture_level,
                )
                members.append(Member(f"worker-{node_id[:8]}-{index}", handle, node_id))
        pool = cls(members)
        started = await pool._start("a rollout worker")
        for member, info in zip(members, started, strict=True):
            for warning in info["warnings"][:1]:  # every worker of a directory says the same
                log.warning("%s: %s", member.name, warning)
        return pool

    def pick(self, node_id: str | None) -> Member:
        """The least busy live worker on ``node_id``, else anywhere; ``RuntimeError`` for none."""
        live = self.live()
        local = [m for m in live if m.node_id == node_id]
        candidates = local or live
        if not candidates:
            raise RuntimeError("every rollout worker died: no node left to run rollouts on")
        return min(candidates, key=lambda m: m.in_flight)
