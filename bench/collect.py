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
compacted / capture on,
and what the raw system calls of one rollout's file cost beside the capture directories before
and after the run (see ``_raw_costs_us``).
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

from _procs import agent_url, free_port, started
from rollcap.collect import collect
from rollcap.gym import example_data_path
from rollcap.store import DEFAULT_LEVEL

BIN = Path(sys.executable).parent
KEY = "bench-key"


ROUNDS = 3


def _run(agent: str, example: Path, out: Path, capture_dir: Path | None, repeats: int,
         concurrency: int, compress: int | None = None) -> float:  # fmt: skip
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
    assert summary.failed == 0, summary
    return summary.ran / elapsed


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
        with started(up_args, "http") as (_, up_lines):
            upstream = up_lines[0].strip()
            common = [f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}"]
            arms = ("capture off", "capture on", "evidence off", "compacted")
            rates: dict[str, list[float]] = {arm: [] for arm in arms}
            with started([*env, "--head-port", str(free_port()), *common], "head") as (_, off):
                for n in range(ROUNDS):
                    out = work / f"off-{n}.jsonl"
                    rates["capture off"].append(
                        _run(agent_url(off), example, out, None, repeats, args.concurrency)
                    )
                    # Each capture-on round is a new run: a fresh environment and an empty
                    # capture directory, as a user's next run would have.
                    for arm in arms[1:]:
                        calls = work / f"calls-{n}-{arm.replace(' ', '-')}"
                        capture = [
                            "++observability_enabled=true",
                            f"++model_call_capture_dir={calls}",
                        ]
                        on_env = [*env, "--head-port", str(free_port()), *common, *capture]
                        with started(on_env, "head") as (_, on):
                            out = work / f"{arm.replace(' ', '-')}-{n}.jsonl"
                            read = None if arm == "evidence off" else calls
                            level = DEFAULT_LEVEL if arm == "compacted" else None
                            rate = _run(
                                agent_url(on), example, out, read, repeats, args.concurrency, level
                            )
                            rates[arm].append(rate)
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
        raw_after = _raw_costs_us(work / "probe-after")
        print("raw system calls of one rollout file beside the capture directories, CPU:")
        print(_costs_line("  before the run", raw_before))
        print(_costs_line("  after the run ", raw_after))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
