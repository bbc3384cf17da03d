"""``make demo``: the MCQA evaluation with capture on, against the embedded model.

The same path as ``rollcap eval run --agent mcqa_simple_agent --model-type local_model
++observability_enabled=true ++model_call_capture_dir=...``: the model server (SmolLM2-135M on
llama.cpp, no credentials), the mcqa resources server, its agent and a head server start in this
process; every example task runs through them; the summary and the paths of the output and
capture files are printed, and the report is written. A 135M model answers poorly: the plumbing
is what is shown.

Each task runs ``--repeats`` times (default 3) at ``--temperature`` (default 0.8) with fixed
seeds (``++rollout_seed``: repeat ``r`` sends ``seed: --seed + r``), so that one task's rollouts
differ from each other, which the report's task comparison and divergence views need, while a
rerun gives exactly the same rollouts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from rollcap.config import load_config
from rollcap.gym import example_data_path
from rollcap.report import find_run, write_report
from rollcap.store import CaptureStore
from rollcap.workflow import EvalRequest, Progress, format_summary, run_eval

DEFAULT_REPEATS = 3
# High enough that a 135M model's repeats of one question answer differently.
DEFAULT_TEMPERATURE = 0.8
MAX_TEMPERATURE = 2.0  # the Responses API's bound, which the embedded model keeps too


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _temperature(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= MAX_TEMPERATURE:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_TEMPERATURE:g}, got {text}")
    return value


def _seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollcap.demo", description=__doc__)
    parser.add_argument("--limit", type=_count, help="only the first N example tasks")
    parser.add_argument("--results", type=Path, default=Path("results/demo"))
    parser.add_argument(
        "--repeats",
        type=_count,
        default=DEFAULT_REPEATS,
        help=f"rollouts per task (default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--temperature",
        type=_temperature,
        default=DEFAULT_TEMPERATURE,
        help=f"sampling temperature (default {DEFAULT_TEMPERATURE}; 0: every repeat the same)",
    )
    parser.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="the first repeat's seed; repeat r uses seed + r (default 0)",
    )
    args = parser.parse_args(argv)

    results = args.results.resolve()
    capture_dir = results / "model-calls"
    output = results / "mcqa_rollouts.jsonl"
    config = load_config(
        overrides=[
            "++observability_enabled=true",
            f"++model_call_capture_dir={capture_dir}",
            f"++responses_create_params.temperature={args.temperature!r}",
            f"++rollout_seed={args.seed}",
        ],
        env_file=None,
    )
    request = EvalRequest(
        agent="mcqa_simple_agent",
        input_path=example_data_path("mcqa"),
        output_path=output,
        limit=args.limit,
        num_repeats=args.repeats,
        concurrency=4,
        model_type="local_model",
        head_port=0,
    )
    last_seed = args.seed + args.repeats - 1
    seeds = f"seed {args.seed}" if args.repeats == 1 else f"seeds {args.seed} to {last_seed}"
    print(
        f"rollcap demo: MCQA on the embedded SmolLM2-135M model, capture on; {args.repeats} "
        f"rollout(s) per task at temperature {args.temperature:g}, {seeds}\n",
        flush=True,
    )
    progress = Progress()
    try:
        summary, uncorrelated = asyncio.run(run_eval(request, config, progress=progress))
    finally:
        progress.close()
    print(format_summary(summary, uncorrelated))
    with CaptureStore(capture_dir) as store:
        captured = len(store.rollout_ids())  # plain and compacted files alike, each rollout once
    print(f"\ncapture files: {capture_dir}/ ({captured})")
    print(f"first rollout's capture: head -n 1 {output} | jq '.ng_model_call_capture'")
    print(
        f"inspect one:             .venv/bin/rollcap capture show {capture_dir} 0-0 --no-payloads"
    )
    report = results / "report.html"
    write_report(find_run(capture_dir, rollouts=output), report)
    print(f"the report:              {report} (made by .venv/bin/rollcap capture report {results})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
