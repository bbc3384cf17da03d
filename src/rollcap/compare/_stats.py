"""Paired statistics of two runs over the same tasks (pure).

The tasks are the sample (Miller, "Adding Error Bars to Evals", 2024): each figure is a mean over
tasks, a task's repeats already averaged into one value, and two runs are compared by the mean of
the per-task differences. Every test, interval and power figure comes from scipy or statsmodels;
this module only chooses which and feeds them:

- a mean's interval: Student's t over the tasks (``scipy.stats.t``);
- the paired difference: the same over the per-task differences (what ``scipy.stats.ttest_rel``
  reports), or with ``clusters`` the cluster-robust standard error of an intercept-only least
  squares fit (statsmodels' ``cov_type="cluster"``, t with clusters - 1 degrees of freedom);
- the paired test: McNemar's exact test (``scipy.stats.binomtest`` on the discordant tasks) when
  every per-task value is 0 or 1, else a seeded paired bootstrap (``scipy.stats.bootstrap``) whose
  p-value is the share of resampled differences at least as far from the observed one as the
  observed one is from 0 (Efron and Tibshirani, "An Introduction to the Bootstrap", 16.4);
- the tasks needed to detect a difference: the paired t-test's power (statsmodels' ``TTestPower``).

scipy and statsmodels are the ``compare`` extra: without them ``CompareUnavailable``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMPARE_INSTALL_HINT",
    "CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "POWER",
    "CompareUnavailable",
    "Interval",
    "PairedTest",
    "check_available",
    "gate_fails",
    "mcnemar_exact",
    "mean_interval",
    "paired_bootstrap",
    "paired_difference",
    "paired_test",
    "tasks_needed",
]

CONFIDENCE = 0.95
POWER = 0.8
DEFAULT_RESAMPLES = 10_000
COMPARE_INSTALL_HINT = "rollcap compare needs scipy and statsmodels: pip install 'rollcap[compare]'"


class CompareUnavailable(ValueError):
    """The ``compare`` extra (scipy, statsmodels) is not installed (a ``ValueError``, as the
    other extras' are: the CLI says it in one line, exit 2)."""


def _scipy_stats() -> Any:
    try:
        import scipy.stats
    except ImportError as exc:
        raise CompareUnavailable(COMPARE_INSTALL_HINT) from exc
    return scipy.stats


def check_available() -> None:
    """Raise ``CompareUnavailable`` unless scipy and statsmodels can be imported."""
    _scipy_stats()
    try:
        import statsmodels.api  # noqa: F401
    except ImportError as exc:
        raise CompareUnavailable(COMPARE_INSTALL_HINT) from exc


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as exc:
        raise CompareUnavailable(COMPARE_INSTALL_HINT) from exc
    return numpy


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over ``n`` values with its standard error and two-sided interval at ``CONFIDENCE``.

    ``se``, ``low`` and ``high`` are ``None`` when the values cannot give them (fewer than two
    values, or fewer than two clusters); ``clusters`` is the number of clusters when the standard
    error is cluster-robust.
    """

    n: int
    mean: float
    se: float | None
    low: float | None
    high: float | None
    sd: float | None = None
    clusters: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": self.mean,
            "se": self.se,
            "ci": None if self.low is None else [self.low, self.high],
            "sd": self.sd,
            "clusters": self.clusters,
        }


def _t_interval(mean: float, se: float, df: int) -> tuple[float, float]:
    if se == 0.0:
        return mean, mean  # every value the same: scipy refuses a zero scale
    low, high = _scipy_stats().t.interval(CONFIDENCE, df, loc=mean, scale=se)
    return float(low), float(high)


def mean_interval(values: Sequence[float]) -> Interval | None:
    """The mean of ``values`` with Student's t interval; ``None`` for no value."""
    if not values:
        return None
    np = _numpy()
    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    if len(data) < 2:
        return Interval(len(data), mean, None, None, None)
    se = float(_scipy_stats().sem(data))
    low, high = _t_interval(mean, se, len(data) - 1)
    return Interval(len(data), mean, se, low, high, sd=float(data.std(ddof=1)))


def paired_difference(
    a: Sequence[float], b: Sequence[float], clusters: Sequence[object] | None = None
) -> Interval | None:
    """The mean of ``b - a`` over paired tasks with its interval, cluster-robust when
    ``clusters`` (one label per task) is given; ``None`` for no task."""
    if len(a) != len(b) or (clusters is not None and len(clusters) != len(a)):
        raise ValueError("a, b and clusters must have one value per task")
    if not a:
        return None
    np = _numpy()
    diff = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if clusters is None:
        return mean_interval(diff.tolist())
    labels = {label: index for index, label in enumerate(dict.fromkeys(clusters))}
    groups = np.asarray([labels[label] for label in clusters])
    mean = float(diff.mean())
    sd = float(diff.std(ddof=1)) if len(diff) > 1 else None
    if len(labels) < 2:
        return Interval(len(diff), mean, None, None, None, sd=sd, clusters=len(labels))
    if np.all(diff == diff[0]):  # every task moved alike: statsmodels would divide by zero
        return Interval(len(diff), mean, 0.0, mean, mean, sd=sd, clusters=len(labels))
    try:
        import statsmodels.api as sm
    except ImportError as exc:
        raise CompareUnavailable(COMPARE_INSTALL_HINT) from exc
    fit = sm.OLS(diff, np.ones((len(diff), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": groups}, use_t=True
    )
    low, high = fit.conf_int(alpha=1 - CONFIDENCE)[0]
    se = float(fit.bse[0])
    return Interval(len(diff), mean, se, float(low), float(high), sd=sd, clusters=len(labels))


@dataclass(frozen=True, slots=True)
class PairedTest:
    """A paired test of ``b`` against ``a``: its name, two-sided p-value and what it counted.

    McNemar's: ``a_only`` tasks that only A solved, ``b_only`` those only B solved. The bootstrap:
    ``resamples``, ``seed`` and its own percentile interval of the difference.
    """

    name: str
    p_value: float
    a_only: int | None = None
    b_only: int | None = None
    resamples: int | None = None
    seed: int | None = None
    interval: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "p_value": self.p_value,
            "a_only": self.a_only,
            "b_only": self.b_only,
            "resamples": self.resamples,
            "seed": self.seed,
            "interval": None if self.interval is None else list(self.interval),
        }


def _is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """McNemar's exact test: the discordant tasks as a binomial test against one half."""
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x == 1.0 and y == 0.0)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if x == 0.0 and y == 1.0)
    discordant = a_only + b_only
    p = 1.0 if discordant == 0 else float(_scipy_stats().binomtest(b_only, discordant).pvalue)
    return PairedTest("mcnemar_exact", p, a_only=a_only, b_only=b_only)


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, seed: int, resamples: int = DEFAULT_RESAMPLES
) -> PairedTest:
    """The paired bootstrap test of ``mean(b - a) == 0`` (module doc), reproducible by ``seed``."""
    np = _numpy()
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    observed = float((xb - xa).mean())
    if len(xa) < 2 or np.all(xb - xa == observed):
        # Nothing to resample: every task moved by the same amount.
        p = 1.0 if observed == 0.0 else 0.0
        return PairedTest("paired_bootstrap", p, resamples=0, seed=seed)

    def statistic(x: Any, y: Any, axis: int) -> Any:
        return np.mean(y, axis=axis) - np.mean(x, axis=axis)

    result = _scipy_stats().bootstrap(
        (xa, xb),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    spread = np.abs(result.bootstrap_distribution - observed)
    p = float(np.mean(spread >= abs(observed))) if observed != 0.0 else 1.0
    interval = (float(result.confidence_interval.low), float(result.confidence_interval.high))
    return PairedTest("paired_bootstrap", p, resamples=resamples, seed=seed, interval=interval)


def paired_test(
    a: Sequence[float], b: Sequence[float], *, seed: int, resamples: int = DEFAULT_RESAMPLES
) -> PairedTest | None:
    """McNemar's exact test when every value is 0 or 1, else the paired bootstrap; ``None``
    for no task."""
    if len(a) != len(b):
        raise ValueError("a and b must have one value per task")
    if not a:
        return None
    if _is_binary(a) and _is_binary(b):
        return mcnemar_exact(a, b)
    return paired_bootstrap(a, b, seed=seed, resamples=resamples)


def tasks_needed(sd: float | None, delta: float) -> int | None:
    """How many paired tasks a two-sided paired t-test at ``1 - CONFIDENCE`` needs to detect a
    difference of ``delta`` with ``POWER``, the per-task differences having ``sd``; ``None``
    when ``sd`` is unknown or ``delta`` is not positive. Zero spread: two tasks."""
    if sd is None or not delta > 0 or not math.isfinite(sd):
        return None
    if sd == 0.0:
        return 2
    try:
        from statsmodels.stats.power import TTestPower
    except ImportError as exc:
        raise CompareUnavailable(COMPARE_INSTALL_HINT) from exc
    n = TTestPower().solve_power(
        effect_size=delta / sd, alpha=1 - CONFIDENCE, power=POWER, alternative="two-sided"
    )
    return max(2, math.ceil(float(n)))


def gate_fails(difference: Interval | None, delta: float) -> bool | None:
    """The regression gate: ``True`` when the interval's upper bound of ``b - a`` is below
    ``-delta`` (B is worse than A by more than ``delta``, at the one-sided level
    ``(1 - CONFIDENCE) / 2``), ``False`` when it is not, ``None`` with no interval."""
    if difference is None or difference.high is None:
        return None
    return difference.high < -delta
