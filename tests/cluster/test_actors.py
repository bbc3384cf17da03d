"""Placement, options and death detection, against stand-ins for Ray's actor handles."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from rollcap.cluster._actors import (  # noqa: E402
    ACTOR_OPTIONS,
    ActorGroup,
    Lifecycle,
    Member,
    error_text,
    mark_dead,
    placed_on,
    start_all,
    verdict,
    watch,
)


def died() -> BaseException:
    error: BaseException = ray.exceptions.ActorDiedError()
    return error


def unavailable() -> BaseException:
    message = "the actor is temporarily unavailable"
    error: BaseException = ray.exceptions.ActorUnavailableError(message, None)
    return error


class Method:
    """``handle.<method>.remote()``: each call plays the next step (a value, an exception, or
    ``hang``)."""

    def __init__(self, *steps: object) -> None:
        self.steps = list(steps)
        self.calls = 0

    def remote(self, *args: object) -> asyncio.Future[Any]:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(step, BaseException):
            future.set_exception(step)
        elif step != "hang":
            future.set_result(step)
        return future


class Handle:
    def __init__(self, **methods: object) -> None:
        for name, method in methods.items():
            setattr(self, name, method)


def member(deaths: list[str] | None = None, **methods: Method) -> Member:
    on_death: Callable[[Member], None] | None = None
    if deaths is not None:
        on_death = lambda m: deaths.append(m.name)  # noqa: E731
    return Member("m", Handle(**methods), "node-1", on_death=on_death)


def test_rollcap_actors_are_never_retried_or_restarted_by_ray() -> None:
    assert ACTOR_OPTIONS == {"num_cpus": 0, "max_restarts": 0, "max_task_retries": 0}


def test_an_actor_is_pinned_to_its_node() -> None:
    node_id = "ab" * 28
    strategy = placed_on(node_id)
    assert strategy.node_id == node_id
    assert strategy.soft is False


async def test_start_all_sets_each_url_and_answers_in_order() -> None:
    stopped: list[bool] = []

    async def stop() -> None:
        stopped.append(True)

    members = [
        Member("a", Handle(start=Method({"url": "http://a", "n": 1})), "node-1"),
        Member("b", Handle(start=Method({"url": "http://b", "n": 2})), "node-2"),
    ]
    answers = await start_all(members, stop, "a thing")
    assert [a["n"] for a in answers] == [1, 2]
    assert [m.url for m in members] == ["http://a", "http://b"]
    assert stopped == []


async def test_start_all_stops_everyone_and_names_each_member_that_failed() -> None:
    stopped: list[bool] = []

    async def stop() -> None:
        stopped.append(True)

    members = [
        Member("a", Handle(start=Method({"url": "http://a"})), "node-1"),
        Member("b", Handle(start=Method({"error": "ValueError: bad"})), "node-2"),
    ]
    with pytest.raises(RuntimeError, match=r"^a thing did not start: b: ValueError: bad$"):
        await start_all(members, stop, "a thing")
    assert stopped == [True]


async def test_start_all_stops_everyone_when_a_start_raises() -> None:
    stopped: list[bool] = []

    async def stop() -> None:
        stopped.append(True)

    members = [
        Member("a", Handle(start=Method({"url": "http://a"})), "node-1"),
        Member("b", Handle(start=Method(died())), "node-2"),
    ]
    with pytest.raises(ray.exceptions.ActorDiedError):
        await start_all(members, stop, "a thing")
    assert stopped == [True]


def test_error_text_is_one_short_line() -> None:
    text = error_text(ValueError("first line\nsecond line" + "x" * 500))
    assert text == "ValueError: first line"
    assert len(error_text(ValueError("y" * 1000))) == 300


async def test_a_live_actor_answers_its_ping() -> None:
    m = member(ping=Method("ok"))
    assert await verdict(m)
    assert m.alive


async def test_unavailable_is_asked_again_until_ray_declares_the_death() -> None:
    deaths: list[str] = []
    m = member(deaths, ping=Method(unavailable(), unavailable(), died()))
    assert not await verdict(m, timeout_s=30)
    assert m.handle.ping.calls == 3
    assert not m.alive
    assert m.died.is_set()
    mark_dead(m, "again")  # told once
    assert deaths == ["m"]


async def test_no_answer_in_time_is_not_alive_but_not_dead_either() -> None:
    m = member(ping=Method("hang"))
    assert not await verdict(m, timeout_s=0.05)
    assert m.alive  # not Ray's verdict: only too slow to be given work


async def test_the_watch_marks_a_death_and_ignores_a_requested_stop() -> None:
    deaths: list[str] = []
    dying = member(deaths, wait_stopped=Method(unavailable(), died()))
    await watch(dying)
    assert deaths == ["m"]
    assert not dying.alive
    stopped = member(deaths, wait_stopped=Method(None))
    await watch(stopped)
    assert stopped.alive
    assert deaths == ["m"]


async def test_an_actor_answers_its_ping_and_waits_until_it_stopped() -> None:
    actor = Lifecycle()
    actor.stopped = asyncio.Event()
    assert await actor.ping() == "ok"
    waiting = asyncio.create_task(actor.wait_stopped())
    await asyncio.sleep(0)
    assert not waiting.done()
    actor.stopped.set()
    await asyncio.wait_for(waiting, 5)


async def test_a_group_starts_every_member_then_watches_each() -> None:
    members = [
        Member("a", Handle(start=Method({"url": "http://a"}), wait_stopped=Method("hang")), "n1"),
        Member("b", Handle(start=Method({"url": "http://b"}), wait_stopped=Method(died())), "n2"),
    ]
    group = ActorGroup(members)
    answers = await group._start("a thing")
    assert [a["url"] for a in answers] == ["http://a", "http://b"]
    await asyncio.sleep(0.01)  # the watcher of b learns of its death
    assert [m.name for m in group.live()] == ["a"]
    for task in group._watchers:
        task.cancel()
