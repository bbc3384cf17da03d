"""Rollout collection through Ray on a simulated cluster against the same collection without Ray.

    .venv/bin/python bench/ray.py [--tasks N] [--concurrency C] [--rounds R]

The fake upstream (``python -m rollcap.testing``) runs in a process of its own. Without Ray:
``rollcap env start`` (mcqa and its agent, capture on) in a process of its own, collection here
against its agent. Through Ray: Ray's simulated cluster (a head and two nodes on this machine,
one CPU each, as the cluster tests start it), ``cluster_collection`` with two model-server
replicas and one rollout worker per node (which run the agent and the resources server), the
same collection here feeding them. Both collect the example MCQA tasks repeated to N rollouts
with capture on, each round a fresh environment and capture directory; the rounds alternate.
Reported: rollouts/s of each (median), the ratio Ray / no Ray, and the driver's CPU per rollout
(this process's CPU time over the collection: planning, journal, dispatch, output), the
dispatch cost the driver pays for each rollout. Start-up (the cluster, the actors) is not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _procs import started

# This file is bench/ray.py: with its directory first on the path, `import ray` would import it.
sys.path.remove(os.path.dirname(os.path.abspath(__file__)))

from ray.cluster_utils import Cluster

import ray
from rollcap.cluster import ClusterSettings, cluster_collection
from rollcap.collect import CollectionSummary, collect
from rollcap.gym import example_data_path

BIN = Path(sys.executable).parent
KEY = "bench-key"
MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _agent_url(lines: list[str]) -> str:
    for line in lines:
        if line.startswith("responses_api_agents"):
            return line.split()[-1]
    raise RuntimeError("env start printed no agent")


async def _timed(run: Any) -> tuple[CollectionSummary, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    summary: CollectionSummary = await run
    return summary, time.perf_counter() - wall, time.process_time() - cpu


def _local(agent: str, example: Path, out: Path, calls: Path, repeats: int, concurrency: int
           ) -> tuple[float, float]:  # fmt: skip
    run = collect(
        agent, example, out, capture_dir=calls, num_repeats=repeats, concurrency=concurrency
    )
    summary, wall, cpu = asyncio.run(_timed(run))
    assert summary.failed == 0, summary
    return summary.ran / wall, cpu / summary.ran


def _on_ray(config: dict[str, Any], nodes: list[str], example: Path, out: Path, calls: Path,
            repeats: int, concurrency: int) -> tuple[float, float]:  # fmt: skip
    async def run() -> tuple[CollectionSummary, float, float]:
        cluster = ClusterSettings(enabled=True, replicas=2, host="127.0.0.1")
        async with cluster_collection(
            config,
            cluster,
            agent="mcqa_simple_agent",
            capture_dir=calls,
            model_type="openai_model",
            resources_server="mcqa",
            nodes=nodes,
        ) as on_cluster:
            run = collect(
                None,
                example,
                out,
                capture_dir=calls,
                num_repeats=repeats,
                concurrency=concurrency,
                dispatch=on_cluster.dispatch,
            )
            return await _timed(run)

    summary, wall, cpu = asyncio.run(run())
    assert summary.failed == 0, summary
    assert summary.lost == 0, summary
    return summary.ran / wall, cpu / summary.ran


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="rollouts per run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rollcap-bench-ray-"))
    # Short: Ray's Unix sockets live under it.
    base = Path(tempfile.mkdtemp(prefix="rc-ray-"))
    (base / "ray").mkdir()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_TMPDIR"] = str(base)
    example = example_data_path("mcqa")
    repeats = -(-args.tasks // len(example.read_text().splitlines()))
    ran = repeats * len(example.read_text().splitlines())
    node = {"num_cpus": 1, "object_store_memory": 96 * MIB, "temp_dir": str(base / "ray")}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        nodes = [cluster.add_node(**node, resources={f"n{i}": 1}).node_id for i in range(2)]
        ray.init(address=cluster.address, log_to_driver=False)
        env = [str(BIN / "rollcap"), "env", "start", "--resources-server", "mcqa",
               "--model-type", "openai_model"]  # fmt: skip
        up_args = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        rates: dict[str, list[float]] = {"no Ray": [], "Ray": []}
        costs: dict[str, list[float]] = {"no Ray": [], "Ray": []}
        with started(up_args, "http") as (_, up_lines):
            upstream = up_lines[0].strip()
            common = [f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}"]
            for n in range(args.rounds):
                calls = work / f"local-calls-{n}"
                capture = ["++observability_enabled=true", f"++model_call_capture_dir={calls}"]
                local_env = [*env, "--head-port", str(_free_port()), *common, *capture]
                with started(local_env, "head") as (_, lines):
                    rate, cost = _local(_agent_url(lines), example, work / f"local-{n}.jsonl",
                                        calls, repeats, args.concurrency)  # fmt: skip
                rates["no Ray"].append(rate)
                costs["no Ray"].append(cost)
                calls = work / f"ray-calls-{n}"
                config = {
                    "observability_enabled": True,
                    "model_call_capture_dir": str(calls),
                    "policy_base_url": f"{upstream}/v1",
                    "policy_api_key": KEY,
                }
                rate, cost = _on_ray(config, nodes, example, work / f"ray-{n}.jsonl", calls,
                                     repeats, args.concurrency)  # fmt: skip
                rates["Ray"].append(rate)
                costs["Ray"].append(cost)
        print(f"{ran} rollouts x {args.rounds} rounds, {args.concurrency} concurrent, capture on")
        print(f"{'':<8}{'rollouts/s':>12}{'driver CPU us/rollout':>24}   (each round)")
        for label in ("no Ray", "Ray"):
            print(f"{label:<8}{statistics.median(rates[label]):>12.0f}"
                  f"{statistics.median(costs[label]) * 1e6:>24.0f}   "
                  f"({', '.join(f'{v:.0f}' for v in rates[label])})")  # fmt: skip
        ratio = statistics.median(rates["Ray"]) / statistics.median(rates["no Ray"])
        print(f"Ray / no Ray: {ratio:.2f} (a head and 2 nodes on this machine's cores)")
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
