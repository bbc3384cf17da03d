"""``read_side``: one side of a comparison read from each kind of path it may be named by."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.collect import failures_path
from rollcap.compare import CompareError, read_side, run_files
from rollcap.compare._lines import task_id
from rollcap.compare._model import Benchmark
from rollcap.store import FrameWriter
from tests.compare.conftest import BENCHMARK
from tests.compare.test_lines import failure_line, rollout_line


def write_lines(path: Path, lines: Iterable[dict[str, Any] | bytes]) -> Path:
    """``lines`` as JSONL (a ``bytes`` item as it is), compressed when ``path`` ends ``.zst``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(
        (item if isinstance(item, bytes) else orjson.dumps(item)) + b"\n" for item in lines
    )
    writer = FrameWriter(path)
    writer.write(data)
    writer.close()
    return path


def rewards(bench: Benchmark) -> dict[str, list[float | None]]:
    """Each task's rewards by its label."""
    return {
        task.label: [r.figures["reward"] for r in task.rollouts] for task in bench.tasks.values()
    }


def test_an_output_file_and_its_failures_file(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "gsm_rollouts.jsonl",
        [rollout_line(0, 0, reward=1.0), rollout_line(0, 1, reward=0.0), rollout_line(1)],
    )
    failures = failures_path(out)
    assert failures == tmp_path / "gsm_rollouts_failures.jsonl"
    write_lines(failures, [failure_line(1, 1), failure_line(2, 0)])
    side = read_side(out)
    assert side.source == str(out)
    [bench] = side.benchmarks
    assert (bench.name, bench.rollouts_file, bench.capture_dir) == ("gsm", str(out), None)
    assert (bench.rollouts, bench.failed, bench.unkeyed, bench.unreadable) == (5, 2, 0, 0)
    # task 1's failure takes the key of task 1's finished line; task 2 has no finished line
    # and a failure line has no input, so it is keyed by its task index alone
    assert rewards(bench) == {
        "task 0": [1.0, 0.0],
        "task 1": [1.0, None],
        '{"_ng_task_index":2}': [None],
    }
    task = bench.tasks[b'[{"content":"task 1","role":"user"}]']
    assert [(r.rollout_id, r.failed) for r in task.rollouts] == [("1-0", False), ("1-1", True)]
    assert task.id == task_id("gsm", task.key)
    assert task.task_index == 1


def test_a_plain_output_file_is_named_after_its_stem(tmp_path: Path) -> None:
    out = write_lines(tmp_path / "results.jsonl", [rollout_line(0)])
    assert read_side(out).benchmarks[0].name == "results"


def test_a_failure_of_a_rollout_that_later_finished_is_not_counted(tmp_path: Path) -> None:
    out = write_lines(tmp_path / "r_rollouts.jsonl", [rollout_line(0, 0, reward=0.5)])
    write_lines(failures_path(out), [failure_line(0, 0), failure_line(0, 1)])
    [bench] = read_side(out).benchmarks
    assert (bench.rollouts, bench.failed) == (2, 1)
    assert rewards(bench) == {"task 0": [0.5, None]}


def test_a_failure_takes_its_tasks_key_under_a_named_key(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "r_rollouts.jsonl", [rollout_line(3, 0, metadata={"id": "q3"}, reward=1.0)]
    )
    write_lines(failures_path(out), [failure_line(3, 1), failure_line(4, 0)])
    [bench] = read_side(out, key="metadata.id").benchmarks
    assert list(bench.tasks) == [b'"q3"']
    assert rewards(bench) == {"task 3": [1.0, None]}
    assert (bench.rollouts, bench.failed, bench.unkeyed) == (3, 2, 1)  # task 4: no key


def test_lines_no_named_key_names_are_counted_unkeyed(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "r_rollouts.jsonl",
        [rollout_line(0, metadata={"id": "a"}), rollout_line(1), rollout_line(2)],
    )
    [bench] = read_side(out, key="metadata.id").benchmarks
    assert (len(bench.tasks), bench.rollouts, bench.unkeyed) == (1, 3, 2)


def test_unreadable_lines_are_counted_in_both_files(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "r_rollouts.jsonl",
        [rollout_line(0), b"{not json", b"[1, 2]", b"", rollout_line(1)],
    )
    write_lines(failures_path(out), [b"{torn", failure_line(2)])
    [bench] = read_side(out).benchmarks
    assert (bench.rollouts, bench.failed, bench.unreadable, len(bench.tasks)) == (3, 1, 3, 3)


def test_a_job_directory_with_model_calls(tmp_path: Path) -> None:
    job = tmp_path / "mcqa"
    write_lines(job / "rollouts.jsonl", [rollout_line(0), rollout_line(1)])
    (job / "model-calls").mkdir()
    side = read_side(job)
    assert side.source == str(job)
    [bench] = side.benchmarks
    assert bench.name == "mcqa"
    assert bench.rollouts_file == str(job / "rollouts.jsonl")
    assert bench.capture_dir == str(job / "model-calls")
    files = run_files(bench)
    assert files is not None
    assert (files.capture_dir, files.rollouts_file) == (job / "model-calls", job / "rollouts.jsonl")
    # the output file named itself finds the same capture directory beside it
    assert read_side(job / "rollouts.jsonl").benchmarks[0].capture_dir == str(job / "model-calls")


def test_a_job_directory_without_model_calls(tmp_path: Path) -> None:
    job = tmp_path / "gsm"
    write_lines(job / "rollouts.jsonl", [rollout_line(0)])
    [bench] = read_side(job).benchmarks
    assert (bench.name, bench.capture_dir, len(bench.tasks)) == ("gsm", None, 1)
    assert run_files(bench) is None


def test_a_capture_directory_with_its_rollouts_file_beside_it(tmp_path: Path) -> None:
    out = write_lines(tmp_path / "run" / "eval_rollouts.jsonl", [rollout_line(0), rollout_line(1)])
    captures = tmp_path / "run" / "captures"
    captures.mkdir()
    side = read_side(captures)
    assert side.source == str(captures)
    [bench] = side.benchmarks
    assert (bench.name, bench.rollouts_file, bench.capture_dir) == (
        "eval",
        str(out),
        str(captures),
    )
    assert len(bench.tasks) == 2


def test_the_drivers_job_dir_gives_one_benchmark_per_job(tmp_path: Path) -> None:
    root = tmp_path / "job_dir"
    write_lines(root / "mcqa" / "rollouts.jsonl", [rollout_line(0), rollout_line(1)])
    (root / "mcqa" / "model-calls").mkdir()
    write_lines(root / "gsm" / "rollouts.jsonl.zst", [rollout_line(0)])
    (root / "notes").mkdir()  # not a job: no rollouts file
    side = read_side(root)
    assert [b.name for b in side.benchmarks] == ["gsm", "mcqa"]
    gsm, mcqa = side.benchmarks
    assert (len(gsm.tasks), gsm.capture_dir) == (1, None)
    assert gsm.rollouts_file == str(root / "gsm" / "rollouts.jsonl.zst")
    assert (len(mcqa.tasks), mcqa.capture_dir) == (2, str(root / "mcqa" / "model-calls"))


def test_a_compressed_output_file_and_its_plain_failures_file(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "big_rollouts.jsonl.zst",
        [rollout_line(0, reward=1.0), rollout_line(1, reward=0.0)],
    )
    assert out.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # a Zstandard frame
    write_lines(tmp_path / "big_rollouts_failures.jsonl", [failure_line(1, 1)])
    [bench] = read_side(out).benchmarks
    assert bench.name == "big"
    assert (bench.rollouts, bench.failed) == (3, 1)
    assert rewards(bench) == {"task 0": [1.0], "task 1": [0.0, None]}


def test_the_cluster_field_is_kept_per_task(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "r_rollouts.jsonl",
        [rollout_line(0, ctx={"doc": 1}), rollout_line(1, ctx={"doc": 1}), rollout_line(2)],
    )
    [bench] = read_side(out, cluster="ctx").benchmarks
    assert [t.cluster for t in bench.tasks.values()] == [b'{"doc":1}', b'{"doc":1}', None]
    [plain] = read_side(out).benchmarks
    assert [t.cluster for t in plain.tasks.values()] == [None, None, None]


def test_a_missing_path_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        read_side(tmp_path / "nothing")


def test_a_directory_without_a_run_is_a_compare_error(tmp_path: Path) -> None:
    empty = tmp_path / "parent" / "empty"
    empty.mkdir(parents=True)
    with pytest.raises(CompareError, match="no rollouts file to compare"):
        read_side(empty)


def test_the_real_runs_read_as_one_mcqa_benchmark_each(choice_runs: tuple[Path, Path]) -> None:
    for job_dir in choice_runs:
        [bench] = read_side(job_dir).benchmarks
        assert bench.name == BENCHMARK
        assert len(bench.tasks) == 27
        assert bench.capture_dir == str(job_dir / "model-calls")
        assert (bench.rollouts, bench.failed, bench.unkeyed, bench.unreadable) == (27, 0, 0, 0)
        assert all(t.mean("reward") in (0.0, 1.0) for t in bench.tasks.values())
        assert all(t.mean("calls") == 1.0 for t in bench.tasks.values())
