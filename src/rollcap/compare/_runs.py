"""Reading one side of a comparison: its benchmarks, their tasks and each rollout's figures.

A side is named by a path (``read_side``):

- an output file of ``eval run`` (``X.jsonl`` or ``X.jsonl.zst``; its ``X_failures.jsonl``
  beside it is read too): one benchmark, named after the file;
- a job directory (``rollouts.jsonl``, usually ``model-calls/`` beside it), as ``eval submit``
  writes for each benchmark: one benchmark, named after the directory;
- a capture directory whose rollouts file the report finds (``rollcap.report.find_run``);
- the driver's ``job_dir``, whose subdirectories are job directories: one benchmark each.

Only a few numbers of each rollout are kept (``LineFigures``), so memory grows with the number
of rollouts, never with what their lines weigh. A line that does not parse, or that no task key
names, is counted, never fatal.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollcap.compare._lines import (
    LineFigures,
    canonical,
    field_value,
    line_figures,
    task_id,
    task_key,
)
from rollcap.compare._lines import task_label as _label
from rollcap.compare._model import Benchmark, Side, Task
from rollcap.report._source import (
    JOB_CAPTURE_DIR,
    JOB_ROLLOUTS_FILE,
    RunFiles,
    find_run,
    jsonl_objects,
)
from rollcap.store import ZSTD_SUFFIX, plain_name

__all__ = ["CompareError", "read_side", "run_files"]


class CompareError(ValueError):
    """A side that cannot be read as a run (no rollouts file, nothing matched ...)."""


def _failures_of(rollouts_file: Path) -> Path:
    from rollcap.collect import failures_path  # here: collection loads the evidence models

    return failures_path(rollouts_file)


def run_files(bench: Benchmark) -> RunFiles | None:
    """The report's view of a benchmark's files; ``None`` without a capture directory."""
    if bench.capture_dir is None:
        return None
    return RunFiles(Path(bench.capture_dir), Path(bench.rollouts_file))


def _read_benchmark(
    name: str, rollouts_file: Path, capture_dir: Path | None, key: str | None, cluster: str | None
) -> Benchmark:
    bench = Benchmark(name, str(rollouts_file), None if capture_dir is None else str(capture_dir))
    keys_by_index: dict[int, bytes] = {}
    seen: set[str] = set()

    def add(line: dict[str, object], figures: LineFigures, key_bytes: bytes | None) -> None:
        if key_bytes is None:
            bench.unkeyed += 1
            return
        task = bench.tasks.get(key_bytes)
        if task is None:
            label_of = field_value(line, cluster) if cluster is not None else None
            task = bench.tasks[key_bytes] = Task(
                id=task_id(name, key_bytes),
                key=key_bytes,
                label=_label(line, key_bytes),
                task_index=figures.task_index,
                cluster=None if label_of is None else canonical(label_of),
            )
        task.rollouts.append(figures)

    for line in jsonl_objects(rollouts_file):
        if line is None:
            bench.unreadable += 1
            continue
        figures = line_figures(line)
        bench.rollouts += 1
        if figures.rollout_id is not None:
            seen.add(figures.rollout_id)
        key_bytes = task_key(line, key)
        if key_bytes is not None and figures.task_index is not None:
            keys_by_index.setdefault(figures.task_index, key_bytes)
        add(line, figures, key_bytes)
    for line in jsonl_objects(_failures_of(rollouts_file)):
        if line is None:
            bench.unreadable += 1
            continue
        figures = line_figures(line, failed=True)
        if figures.rollout_id is not None and figures.rollout_id in seen:
            continue  # an earlier attempt of a rollout that then finished
        bench.rollouts += 1
        bench.failed += 1
        index = figures.task_index
        by_index = None if index is None else keys_by_index.get(index)
        add(line, figures, by_index if by_index is not None else task_key(line, key))
    return bench


def _job_rollouts(directory: Path) -> Path | None:
    for name in (JOB_ROLLOUTS_FILE, JOB_ROLLOUTS_FILE + ZSTD_SUFFIX):
        if (directory / name).is_file():
            return directory / name
    return None


def _job_benchmark(directory: Path, key: str | None, cluster: str | None) -> Benchmark:
    rollouts = _job_rollouts(directory)
    assert rollouts is not None
    captures = directory / JOB_CAPTURE_DIR
    return _read_benchmark(
        directory.name, rollouts, captures if captures.is_dir() else None, key, cluster
    )


def _file_name(path: Path) -> str:
    stem = Path(plain_name(path.name)).stem
    return stem.removesuffix("_rollouts") or stem


def read_side(
    path: str | os.PathLike[str], *, key: str | None = None, cluster: str | None = None
) -> Side:
    """Read the run at ``path`` (module doc), tasks keyed by ``key`` (a dotted field; ``None``:
    the task's input) and clustered by ``cluster``. ``FileNotFoundError`` for a missing path,
    ``CompareError`` for a directory that holds no run."""
    root = Path(path)
    if root.is_file():
        name = _file_name(root)
        captures = root.parent / JOB_CAPTURE_DIR
        found = captures if captures.is_dir() else None
        return Side(str(root), [_read_benchmark(name, root, found, key, cluster)])
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or directory")
    if _job_rollouts(root) is not None:
        return Side(str(root), [_job_benchmark(root, key, cluster)])
    jobs = sorted(p for p in root.iterdir() if p.is_dir() and _job_rollouts(p) is not None)
    if jobs:
        return Side(str(root), [_job_benchmark(job, key, cluster) for job in jobs])
    run = find_run(root)
    if run.rollouts_file is None:
        raise CompareError(
            f"{root}: no rollouts file to compare ({run.rollouts_note}); name an output file, "
            "a job directory or the driver's job_dir"
        )
    return Side(
        str(root),
        [
            _read_benchmark(
                _file_name(run.rollouts_file), run.rollouts_file, run.capture_dir, key, cluster
            )
        ],
    )
