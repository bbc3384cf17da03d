"""What the cluster tests share: Ray's simulated cluster, a gate in front of the fake upstream.

``sim`` is one cluster for the whole ``pytest -m ray`` process (a head and two nodes, each
with one CPU and a custom resource named after it; tests that kill a node add their own). Ray is
imported only when it is asked for, so the main suite collects this directory without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from rollcap.cluster import ClusterRun, ClusterSettings, cluster_collection
from rollcap.collect import CollectionSummary, collect
from rollcap.testing import FakeUpstream

if TYPE_CHECKING:  # these import Ray
    from rollcap.cluster import ClusterRun, ReplicaSet

AGENTS = Path(__file__).with_name("agents.py")
MIB = 1 << 20
# Generous: a 2-core machine runs a dozen Ray processes here.
BOUND_S = 120
_INPUT = re.compile(r"(\S+) call (\d+)\Z")


# -- the cluster ------------------------------------------------------------------------------


@dataclass
class SimCluster:
    cluster: Any
    base: Path
    nodes: dict[str, Any] = field(default_factory=dict)  # name -> ray._private.node.Node

    def node_id(self, name: str) -> str:
        node_id: str = self.nodes[name].node_id
        return node_id

    def add(self, name: str) -> str:
        self.nodes[name] = self.cluster.add_node(**_node_args(self.base), resources={name: 1})
        return self.node_id(name)


def _node_args(base: Path) -> dict[str, Any]:
    return {"num_cpus": 1, "object_store_memory": 96 * MIB, "temp_dir": str(base / "ray")}


@pytest.fixture(scope="session")
def sim() -> Iterator[SimCluster]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Unix socket paths are short (107 bytes): Ray's session directory goes in a short temp dir
    # rather than pytest's, and nothing goes to Ray's default /tmp/ray.
    base = Path(tempfile.mkdtemp(prefix="rc-ray-"))
    (base / "ray").mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.setenv("RAY_TMPDIR", str(base))
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **_node_args(base),
                "include_dashboard": False,
                "_system_config": {
                    "health_check_period_ms": 500,
                    "health_check_timeout_ms": 500,
                    "health_check_failure_threshold": 3,
                },
            },
        )
        sim = SimCluster(cluster, base)
        try:
            sim.add("node_a")
            sim.add("node_b")
            ray.init(address=cluster.address, log_to_driver=False, namespace="rollcap-test")
            yield sim
        finally:
            ray.shutdown()
            cluster.shutdown()  # type: ignore[no-untyped-call]  # never `ray stop`: it would end every Ray process on the host
            shutil.rmtree(base, ignore_errors=True)


# -- the gate in front of the fake upstream ---------------------------------------------------


class Gate:
    """Forwards ``POST /v1/responses`` to the fake upstream; holds the calls ``hold`` picks
    (by rollout id and call number) until ``open()``, or until their client leaves."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.hold: Callable[[str, int], bool] = lambda rollout_id, n: False
        self.held = 0
        self.opened = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Gate:
        app = web.Application()
        app.router.add_post("/v1/responses", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.opened.set()
        assert self._session is not None
        assert self._runner is not None
        await self._session.close()
        await self._runner.cleanup()

    def open(self) -> None:
        self.opened.set()

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        match = _INPUT.match(str(orjson.loads(body).get("input", "")))
        if match and self.hold(match.group(1), int(match.group(2))):
            self.held += 1
            await self.opened.wait()
        assert self._session is not None
        async with self._session.post(
            self.upstream + "/v1/responses",
            data=body,
            headers={"content-type": "application/json"},
        ) as answer:
            return web.Response(
                body=await answer.read(),
                status=answer.status,
                content_type="application/json",
            )


@dataclass
class Stack:
    upstream: FakeUpstream
    gate: Gate
    capture: Path
    config: dict[str, Any]


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with FakeUpstream() as upstream, Gate(upstream.url) as gate:
        capture = tmp_path / "calls"
        config = {
            "observability_enabled": True,
            "model_call_capture_dir": str(capture),
            "policy_base_url": gate.url + "/v1",
            "mcqa": {"resources_servers": {"mcqa": {}}},
            "many_calls": {
                "responses_api_agents": {
                    "many_calls": {"entrypoint": f"{AGENTS}:ManyCalls", "resources_server": "mcqa"}
                }
            },
        }
        yield Stack(upstream, gate, capture, config)


def settings(**changes: Any) -> ClusterSettings:
    # Replicas listen on 127.0.0.1: every node of this cluster is this host.
    return ClusterSettings(enabled=True, host="127.0.0.1", **changes)


def collection(
    stack: Stack, nodes: list[str], *, compress_capture_level: int | None = None, **changes: Any
) -> contextlib.AbstractAsyncContextManager[ClusterRun]:
    """``cluster_collection`` of the many_calls agent with mcqa on ``nodes``, the cluster's
    settings ``settings(**changes)``."""
    return cluster_collection(
        stack.config,
        settings(**changes),
        agent="many_calls",
        capture_dir=stack.capture,
        compress_capture_level=compress_capture_level,
        model_type="openai_model",
        resources_server="mcqa",
        nodes=nodes,
    )


def input_file(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(t, option=orjson.OPT_APPEND_NEWLINE) for t in tasks))
    return path


def lines_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def records(capture: Path, rollout_id: str) -> list[dict[str, Any]]:
    """Every line of the rollout's capture file, each parsed whole (a torn one fails here)."""
    return [
        orjson.loads(line)
        for line in (capture / f"{rollout_id}.capture.jsonl").read_bytes().splitlines()
    ]


def input_of(record: dict[str, Any]) -> str:
    return str(record["request"]["input"])


def replicas_of(run: ClusterRun) -> ReplicaSet:
    assert run.replicas is not None
    return run.replicas


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


async def collect_with(
    stack: Stack, run: ClusterRun, tmp_path: Path, tasks: int, **options: Any
) -> CollectionSummary:
    task = {"calls": options.pop("calls", 3), "observe": options.pop("observe", False)}
    return await collect(
        None,
        input_file(tmp_path / "in.jsonl", [task] * tasks),
        tmp_path / "out.jsonl",
        capture_dir=stack.capture,
        dispatch=run.dispatch,
        **options,
    )
