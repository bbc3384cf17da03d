"""The statistics: each figure against a worked example whose answer is published, and the gate
against simulations of its error rate and its power."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollcap.compare._stats import (
    COMPARE_INSTALL_HINT,
    CompareUnavailable,
    check_available,
    gate_fails,
    mcnemar_exact,
    mean_interval,
    paired_bootstrap,
    paired_difference,
    paired_test,
    tasks_needed,
)

# Student's sleep data (Cushny and Peebles), as R ships it (datasets::sleep): extra hours of
# sleep of ten patients under two drugs. R's documented example
# `t.test(extra ~ group, data = sleep, paired = TRUE)` prints t = -4.0621, df = 9,
# p-value = 0.002833, 95 percent interval -2.4598858 -0.7001142, mean difference -1.58.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_the_paired_interval_is_rs_on_the_sleep_data() -> None:
    diff = paired_difference(SLEEP_2, SLEEP_1)  # group 1 - group 2, as R's formula orders it
    assert diff is not None
    assert diff.mean == pytest.approx(-1.58)
    assert diff.low == pytest.approx(-2.4598858, abs=1e-7)
    assert diff.high == pytest.approx(-0.7001142, abs=1e-7)
    assert diff.mean / diff.se == pytest.approx(-4.0621, abs=1e-4)  # type: ignore[operator]


def test_singleton_clusters_give_the_unclustered_interval() -> None:
    # One task a cluster: the cluster-robust error with its small-sample correction is the
    # plain one, and so is its interval (t with clusters - 1 = n - 1 degrees of freedom).
    clustered = paired_difference(SLEEP_2, SLEEP_1, clusters=list(range(10)))
    assert clustered is not None
    assert clustered.clusters == 10
    assert clustered.low == pytest.approx(-2.4598858, abs=1e-7)
    assert clustered.high == pytest.approx(-0.7001142, abs=1e-7)


def test_the_clustered_error_is_millers_with_the_usual_correction() -> None:
    # Miller (2024), eq. 4: SE_C^2 = (1/n^2) sum over clusters of (sum of residuals in it)^2,
    # here with the small-sample factor G/(G-1) * (n-1)/(n-1) that statsmodels applies.
    rng = np.random.default_rng(7)
    clusters = [i // 5 for i in range(60)]
    shared = rng.normal(size=12)
    a = rng.normal(size=60)
    b = a + np.asarray([shared[c] for c in clusters]) + rng.normal(scale=0.3, size=60)
    diff = paired_difference(a.tolist(), b.tolist(), clusters=clusters)
    assert diff is not None
    d = b - a
    residuals = d - d.mean()
    sums = np.asarray(
        [residuals[[i for i, c in enumerate(clusters) if c == g]].sum() for g in range(12)]
    )
    miller = math.sqrt((sums**2).sum() / 60**2 * 12 / 11)
    assert diff.se == pytest.approx(miller, rel=1e-9)
    plain = paired_difference(a.tolist(), b.tolist())
    assert plain is not None
    assert plain.se is not None
    assert diff.se is not None
    assert diff.se > 1.5 * plain.se  # the shared context widens it, as it should


def test_mcnemars_exact_test_is_fagerland_et_als_example() -> None:
    # Fagerland, Lydersen and Laake, "The McNemar test for binary matched-pairs data",
    # BMC Med Res Methodol 13:91 (2013), Table 1: 1 pair yes/no, 7 no/yes; exact p = 0.070.
    a = [1.0] + [0.0] * 7 + [1.0] * 1 + [0.0] * 12
    b = [0.0] + [1.0] * 7 + [1.0] * 1 + [0.0] * 12
    test = mcnemar_exact(a, b)
    assert (test.a_only, test.b_only) == (1, 7)
    assert round(test.p_value, 3) == 0.070
    assert test.p_value == pytest.approx(18 / 256)


def test_the_test_is_mcnemar_for_zero_one_values_and_the_bootstrap_otherwise() -> None:
    assert paired_test([0.0, 1.0], [1.0, 1.0], seed=0).name == "mcnemar_exact"  # type: ignore[union-attr]
    assert paired_test([0.5, 1.0], [1.0, 1.0], seed=0).name == "paired_bootstrap"  # type: ignore[union-attr]
    assert paired_test([], [], seed=0) is None
    assert mcnemar_exact([1.0, 0.0], [1.0, 0.0]).p_value == 1.0  # no discordant task


def test_the_bootstrap_agrees_with_the_published_t_test_and_is_seeded() -> None:
    test = paired_bootstrap(SLEEP_1, SLEEP_2, seed=3)
    assert test.p_value < 0.01  # R's t-test: 0.002833
    assert test.interval is not None
    low, high = test.interval
    assert 0.7001142 - 0.3 < low < 1.58 < high < 2.4598858 + 0.3
    assert paired_bootstrap(SLEEP_1, SLEEP_2, seed=3) == test
    assert paired_bootstrap(SLEEP_1, SLEEP_2, seed=4).interval != test.interval
    same = paired_bootstrap(SLEEP_1, SLEEP_1, seed=0)
    assert same.p_value == 1.0


def test_tasks_needed_is_the_published_sample_size() -> None:
    # A paired (one-sample) two-sided t-test at alpha 0.05 detecting d = 0.5 with 80% power
    # needs 34 pairs (G*Power's "means: difference from constant", and Cohen 1988, Table 2.4.1
    # read for the one-sample case: n = 33.4, rounded up).
    assert tasks_needed(1.0, 0.5) == 34
    assert tasks_needed(2.0, 1.0) == 34  # only the ratio counts
    assert tasks_needed(None, 0.5) is None
    assert tasks_needed(1.0, 0.0) is None
    assert tasks_needed(0.0, 0.1) == 2


def test_the_tasks_needed_do_detect_the_difference_about_four_times_in_five() -> None:
    sd, delta = 0.6, 0.15
    n = tasks_needed(sd, delta)
    assert n is not None
    rng = np.random.default_rng(11)
    hits = 0
    trials = 1000
    for _ in range(trials):
        d = rng.normal(delta, sd, size=n)
        interval = paired_difference([0.0] * n, d.tolist())
        assert interval is not None
        assert interval.low is not None
        hits += interval.low > 0 or interval.high < 0  # type: ignore[operator]
    assert 0.75 <= hits / trials <= 0.85


def test_a_mean_interval() -> None:
    one = mean_interval([0.25])
    assert one is not None
    assert (one.mean, one.se, one.low) == (0.25, None, None)
    assert mean_interval([]) is None
    flat = mean_interval([1.0, 1.0, 1.0])
    assert flat is not None
    assert (flat.low, flat.high) == (1.0, 1.0)
    sleep = mean_interval([b - a for a, b in zip(SLEEP_2, SLEEP_1, strict=True)])
    assert sleep is not None
    assert sleep.low == pytest.approx(-2.4598858, abs=1e-7)


def test_the_gate_reads_the_upper_bound() -> None:
    diff = paired_difference(SLEEP_2, SLEEP_1)  # [-2.46, -0.70]
    assert gate_fails(diff, 0.5) is True
    assert gate_fails(diff, 0.8) is False
    assert gate_fails(None, 0.1) is None
    assert gate_fails(paired_difference([1.0], [0.0]), 0.1) is None  # one task: no interval


def simulate_gate(
    trials: int, tasks: int, drop: float, margin: float, seed: int, repeats: int = 1
) -> float:
    """How often the gate fails when B's chance of solving each task is A's minus ``drop``.

    Tasks differ in difficulty (a chance drawn per task); each run's reward on a task is the
    mean of ``repeats`` Bernoulli draws, as collection with --num-repeats gives.
    """
    rng = np.random.default_rng(seed)
    failed = 0
    for _ in range(trials):
        chance = rng.beta(2.0, 2.0, size=tasks)
        a = rng.binomial(repeats, chance) / repeats
        b = rng.binomial(repeats, np.clip(chance - drop, 0.0, 1.0)) / repeats
        failed += bool(gate_fails(paired_difference(a.tolist(), b.tolist()), margin))
    return failed / trials


def test_identical_policies_with_no_margin_fail_at_the_stated_rate() -> None:
    # The gate fails when the upper bound of a two-sided 95% interval is below 0: for two
    # identical policies that is the one-sided 2.5%. 4000 trials: a binomial sd of 0.25%.
    rate = simulate_gate(4000, 200, drop=0.0, margin=0.0, seed=1)
    assert 0.015 <= rate <= 0.035


def test_identical_policies_with_a_margin_almost_never_fail() -> None:
    assert simulate_gate(2000, 200, drop=0.0, margin=0.05, seed=2) <= 0.005


def test_a_regression_larger_than_the_margin_nearly_always_fails() -> None:
    assert simulate_gate(1000, 500, drop=0.15, margin=0.05, seed=3, repeats=4) >= 0.99


def simulate_clustered(trials: int, seed: int) -> tuple[float, float]:
    """How often the gate (no margin) fails identical policies whose tasks come in 30 groups of
    10 that share a context, the context moving all of its tasks' differences alike: without
    clusters and with them."""
    rng = np.random.default_rng(seed)
    clusters = [i // 10 for i in range(300)]
    plain = clustered = 0
    zeros = [0.0] * 300
    for _ in range(trials):
        shift = rng.normal(0.0, 0.2, size=30)
        d = np.asarray([shift[c] for c in clusters]) + rng.normal(0.0, 0.2, size=300)
        plain += bool(gate_fails(paired_difference(zeros, d.tolist()), 0.0))
        clustered += bool(gate_fails(paired_difference(zeros, d.tolist(), clusters), 0.0))
    return plain / trials, clustered / trials


def test_clustered_tasks_keep_the_stated_rate_where_the_plain_interval_does_not() -> None:
    # The unclustered interval is too narrow here and fails identical policies far more often
    # than 2.5%; clustered, it holds.
    plain, clustered = simulate_clustered(1000, seed=5)
    assert plain > 0.1
    assert 0.01 <= clustered <= 0.045


def test_without_the_extra_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_available()
    import sys

    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    with pytest.raises(CompareUnavailable, match=r"pip install 'rollcap\[compare\]'"):
        check_available()
    assert "rollcap[compare]" in COMPARE_INSTALL_HINT
