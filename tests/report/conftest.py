"""A real evaluation to report on, and a headless Chromium to look at the report with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.report._evaluation import run_evaluation


@pytest.fixture(scope="session")
def evaluation_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``eval submit``-style job directory (see ``_evaluation``); tests must not change it."""
    job_dir = tmp_path_factory.mktemp("evaluation") / "job"
    run_evaluation(job_dir)
    return job_dir


@pytest.fixture
def job_copy(evaluation_dir: Path, tmp_path: Path) -> Path:
    """A copy of the evaluation's job directory that a test may change."""
    copy = tmp_path / "job"
    shutil.copytree(evaluation_dir, copy)
    return copy
