"""Two runs compared, benchmark by benchmark and overall, as one JSON-ready document (pure).

Benchmarks are paired by name; two sides of one benchmark each are paired whatever their
names. In a pair, tasks are matched by key (``_lines``); a task in one run only is counted, not
compared. Every figure is over matched tasks, a task's rollouts averaged first (``_stats``).

``overall`` pools the matched tasks of every paired benchmark. The verdict of
``fail_if_worse=D`` reads the overall reward: it fails when the upper bound of the 95% interval
of ``B - A`` is below ``-D``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollcap.compare._lines import METRICS, index_key
from rollcap.compare._model import Benchmark, Side, Task
from rollcap.compare._stats import (
    CONFIDENCE,
    DEFAULT_RESAMPLES,
    POWER,
    Interval,
    gate_fails,
    mean_interval,
    paired_difference,
    paired_test,
    tasks_needed,
)

__all__ = ["COMPARE_SCHEMA", "DEFAULT_DETECT", "compare_sides", "paired_benchmarks", "task_pairs"]

COMPARE_SCHEMA = 1
# The difference the power line sizes for when no --fail-if-worse margin is given: five points
# of a reward in [0, 1].
DEFAULT_DETECT = 0.05

Pair = tuple[Task, Task]


def task_pairs(a: Benchmark, b: Benchmark) -> list[Pair]:
    """Tasks of one key; then a task that only its index names (every rollout of it failed, so
    no line carried its input) with the other side's unmatched task of that index."""
    pairs = [(task, b.tasks[key]) for key, task in a.tasks.items() if key in b.tasks]
    left_a = [t for k, t in a.tasks.items() if k not in b.tasks and t.task_index is not None]
    left_b = [t for k, t in b.tasks.items() if k not in a.tasks and t.task_index is not None]
    by_index_b = {t.task_index: t for t in left_b}
    for task in left_a:
        other = by_index_b.get(task.task_index)
        if other is None or index_key(task.task_index) not in (task.key, other.key):
            continue
        pairs.append((task, other))
        del by_index_b[task.task_index]
    return pairs


def _cluster_of(pair: Pair) -> object:
    task = pair[0]
    return task.cluster if task.cluster is not None else ("task", task.id)


def _paired_values(
    pairs: Sequence[Pair], metric: str
) -> tuple[list[float], list[float], list[Pair]]:
    """``metric``'s per-task means on each side, over the pairs where both sides report it."""
    a: list[float] = []
    b: list[float] = []
    known: list[Pair] = []
    for pair in pairs:
        x, y = pair[0].mean(metric), pair[1].mean(metric)
        if x is not None and y is not None:
            a.append(x)
            b.append(y)
            known.append(pair)
    return a, b, known


def _metric(
    pairs: Sequence[Pair], metric: str, clustered: bool
) -> tuple[dict[str, Any] | None, Interval | None]:
    a, b, known = _paired_values(pairs, metric)
    if not known:
        return None, None
    clusters = [_cluster_of(pair) for pair in known] if clustered else None
    mean_a, mean_b = mean_interval(a), mean_interval(b)
    diff = paired_difference(a, b, clusters)
    figures = {
        "tasks": len(known),
        "a": None if mean_a is None else mean_a.to_dict(),
        "b": None if mean_b is None else mean_b.to_dict(),
        "diff": None if diff is None else diff.to_dict(),
    }
    return figures, diff


def _change(pair: Pair) -> dict[str, Any]:
    ta, tb = pair
    a, b = ta.mean("reward"), tb.mean("reward")
    return {
        "id": ta.id,
        "label": ta.label,
        "task_index": {"a": ta.task_index, "b": tb.task_index},
        "a": a,
        "b": b,
        "change": None if a is None or b is None else b - a,
        "rollouts": {
            "a": [r.rollout_id for r in ta.rollouts],
            "b": [r.rollout_id for r in tb.rollouts],
        },
    }


def _section(
    name: str,
    pairs: Sequence[Pair],
    only_a: int,
    only_b: int,
    *,
    clustered: bool,
    detect: float,
    seed: int,
    resamples: int,
) -> tuple[dict[str, Any], Interval | None]:
    """One benchmark's (or the overall) figures, and its reward difference's interval."""
    computed = {m: _metric(pairs, m, clustered) for m in METRICS}
    metrics = {m: figures for m, (figures, _) in computed.items()}
    a, b, _ = _paired_values(pairs, "reward")
    test = paired_test(a, b, seed=seed, resamples=resamples)
    reward = metrics["reward"]
    sd = None if reward is None or reward["diff"] is None else reward["diff"]["sd"]
    changes = sorted(
        (_change(pair) for pair in pairs),
        key=lambda c: (c["change"] is None, c["change"] or 0.0, c["label"]),
    )
    section = {
        "name": name,
        "tasks": {"matched": len(pairs), "only_a": only_a, "only_b": only_b},
        "metrics": metrics,
        "test": None if test is None else test.to_dict(),
        "flips": {
            "better": sum(1 for c in changes if (c["change"] or 0.0) > 0),
            "worse": sum(1 for c in changes if (c["change"] or 0.0) < 0),
        },
        "power": {
            "delta": detect,
            "power": POWER,
            "sd": sd,
            "tasks_needed": tasks_needed(sd, detect),
        },
        "changes": changes,
    }
    return section, computed["reward"][1]


def paired_benchmarks(
    a: Side, b: Side
) -> tuple[list[tuple[str, Benchmark, Benchmark]], list[str], list[str]]:
    if len(a.benchmarks) == 1 and len(b.benchmarks) == 1:
        return [(a.benchmarks[0].name, a.benchmarks[0], b.benchmarks[0])], [], []
    by_name = {bench.name: bench for bench in b.benchmarks}
    paired = [(x.name, x, by_name[x.name]) for x in a.benchmarks if x.name in by_name]
    names = {name for name, _, _ in paired}
    only_a = [x.name for x in a.benchmarks if x.name not in names]
    only_b = [x.name for x in b.benchmarks if x.name not in names]
    return paired, only_a, only_b


def _side_summary(side: Side) -> dict[str, Any]:
    return {
        "source": side.source,
        "rollouts": sum(x.rollouts for x in side.benchmarks),
        "failed": sum(x.failed for x in side.benchmarks),
        "benchmarks": [x.describe() for x in side.benchmarks],
    }


def compare_sides(
    a: Side,
    b: Side,
    *,
    key: str | None = None,
    cluster: str | None = None,
    fail_if_worse: float | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, Any]:
    """The comparison of ``b`` against ``a`` (module doc): what ``rollcap compare --json``
    prints. ``key`` and ``cluster`` are only recorded here: the sides were read with them."""
    if fail_if_worse is not None and not fail_if_worse >= 0:
        raise ValueError(f"--fail-if-worse must be a number >= 0, got {fail_if_worse!r}")
    detect = fail_if_worse if fail_if_worse else DEFAULT_DETECT
    clustered = cluster is not None
    paired, bench_only_a, bench_only_b = paired_benchmarks(a, b)
    sections = []
    every: list[Pair] = []
    for name, x, y in paired:
        pairs = task_pairs(x, y)
        every.extend(pairs)
        section, _ = _section(
            name,
            pairs,
            len(x.tasks) - len(pairs),
            len(y.tasks) - len(pairs),
            clustered=clustered,
            detect=detect,
            seed=seed,
            resamples=resamples,
        )
        sections.append(section)
    overall, interval = _section(
        "overall",
        every,
        sum(s["tasks"]["only_a"] for s in sections),
        sum(s["tasks"]["only_b"] for s in sections),
        clustered=clustered,
        detect=detect,
        seed=seed,
        resamples=resamples,
    )
    verdict: dict[str, Any] | None = None
    if fail_if_worse is not None:
        fails = gate_fails(interval, fail_if_worse)
        verdict = {
            "fail_if_worse": fail_if_worse,
            "upper": None if interval is None else interval.high,
            "failed": fails,
        }
    return {
        "schema": COMPARE_SCHEMA,
        "a": _side_summary(a),
        "b": _side_summary(b),
        "key": key,
        "cluster": cluster,
        "confidence": CONFIDENCE,
        "seed": seed,
        "resamples": resamples,
        "benchmarks": sections,
        "benchmarks_unmatched": {"a": bench_only_a, "b": bench_only_b},
        "overall": overall,
        "verdict": verdict,
    }
