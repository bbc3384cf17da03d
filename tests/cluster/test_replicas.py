"""A replica's server run in-process, and the driver's view of a replica set (no cluster)."""

from __future__ import annotations

import asyncio
import fcntl
import socket
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("ray")

from rollcap.affinity import choose_replica
from rollcap.cluster import ModelReplica, ReplicaSet
from rollcap.cluster._actors import Member, mark_dead
from rollcap.server import ModelServerSettings
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream


async def test_a_replica_serves_rollcap_s_model_server_and_counts_its_calls(
    tmp_path: Path,
) -> None:
    async with FakeUpstream() as upstream:
        settings = ModelServerSettings(
            "openai_model", upstream.url + "/v1", capture_dir=tmp_path / "calls"
        )
        replica = ModelReplica(settings, "127.0.0.1")
        started = await replica.start()
        assert set(started) == {"url", "node_id", "warnings"}
        assert started["url"].startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as session:
            url = f"{started['url']}/ng-rollout/0-0/v1/responses"
            async with session.post(url, json={"model": "m", "input": "hi"}) as response:
                assert response.status == 200
        health = await replica.health()
        assert (health["url"], health["captured"], health["uncorrelated"]) == (started["url"], 1, 0)
        assert await replica.ping() == "ok"
        await replica.stop()
        await replica.wait_stopped()  # returns at once: it stopped on request
    assert len(CaptureStore(tmp_path / "calls").read("0-0")) == 1


async def test_a_replica_closes_a_connection_that_never_finishes_its_headers() -> None:
    # The configured header_read_timeout_s, as a model server started by env start has it.
    replica = ModelReplica(ModelServerSettings("openai_model", "http://x"), "127.0.0.1", 0.3)
    started = await replica.start()
    host, port = started["url"].removeprefix("http://").rsplit(":", 1)

    def idle_connection() -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as idle:
            idle.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # never the blank line
            return idle.recv(4096)

    try:
        assert await asyncio.to_thread(idle_connection) == b""  # closed, long before 10 s
    finally:
        await replica.stop()


async def test_a_replica_that_cannot_start_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = ModelReplica(ModelServerSettings("nope_model", "http://x"), "127.0.0.1")
    assert "unknown or not yet supported model type" in (await bad.start())["error"]
    # A capture directory whose flock keeps nobody out is refused before anything serves.
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: None)
    settings = ModelServerSettings("openai_model", "http://x", capture_dir=tmp_path)
    answer = await ModelReplica(settings, "127.0.0.1").start()
    assert answer["error"].startswith("CaptureDirError: ")


def _set(*nodes: str) -> ReplicaSet:
    return ReplicaSet(
        [Member(f"r{i}", None, node, url=f"http://10.0.0.{i}:8000") for i, node in enumerate(nodes)]
    )


def test_each_rollout_sticks_to_a_live_replica_and_only_the_dead_one_s_move() -> None:
    replicas = _set("a", "b", "c")
    urls = [m.url for m in replicas.members]
    ids = [f"{t}-0" for t in range(60)]
    before: dict[str, Member] = {}
    for rollout_id in ids:
        chosen = replicas.choose(rollout_id)
        assert chosen is not None
        assert chosen.url == choose_replica(rollout_id, urls)
        before[rollout_id] = chosen
    assert replicas.listing() == [{"url": m.url, "node_id": m.node_id} for m in replicas.members]
    died: list[str] = []
    replicas.on_death(lambda m: died.append(m.name))
    for m in replicas.members:
        m.on_death = replicas._died
    gone = replicas.members[1]
    mark_dead(gone, "its node died")
    assert died == ["r1"]
    assert replicas.urls() == (urls[0], urls[2])
    for rollout_id, first in before.items():
        after = replicas.choose(rollout_id)
        assert after is not None
        assert after is not gone
        if first is not gone:
            assert after is first
    for m in replicas.members:
        m.alive = False
    assert replicas.choose("0-0") is None
