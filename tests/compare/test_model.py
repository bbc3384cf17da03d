"""Task, Benchmark and Side: a run as a comparison holds it."""

from __future__ import annotations

from rollcap.compare._lines import METRICS, LineFigures
from rollcap.compare._model import Benchmark, Side, Task


def figures(reward: float | None, tokens: float | None = None) -> LineFigures:
    values: dict[str, float | None] = dict.fromkeys(METRICS)
    values["reward"] = reward
    values["tokens"] = tokens
    return LineFigures(None, 0, None, reward is None, values)


def test_a_tasks_mean_is_over_its_repeats_that_report_the_metric() -> None:
    task = Task("id", b"k", "label", 0, None)
    task.rollouts += [figures(1.0, 10.0), figures(0.0), figures(None, 50.0), figures(0.5)]
    assert task.mean("reward") == 0.5  # (1 + 0 + 0.5) / 3; the failed repeat has none
    assert task.mean("tokens") == 30.0
    assert task.mean("latency_ms") is None


def test_a_task_without_rollouts_has_no_mean() -> None:
    assert Task("id", b"k", "label", None, None).mean("reward") is None


def test_a_benchmark_describes_its_counts() -> None:
    bench = Benchmark("mcqa", "/runs/a/rollouts.jsonl", None, rollouts=5, failed=1, unkeyed=2)
    bench.tasks[b"k"] = Task("id", b"k", "label", 0, None)
    assert bench.describe() == {
        "name": "mcqa",
        "rollouts_file": "/runs/a/rollouts.jsonl",
        "capture_dir": None,
        "tasks": 1,
        "rollouts": 5,
        "failed": 1,
        "unkeyed": 2,
        "unreadable": 0,
    }
    side = Side("/runs/a", [bench])
    assert side.benchmarks[0].tasks[b"k"].label == "label"
