"""Finding a run's files and reading them tolerantly."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from rollcap.report._model import RolloutLine
from rollcap.report._source import (
    NOTE_FILE_NAME_INVALID,
    NOTE_ROLLOUTS_UNREADABLE,
    find_run,
    read_rollout,
    read_rollout_lines,
    read_tokens,
    rollout_order,
    valid_ids,
)
from rollcap.store import CaptureStore
from tests.report._evaluation import EXPECTED_CALLS


def test_a_job_directory_is_found_by_its_layout(evaluation_dir: Path) -> None:
    run = find_run(evaluation_dir)
    assert run.capture_dir == evaluation_dir / "model-calls"
    assert run.rollouts_file == evaluation_dir / "rollouts.jsonl"
    assert run.failures_file == evaluation_dir / "rollouts_failures.jsonl"
    assert run.staging_dir is None
    run = find_run(evaluation_dir, staging=evaluation_dir / "staging")
    assert run.staging_dir == evaluation_dir / "staging"


def test_a_capture_directory_is_read_as_it_is(evaluation_dir: Path) -> None:
    run = find_run(evaluation_dir / "model-calls")
    assert (run.capture_dir, run.rollouts_file) == (evaluation_dir / "model-calls", None)
    rollouts = evaluation_dir / "rollouts.jsonl"
    assert find_run(evaluation_dir / "model-calls", rollouts=rollouts).rollouts_file == rollouts


def test_a_job_directory_without_rollouts_yet(tmp_path: Path) -> None:
    (tmp_path / "model-calls").mkdir()
    run = find_run(tmp_path)
    assert (run.capture_dir, run.rollouts_file) == (tmp_path / "model-calls", None)


def test_missing_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such directory"):
        find_run(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no such rollouts file"):
        find_run(tmp_path, rollouts=tmp_path / "r.jsonl")
    with pytest.raises(FileNotFoundError, match="no such staging directory"):
        find_run(tmp_path, staging=tmp_path / "s")


def test_rollout_lines_count_what_does_not_parse(job_copy: Path) -> None:
    rollouts = job_copy / "rollouts.jsonl"
    with rollouts.open("ab") as handle:
        handle.write(
            b'{"rollout_id": "9-0", "reward": 1}\n[1, 2]\n{"rollout_id": "../x"}\n{"torn\n'
        )
    lines, notes = read_rollout_lines(find_run(job_copy))
    assert lines["0-0"] == RolloutLine(task=0, rollout=0, attempt=0, reward=1.0)
    assert lines["9-0"].reward == 1.0
    assert lines["2-0"].failure == "agent_error: the model stream broke off </b>"
    assert [(n.code, n.detail) for n in notes] == [
        (NOTE_ROLLOUTS_UNREADABLE, f"{rollouts}: count=3")
    ]


def test_a_finished_line_wins_over_a_failure_line(job_copy: Path) -> None:
    failures = job_copy / "rollouts_failures.jsonl"
    with failures.open("ab") as handle:
        line = {"rollout_id": "0-0", "error": {"kind": "timeout", "message": "slow"}}
        handle.write(orjson.dumps(line) + b"\n")
    lines, _ = read_rollout_lines(find_run(job_copy))
    assert lines["0-0"].failure is None
    assert lines["0-0"].reward == 1.0


def test_ids_are_validated_and_ordered_numerically() -> None:
    good, notes = valid_ids(["10-0", "2-0", "../x", "2-0-a1", "name"])
    assert good == ["10-0", "2-0", "2-0-a1", "name"]
    assert [n.code for n in notes] == [NOTE_FILE_NAME_INVALID]
    assert rollout_order(set(good), {}) == ["2-0", "2-0-a1", "10-0", "name"]


def test_read_rollout_is_tolerant(job_copy: Path) -> None:
    store = CaptureStore(job_copy / "model-calls")
    torn = read_rollout(store, "1-0", None)
    assert (len(torn.records), torn.bad_lines, torn.read_error) == (EXPECTED_CALLS["1-0"], 1, None)
    store.mark_incomplete("0-0")
    assert read_rollout(store, "0-0", None).incomplete
    os.unlink(store.path_for("0-1"))
    os.mkdir(store.path_for("0-1"))  # a file that cannot be read
    broken = read_rollout(store, "0-1", None)
    assert broken.records == []
    assert broken.read_error is not None
    assert broken.read_error.startswith("IsADirectoryError")


def test_the_token_view_of_a_staged_rollout(evaluation_dir: Path) -> None:
    staging = evaluation_dir / "staging"
    assert read_tokens(staging, "0-0") is None
    tokens = read_tokens(staging, "3-0")
    assert tokens is not None
    assert tokens["error"] is None
    checks = tokens["checks"]
    assert isinstance(checks, dict)
    assert len(checks) == 2
    assert set(checks.values()) == {None}
    chains = tokens["chains"]
    assert isinstance(chains, list)
    (chain,) = chains
    assert (
        len(chain["ids"]) == len(chain["mask"]) == len(chain["logprobs"]) == chain["cum_lens"][-1]
    )
    assert 0 in chain["mask"]
    assert 1 in chain["mask"]


def test_a_tampered_staged_call_is_named(job_copy: Path) -> None:
    staging = job_copy / "staging"
    record_path = next((staging / "3-0").glob("*/record.json"))
    record = orjson.loads(record_path.read_bytes())
    record["token_ids"][-1] += 1
    record_path.write_bytes(orjson.dumps(record))
    tokens = read_tokens(staging, "3-0")
    assert tokens is not None
    assert tokens["chains"] == []
    assert "digest mismatch" in str(tokens["error"])
    checks = tokens["checks"]
    assert isinstance(checks, dict)
    assert sorted(v is None for v in checks.values()) == [False, True]
