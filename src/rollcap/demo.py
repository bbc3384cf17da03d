"""``make demo``: the MCQA evaluation with capture on, against the embedded model.

The same path as ``rollcap eval run --agent mcqa_simple_agent --model-type local_model
++observability_enabled=true ++model_call_capture_dir=...``: the model server (SmolLM2-135M on
llama.cpp, no credentials), the mcqa resources server, its agent and a head server start in this
process; every example task runs through them; the summary and the paths of the output and
capture files are printed. A 135M model answers poorly: the plumbing is what is shown.
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
from rollcap.workflow import EvalRequest, Progress, format_summary, run_eval


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollcap.demo", description=__doc__)
    parser.add_argument("--limit", type=int, help="only the first N example tasks")
    parser.add_argument("--results", type=Path, default=Path("results/demo"))
    args = parser.parse_args(argv)

    results = args.results.resolve()
    capture_dir = results / "model-calls"
    output = results / "mcqa_rollouts.jsonl"
    config = load_config(
        overrides=["++observability_enabled=true", f"++model_call_capture_dir={capture_dir}"],
        env_file=None,
    )
    request = EvalRequest(
        agent="mcqa_simple_agent",
        input_path=example_data_path("mcqa"),
        output_path=output,
        limit=args.limit,
        concurrency=4,
        model_type="local_model",
        head_port=0,
    )
    print("rollcap demo: MCQA on the embedded SmolLM2-135M model, capture on\n", flush=True)
    progress = Progress()
    try:
        summary, uncorrelated = asyncio.run(run_eval(request, config, progress=progress))
    finally:
        progress.close()
    print(format_summary(summary, uncorrelated))
    print(f"\ncapture files: {capture_dir}/ ({len(list(capture_dir.glob('*.capture.jsonl')))})")
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
