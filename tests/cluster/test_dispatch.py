"""The driver's dispatch over HTTP to stand-in workers: outcomes, lost attempts, where the next
one goes. Ray's verdicts come from stand-in actor handles (no cluster)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

pytest.importorskip("ray")

from tests.cluster.test_actors import Handle, Method, died

from rollcap._runtime.serving import serving
from rollcap.cluster import RayDispatch, ReplicaSet, WorkerPool
from rollcap.cluster._actors import Member, mark_dead
from rollcap.cluster._wire import decode_request, outcome_headers
from rollcap.cluster._workers import AGENT_TARGET, REPLICA_TARGET
from rollcap.collect import Rollout, RolloutOutcome, failure_line

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: as a worker whose process is gone


class FakeWorker:
    """A worker's ``POST /rollout``: answers ``answer`` (``"ok"``, ``"unreachable"``,
    ``"hang"``, ``"bad"``) and notes what it was sent."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.received: list[tuple[str, str, str]] = []
        self.started = asyncio.Event()

    def app(self) -> Starlette:
        async def rollout(request: Request) -> Response:
            rollout, kind, target = decode_request(await request.body())
            self.received.append((rollout.rollout_id, kind, target))
            self.started.set()
            if self.answer == "hang":
                await asyncio.Event().wait()
            if self.answer == "bad":
                return Response(b"boom", 500)
            if self.answer == "unreachable":
                line = failure_line(rollout, "agent_error", "model unreachable")
                outcome = RolloutOutcome(
                    RolloutOutcome.FAILED,
                    orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE),
                    model_unreachable=True,
                )
            else:
                line = {"rollout_id": rollout.rollout_id, "reward": 1.0}
                outcome = RolloutOutcome(
                    RolloutOutcome.OK, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
                )
            return Response(outcome.line, headers=outcome_headers(outcome))

        return Starlette(routes=[Route("/rollout", rollout, methods=["POST"])])


@contextlib.asynccontextmanager
async def two_nodes(
    answers: dict[str, str], ping: dict[str, object] | None = None
) -> AsyncIterator[tuple[RayDispatch, dict[str, FakeWorker]]]:
    """Nodes a and b, each with a replica and a worker; ``answers`` per node (``"dead"``: a
    worker nothing listens for), ``ping`` Ray's answer about node n's actors."""
    ping = ping or {}
    fakes = {n: FakeWorker(a) for n, a in answers.items()}
    async with contextlib.AsyncExitStack() as stack:
        urls = {
            n: DEAD_URL if a == "dead" else await stack.enter_async_context(serving(fakes[n].app()))
            for n, a in answers.items()
        }
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
                Member(f"w-{n}", Handle(ping=Method(ping.get(n, "ok"))), n, url=urls[n])
                for n in ("a", "b")
            ]
        )
        dispatch = RayDispatch(workers, replicas=replicas)
        try:
            yield dispatch, fakes
        finally:
            await dispatch.close()


def _rollout_on(dispatch: RayDispatch, node: str, attempt: int = 0) -> Rollout:
    assert dispatch.replicas is not None
    for task in range(100):
        rollout = Rollout(task, 0, attempt, {"q": task})
        replica = dispatch.replicas.choose(rollout.rollout_id)
        if replica is not None and replica.node_id == node:
            return rollout
    raise AssertionError(f"no rollout sticks to node {node}")


def _member(members: list[Member], node: str) -> Member:
    return next(m for m in members if m.node_id == node)


async def test_an_attempt_runs_on_the_worker_next_to_its_replica() -> None:
    async with two_nodes({"a": "ok", "b": "ok"}) as (dispatch, fakes):
        for node in ("a", "b"):
            rollout = _rollout_on(dispatch, node)
            outcome = await dispatch(rollout)
            assert outcome.kind == RolloutOutcome.OK
            assert orjson.loads(outcome.line)["rollout_id"] == rollout.rollout_id
            assert fakes[node].received == [
                (rollout.rollout_id, REPLICA_TARGET, f"http://{node}:1")
            ]
        assert all(m.in_flight == 0 for m in dispatch.workers.members)


async def test_a_worker_whose_process_is_gone_loses_the_attempt_and_gets_no_more() -> None:
    # Node b died: nothing answers at its worker's address, and Ray's verdict on its worker and
    # its replica is death.
    async with two_nodes({"a": "ok", "b": "dead"}, ping={"b": died()}) as (dispatch, fakes):
        rollout = _rollout_on(dispatch, "b")
        outcome = await dispatch(rollout)
        assert outcome.kind == RolloutOutcome.LOST
        assert outcome.line == b""
        assert outcome.reason.startswith("w-b: ClientConnectorError")
        assert dispatch.lost == 1
        assert not _member(dispatch.workers.members, "b").alive
        assert dispatch.replicas is not None
        assert [m.name for m in dispatch.replicas.live()] == ["r-a"]
        # The next attempt sticks to the replica left, and runs next to it.
        again = Rollout(rollout.task_index, 0, 1, {})
        assert (await dispatch(again)).kind == RolloutOutcome.OK
        assert fakes["a"].received[-1] == (again.rollout_id, REPLICA_TARGET, "http://a:1")


async def test_a_worker_that_died_alone_leaves_its_node_s_replica_alive() -> None:
    async with two_nodes({"a": "ok", "b": "dead"}) as (dispatch, fakes):
        _member(dispatch.workers.members, "b").handle.ping = Method(died())
        assert (await dispatch(_rollout_on(dispatch, "b"))).kind == RolloutOutcome.LOST
        assert dispatch.replicas is not None
        assert len(dispatch.replicas.live()) == 2
        # Its rollouts still stick to replica b, run by the worker left.
        assert (await dispatch(_rollout_on(dispatch, "b"))).kind == RolloutOutcome.OK
        assert fakes["a"].received[-1][2] == "http://b:1"


@pytest.mark.parametrize("dying", ["w-b", "r-b"])
async def test_a_death_ray_declares_mid_attempt_gives_the_attempt_up(dying: str) -> None:
    # A node that stopped answering Ray while its processes (and connections) live on.
    async with two_nodes({"a": "ok", "b": "hang"}) as (dispatch, fakes):
        running = asyncio.create_task(dispatch(_rollout_on(dispatch, "b")))
        await fakes["b"].started.wait()
        assert dispatch.replicas is not None
        members = [*dispatch.workers.members, *dispatch.replicas.members]
        mark_dead(next(m for m in members if m.name == dying), "declared dead")
        outcome = await running
        assert outcome.kind == RolloutOutcome.LOST
        assert outcome.reason == f"{dying} died while it ran"


@pytest.mark.parametrize("dying", ["w-b", "r-b"])
async def test_when_one_actor_of_a_node_is_found_dead_its_neighbour_is_asked_before_the_retry(
    dying: str,
) -> None:
    # The whole node died, but the dispatch learns of one death first: the other actor on the
    # node must be found dead before the attempt is given up, or its retry would go there.
    async with two_nodes({"a": "ok", "b": "hang"}, ping={"b": died()}) as (dispatch, fakes):
        rollout = _rollout_on(dispatch, "b")
        running = asyncio.create_task(dispatch(rollout))
        await fakes["b"].started.wait()
        assert dispatch.replicas is not None
        members = [*dispatch.workers.members, *dispatch.replicas.members]
        mark_dead(next(m for m in members if m.name == dying), "declared dead")
        assert (await running).kind == RolloutOutcome.LOST
        assert [m.node_id for m in members if m.alive] == ["a", "a"]
        again = Rollout(rollout.task_index, 0, 1, {})
        assert (await dispatch(again)).kind == RolloutOutcome.OK
        assert fakes["a"].received[-1] == (again.rollout_id, REPLICA_TARGET, "http://a:1")


async def test_an_answer_that_is_not_an_outcome_is_the_rollout_s_failure() -> None:
    async with two_nodes({"a": "bad", "b": "bad"}) as (dispatch, _):
        outcome = await dispatch(Rollout(3, 1, 0, {}))
    assert outcome.kind == RolloutOutcome.FAILED
    line = orjson.loads(outcome.line)
    assert (line["rollout_id"], line["error"]["kind"]) == ("3-1", "worker_error")
    assert "answered 500" in line["error"]["message"]


@pytest.mark.parametrize("replica_dead", [True, False])
async def test_an_unreachable_model_is_lost_only_when_its_replica_is_dead(
    replica_dead: bool,
) -> None:
    ping: dict[str, object] = {"b": died() if replica_dead else "ok"}
    async with two_nodes({"a": "unreachable", "b": "unreachable"}, ping) as (dispatch, _):
        outcome = await dispatch(_rollout_on(dispatch, "b"))
    assert outcome.kind == (RolloutOutcome.LOST if replica_dead else RolloutOutcome.FAILED)


async def test_without_replicas_every_attempt_goes_to_the_environment_s_agent() -> None:
    fake = FakeWorker("ok")
    async with serving(fake.app()) as url:
        workers = WorkerPool([Member("w", Handle(), "a", url=url)])
        dispatch = RayDispatch(workers, agent_url="http://agent:9")
        try:
            assert (await dispatch(Rollout(0, 0, 0, {}))).kind == RolloutOutcome.OK
        finally:
            await dispatch.close()
    assert fake.received == [("0-0", AGENT_TARGET, "http://agent:9")]
    with pytest.raises(ValueError, match="replicas or an agent URL"):
        RayDispatch(workers)


async def test_no_replica_left_ends_the_run() -> None:
    async with two_nodes({"a": "ok", "b": "ok"}) as (dispatch, _):
        assert dispatch.replicas is not None
        for member in dispatch.replicas.members:
            member.alive = False
        with pytest.raises(RuntimeError, match="every model-server replica died"):
            await dispatch(Rollout(0, 0, 0, {}))
