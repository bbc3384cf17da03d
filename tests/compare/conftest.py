"""Two real runs to compare, and the report's headless Chromium to look at the compare page.

The runs are the MCQA example tasks collected twice through the real stack (the simple agent, a
capturing model server, the MCQA resources server and collection) against the fake upstream
answering as ``choice-1`` and as ``choice-2``: deterministic option letters that differ by seed,
so some tasks flip between the runs. Each run is an ``eval submit``-style job directory
(``rollouts.jsonl`` and ``model-calls/``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollcap.collect import collect
from rollcap.compare import Comparison, compare_runs
from rollcap.gym import example_data_path
from rollcap.report._source import JOB_CAPTURE_DIR, JOB_ROLLOUTS_FILE
from rollcap.testing import FakeUpstream
from tests.gym.conftest import gym_stack
from tests.report._runs import run_in_thread
from tests.report.conftest import browser, watched

__all__ = [
    "BENCHMARK",
    "RUN_MODELS",
    "browser",
    "choice_runs",
    "collect_run",
    "comparison",
    "watched",
]

RUN_MODELS = ("choice-1", "choice-2")
BENCHMARK = "mcqa"  # each job directory's name, so the benchmark's


async def _collect(model: str, job_dir: Path) -> None:
    capture = job_dir / JOB_CAPTURE_DIR
    async with (
        FakeUpstream() as upstream,
        gym_stack(upstream.url, capture, model_name=model) as stack,
        asyncio.timeout(60),
    ):
        await collect(
            stack.agent_url,
            example_data_path("mcqa"),
            job_dir / JOB_ROLLOUTS_FILE,
            capture_dir=capture,
        )


def collect_run(model: str, job_dir: Path) -> None:
    """The MCQA example tasks answered by the fake upstream as ``model``, into ``job_dir``; in a
    thread of its own, so that a caller whose thread runs an event loop (Playwright's) can."""
    job_dir.mkdir(parents=True, exist_ok=True)
    run_in_thread(lambda: _collect(model, job_dir))


@pytest.fixture(scope="session")
def choice_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Run A (``choice-1``) and run B (``choice-2``), both of benchmark ``mcqa``; tests must
    not change them."""
    root = tmp_path_factory.mktemp("runs")
    a, b = root / "a" / BENCHMARK, root / "b" / BENCHMARK
    for model, job_dir in zip(RUN_MODELS, (a, b), strict=True):
        collect_run(model, job_dir)
    return a, b


@pytest.fixture(scope="session")
def comparison(choice_runs: tuple[Path, Path]) -> Comparison:
    """B against A."""
    return compare_runs(*choice_runs)
