"""``format_comparison``: the lines a user reads of a comparison."""

from __future__ import annotations

import re
from pathlib import Path

from rollcap.compare import Comparison, format_comparison
from rollcap.compare._compare import compare_sides
from rollcap.compare._text import FLIPS_SHOWN
from tests.compare.test_compare import WORSE_A, WORSE_B, bench, compare, side

MCNEMAR_A = {"t1": [1.0], "t2": [1.0], "t3": [0.0], "t4": [1.0]}
MCNEMAR_B = {"t1": [0.0], "t2": [0.0], "t3": [1.0], "t4": [1.0]}


def cells(text: str, title: str) -> list[str]:
    """The cells of the table row titled ``title``."""
    [row] = [line for line in text.splitlines() if line.startswith(f"  {title}  ")]
    return re.split(r"\s{2,}", row.strip())


def test_the_head_names_both_sides_and_the_key() -> None:
    text = format_comparison(compare({"t1": [1, None]}, {"t1": [1]}))
    assert text.splitlines()[:4] == [
        "A: A (2 rollouts, 1 failed)",
        "B: B (1 rollouts, 0 failed)",
        "tasks matched by the task's input (responses_create_params.input)",
        "",
    ]
    named = format_comparison(compare({"t1": [1]}, {"t1": [1]}, key="metadata.id"))
    assert named.splitlines()[2] == "tasks matched by metadata.id"


def test_the_table_rows() -> None:
    text = format_comparison(compare(MCNEMAR_A, MCNEMAR_B))
    lines = text.splitlines()
    assert lines[4] == "x: 4 tasks matched, 0 only in A, 0 only in B"
    assert re.split(r"\s{2,}", lines[5].strip()) == [
        "A (95% CI)",
        "B (95% CI)",
        "B - A (se) [95% CI]",
        "tasks",
    ]
    assert cells(text, "reward") == [
        "reward",
        "0.750 [-0.046, 1.546]",
        "0.500 [-0.419, 1.419]",
        "-0.250 (se 0.4787) [-1.773, +1.273]",
        "4",
    ]
    assert cells(text, "tokens/rollout") == [
        "tokens/rollout",
        "100 [100, 100]",
        "100 [100, 100]",
        "+0 (se 0.00) [+0, +0]",
        "4",
    ]
    assert cells(text, "latency ms") == ["latency ms", "-", "-", "-", "0"]
    assert [line.split()[0] for line in lines[6:12]] == [
        "reward",
        "tokens/rollout",
        "calls/rollout",
        "latency",
        "error",
        "gap",
    ]


def test_the_mcnemar_test_line() -> None:
    text = format_comparison(compare(MCNEMAR_A, MCNEMAR_B))
    assert (
        "  paired test: McNemar's exact test (2 tasks solved by A only, 1 by B only): p = 1"
        in text.splitlines()
    )


def test_the_bootstrap_test_line() -> None:
    doc = compare({"t1": [1, 0], "t2": [1]}, {"t1": [1], "t2": [0]}, seed=3, resamples=50)
    p = doc["overall"]["test"]["p_value"]
    line = f"  paired test: paired bootstrap (50 resamples, seed 3): p = {p:.4g}"
    assert line in format_comparison(doc).splitlines()


def test_without_a_reward_in_both_runs_there_is_no_test_and_no_power() -> None:
    lines = format_comparison(compare({"t1": [None]}, {"t1": [1]})).splitlines()
    assert "  paired test: no task with a reward in both runs" in lines
    assert "  power: unknown (needs two tasks with a reward in both runs)" in lines
    assert cells("\n".join(lines), "reward") == ["reward", "-", "-", "-", "0"]


def test_the_flips_worst_first_then_best_first() -> None:
    lines = format_comparison(compare(MCNEMAR_A, MCNEMAR_B)).splitlines()
    start = lines.index("  flips: 1 tasks better in B, 2 worse")
    assert lines[start + 1 : start + 4] == [
        "    worse: task 0 1.00 -> 0.00  t1",
        "    worse: task 1 1.00 -> 0.00  t2",
        "    better: task 2 0.00 -> 1.00  t3",
    ]


def test_more_flips_than_shown_are_counted() -> None:
    count = FLIPS_SHOWN + 2
    doc = compare({f"t{i:02}": [1] for i in range(count)}, {f"t{i:02}": [0] for i in range(count)})
    lines = format_comparison(doc).splitlines()
    worse = [line for line in lines if line.startswith("    worse: ")]
    assert len(worse) == FLIPS_SHOWN
    assert worse[0] == "    worse: task 0 1.00 -> 0.00  t00"
    assert "    ... 2 more worse (--json lists them all)" in lines


def test_a_flip_without_a_task_index_is_named_by_its_id() -> None:
    a, b = bench("x", {"t1": [1]}), bench("x", {"t1": [0]})
    a.tasks[b'"t1"'].task_index = None
    lines = format_comparison(compare_sides(side("A", a), side("B", b))).splitlines()
    assert "    worse: id-t1 1.00 -> 0.00  t1" in lines


def test_the_power_line() -> None:
    doc = compare({"t1": [1], "t2": [1], "t3": [1]}, {"t1": [0], "t2": [0], "t3": [0]})
    assert doc["overall"]["power"]["tasks_needed"] == 2
    assert format_comparison(doc).splitlines()[-1] == (
        "  power: 2 tasks would detect a reward difference of 0.05 with 80% power "
        "(per-task difference sd 0.000; 3 matched here)"
    )
    wide = format_comparison(compare(MCNEMAR_A, MCNEMAR_B, fail_if_worse=0.1)).splitlines()
    n = compare(MCNEMAR_A, MCNEMAR_B, fail_if_worse=0.1)["overall"]["power"]["tasks_needed"]
    assert (
        f"  power: {n:,} tasks would detect a reward difference of 0.1 with 80% power "
        "(per-task difference sd 0.957; 4 matched here)"
    ) in wide


def test_the_verdict_fail() -> None:
    lines = format_comparison(compare(WORSE_A, WORSE_B, fail_if_worse=0.1)).splitlines()
    assert lines[-2:] == [
        "",
        "verdict: FAIL: the 95% interval's upper bound of B - A, -0.4049, is below -0.1",
    ]


def test_the_verdict_pass() -> None:
    lines = format_comparison(compare(WORSE_A, WORSE_B, fail_if_worse=0.5)).splitlines()
    assert lines[-1] == (
        "verdict: PASS: the 95% interval's upper bound of B - A, -0.4049, is not below -0.5"
    )


def test_the_verdict_without_an_interval() -> None:
    lines = format_comparison(compare({"t1": [1]}, {"t1": [0]}, fail_if_worse=0.1)).splitlines()
    assert lines[-1] == "verdict: FAIL: no interval of the reward difference to gate on"
    plain = format_comparison(compare({"t1": [1]}, {"t1": [0]}))
    assert "verdict" not in plain


def test_nothing_matched_hints_at_key() -> None:
    lines = format_comparison(compare({"t1": [1]}, {"t2": [1]})).splitlines()
    assert lines[4:] == [
        "x: 0 tasks matched, 1 only in A, 1 only in B",
        "no task is in both runs: name the field that identifies a task with --key",
    ]
    matched = format_comparison(compare({"t1": [1]}, {"t1": [1]}))
    assert "--key" not in matched


def test_several_benchmarks_end_with_overall_and_list_the_unmatched() -> None:
    a = side("A", bench("gsm", {"t": [1]}), bench("mcqa", {"t": [1]}), bench("xq", {"t": [1]}))
    b = side("B", bench("mcqa", {"t": [0]}), bench("xq", {"t": [1]}))
    lines = format_comparison(compare_sides(a, b)).splitlines()
    assert "benchmarks not in both runs: A only gsm, B only -" in lines
    heads = [line for line in lines if " tasks matched, " in line]
    assert heads == [
        "mcqa: 1 tasks matched, 0 only in A, 0 only in B",
        "xq: 1 tasks matched, 0 only in A, 0 only in B",
        "overall: 2 tasks matched, 0 only in A, 0 only in B",
    ]


def test_one_benchmark_is_not_repeated_as_overall() -> None:
    lines = format_comparison(compare(MCNEMAR_A, MCNEMAR_B)).splitlines()
    assert [line for line in lines if " tasks matched, " in line] == [
        "x: 4 tasks matched, 0 only in A, 0 only in B"
    ]


def test_clustered_errors_are_named_and_counted() -> None:
    groups = {"t1": "d1", "t2": "d1", "t3": "d2", "t4": "d3"}
    a = side("A", bench("x", MCNEMAR_A, groups))
    b = side("B", bench("x", MCNEMAR_B, groups))
    text = format_comparison(compare_sides(a, b, cluster="metadata.doc"))
    assert text.splitlines()[3] == "standard errors clustered by metadata.doc"
    assert cells(text, "reward")[3].endswith("] 3 clusters")


def test_the_real_comparison_reads_as_text(
    comparison: Comparison, choice_runs: tuple[Path, Path]
) -> None:
    lines = comparison.text().splitlines()
    assert lines[:2] == [
        f"A: {choice_runs[0]} (27 rollouts, 0 failed)",
        f"B: {choice_runs[1]} (27 rollouts, 0 failed)",
    ]
    assert lines[4] == "mcqa: 27 tasks matched, 0 only in A, 0 only in B"
    assert comparison.text() == format_comparison(comparison.data)
