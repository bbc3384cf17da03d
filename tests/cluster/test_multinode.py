"""rollcap across nodes, on Ray's simulated cluster: a head and two nodes on this machine.

Real raylets, a real GCS, real node death and real placement by node; what it cannot show (locks
across real hosts, NFS caches, partitions) is docs/scale-out.md's checklist. Marked ``ray``: the
module runs in a pytest process of its own (``make test`` runs ``pytest -m ray`` after the main
suite), since a cluster holds about a gigabyte and a dozen processes while it lives.

Every model call goes through ``Gate`` (a pass-through in front of the fake upstream, on
127.0.0.1), which can hold chosen calls in flight: that is how a test knows a node's rollouts are
mid-way when it removes the node, instead of guessing with a timer.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("ray")

from tests.cluster.conftest import (
    BOUND_S,
    SimCluster,
    Stack,
    collect_with,
    collection,
    input_file,
    input_of,
    lines_of,
    records,
    replicas_of,
    until,
)

from rollcap.affinity import choose_replica
from rollcap.cluster import (
    REPLICA_OPTIONS,
    WORKER_OPTIONS,
    ReplicaSet,
)
from rollcap.collect import collect
from rollcap.evidence import CAPTURE_KEY, OBSERVATIONS_KEY, PERF_KEY, TRAJECTORY_KEY
from rollcap.server import ModelServerSettings
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream

pytestmark = pytest.mark.ray


# -- the tests --------------------------------------------------------------------------------


def test_no_actor_of_rollcap_is_ever_retried_by_ray() -> None:
    for options in (WORKER_OPTIONS, REPLICA_OPTIONS):
        assert options["max_task_retries"] == 0
        assert options["max_restarts"] == 0
        assert options["num_cpus"] == 0


async def test_capture_across_nodes_is_complete(
    sim: SimCluster, stack: Stack, tmp_path: Path
) -> None:
    nodes = [sim.node_id("node_a"), sim.node_id("node_b")]
    async with (
        asyncio.timeout(BOUND_S),
        collection(stack, nodes, replicas=2) as run,
    ):
        assert {m.node_id for m in replicas_of(run).live()} == set(nodes)
        assert {m.node_id for m in run.workers.live()} == set(nodes)
        summary = await collect_with(stack, run, tmp_path, 100, concurrency=32, observe=True)
        health = await replicas_of(run).health()
    assert (summary.ran, summary.failed, summary.lost) == (100, 0, 0)
    lines = lines_of(summary.output_path)
    assert [line["rollout_id"] for line in lines] == [f"{t}-0" for t in range(100)]
    for line in lines:
        capture = line[CAPTURE_KEY]
        assert capture["metrics"]["num_calls"] == 3
        assert "gaps" not in capture
        found = records(stack.capture, line["rollout_id"])
        # In its own rollout's file, in call order, nothing else.
        assert [input_of(r) for r in found] == [f"{line['rollout_id']} call {n}" for n in range(3)]
        # The worker built the line as collection on one machine does: the agent's evidence
        # joined with the calls, the trajectory, and ng_perf with the /run it measured.
        (invocation,) = line[OBSERVATIONS_KEY]["records"]
        ids = [r["model_call_id"] for r in found]
        assert [ref["model_call_id"] for ref in invocation["model_calls"]] == ids
        assert [c["model_call_id"] for c in line[TRAJECTORY_KEY]["model_calls"]] == ids
        perf = line[PERF_KEY]
        assert perf["num_turns"] == 3
        assert perf["total_latency_ms"] >= sum(r["latency_ms"] for r in found)
    (entry,) = summary.aggregate_metrics
    assert entry["perf_summary"]["mean_num_turns"] == 3.0
    # Both replicas served, and between them they captured every call once.
    captured = [h["captured"] for h in health]
    assert len(captured) == 2
    assert min(captured) > 0
    assert sum(captured) == 300
    assert len(stack.upstream.requests) == 300


async def test_the_workers_compact_each_capture_once_its_line_is_built(
    sim: SimCluster, stack: Stack, tmp_path: Path
) -> None:
    nodes = [sim.node_id("node_a"), sim.node_id("node_b")]
    async with (
        asyncio.timeout(BOUND_S),
        collection(stack, nodes, replicas=2, compress_capture_level=3) as run,
    ):
        summary = await collect_with(stack, run, tmp_path, 6)
    assert (summary.ran, summary.failed, summary.lost) == (6, 0, 0)
    lines = lines_of(summary.output_path)
    assert [line[CAPTURE_KEY]["metrics"]["num_calls"] for line in lines] == [3] * 6
    store = CaptureStore(stack.capture)
    ids = [line["rollout_id"] for line in lines]
    assert (store.rollout_ids(compressed=True), store.rollout_ids(compressed=False)) == (ids, [])
    assert [len(store.read(rollout_id)) for rollout_id in ids] == [3] * 6


async def test_a_node_removed_mid_run_loses_its_rollouts_and_resume_runs_them_as_attempt_1(
    sim: SimCluster, stack: Stack, tmp_path: Path
) -> None:
    node_a, node_c = sim.node_id("node_a"), sim.add("node_c")
    tasks = 24
    async with (
        asyncio.timeout(BOUND_S),
        collection(stack, [node_a, node_c], replicas=2) as run,
    ):
        urls = replicas_of(run).urls()
        doomed_url = next(m.url for m in replicas_of(run).live() if m.node_id == node_c)
        doomed = {f"{t}-0" for t in range(tasks) if choose_replica(f"{t}-0", urls) == doomed_url}
        assert 0 < len(doomed) < tasks
        # node_c's rollouts make two calls, then hang on their third.
        stack.gate.hold = lambda rollout_id, n: rollout_id in doomed and n == 2
        running = asyncio.create_task(
            collect_with(stack, run, tmp_path, tasks, concurrency=tasks, lost_retries=0)
        )
        await until(lambda: stack.gate.held == len(doomed), "node_c's rollouts held")
        await asyncio.to_thread(sim.cluster.remove_node, sim.nodes.pop("node_c"), False)
        summary = await running
    assert (summary.ran, summary.failed, summary.lost) == (tasks, 0, len(doomed))
    written = {line["rollout_id"] for line in lines_of(summary.output_path)}
    assert written == {f"{t}-0" for t in range(tasks)} - doomed
    assert not summary.failures_path.exists()  # written nowhere: neither output nor failures
    for rollout_id in doomed:
        # The attempt's two finished calls, each a whole record, and no third.
        assert [input_of(r) for r in records(stack.capture, rollout_id)] == [
            f"{rollout_id} call 0",
            f"{rollout_id} call 1",
        ]

    stack.gate.hold = lambda rollout_id, n: False
    async with (
        asyncio.timeout(BOUND_S),
        collection(stack, [node_a], replicas=1) as run,
    ):
        resumed = await collect_with(stack, run, tmp_path, tasks, resume=True)
    assert (resumed.ran, resumed.skipped, resumed.lost) == (len(doomed), tasks - len(doomed), 0)
    lines = lines_of(resumed.output_path)
    assert len(lines) == tasks
    again = [line for line in lines if line["rollout_id"].removesuffix("-a1") in doomed]
    assert sorted(line["rollout_id"] for line in again) == sorted(f"{r}-a1" for r in doomed)
    for line in again:
        assert line["_ng_attempt_index"] == 1
        assert line[CAPTURE_KEY]["metrics"]["num_calls"] == 3
        assert len(records(stack.capture, line["rollout_id"])) == 3


async def test_a_zombie_node_writes_only_to_its_own_attempt(
    sim: SimCluster, stack: Stack, tmp_path: Path
) -> None:
    node_a, node_z = sim.node_id("node_a"), sim.add("node_z")
    tasks = 16
    raylet = sim.nodes["node_z"].all_processes["raylet"][0].process
    try:
        async with (
            asyncio.timeout(BOUND_S),
            collection(stack, [node_a, node_z], replicas=2, lost_retries=1) as run,
        ):
            urls = replicas_of(run).urls()
            zombie_url = next(m.url for m in replicas_of(run).live() if m.node_id == node_z)
            zombies = {
                f"{t}-0" for t in range(tasks) if choose_replica(f"{t}-0", urls) == zombie_url
            }
            assert 0 < len(zombies) < tasks
            stack.gate.hold = lambda rollout_id, n: rollout_id in zombies and n == 2
            running = asyncio.create_task(
                collect_with(stack, run, tmp_path, tasks, concurrency=tasks)
            )
            await until(lambda: stack.gate.held == len(zombies), "node_z's rollouts held")
            # Its raylet frozen, the node misses its health checks and is declared dead, while
            # its replica and worker processes go on.
            os.kill(raylet.pid, signal.SIGSTOP)
            summary = await running  # the lost ones ran again on node_a as attempt 1
            assert not any(m.alive for m in replicas_of(run).members if m.node_id == node_z)
            declared = {r: len(records(stack.capture, r)) for r in zombies}
            # Now the zombie's held calls go through: its replica appends to the old files.
            stack.gate.open()
            await until(
                lambda: all(len(records(stack.capture, r)) == 3 for r in zombies),
                "the zombie's last calls",
            )
    finally:
        os.kill(raylet.pid, signal.SIGCONT)
        await asyncio.to_thread(sim.cluster.remove_node, sim.nodes.pop("node_z"), False)
    assert (summary.ran, summary.failed, summary.lost) == (tasks, 0, 0)
    lines = {line["rollout_id"]: line for line in lines_of(summary.output_path)}
    assert set(lines) == {f"{t}-0" for t in range(tasks) if f"{t}-0" not in zombies} | {
        f"{r}-a1" for r in zombies
    }
    for rollout_id in zombies:
        old = records(stack.capture, rollout_id)
        new = records(stack.capture, rollout_id + "-a1")
        assert declared[rollout_id] == 2  # the old files grew after the declaration...
        assert [input_of(r) for r in old] == [f"{rollout_id} call {n}" for n in range(3)]
        # ...and the new attempt's file holds only the new attempt's calls.
        assert [input_of(r) for r in new] == [f"{rollout_id}-a1 call {n}" for n in range(3)]
        attached = [c["model_call_id"] for c in lines[rollout_id + "-a1"][CAPTURE_KEY]["calls"]]
        assert attached == [r["model_call_id"] for r in new]
        assert not {r["model_call_id"] for r in old} & set(attached)


async def test_two_replicas_appending_to_one_rollout(sim: SimCluster, tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    async with FakeUpstream() as upstream:
        settings = ModelServerSettings("openai_model", upstream.url + "/v1", capture_dir=capture)
        nodes = [sim.node_id("node_a"), sim.node_id("node_b")]
        replicas = await ReplicaSet.start(settings, 2, nodes, host="127.0.0.1")
        try:
            urls = replicas.urls()
            assert len(set(urls)) == 2

            async def call(session: aiohttp.ClientSession, url: str, rollout: str, n: int) -> None:
                async with session.post(
                    f"{url}/ng-rollout/{rollout}/v1/responses",
                    json={"model": "m", "input": f"{rollout} call {n}"},
                ) as response:
                    assert response.status == 200

            async with asyncio.timeout(BOUND_S), aiohttp.ClientSession() as session:
                # One after the other, alternating replicas: the file is in call order.
                for n in range(20):
                    await call(session, urls[n % 2], "shared-0", n)
                # All at once from both: every record whole, none lost.
                await asyncio.gather(
                    *(call(session, urls[n % 2], "shared-1", n) for n in range(200))
                )
        finally:
            await replicas.stop()
    store = CaptureStore(capture)
    assert [input_of(r) for r in store.read("shared-0")] == [
        f"shared-0 call {n}" for n in range(20)
    ]
    burst = store.read("shared-1")  # strict: a torn or interleaved line raises
    assert sorted(input_of(r) for r in burst) == sorted(f"shared-1 call {n}" for n in range(200))
    names = {r["model_ref"]["name"] for r in [*store.read("shared-0"), *burst]}
    assert names == {"policy_model"}


async def test_a_worker_that_dies_is_never_retried_by_ray(
    sim: SimCluster, stack: Stack, tmp_path: Path
) -> None:
    marker = tmp_path / "crashed"
    tasks = [{"calls": 1}] * 6 + [{"calls": 1, "crash_marker": str(marker)}]
    async with (
        asyncio.timeout(BOUND_S),
        collection(
            stack, [sim.node_id("node_a"), sim.node_id("node_b")], replicas=2, lost_retries=1
        ) as run,
    ):
        summary = await collect(
            None,
            input_file(tmp_path / "in.jsonl", tasks),
            tmp_path / "out.jsonl",
            capture_dir=stack.capture,
            dispatch=run.dispatch,
            concurrency=1,  # one at a time: the crash takes only its own rollout with it
        )
        assert len(run.workers.live()) == 1
    # Attempt 0 ran once and died with its worker; Ray did not run it again: a new attempt did.
    assert marker.read_text().splitlines() == ["6-0"]
    assert (summary.ran, summary.failed, summary.lost) == (7, 0, 0)
    lines = lines_of(summary.output_path)
    assert [line["rollout_id"] for line in lines] == [*(f"{t}-0" for t in range(6)), "6-0-a1"]
    assert records(stack.capture, "6-0") == []
    assert len(records(stack.capture, "6-0-a1")) == 1
