"""Model-server replicas: rollcap's model server in plain Ray actors, one uvicorn each.

Each ``ModelReplica`` actor runs the same ASGI app as ``rollcap serve model``
(``create_model_app``) under its own uvicorn, on its node's address and a free port, so model
traffic goes from agents to replicas over HTTP and never through Ray. Ray only places the
replicas (one per node in turn, pinned), watches them and tells when one dies.

``ReplicaSet`` is the driver's side: it starts the replicas, knows the live ones, picks the one a
rollout sticks to (``rollcap.affinity.choose_replica`` over the live replicas' URLs, as
``resolve_model_base_url`` does from ``GET /servers``) and calls back when one dies, so that its
rollouts in flight can be given up and run again elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray

from rollcap._runtime.heap import freeze_startup
from rollcap._runtime.serving import serving
from rollcap.affinity import choose_replica
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
from rollcap.config import HEADER_READ_TIMEOUT_S
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.store import check_capture_dir

__all__ = ["REPLICA_OPTIONS", "ModelReplica", "ReplicaSet"]

log = logging.getLogger("rollcap.cluster")

# Few calls reach a replica through Ray (start, health, stop, the death watch): its traffic is
# HTTP, served by its own uvicorn.
REPLICA_OPTIONS: dict[str, Any] = {**ACTOR_OPTIONS, "max_concurrency": 32}


class ModelReplica(Lifecycle):
    """One model server in a Ray actor. Its methods answer plain data, never raise."""

    def __init__(
        self,
        settings: ModelServerSettings,
        host: str | None,
        header_timeout_s: float = HEADER_READ_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.host = host
        self.header_timeout_s = header_timeout_s
        self.stack = contextlib.AsyncExitStack()
        self.app: Any = None
        self.url = ""

    async def start(self) -> dict[str, Any]:
        """``{"url", "node_id", "warnings"}`` once it serves, or ``{"error"}``."""
        self.stopped = asyncio.Event()
        try:
            warnings: list[str] = []
            if self.settings.capture_dir is not None:
                warnings = await asyncio.to_thread(
                    check_capture_dir, self.settings.capture_dir, shared=True
                )
            self.app = create_model_app(self.settings)
            host = self.host or node_address()
            self.url = await self.stack.enter_async_context(
                serving(self.app, host, header_timeout_s=self.header_timeout_s)
            )
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        if in_actor():  # its own process: serve with the collector set as the commands do
            freeze_startup()
        return {"url": self.url, "node_id": current_node(), "warnings": warnings}

    async def health(self) -> dict[str, Any]:
        """Its URL and what its ``GET /health`` counts."""
        state = self.app.state.capture
        return {
            "url": self.url,
            "name": self.settings.name,
            "captured": state.captured,
            "uncorrelated": state.uncorrelated,
            "capture_failures": state.capture_failures,
        }

    async def stop(self) -> None:
        await self.stack.aclose()
        if self.stopped is not None:
            self.stopped.set()


class ReplicaSet(ActorGroup):
    """The replicas of one model server, as the driver sees them. Use on one event loop."""

    def __init__(self, members: list[Member]) -> None:
        super().__init__(members)
        self._on_death: list[Callable[[Member], None]] = []

    @classmethod
    async def start(
        cls,
        settings: ModelServerSettings,
        count: int,
        nodes: Sequence[str],
        *,
        host: str | None = None,
        header_timeout_s: float = HEADER_READ_TIMEOUT_S,
    ) -> ReplicaSet:
        """Start ``count`` replicas, the i-th on ``nodes[i % len(nodes)]``; all or none.
        ``header_timeout_s``: how long each waits for a client's request headers.

        A replica that cannot start (a bad upstream setting, a capture directory refused) stops
        the others and raises ``RuntimeError`` with its reason.
        """
        if not nodes:
            raise RuntimeError("no alive Ray node to place model-server replicas on")
        actor = ray.remote(ModelReplica)
        members = []
        for index in range(count):
            node_id = nodes[index % len(nodes)]
            name = f"{settings.name}-{index}"
            handle = actor.options(
                **REPLICA_OPTIONS, scheduling_strategy=placed_on(node_id), name=None
            ).remote(settings, host, header_timeout_s)
            members.append(Member(name, handle, node_id))
        replicas = cls(members)
        for member in members:
            member.on_death = replicas._died
        started = await replicas._start("a model-server replica")
        for member, info in zip(members, started, strict=True):
            member.node_id = info["node_id"]
            for warning in info["warnings"]:
                log.warning("%s: %s", member.name, warning)
        return replicas

    def _died(self, member: Member) -> None:
        for callback in list(self._on_death):
            callback(member)

    def on_death(self, callback: Callable[[Member], None]) -> None:
        """Call ``callback(member)`` when a replica dies."""
        self._on_death.append(callback)

    def listing(self) -> list[dict[str, str]]:
        """The live replicas as ``GET /servers`` lists them."""
        return [{"url": m.url, "node_id": m.node_id} for m in self.live()]

    def urls(self) -> tuple[str, ...]:
        return tuple(m.url for m in self.live())

    def choose(self, rollout_id: str) -> Member | None:
        """The live replica ``rollout_id`` sticks to; None when none is alive."""
        live = {m.url: m for m in self.live()}
        return live[choose_replica(rollout_id, list(live))] if live else None

    async def health(self) -> list[dict[str, Any]]:
        """Each live replica's counters (``captured``, ``uncorrelated``, ``capture_failures``)."""
        live = self.live()
        answers = await asyncio.gather(
            *(m.handle.health.remote() for m in live), return_exceptions=True
        )
        return [a for a in answers if isinstance(a, dict)]
