"""What the replicas and the workers share: placement, options, and knowing when one died.

Every rollcap actor is a plain Ray actor with ``num_cpus=0`` (it waits on sockets; Ray's CPU
accounting would only starve it), pinned to its node, never restarted and never retried
(``max_restarts=0``, ``max_task_retries=0``): a Ray retry would run the same rollout attempt a
second time, whose agent would append to a file the first may still be writing. A dead actor's
work is re-planned by rollcap under a new attempt id instead.

An actor's death is learnt by awaiting a call that only returns when it stops
(``wait_stopped``); the call fails once Ray declares the actor (or its node) dead. After a call
failed, ``verdict`` waits for Ray to make up its mind (a node that stops answering is first
"unavailable", then dead), so that the rollout's next attempt is not sent to the same place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = [
    "ACTOR_OPTIONS",
    "ActorGroup",
    "Lifecycle",
    "Member",
    "alive_nodes",
    "current_node",
    "error_text",
    "in_actor",
    "kill_all",
    "mark_dead",
    "node_address",
    "placed_on",
    "start_all",
    "verdict",
    "watch",
]

log = logging.getLogger("rollcap.cluster")

# The options that keep Ray from ever running a rollout attempt twice (see the docstring).
ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_task_retries": 0}
# How long a watcher waits before asking again after the actor was unreachable for a moment.
_UNAVAILABLE_PAUSE_S = 0.5
_STOP_TIMEOUT_S = 10.0
_VERDICT_TIMEOUT_S = 60.0


@dataclass(eq=False)
class Member:
    """One actor of a replica set or a worker pool, as the driver tracks it."""

    name: str
    handle: Any  # ray.actor.ActorHandle
    node_id: str
    url: str = ""
    alive: bool = True
    in_flight: int = 0
    died: asyncio.Event = field(default_factory=asyncio.Event)
    on_death: Callable[[Member], None] | None = None  # called once, when it is found dead


def mark_dead(member: Member, reason: str) -> None:
    """Record ``member``'s death (once) and tell its owner."""
    if not member.alive:
        return
    log.warning("%s on node %s died: %s", member.name, member.node_id, reason)
    member.alive = False
    member.died.set()
    if member.on_death is not None:
        member.on_death(member)


def placed_on(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Pin an actor to one node; if the node is gone the actor is never placed elsewhere."""
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def alive_nodes() -> list[str]:
    """The ids of the cluster's alive nodes, in a stable order."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return sorted(node["NodeID"] for node in nodes if node.get("Alive"))


def node_address() -> str:
    """The address of this process's node, as Ray knows it."""
    address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return address


def in_actor() -> bool:
    """Whether this process is a Ray actor's (not a driver, not a class used in-process)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def current_node() -> str:
    """This process's node id; ``""`` outside a cluster (an actor's class used in-process),
    where asking Ray would start a local instance."""
    if not ray.is_initialized():
        return ""
    node_id: str = ray.get_runtime_context().get_node_id()
    return node_id


async def start_all(
    members: Sequence[Member], stop: Callable[[], Awaitable[None]], what: str
) -> list[dict[str, Any]]:
    """Start every member and set its ``url``; each member's ``start`` answer, in order.

    If any cannot start (its ``start`` raised or answered ``{"error"}``), ``stop`` is awaited
    so that no started member is left behind, and the error is raised: ``RuntimeError``
    naming each member that failed and what it said, with ``what`` as the subject.
    """
    try:
        answers: list[dict[str, Any]] = await asyncio.gather(
            *(m.handle.start.remote() for m in members)
        )
    except BaseException:
        await stop()
        raise
    errors = [
        f"{member.name}: {answer['error']}"
        for member, answer in zip(members, answers, strict=True)
        if "error" in answer
    ]
    if errors:
        await stop()
        raise RuntimeError(f"{what} did not start: " + "; ".join(errors))
    for member, answer in zip(members, answers, strict=True):
        member.url = answer["url"]
    return answers


def error_text(exc: BaseException) -> str:
    """A one-line account of a Ray error, for logs and lost outcomes."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def watch(member: Member) -> asyncio.Task[None]:
    """A task that learns when ``member`` dies and marks it dead (``mark_dead``)."""

    async def wait() -> None:
        while member.alive:
            try:
                await member.handle.wait_stopped.remote()
                return  # stopped on request: not a death
            except ray.exceptions.ActorUnavailableError:
                # Unreachable for now (its node may be dying): ask again until Ray decides.
                await asyncio.sleep(_UNAVAILABLE_PAUSE_S)
            except ray.exceptions.RayError as exc:
                mark_dead(member, error_text(exc))

    return asyncio.create_task(wait(), name=f"rollcap-watch-{member.name}")


async def verdict(member: Member, timeout_s: float = _VERDICT_TIMEOUT_S) -> bool:
    """Whether ``member`` lives: it answered a ping (True), or Ray declared it dead (False,
    marked). While Ray only finds it unavailable, ask again, up to ``timeout_s`` (then False,
    unmarked: too slow to be given work)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while member.alive:
        left = deadline - loop.time()
        if left <= 0:
            return False
        try:
            async with asyncio.timeout(left):
                await member.handle.ping.remote()
            return True
        except TimeoutError:
            return False
        except ray.exceptions.ActorUnavailableError:
            await asyncio.sleep(_UNAVAILABLE_PAUSE_S)
        except ray.exceptions.RayError as exc:
            mark_dead(member, error_text(exc))
    return False


async def kill_all(members: Sequence[Member], watchers: Sequence[asyncio.Task[None]]) -> None:
    """Stop every live member (its ``stop``, bounded), then make sure with ``ray.kill``."""
    for task in watchers:
        task.cancel()
    live = [m for m in members if m.alive]
    stops = [asyncio.ensure_future(_stop(m)) for m in live]
    if stops:
        await asyncio.wait(stops, timeout=_STOP_TIMEOUT_S)
    for member in members:
        with contextlib.suppress(Exception):
            ray.kill(member.handle, no_restart=True)
        member.alive = False
    for task in watchers:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _stop(member: Member) -> None:
    with contextlib.suppress(ray.exceptions.RayError):
        await member.handle.stop.remote()


class Lifecycle:
    """What the driver asks of every rollcap actor besides its own work: is it alive (``ping``),
    and when has it stopped on request (``wait_stopped``). ``start`` sets ``stopped``; ``stop``
    sets it once it has let go of everything."""

    stopped: asyncio.Event | None = None

    async def ping(self) -> str:
        return "ok"

    async def wait_stopped(self) -> None:
        assert self.stopped is not None
        await self.stopped.wait()


class ActorGroup:
    """The actors of a replica set or a worker pool, as the driver sees them. Use on one event
    loop."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self._watchers: list[asyncio.Task[None]] = []

    async def _start(self, what: str) -> list[dict[str, Any]]:
        """Start every member (``start_all``, ``what`` names one in its error), then watch each
        for its death; each member's ``start`` answer, in order."""
        answers = await start_all(self.members, self.stop, what)
        self._watchers = [watch(m) for m in self.members]
        return answers

    def live(self) -> list[Member]:
        return [m for m in self.members if m.alive]

    async def stop(self) -> None:
        await kill_all(self.members, self._watchers)
