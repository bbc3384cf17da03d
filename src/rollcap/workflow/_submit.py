"""``rollcap eval submit``: run each benchmark of a driver config into its job directory.

Each benchmark is an ``eval run`` (``_run``) with the benchmark's settings on top of the global
ones, capture on by default, and its own head server port.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollcap.collect import CollectionSummary
from rollcap.config import ConfigError, RunSettings
from rollcap.workflow._run import EvalRequest, Progress, run_eval

__all__ = ["BenchmarkResult", "format_submit_table", "submit"]


@dataclass(frozen=True, slots=True)
class BenchmarkResult:
    name: str
    job_dir: Path
    capture_dir: Path | None
    summary: CollectionSummary


def _benchmark_config(
    config: Mapping[str, Any], name: str, bench: Mapping[str, Any], job_dir: Path
) -> dict[str, Any]:
    """The global config with the benchmark's ``run`` settings on top; capture on by default."""
    run = bench.get("run") or {}
    if not isinstance(run, Mapping):
        raise ConfigError(f"driver.benchmarks.{name}.run must be a mapping")
    merged = {k: v for k, v in config.items() if k != "driver"}
    merged.update(run)
    if "observability_enabled" not in run:
        merged["observability_enabled"] = True
    if merged["observability_enabled"] is True and "model_call_capture_dir" not in run:
        merged["model_call_capture_dir"] = str(job_dir / "model-calls")
    RunSettings.from_config(merged)  # the one-line error names the key
    return merged


def _benchmarks(config: Mapping[str, Any]) -> tuple[Path, Mapping[str, Any]]:
    driver = config.get("driver")
    if not isinstance(driver, Mapping):
        raise ConfigError("the driver config needs a driver: mapping with benchmarks")
    benchmarks = driver.get("benchmarks")
    if not isinstance(benchmarks, Mapping) or not benchmarks:
        raise ConfigError("driver.benchmarks must name at least one benchmark")
    root = Path(str(driver.get("job_dir", "results"))).resolve()
    return root, benchmarks


def _int_option(name: str, bench: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = bench.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"driver.benchmarks.{name}.{key} must be an integer >= 1, got {value!r}")
    return value


async def submit(config: Mapping[str, Any]) -> list[BenchmarkResult]:
    """Run each benchmark of ``driver.benchmarks`` into its job directory, one after another."""
    root, benchmarks = _benchmarks(config)
    plans = []
    for name, bench in benchmarks.items():
        if not isinstance(bench, Mapping):
            raise ConfigError(f"driver.benchmarks.{name} must be a mapping")
        for key in ("agent", "input", "model_type"):
            if not isinstance(bench.get(key), str):
                raise ConfigError(f"driver.benchmarks.{name}.{key} is required (a string)")
        job_dir = Path(str(bench.get("job_dir", root / str(name)))).resolve()
        bench_config = _benchmark_config(config, str(name), bench, job_dir)
        request = EvalRequest(
            agent=bench["agent"],
            input_path=Path(bench["input"]),
            output_path=job_dir / "rollouts.jsonl",
            limit=_int_option(str(name), bench, "limit", None),
            num_repeats=_int_option(str(name), bench, "num_repeats", 1) or 1,
            concurrency=_int_option(str(name), bench, "concurrency", 16) or 16,
            model_type=bench["model_type"],
            head_port=0,  # each benchmark's head server on a port of its own
        )
        plans.append((str(name), job_dir, bench_config, request))
    results = []
    for name, job_dir, bench_config, request in plans:
        job_dir.mkdir(parents=True, exist_ok=True)
        progress = Progress()
        try:
            summary, _ = await run_eval(request, bench_config, progress=progress)
        finally:
            progress.close()
        capture_dir = RunSettings.from_config(bench_config).capture_dir
        results.append(BenchmarkResult(name, job_dir, capture_dir, summary))
    return results


def format_submit_table(results: list[BenchmarkResult]) -> str:
    rows = [f"{'benchmark':<20}{'rollouts':>9}{'failed':>8}{'reward':>8}{'calls':>7}  capture"]
    for r in results:
        m = r.summary.metrics
        reward = "-" if m.get("mean_reward") is None else f"{m['mean_reward']:.3f}"
        calls = "-" if m.get("num_calls") is None else str(m["num_calls"])
        rows.append(
            f"{r.name:<20}{m.get('rollouts', 0):>9}{r.summary.failed:>8}{reward:>8}{calls:>7}"
            f"  {r.capture_dir or 'off'}"
        )
    return "\n".join(rows)
