"""The regression gate of ``rollcap compare --fail-if-worse`` against its stated error rate.

The gate fails when the upper bound of the two-sided 95% interval of B - A is below -D, so on two
identical policies with D = 0 it should fail 2.5% of the time (the baseline the figure is read
against: the ratio is observed / stated). Beside it: identical policies with a margin, a planted
regression larger than the margin (the gate's power), and tasks sharing a context, without and
with clusters. The simulations are the tests' (tests/compare/test_stats.py), run longer.

    python bench/compare.py [--trials N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.compare.test_stats import simulate_clustered, simulate_gate

STATED = 0.025


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    trials = parser.parse_args().trials
    started = time.perf_counter()
    rows = [
        ("identical, D = 0, 200 tasks", simulate_gate(trials, 200, 0.0, 0.0, seed=1), STATED),
        ("identical, D = 0.05, 200 tasks", simulate_gate(trials, 200, 0.0, 0.05, seed=2), None),
        (
            "drop 0.15, D = 0.05, 500 tasks x 4 repeats",
            simulate_gate(trials // 4, 500, 0.15, 0.05, seed=3, repeats=4),
            None,
        ),
    ]
    plain, clustered = simulate_clustered(trials // 4, seed=5)
    rows.append(("identical, shared contexts, no --cluster", plain, STATED))
    rows.append(("identical, shared contexts, --cluster", clustered, STATED))
    print(f"{'case':<46} {'gate failed':>11} {'/ stated':>9}")
    for name, rate, stated in rows:
        ratio = f"{rate / stated:.2f}" if stated else "-"
        print(f"{name:<46} {rate:>10.2%} {ratio:>9}")
    took = time.perf_counter() - started
    print(f"({trials:,} trials a row, a quarter for the last three; {took:.0f} s)")


if __name__ == "__main__":
    main()
