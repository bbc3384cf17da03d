"""``compare_sides``: two sides matched task by task into the comparison document."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollcap.compare import COMPARE_SCHEMA, DEFAULT_DETECT, compare_runs
from rollcap.compare._compare import compare_sides
from rollcap.compare._lines import METRICS, LineFigures
from rollcap.compare._model import Benchmark, Side, Task
from tests.compare.test_lines import rollout_line
from tests.compare.test_runs import write_lines

Rewards = Sequence[float | None]


def bench(
    name: str, tasks: Mapping[str, Rewards], clusters: Mapping[str, str] | None = None
) -> Benchmark:
    """A benchmark whose task ``t`` (key ``"t"``, label ``t``, index its place) has one rollout
    per reward given; a ``None`` reward is a failed rollout."""
    out = Benchmark(name, f"/runs/{name}/rollouts.jsonl", None)
    for index, (label, values) in enumerate(tasks.items()):
        key = f'"{label}"'.encode()
        cluster = None if clusters is None else f'"{clusters[label]}"'.encode()
        task = out.tasks[key] = Task(f"id-{label}", key, label, index, cluster)
        for repeat, reward in enumerate(values):
            figures: dict[str, float | None] = dict.fromkeys(METRICS)
            figures["reward"] = reward
            figures["error"] = 1.0 if reward is None else 0.0
            figures["tokens"] = 100.0 * (repeat + 1)
            task.rollouts.append(
                LineFigures(f"{index}-{repeat}", index, repeat, reward is None, figures)
            )
            out.rollouts += 1
            out.failed += reward is None
    return out


def side(source: str, *benchmarks: Benchmark) -> Side:
    return Side(source, list(benchmarks))


def compare(a: Mapping[str, Rewards], b: Mapping[str, Rewards], **options: Any) -> dict[str, Any]:
    return compare_sides(side("A", bench("x", a)), side("B", bench("x", b)), **options)


def test_tasks_are_matched_by_key_and_counted_when_in_one_run_only() -> None:
    doc = compare({"t1": [1], "t2": [1], "t3": [0]}, {"t2": [0], "t3": [0], "t4": [1]})
    assert doc["schema"] == COMPARE_SCHEMA
    [section] = doc["benchmarks"]
    assert section["name"] == "x"
    assert section["tasks"] == {"matched": 2, "only_a": 1, "only_b": 1}
    assert doc["overall"]["tasks"] == {"matched": 2, "only_a": 1, "only_b": 1}
    assert sorted(c["label"] for c in section["changes"]) == ["t2", "t3"]


def test_repeats_are_averaged_before_comparing() -> None:
    doc = compare({"t1": [1, 0, 1, 0], "t2": [1, 1]}, {"t1": [1, 1], "t2": [0, None]})
    reward = doc["overall"]["metrics"]["reward"]
    assert reward["tasks"] == 2
    assert reward["a"]["mean"] == 0.75  # (0.5 + 1) / 2
    assert reward["b"]["mean"] == 0.5  # (1 + 0) / 2: the failed repeat has no reward
    assert reward["diff"]["mean"] == -0.25
    changes = {c["label"]: c for c in doc["overall"]["changes"]}
    assert (changes["t1"]["a"], changes["t1"]["b"], changes["t1"]["change"]) == (0.5, 1.0, 0.5)
    assert changes["t2"]["rollouts"] == {"a": ["1-0", "1-1"], "b": ["1-0", "1-1"]}
    assert changes["t2"]["task_index"] == {"a": 1, "b": 1}
    # the other figures are averaged too: tokens 100, 200, ... by repeat
    tokens = doc["overall"]["metrics"]["tokens"]
    assert (tokens["a"]["mean"], tokens["b"]["mean"]) == (200.0, 150.0)
    error = doc["overall"]["metrics"]["error"]
    assert (error["a"]["mean"], error["b"]["mean"]) == (0.0, 0.25)
    assert doc["overall"]["metrics"]["latency_ms"] is None  # no rollout reports one


def test_the_sides_are_summarised() -> None:
    doc = compare({"t1": [1, None]}, {"t1": [1]})
    assert doc["a"]["source"] == "A"
    assert (doc["a"]["rollouts"], doc["a"]["failed"]) == (2, 1)
    assert (doc["b"]["rollouts"], doc["b"]["failed"]) == (1, 0)
    assert doc["a"]["benchmarks"][0]["name"] == "x"
    assert doc["a"]["benchmarks"][0]["tasks"] == 1


def test_benchmarks_are_paired_by_name_and_the_rest_listed() -> None:
    a = side("A", bench("gsm", {"t": [1]}), bench("mcqa", {"t": [1], "u": [0]}))
    b = side("B", bench("mcqa", {"t": [0], "u": [0]}), bench("swe", {"t": [1]}))
    doc = compare_sides(a, b)
    assert [s["name"] for s in doc["benchmarks"]] == ["mcqa"]
    assert doc["benchmarks_unmatched"] == {"a": ["gsm"], "b": ["swe"]}
    assert doc["overall"]["tasks"]["matched"] == 2


def test_one_benchmark_each_is_paired_whatever_the_names() -> None:
    doc = compare_sides(side("A", bench("run1", {"t": [1]})), side("B", bench("run2", {"t": [0]})))
    assert [s["name"] for s in doc["benchmarks"]] == ["run1"]
    assert doc["benchmarks_unmatched"] == {"a": [], "b": []}
    assert doc["overall"]["tasks"]["matched"] == 1


def test_overall_pools_the_tasks_of_every_paired_benchmark() -> None:
    a = side("A", bench("m", {"t": [1], "u": [1]}), bench("n", {"t": [0]}))
    b = side("B", bench("m", {"t": [0], "u": [1]}), bench("n", {"t": [1]}))
    doc = compare_sides(a, b)
    assert [s["tasks"]["matched"] for s in doc["benchmarks"]] == [2, 1]
    assert doc["overall"]["tasks"]["matched"] == 3
    assert doc["overall"]["flips"] == {"better": 1, "worse": 1}
    assert doc["overall"]["metrics"]["reward"]["diff"]["mean"] == 0.0


def test_flips_are_counted_and_changes_sorted_worst_first() -> None:
    doc = compare(
        {"up": [0], "same": [1], "down": [1], "half": [1], "gone": [1], "b": [0], "a": [0]},
        {"up": [1], "same": [1], "down": [0], "half": [1, 0], "gone": [None], "b": [1], "a": [1]},
    )
    section = doc["benchmarks"][0]
    assert section["flips"] == {"better": 3, "worse": 2}
    assert [(c["label"], c["change"]) for c in section["changes"]] == [
        ("down", -1.0),
        ("half", -0.5),
        ("same", 0.0),
        ("a", 1.0),  # equal changes by label
        ("b", 1.0),
        ("up", 1.0),
        ("gone", None),  # no reward in B: last
    ]


def test_mcnemar_is_chosen_for_zero_one_values() -> None:
    doc = compare(
        {"t1": [1], "t2": [1], "t3": [1], "t4": [0]}, {"t1": [0], "t2": [0], "t3": [1], "t4": [1]}
    )
    test = doc["overall"]["test"]
    assert test["name"] == "mcnemar_exact"
    assert (test["a_only"], test["b_only"]) == (2, 1)
    assert test["p_value"] == 1.0  # binomtest(1, 3)
    assert test["resamples"] is None


BOOT_A = {"t1": [1.0, 0.0], "t2": [1.0], "t3": [0.0]}
BOOT_B = {"t1": [1.0], "t2": [0.0], "t3": [0.0]}


def test_the_bootstrap_is_chosen_otherwise() -> None:
    doc = compare(BOOT_A, BOOT_B, seed=7, resamples=99)
    test = doc["overall"]["test"]
    assert test["name"] == "paired_bootstrap"
    assert (test["seed"], test["resamples"]) == (7, 99)
    assert test["a_only"] is None
    assert (doc["seed"], doc["resamples"]) == (7, 99)
    again = compare(BOOT_A, BOOT_B, seed=7, resamples=99)
    assert again["overall"]["test"] == test  # seeded: the same p-value


def test_no_task_with_a_reward_in_both_runs_has_no_test() -> None:
    doc = compare({"t1": [None]}, {"t1": [1]})
    assert doc["overall"]["tasks"]["matched"] == 1
    assert doc["overall"]["test"] is None
    assert doc["overall"]["metrics"]["reward"] is None
    assert doc["overall"]["power"]["tasks_needed"] is None


def test_the_power_figure_sizes_for_the_margin_or_the_default() -> None:
    a = {"t1": [1], "t2": [1], "t3": [1]}
    b = {"t1": [0], "t2": [0], "t3": [0]}
    plain = compare(a, b)["overall"]["power"]
    assert plain == {"delta": DEFAULT_DETECT, "power": 0.8, "sd": 0.0, "tasks_needed": 2}
    assert compare(a, b, fail_if_worse=0.2)["overall"]["power"]["delta"] == 0.2
    assert compare(a, b, fail_if_worse=0.0)["overall"]["power"]["delta"] == DEFAULT_DETECT


WORSE_A = {f"t{i}": [1.0] for i in range(6)}
WORSE_B = {f"t{i}": [0.0 if i < 5 else 1.0] for i in range(6)}


def test_the_verdict_fails_when_b_is_worse_by_more_than_the_margin() -> None:
    doc = compare(WORSE_A, WORSE_B, fail_if_worse=0.1)
    verdict = doc["verdict"]
    assert verdict["fail_if_worse"] == 0.1
    assert verdict["failed"] is True
    assert verdict["upper"] == doc["overall"]["metrics"]["reward"]["diff"]["ci"][1]
    assert verdict["upper"] == pytest.approx(-0.40490, abs=1e-5)  # -5/6 + t(5) * sd / sqrt(6)


def test_the_verdict_passes_within_the_margin() -> None:
    doc = compare(WORSE_A, WORSE_B, fail_if_worse=0.5)
    assert doc["verdict"]["failed"] is False
    same = compare({"t1": [1], "t2": [0]}, {"t1": [1], "t2": [0]}, fail_if_worse=0.0)
    assert same["verdict"] == {"fail_if_worse": 0.0, "upper": 0.0, "failed": False}


def test_the_verdict_is_unknown_without_an_interval() -> None:
    doc = compare({"t1": [1]}, {"t1": [0]}, fail_if_worse=0.1)
    assert doc["verdict"] == {"fail_if_worse": 0.1, "upper": None, "failed": None}
    assert compare({"t1": [1]}, {"t1": [0]})["verdict"] is None


@pytest.mark.parametrize("margin", [-0.01, float("nan")])
def test_a_bad_margin_is_a_value_error(margin: float) -> None:
    with pytest.raises(ValueError, match="--fail-if-worse must be a number >= 0"):
        compare({"t1": [1]}, {"t1": [0]}, fail_if_worse=margin)


def test_a_clustered_difference_counts_its_clusters() -> None:
    tasks_a = {"t1": [1.0], "t2": [1.0], "t3": [0.0], "t4": [1.0]}
    tasks_b = {"t1": [0.0], "t2": [1.0], "t3": [1.0], "t4": [0.0]}
    groups = {"t1": "doc1", "t2": "doc1", "t3": "doc2", "t4": "doc3"}
    a = side("A", bench("x", tasks_a, groups))
    b = side("B", bench("x", tasks_b, groups))
    doc = compare_sides(a, b, cluster="metadata.doc")
    assert doc["cluster"] == "metadata.doc"
    diff = doc["overall"]["metrics"]["reward"]["diff"]
    assert diff["clusters"] == 3
    assert diff["mean"] == -0.25
    plain = compare_sides(a, b)["overall"]["metrics"]["reward"]["diff"]
    assert plain["clusters"] is None
    assert plain["mean"] == -0.25
    assert diff["se"] != plain["se"]


def test_the_key_is_recorded() -> None:
    assert compare({"t": [1]}, {"t": [1]}, key="metadata.id")["key"] == "metadata.id"
    assert compare({"t": [1]}, {"t": [1]})["key"] is None


def test_compare_runs_reads_both_paths(tmp_path: Path) -> None:
    a = write_lines(tmp_path / "a_rollouts.jsonl", [rollout_line(i, reward=1.0) for i in range(3)])
    b = write_lines(
        tmp_path / "b_rollouts.jsonl",
        [rollout_line(i, reward=float(i != 1)) for i in (2, 1, 0, 9)],  # another order
    )
    comparison = compare_runs(a, b, fail_if_worse=0.5)
    assert comparison.data["overall"]["tasks"] == {"matched": 3, "only_a": 0, "only_b": 1}
    assert comparison.data["overall"]["flips"] == {"better": 0, "worse": 1}
    assert comparison.data["overall"]["changes"][0]["label"] == "task 1"
    assert comparison.failed is False
    with pytest.raises(ValueError, match="resamples must be >= 1"):
        compare_runs(a, b, resamples=0)


def test_a_task_that_failed_every_time_in_b_is_paired_by_index(tmp_path: Path) -> None:
    # B's task 1 has no finished line: its failure lines carry no input, so its key is its
    # index alone; it is still B's side of A's task 1, and B's error rate counts it.
    from rollcap.collect import failures_path
    from tests.compare.test_lines import failure_line

    a = write_lines(tmp_path / "a" / "r.jsonl", [rollout_line(0), rollout_line(1)])
    b = write_lines(tmp_path / "b" / "r.jsonl", [rollout_line(0)])
    write_lines(failures_path(b), [failure_line(1, 0)])
    doc = compare_runs(a, b).data
    overall = doc["overall"]
    assert overall["tasks"] == {"matched": 2, "only_a": 0, "only_b": 0}
    error = overall["metrics"]["error"]
    assert (error["a"]["mean"], error["b"]["mean"], error["tasks"]) == (0.0, 0.5, 2)
    assert overall["metrics"]["reward"]["tasks"] == 1  # a failed rollout has no reward
    swapped = compare_runs(b, a).data["overall"]
    assert swapped["tasks"] == {"matched": 2, "only_a": 0, "only_b": 0}
