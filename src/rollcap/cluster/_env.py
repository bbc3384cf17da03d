"""An environment, or a collection, spread over a Ray cluster.

``cluster_environment`` is ``rollcap env start --ray``: the model server as replicas on the
cluster's nodes (``ReplicaSet``), the resources and agent servers and the head server in this
process. ``GET /servers`` lists the live replicas; each agent sends a rollout's calls to the
replica it sticks to, as ``resolve_model_base_url`` does.

``cluster_collection`` is ``rollcap eval run --ray``: replicas and rollout workers on the nodes
(or, with ``serve=False``, workers only, calling the agent of a running environment), and the
``Dispatch`` that ``rollcap.collect.collect`` runs every rollout through. The driver keeps
planning, the journal and the one output writer.

Both check the capture directory first, as shared by several hosts (``check_capture_dir``): a
mount whose locks stay on each host is refused, and the lock probe's second process is a
rollout worker on another node where there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from rollcap._runtime.serving import serving
from rollcap.cluster._actors import alive_nodes, current_node
from rollcap.cluster._dispatch import RayDispatch
from rollcap.cluster._replicas import ReplicaSet
from rollcap.cluster._settings import ClusterSettings, require_ray
from rollcap.cluster._workers import WorkerPool
from rollcap.server import create_model_app
from rollcap.store import check_capture_dir
from rollcap.workflow._discovery import find_server, list_servers
from rollcap.workflow._env import (
    DEFAULT_HEAD_PORT,
    Environment,
    ServerInfo,
    head_app,
    plan_servers,
)

__all__ = [
    "ClusterEnvironment",
    "ClusterRun",
    "cluster_collection",
    "cluster_environment",
    "connected",
]

log = logging.getLogger("rollcap.cluster")
_PROBE_TIMEOUT_S = 60.0


@contextlib.contextmanager
def connected(settings: ClusterSettings) -> Iterator[None]:
    """Joined to the cluster for the block: ``ray.init`` unless this process already is."""
    require_ray()
    if ray.is_initialized():
        yield
        return
    handlers = _signal_handlers()
    ray.init(address=settings.address, namespace="rollcap")
    # ray.init installs a SIGTERM handler that exits the process on the spot; the commands
    # stop their servers and actors in order on SIGTERM, so theirs are put back.
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    try:
        yield
    finally:
        ray.shutdown()


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    found = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    return {sig: handler for sig, handler in found.items() if handler is not None}


def _check_capture_dir(directory: Path, workers: WorkerPool | None) -> None:
    """The shared-directory check; the probe's other process is a worker on another node."""
    other = None
    if workers is not None and workers.live():
        here = current_node()
        elsewhere = [m for m in workers.live() if m.node_id != here] or workers.live()
        member = elsewhere[0]

        def other(path: str) -> bool:
            granted: bool = ray.get(member.handle.try_lock.remote(path), timeout=_PROBE_TIMEOUT_S)
            return granted

    for warning in check_capture_dir(directory, shared=True, other=other):
        log.warning("%s", warning)


@dataclass(frozen=True, slots=True)
class ClusterEnvironment:
    environment: Environment
    replicas: ReplicaSet


@contextlib.asynccontextmanager
async def cluster_environment(
    config: Mapping[str, Any],
    cluster: ClusterSettings,
    *,
    model_type: str | None = None,
    resources_server: str | None = None,
    agent: str | None = None,
    host: str = "127.0.0.1",
    head_port: int = DEFAULT_HEAD_PORT,
    nodes: Sequence[str] | None = None,
) -> AsyncIterator[ClusterEnvironment]:
    """``environment(...)`` with the model server as ``cluster.replicas`` replicas on the
    cluster (on ``nodes``, default every alive node, one after the other)."""
    plan = plan_servers(
        config, model_type=model_type, resources_server=resources_server, agent=agent
    )
    create_model_app(plan.model_settings)  # a bad model setting starts nothing
    resources_apps = plan.resources_apps()
    model = plan.model
    with connected(cluster):
        if plan.model_settings.capture_dir is not None:
            await asyncio.to_thread(_check_capture_dir, plan.model_settings.capture_dir, None)
        replicas = await ReplicaSet.start(
            plan.model_settings,
            cluster.replicas,
            list(nodes) if nodes is not None else alive_nodes(),
            host=cluster.host,
            header_timeout_s=plan.header_read_timeout_s,
        )
        try:
            async with contextlib.AsyncExitStack() as stack:
                urls = replicas.urls()
                servers = [ServerInfo(model.name, model.kind, model.type, urls[0])]
                resources = await plan.serve_resources(stack, host, resources_apps)
                servers += resources
                for agent_plan in plan.agents:
                    servers.append(await plan.serve_agent(agent_plan, stack, host, urls, resources))
                app = head_app(config, servers, replicas.listing)
                head_url = await stack.enter_async_context(serving(app, host, head_port))
                yield ClusterEnvironment(Environment(head_url, tuple(servers)), replicas)
        finally:
            await replicas.stop()


@dataclass(frozen=True, slots=True)
class ClusterRun:
    """A collection's hold on the cluster: the dispatch to hand ``collect``."""

    dispatch: RayDispatch
    workers: WorkerPool
    replicas: ReplicaSet | None
    model_url: str | None  # without replicas: the environment's model server

    async def uncorrelated(self) -> int | None:
        """The replicas' count of calls made without a rollout prefix (None without them)."""
        if self.replicas is None:
            return None
        counts = [h.get("uncorrelated") for h in await self.replicas.health()]
        return sum(c for c in counts if isinstance(c, int))


@contextlib.asynccontextmanager
async def cluster_collection(
    config: Mapping[str, Any],
    cluster: ClusterSettings,
    *,
    agent: str,
    capture_dir: Path | None,
    compress_capture_level: int | None = None,
    serve: bool = True,
    model_type: str | None = None,
    resources_server: str | None = None,
    head_url: str | None = None,
    request_timeout: float | None = None,
    nodes: Sequence[str] | None = None,
) -> AsyncIterator[ClusterRun]:
    """Replicas and workers (``serve``), or workers alone against the agent that the head
    server at ``head_url`` names; stopped when the block ends. ``nodes``: where to place them
    (default every alive node). ``compress_capture_level``: the workers compact each rollout's
    capture at that level once its line is built (``collect``'s setting; None: they do not)."""
    plan_args = {"model_type": model_type, "resources_server": resources_server, "agent": agent}
    if serve:
        plan = plan_servers(config, **plan_args)
        plan.agent(agent)
        create_model_app(plan.model_settings)  # a bad model setting starts nothing
    with connected(cluster):
        where = list(nodes) if nodes is not None else alive_nodes()
        async with contextlib.AsyncExitStack() as stack:
            replicas = None
            agent_url = model_url = None
            if serve:
                replicas = await ReplicaSet.start(
                    plan.model_settings,
                    cluster.replicas,
                    where,
                    host=cluster.host,
                    header_timeout_s=plan.header_read_timeout_s,
                )
                stack.push_async_callback(replicas.stop)
            else:
                servers = await asyncio.to_thread(list_servers, head_url)
                agent_url = str(find_server(servers, agent, "responses_api_agents")["url"])
                models = [s for s in servers if s.get("kind") == "responses_api_models"]
                model_url = str(models[0]["url"]) if models else None
            workers = await WorkerPool.start(
                where,
                cluster.workers_per_node,
                capture_dir=capture_dir,
                compress_capture_level=compress_capture_level,
                plan_config=config if serve else None,
                plan_args=plan_args,
                agent=agent,
                request_timeout=request_timeout,
                host=cluster.host,
            )
            stack.push_async_callback(workers.stop)
            if capture_dir is not None:
                await asyncio.to_thread(_check_capture_dir, capture_dir, workers)
            dispatch = RayDispatch(workers, replicas=replicas, agent_url=agent_url)
            stack.push_async_callback(dispatch.close)
            yield ClusterRun(dispatch, workers, replicas, model_url)
