"""Rollout collection with capture off vs on, and with its evidence on vs off, in one run.

    .venv/bin/python bench/collect.py [--tasks N] [--concurrency C]

The fake upstream (``python -m rollcap.testing``) and ``rollcap env start`` environments (the
mcqa resources server and its agent) run in processes of their own; collection runs here against
each agent in turn, over the example MCQA tasks repeated to N rollouts, in 3 alternating rounds
of three arms:

- capture off: an environment without capture (one, kept for the rounds);
- capture on: a fresh environment and capture directory, collection with ``capture_dir``: it
  reads each rollout's capture and attaches the evidence (``ng_model_call_capture``, the agent's
  observations joined, ``ng_trajectory``, ``ng_perf``);
- evidence off: the same, but collection without ``capture_dir``: the model server captures
  alike, collection reads no capture (the agent's own evidence still makes a trajectory);
- compacted: capture on, and each rollout's capture compacted into ``.capture.jsonl.zst`` once
  its line is built (``compress_capture_level``, the default level).

Reported: the median rollouts/s of each arm, the ratios capture on / off, evidence on / off and
compacted / capture on; the CPU each process spent per rollout in each arm (user + system, from
``/proc``, median over the rounds): the collector (this process), the environment (``env
start`` runs the model server, the agent and the resources server in one process, on one
event loop) and the fake upstream, each as its main thread (the event loop) and its other
threads (the collector's I/O threads; the model server's record writer and syncs); and what the
raw system calls of one rollout's file cost beside the capture directories before and after
the run (see ``_raw_costs_us``).
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
from pathlib import Path

from _procs import Cpu, agent_url, cpu_of, free_port, started
from rollcap.collect import collect
from rollcap.gym import example_data_path
from rollcap.store import DEFAULT_LEVEL

BIN = Path(sys.executable).parent
KEY = "bench-key"


ROUNDS = 3


# The processes whose CPU is reported, in the order of the table's columns.
PROCESSES = ("collector", "environment", "fake upstream")


def _run(agent: str, example: Path, out: Path, capture_dir: Path | None, repeats: int,
         concurrency: int, pids: dict[str, int],
         compress: int | None = None) -> tuple[float, dict[str, Cpu]]:  # fmt: skip
    """The run's rollouts/s, and each process's CPU per rollout (seconds) while it ran."""
    before = {name: cpu_of(pid) for name, pid in pids.items()}
    start = time.perf_counter()
    summary = asyncio.run(
        collect(
            agent,
            example,
            out,
            capture_dir=capture_dir,
            num_repeats=repeats,
            concurrency=concurrency,
            compress_capture_level=compress,
        )
    )
    elapsed = time.perf_counter() - start
    spent = {name: cpu_of(pid) - before[name] for name, pid in pids.items()}
    assert summary.failed == 0, summary
    ran = summary.ran
    return ran / elapsed, {
        name: Cpu(cpu.main / ran, cpu.total / ran) for name, cpu in spent.items()
    }


def _cpu_table(cpu: dict[str, list[dict[str, Cpu]]]) -> list[str]:
    """Per arm, each process's CPU per rollout in us as ``loop + threads``, and the sum."""
    head = "".join(f"{name:>22}" for name in PROCESSES)
    lines = [f"{'us per rollout':<14}{head}{'all':>8}"]
    for arm, rounds in cpu.items():
        cells = []
        total = 0.0
        for name in PROCESSES:
            main = statistics.median(r[name].main for r in rounds) * 1e6
            threads = statistics.median(r[name].threads for r in rounds) * 1e6
            total += main + threads
            cells.append(f"{f'{main:.0f} + {threads:.0f}':>22}")
        lines.append(f"{arm:<14}{''.join(cells)}{total:>8.0f}")
    return lines


def _raw_costs_us(directory: Path, count: int = 200) -> tuple[float, float, float]:
    """CPU time of the system calls one rollout's file needs, done raw in ``directory``:
    creating it, writing and fsyncing one 2.5 KiB line, reading it back (the files stay until
    the end). No capture can cost less than their sum.

    On an ext4 without a journal, creating a file in a block group where many inodes were
    deleted in the last minutes scans past each of them: hundreds of us instead of tens,
    whatever the program. The figures tell the reader which case a run measured.
    """
    directory.mkdir()
    paths = [os.fspath(directory / f"probe-{n}") for n in range(count)]
    line = b'{"probe": "' + b"x" * 2500 + b'"}\n'
    costs: list[float] = []
    start = time.process_time()
    for path in paths:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    costs.append(time.process_time() - start)
    start = time.process_time()
    for path in paths:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    costs.append(time.process_time() - start)
    start = time.process_time()
    for path in paths:
        with open(path, "rb") as handle:
            handle.read()
    costs.append(time.process_time() - start)
    create, write, read = (cost / count * 1e6 for cost in costs)
    return create, write, read


def _costs_line(label: str, costs: tuple[float, float, float]) -> str:
    return "{}: create {:.0f} us, write + fsync {:.0f} us, read {:.0f} us".format(label, *costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="rollouts per run")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rollcap-bench-collect-"))
    raw_before = _raw_costs_us(work / "probe-before")
    example = example_data_path("mcqa")
    repeats = -(-args.tasks // len(example.read_text().splitlines()))
    env = [str(BIN / "rollcap"), "env", "start", "--resources-server", "mcqa",
           "--model-type", "openai_model"]  # fmt: skip
    try:
        up_args = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        with started(up_args, "http") as (up_proc, up_lines):
            upstream = up_lines[0].strip()
            common = [f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}"]
            arms = ("capture off", "capture on", "evidence off", "compacted")
            rates: dict[str, list[float]] = {arm: [] for arm in arms}
            cpu: dict[str, list[dict[str, Cpu]]] = {arm: [] for arm in arms}
            with started([*env, "--head-port", str(free_port()), *common], "head") as (
                off_proc,
                off,
            ):
                pids = {"collector": os.getpid(), "fake upstream": up_proc.pid}
                for n in range(ROUNDS):
                    out = work / f"off-{n}.jsonl"
                    rate, spent = _run(
                        agent_url(off),
                        example,
                        out,
                        None,
                        repeats,
                        args.concurrency,
                        {**pids, "environment": off_proc.pid},
                    )
                    rates["capture off"].append(rate)
                    cpu["capture off"].append(spent)
                    # Each capture-on round is a new run: a fresh environment and an empty
                    # capture directory, as a user's next run would have.
                    for arm in arms[1:]:
                        calls = work / f"calls-{n}-{arm.replace(' ', '-')}"
                        capture = [
                            "++observability_enabled=true",
                            f"++model_call_capture_dir={calls}",
                        ]
                        on_env = [*env, "--head-port", str(free_port()), *common, *capture]
                        with started(on_env, "head") as (on_proc, on):
                            out = work / f"{arm.replace(' ', '-')}-{n}.jsonl"
                            read = None if arm == "evidence off" else calls
                            level = DEFAULT_LEVEL if arm == "compacted" else None
                            rate, spent = _run(
                                agent_url(on),
                                example,
                                out,
                                read,
                                repeats,
                                args.concurrency,
                                {**pids, "environment": on_proc.pid},
                                level,
                            )
                            rates[arm].append(rate)
                            cpu[arm].append(spent)
                            if level is not None:
                                assert not list(calls.glob("*.capture.jsonl")), "not compacted"
        ran = repeats * len(example.read_text().splitlines())
        for label, values in rates.items():
            print(f"{label:<12} {ran} rollouts x {ROUNDS} rounds: median "
                  f"{statistics.median(values):.0f} rollouts/s "
                  f"({', '.join(f'{v:.0f}' for v in values)})")  # fmt: skip
        median = {label: statistics.median(values) for label, values in rates.items()}
        ratio = median["capture on"] / median["capture off"]
        print(f"capture on / off: {ratio:.2f} ({args.concurrency} concurrent, 2 cores shared)")
        evidence = median["capture on"] / median["evidence off"]
        print(f"evidence on / off (both captured): {evidence:.2f}")
        compacted = median["compacted"] / median["capture on"]
        print(f"compacted / capture on (level {DEFAULT_LEVEL}): {compacted:.2f}")
        print("CPU per rollout, user + system, median of the rounds (main thread + the others;")
        print("the environment is the model server, the agent and the resources server):")
        for line in _cpu_table(cpu):
            print("  " + line)
        raw_after = _raw_costs_us(work / "probe-after")
        print("raw system calls of one rollout file beside the capture directories, CPU:")
        print(_costs_line("  before the run", raw_before))
        print(_costs_line("  after the run ", raw_after))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
