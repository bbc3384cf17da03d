"""Comparing two runs: what got better, what got worse, and whether it is real.

``compare_runs(a, b)`` reads two runs (an output file, a job directory, a capture directory with
its rollouts file, or the driver's ``job_dir`` of ``eval submit``), matches their tasks by key,
averages each task's repeats, and compares B against A task by task: mean reward and the other
figures of a rollout with 95% intervals, the paired difference, a paired test, the tasks that
flipped, the tasks needed to detect a given difference, and with ``fail_if_worse`` a regression
verdict. ``Comparison.data`` is the JSON document (``rollcap compare --json``),
``Comparison.text()`` its printed form; ``write_compare_report`` writes the one-file HTML page
(``rollcap capture report A --compare B``).

The statistics are scipy's and statsmodels' (the ``compare`` extra:
``pip install 'rollcap[compare]'``; without it ``CompareUnavailable``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rollcap.compare._compare import COMPARE_SCHEMA, DEFAULT_DETECT, compare_sides
from rollcap.compare._lines import DEFAULT_KEY, METRICS, line_figures, task_key
from rollcap.compare._model import Benchmark, Side, Task
from rollcap.compare._page import CompareReportStats, build_compare_report, write_compare_report
from rollcap.compare._runs import CompareError, read_side, run_files
from rollcap.compare._stats import (
    COMPARE_INSTALL_HINT,
    CONFIDENCE,
    DEFAULT_RESAMPLES,
    CompareUnavailable,
    Interval,
    PairedTest,
    check_available,
    gate_fails,
    mean_interval,
    paired_difference,
    paired_test,
    tasks_needed,
)
from rollcap.compare._text import format_comparison

__all__ = [
    "COMPARE_INSTALL_HINT",
    "COMPARE_SCHEMA",
    "CONFIDENCE",
    "DEFAULT_DETECT",
    "DEFAULT_KEY",
    "DEFAULT_RESAMPLES",
    "METRICS",
    "Benchmark",
    "CompareError",
    "CompareReportStats",
    "CompareUnavailable",
    "Comparison",
    "Interval",
    "PairedTest",
    "Side",
    "Task",
    "build_compare_report",
    "check_available",
    "compare_runs",
    "format_comparison",
    "gate_fails",
    "line_figures",
    "mean_interval",
    "paired_difference",
    "paired_test",
    "read_side",
    "run_files",
    "task_key",
    "tasks_needed",
    "write_compare_report",
]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two runs compared: the sides as read and the comparison document."""

    a: Side
    b: Side
    data: dict[str, Any]

    @property
    def failed(self) -> bool:
        """Whether the regression gate failed: B worse than A by more than the margin, or no
        interval to tell (fewer than two tasks with a reward in both runs). ``False`` without
        a margin."""
        verdict = self.data["verdict"]
        return verdict is not None and verdict["failed"] is not False

    def text(self) -> str:
        return format_comparison(self.data)


def compare_runs(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    key: str | None = None,
    cluster: str | None = None,
    fail_if_worse: float | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> Comparison:
    """Compare run ``b`` against run ``a`` (module doc). ``key``: the dotted line field that
    names a task (default: the task's input, ``DEFAULT_KEY``); ``cluster``: the field whose
    value groups tasks that share a context (cluster-robust standard errors);
    ``fail_if_worse``: the regression margin; ``seed`` and ``resamples``: the bootstrap's.

    ``FileNotFoundError`` for a missing path, ``CompareError`` for one that holds no run,
    ``ValueError`` for a bad option, ``CompareUnavailable`` without the ``compare`` extra.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    check_available()  # before anything is read
    for path in (a, b):  # both, before either is read: a missing B is said as such
        if not os.path.exists(path):
            raise FileNotFoundError(f"{os.fspath(path)}: no such file or directory")
    side_a = read_side(a, key=key, cluster=cluster)
    side_b = read_side(b, key=key, cluster=cluster)
    data = compare_sides(
        side_a,
        side_b,
        key=key,
        cluster=cluster,
        fail_if_worse=fail_if_worse,
        seed=seed,
        resamples=resamples,
    )
    return Comparison(side_a, side_b, data)
