"""Rollout collection with capture off vs on, in one run.

    .venv/bin/python bench/collect.py [--tasks N] [--concurrency C]

The fake upstream (``python -m rollcap.testing``) and two environments (``rollcap env start``
with the mcqa resources server and its agent), one with capture off and one with capture on, run
in processes of their own; collection runs here against each agent in turn, over the example
MCQA tasks repeated to N rollouts. Reported: rollouts/s for each and the ratio on/off.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from _procs import started
from rollcap.collect import collect
from rollcap.gym import example_data_path

BIN = Path(sys.executable).parent
KEY = "bench-key"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _agent_url(lines: list[str]) -> str:
    for line in lines:
        if line.startswith("responses_api_agents"):
            return line.split()[-1]
    raise RuntimeError("env start printed no agent")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="rollouts per run")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rollcap-bench-collect-"))
    example = example_data_path("mcqa")
    repeats = -(-args.tasks // len(example.read_text().splitlines()))
    env = [str(BIN / "rollcap"), "env", "start", "--resources-server", "mcqa",
           "--model-type", "openai_model"]  # fmt: skip
    try:
        up_args = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        with started(up_args, "http") as (_, up_lines):
            upstream = up_lines[0].strip()
            common = [f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}"]
            capture = ["++observability_enabled=true", f"++model_call_capture_dir={work / 'calls'}"]
            with (
                started([*env, "--head-port", str(_free_port()), *common], "head") as (_, off),
                started([*env, "--head-port", str(_free_port()), *common, *capture], "head") as (
                    _,
                    on,
                ),
            ):
                rates = {}
                for label, lines, capture_dir in (
                    ("capture off", off, None),
                    ("capture on", on, work / "calls"),
                ):
                    start = time.perf_counter()
                    summary = asyncio.run(
                        collect(
                            _agent_url(lines),
                            example,
                            work / f"{label.replace(' ', '_')}.jsonl",
                            capture_dir=capture_dir,
                            num_repeats=repeats,
                            concurrency=args.concurrency,
                        )
                    )
                    elapsed = time.perf_counter() - start
                    assert summary.failed == 0, summary
                    rates[label] = summary.ran / elapsed
                    print(f"{label:<12} {summary.ran} rollouts in {elapsed:.1f} s: "
                          f"{rates[label]:.0f} rollouts/s")  # fmt: skip
        ratio = rates["capture on"] / rates["capture off"]
        print(f"capture on / off: {ratio:.2f} ({args.concurrency} concurrent, 2 cores shared)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
