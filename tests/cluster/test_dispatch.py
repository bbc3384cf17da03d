"""The driver's dispatch: outcomes, lost attempts and where the next one goes (Ray stand-ins)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

ray = pytest.importorskip("ray")

from tests.cluster.test_actors import Handle, Method, died  # noqa: E402

from rollcap.cluster import RayDispatch, ReplicaSet, WorkerPool  # noqa: E402
from rollcap.cluster._actors import Member, mark_dead  # noqa: E402
from rollcap.cluster._workers import AGENT_TARGET, REPLICA_TARGET  # noqa: E402
from rollcap.collect import Rollout, RolloutOutcome  # noqa: E402

OK = RolloutOutcome(RolloutOutcome.OK, b'{"ok": 1}\n')


class Run:
    """``worker.run.remote(rollout, kind, target)``: notes the call, answers what it is told."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, str]] = []
        self.release = asyncio.Event()

    def remote(self, rollout: Rollout, kind: str, target: str) -> Any:
        self.calls.append((rollout.rollout_id, kind, target))

        async def answer() -> object:
            if self.answer == "hang":
                await self.release.wait()
                raise ray.exceptions.TaskCancelledError()
            if isinstance(self.answer, BaseException):
                raise self.answer
            return self.answer

        return asyncio.ensure_future(answer())


def cluster(run: dict[str, object], ping: dict[str, object] | None = None) -> RayDispatch:
    """Two nodes, each with a replica and a worker; ``run`` and ``ping`` per node."""
    ping = ping or {}
    replicas = ReplicaSet(
        [
            Member(f"r-{n}", Handle(ping=Method(ping.get(n, "ok"))), n, url=f"http://{n}:1")
            for n in ("a", "b")
        ]
    )
    for member in replicas.members:
        member.on_death = replicas._died
    workers = WorkerPool(
        [
            Member(f"w-{n}", Handle(run=Run(run[n]), ping=Method(ping.get(n, "ok"))), n)
            for n in ("a", "b")
        ]
    )
    return RayDispatch(workers, replicas=replicas)


def _rollout_on(dispatch: RayDispatch, node: str) -> Rollout:
    assert dispatch.replicas is not None
    for task in range(100):
        rollout = Rollout(task, 0, 0, {})
        replica = dispatch.replicas.choose(rollout.rollout_id)
        if replica is not None and replica.node_id == node:
            return rollout
    raise AssertionError(f"no rollout sticks to node {node}")


def _worker(dispatch: RayDispatch, node: str) -> Member:
    return next(m for m in dispatch.workers.members if m.node_id == node)


async def test_an_attempt_runs_on_the_worker_next_to_its_replica() -> None:
    dispatch = cluster({"a": OK, "b": OK})
    for node in ("a", "b"):
        rollout = _rollout_on(dispatch, node)
        assert await dispatch(rollout) == OK
        assert _worker(dispatch, node).handle.run.calls == [
            (rollout.rollout_id, REPLICA_TARGET, f"http://{node}:1")
        ]
        assert _worker(dispatch, node).in_flight == 0


async def test_a_worker_that_died_loses_the_attempt_and_gets_no_more() -> None:
    # Node b died: its worker's call fails, and Ray's verdict on it and its replica is death.
    dispatch = cluster({"a": OK, "b": died()}, ping={"b": died()})
    rollout = _rollout_on(dispatch, "b")
    outcome = await dispatch(rollout)
    assert outcome.kind == RolloutOutcome.LOST
    assert outcome.line == b""
    assert "w-b: ActorDiedError" in outcome.reason
    assert dispatch.lost == 1
    assert not _worker(dispatch, "b").alive
    assert dispatch.replicas is not None
    assert [m.name for m in dispatch.replicas.live()] == ["r-a"]
    # The next attempt sticks to the replica left, and runs next to it.
    again = Rollout(rollout.task_index, 0, 1, {})
    assert await dispatch(again) == OK
    assert _worker(dispatch, "a").handle.run.calls[-1][0] == again.rollout_id


async def test_a_worker_that_died_alone_leaves_its_node_s_replica_alive() -> None:
    dispatch = cluster({"a": OK, "b": died()}, ping={"b": "ok"})
    _worker(dispatch, "b").handle.ping = Method(died())
    assert (await dispatch(_rollout_on(dispatch, "b"))).kind == RolloutOutcome.LOST
    assert dispatch.replicas is not None
    assert len(dispatch.replicas.live()) == 2
    # Its rollouts still stick to replica b, run by the worker left.
    assert await dispatch(_rollout_on(dispatch, "b")) == OK
    assert _worker(dispatch, "a").handle.run.calls[-1][2] == "http://b:1"


async def test_an_error_raised_in_the_worker_is_the_rollout_s_failure_not_a_loss() -> None:
    error = ray.exceptions.RayTaskError("run", "Traceback ...", ValueError("bug"))
    dispatch = cluster({"a": error, "b": error})
    outcome = await dispatch(Rollout(3, 1, 0, {}))
    assert outcome.kind == RolloutOutcome.FAILED
    line = orjson.loads(outcome.line)
    assert (line["rollout_id"], line["error"]["kind"]) == ("3-1", "worker_error")
    assert all(m.alive for m in dispatch.workers.members)


@pytest.mark.parametrize("replica_dead", [True, False])
async def test_an_unreachable_model_is_lost_only_when_its_replica_is_dead(
    replica_dead: bool,
) -> None:
    failed = RolloutOutcome(RolloutOutcome.FAILED, b'{"error": {}}\n', model_unreachable=True)
    dispatch = cluster({"a": failed, "b": failed}, ping={"b": died() if replica_dead else "ok"})
    outcome = await dispatch(_rollout_on(dispatch, "b"))
    assert outcome.kind == (RolloutOutcome.LOST if replica_dead else RolloutOutcome.FAILED)


async def test_a_replica_s_death_gives_up_its_rollouts_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cancelled: list[object] = []
    monkeypatch.setattr(ray, "cancel", cancelled.append)
    dispatch = cluster({"a": OK, "b": "hang"})
    rollout = _rollout_on(dispatch, "b")
    running = asyncio.create_task(dispatch(rollout))
    await asyncio.sleep(0)
    assert dispatch.replicas is not None
    replica_b = next(m for m in dispatch.replicas.members if m.node_id == "b")
    mark_dead(replica_b, "declared dead")
    assert len(cancelled) == 1
    _worker(dispatch, "b").handle.run.release.set()  # as Ray answers a cancelled call
    outcome = await running
    assert outcome.kind == RolloutOutcome.LOST


async def test_without_replicas_every_attempt_goes_to_the_environment_s_agent() -> None:
    workers = WorkerPool([Member("w", Handle(run=Run(OK)), "a")])
    dispatch = RayDispatch(workers, agent_url="http://agent:9")
    assert await dispatch(Rollout(0, 0, 0, {})) == OK
    assert workers.members[0].handle.run.calls == [("0-0", AGENT_TARGET, "http://agent:9")]
    with pytest.raises(ValueError, match="replicas or an agent URL"):
        RayDispatch(workers)


async def test_no_replica_left_ends_the_run() -> None:
    dispatch = cluster({"a": OK, "b": OK})
    assert dispatch.replicas is not None
    for member in dispatch.replicas.members:
        member.alive = False
    with pytest.raises(RuntimeError, match="every model-server replica died"):
        await dispatch(Rollout(0, 0, 0, {}))
