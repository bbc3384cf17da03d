"""Rollout collection through Ray on a simulated cluster against the same collection without Ray.

    .venv/bin/python bench/ray.py [--tasks N] [--calls K] [--concurrency C] [--rounds R]

The fake upstream (``python -m rollcap.testing``) runs in a process of its own. Without Ray:
``rollcap env start`` (mcqa and its agent, capture on) in a process of its own, collection here
against its agent. Through Ray: Ray's simulated cluster (a head and two nodes on this machine,
one CPU each, as the cluster tests start it), ``cluster_collection`` with two model-server
replicas and one rollout worker per node (which run the agent and the resources server), the
same collection here feeding them. Both collect the example MCQA tasks repeated to N rollouts
with capture on, each rollout making K model calls (``--calls``: the mcqa agent, or for K > 1
``bench/_agents.py``'s, which calls K - 1 times more before its graded call), each round a fresh
environment and capture directory; the rounds alternate.
Reported: rollouts/s of each (median), the ratio Ray / no Ray, the driver's CPU per rollout
(this process's CPU time over the collection: planning, journal, dispatch, output), the
dispatch cost the driver pays for each rollout, and the CPU per rollout of every process the
bench started (upstream, environment or cluster, driver; Linux ``/proc``), which other load on
the machine moves far less than rollouts/s. Start-up (the cluster, the actors) is not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from _procs import agent_url, free_port, started

# This file is bench/ray.py: with its directory first on the path, `import ray` would import it.
sys.path.remove(os.path.dirname(os.path.abspath(__file__)))

import ray
from ray.cluster_utils import Cluster

from rollcap.cluster import ClusterSettings, cluster_collection
from rollcap.collect import CollectionSummary, collect
from rollcap.gym import example_data_path

BIN = Path(sys.executable).parent
KEY = "bench-key"
MIB = 1 << 20


def _tree_cpu() -> float:
    """CPU seconds used so far by this process and every process below it (Linux)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me, total = os.getpid(), 0.0
    for pid, cpu in times.items():
        ancestor = pid
        while ancestor > 1 and ancestor != me:
            ancestor = parents.get(ancestor, 0)
        if ancestor == me:
            total += cpu
    return total


@dataclass(frozen=True)
class Round:
    rate: float  # rollouts/s
    driver_us: float  # this process's CPU per rollout
    total_us: float  # every process's CPU per rollout


async def _timed(run: Any) -> Round:
    tree, cpu, wall = _tree_cpu(), time.process_time(), time.perf_counter()
    summary: CollectionSummary = await run
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tree = _tree_cpu() - tree
    assert summary.failed == 0, summary
    assert summary.lost == 0, summary
    return Round(summary.ran / wall, cpu / summary.ran * 1e6, tree / summary.ran * 1e6)


AGENT_FILE = Path(__file__).with_name("_agents.py")


def _agent_config(calls: int) -> tuple[str, dict[str, Any]]:
    """The agent to run and the config blocks that define it."""
    if calls == 1:
        return "mcqa_simple_agent", {}
    entry = {"entrypoint": f"{AGENT_FILE}:RepeatedCalls", "resources_server": "mcqa"}
    blocks = {
        "mcqa": {"resources_servers": {"mcqa": {}}},
        "repeated_calls": {"responses_api_agents": {"repeated_calls": entry}},
    }
    return "repeated_calls", blocks


def _local(agent: str, example: Path, out: Path, calls: Path, repeats: int, concurrency: int
           ) -> Round:  # fmt: skip
    run = collect(
        agent, example, out, capture_dir=calls, num_repeats=repeats, concurrency=concurrency
    )
    return asyncio.run(_timed(run))


def _on_ray(config: dict[str, Any], agent: str, nodes: list[str], example: Path, out: Path,
            calls: Path, repeats: int, concurrency: int) -> Round:  # fmt: skip
    async def run() -> Round:
        cluster = ClusterSettings(enabled=True, replicas=2, host="127.0.0.1")
        async with cluster_collection(
            config,
            cluster,
            agent=agent,
            capture_dir=calls,
            model_type="openai_model",
            resources_server=None if config.get("mcqa") else "mcqa",
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

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="rollouts per run")
    parser.add_argument("--calls", type=int, default=1, help="model calls per rollout")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rollcap-bench-ray-"))
    # Short: Ray's Unix sockets live under it.
    base = Path(tempfile.mkdtemp(prefix="rc-ray-"))
    (base / "ray").mkdir()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_TMPDIR"] = str(base)
    tasks = [orjson.loads(line) for line in example_data_path("mcqa").read_bytes().splitlines()]
    example = work / "tasks.jsonl"
    example.write_bytes(b"".join(orjson.dumps({**t, "calls": args.calls}) + b"\n" for t in tasks))
    repeats = -(-args.tasks // len(tasks))
    ran = repeats * len(tasks)
    agent, blocks = _agent_config(args.calls)
    (work / "agents.yaml").write_bytes(orjson.dumps(blocks))  # JSON is YAML
    node = {"num_cpus": 1, "object_store_memory": 96 * MIB, "temp_dir": str(base / "ray")}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        nodes = [cluster.add_node(**node, resources={f"n{i}": 1}).node_id for i in range(2)]
        ray.init(address=cluster.address, log_to_driver=False)
        env = [str(BIN / "rollcap"), "env", "start", "--resources-server", "mcqa",
               "--model-type", "openai_model", "--config", str(work / "agents.yaml")]  # fmt: skip
        up_args = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        rounds: dict[str, list[Round]] = {"no Ray": [], "Ray": []}
        with started(up_args, "http") as (_, up_lines):
            upstream = up_lines[0].strip()
            common = [f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}"]
            for n in range(args.rounds):
                calls = work / f"local-calls-{n}"
                capture = ["++observability_enabled=true", f"++model_call_capture_dir={calls}"]
                local_env = [*env, "--head-port", str(free_port()), *common, *capture]
                with started(local_env, "head") as (_, lines):
                    rounds["no Ray"].append(
                        _local(
                            agent_url(lines),
                            example,
                            work / f"local-{n}.jsonl",
                            calls,
                            repeats,
                            args.concurrency,
                        )
                    )
                calls = work / f"ray-calls-{n}"
                config = {
                    **blocks,
                    "observability_enabled": True,
                    "model_call_capture_dir": str(calls),
                    "policy_base_url": f"{upstream}/v1",
                    "policy_api_key": KEY,
                }
                rounds["Ray"].append(
                    _on_ray(
                        config,
                        agent,
                        nodes,
                        example,
                        work / f"ray-{n}.jsonl",
                        calls,
                        repeats,
                        args.concurrency,
                    )
                )
        print(f"{ran} rollouts of {args.calls} call(s) x {args.rounds} rounds, "
              f"{args.concurrency} concurrent, capture on")  # fmt: skip
        print(f"{'':<8}{'rollouts/s':>11}{'driver CPU':>12}{'all CPU':>10}  us per rollout; "
              "rollouts/s of each round")  # fmt: skip
        medians = {}
        for label, runs in rounds.items():
            medians[label] = [statistics.median(getattr(r, k) for r in runs)
                              for k in ("rate", "driver_us", "total_us")]  # fmt: skip
            rate, driver, total = medians[label]
            print(f"{label:<8}{rate:>11.0f}{driver:>12.0f}{total:>10.0f}  "
                  f"({', '.join(f'{r.rate:.0f}' for r in runs)})")  # fmt: skip
        print(f"Ray / no Ray: {medians['Ray'][0] / medians['no Ray'][0]:.2f} in rollouts/s, "
              f"{medians['no Ray'][2] / medians['Ray'][2]:.2f} in CPU per rollout "
              "(a head and 2 nodes on this machine's cores)")  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
