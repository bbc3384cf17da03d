"""Finding a run's files and reading them tolerantly."""

from __future__ import annotations

import dataclasses
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
from rollcap.report._tokens import SNAPSHOT_UNAVAILABLE
from rollcap.staging import REASON_UNRESOLVED_PARENT, FileLineageStore
from rollcap.store import CaptureStore
from rollcap.store._frames import encode_frame
from tests.report._evaluation import EXPECTED_CALLS, WEIGHT_VERSION


def test_a_job_directory_is_found_by_its_layout(evaluation_dir: Path) -> None:
    run = find_run(evaluation_dir)
    assert run.capture_dir == evaluation_dir / "model-calls"
    assert run.rollouts_file == evaluation_dir / "rollouts.jsonl"
    assert run.failures_file == evaluation_dir / "rollouts_failures.jsonl"
    assert run.staging_dir is None
    assert run.describe()["ledger_dir"] is None
    run = find_run(evaluation_dir, staging=evaluation_dir / "staging")
    assert run.staging_dir == evaluation_dir / "staging"
    assert run.ledger_root == evaluation_dir / "model-calls"  # the gate's default place


def test_a_capture_directory_is_read_as_it_is_with_the_rollouts_beside_it(
    evaluation_dir: Path,
) -> None:
    run = find_run(evaluation_dir / "model-calls")
    assert (run.capture_dir, run.rollouts_file) == (
        evaluation_dir / "model-calls",
        evaluation_dir / "rollouts.jsonl",
    )
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
    assert dataclasses.replace(lines["0-0"], facts=None) == RolloutLine(
        task=0, rollout=0, attempt=0, reward=1.0
    )
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
    staging, ledger = evaluation_dir / "staging", evaluation_dir / "model-calls"
    assert read_tokens(staging, "0-0", ledger_dir=ledger) is None
    tokens = read_tokens(staging, "3-0", ledger_dir=ledger)
    assert tokens is not None
    assert tokens["error"] is None
    assert tokens["ledger"] == {
        "path": str(ledger / "3-0.lineage.jsonl"),
        "found": True,
        "error": None,
    }
    calls = [record["model_call_id"] for record in CaptureStore(ledger).read("3-0")]
    assert [c["id"] for c in tokens["calls"]] == calls  # the gate's ids are the capture's
    assert all(c["in_manifest"] and c["read"] is None for c in tokens["calls"])
    assert tokens["calls"][1]["parent"] == calls[0]
    verdict = tokens["verdict"]
    assert (verdict["trainable"], verdict["terminal"], verdict["selection"]) == (
        True,
        calls[1],
        "heuristic",
    )
    assert tokens["failures"] == []
    (chain,) = tokens["chains"]
    assert (chain["calls"], chain["terminal"], chain["refusal"]) == (calls, True, None)
    assert chain["custody"] == "ledger"
    assert (
        len(chain["ids"])
        == len(chain["mask"])
        == len(chain["logprobs"])
        == chain["spans"][-1]["end"]
    )
    assert set(chain["mask"]) == {0.0, 1.0}
    assert [s["weight_version"] for s in chain["spans"]] == [WEIGHT_VERSION, WEIGHT_VERSION]
    assert [s["start"] for s in chain["spans"]] == [0, tokens["calls"][1]["prev_len"]]
    assert [link[0] for link in chain["links"]] == calls
    # Each call's generated tokens are the ones its span ends with.
    for span, (_, carry, generated) in zip(chain["spans"], chain["links"], strict=True):
        assert chain["mask"][span["start"] : span["end"]] == [0.0] * carry + [1.0] * generated


def test_a_tampered_staged_call_is_refused_with_its_code(job_copy: Path) -> None:
    staging, ledger = job_copy / "staging", job_copy / "model-calls"
    record_path = next((staging / "3-0").glob("*/record.json"))
    record = orjson.loads(record_path.read_bytes())
    record["token_ids_delta"][-1] += 1
    record_path.write_bytes(orjson.dumps(record))
    tokens = read_tokens(staging, "3-0", ledger_dir=ledger)
    assert tokens is not None
    verdict = tokens["verdict"]
    assert (verdict["trainable"], verdict["code"]) == (False, "corrupt_digest")
    assert record["model_call_id"] in verdict["detail"]
    (chain,) = tokens["chains"]
    assert chain["refusal"]["code"] == "corrupt_digest"
    assert record["token_ids_delta"][-1] in chain["ids"]  # shown as staged, unverified
    bad = [c for c in tokens["calls"] if c["read"] is not None]
    assert [c["id"] for c in bad] == [record["model_call_id"]]
    assert "staged digest mismatch" in bad[0]["read"]
    # A record that is not even JSON is unreadable: nothing of it can be verified.
    record_path.write_bytes(b"{torn")
    tokens = read_tokens(staging, "3-0", ledger_dir=ledger)
    assert tokens is not None
    assert tokens["verdict"]["code"] == SNAPSHOT_UNAVAILABLE
    assert tokens["chains"][0]["ids"] == []


def test_a_failure_in_the_ledger_poisons_the_rollout(job_copy: Path) -> None:
    ledger = job_copy / "model-calls"
    FileLineageStore(ledger).record_failure("3-0", "f" * 32, REASON_UNRESOLVED_PARENT)
    tokens = read_tokens(job_copy / "staging", "3-0", ledger_dir=ledger)
    assert tokens is not None
    verdict = tokens["verdict"]
    assert (verdict["trainable"], verdict["code"], verdict["detail"]) == (
        False,
        "rollout_failed",
        REASON_UNRESOLVED_PARENT,
    )
    assert tokens["failures"] == [{"call": "f" * 32, "reason": REASON_UNRESOLVED_PARENT}]
    assert tokens["chains"][0]["refusal"] is None


def test_the_ledger_is_found_where_it_is_named(job_copy: Path, tmp_path: Path) -> None:
    staging = job_copy / "staging"
    elsewhere = tmp_path / "ledger"
    elsewhere.mkdir()
    os.rename(job_copy / "model-calls" / "3-0.lineage.jsonl", elsewhere / "3-0.lineage.jsonl")
    run = find_run(job_copy, staging=staging)
    assert run.ledger_root == job_copy / "model-calls"
    tokens = read_tokens(staging, "3-0", ledger_dir=run.ledger_root)
    assert tokens is not None
    assert tokens["ledger"]["found"] is False
    assert tokens["verdict"] is None  # the records are still verified, alone
    (chain,) = tokens["chains"]
    assert (chain["custody"], chain["refusal"]) == ("records", None)
    run = find_run(job_copy, staging=staging, ledger=elsewhere)
    assert run.ledger_root == elsewhere
    assert run.describe()["ledger_dir"] == str(elsewhere)
    tokens = read_tokens(staging, "3-0", ledger_dir=run.ledger_root)
    assert tokens is not None
    assert tokens["verdict"]["trainable"]
    with pytest.raises(FileNotFoundError, match="no such ledger directory"):
        find_run(job_copy, ledger=tmp_path / "absent")


def test_a_ledger_that_cannot_be_read_is_named(job_copy: Path) -> None:
    ledger = job_copy / "model-calls"
    with (ledger / "3-0.lineage.jsonl").open("ab") as handle:
        row = {"model_call_id": "x", "response_id": "r", "chain_hash": "h", "cumulative_hash": "c"}
        handle.write(orjson.dumps(row) + b"\n")
    tokens = read_tokens(job_copy / "staging", "3-0", ledger_dir=ledger)
    assert tokens is not None
    assert tokens["ledger"]["found"] is True
    assert "not a valid call record" in tokens["ledger"]["error"]
    assert tokens["verdict"] is None
    assert tokens["chains"][0]["refusal"] is None


def test_a_rollout_the_ledger_lists_but_nothing_staged(job_copy: Path) -> None:
    ledger = job_copy / "model-calls"
    FileLineageStore(ledger).record_failure("0-0", "e" * 32, "worker_capture_failed")
    tokens = read_tokens(job_copy / "staging", "0-0", ledger_dir=ledger)
    assert tokens is not None
    assert tokens["failures"] == [{"call": "e" * 32, "reason": "worker_capture_failed"}]
    assert tokens["verdict"]["code"] == "rollout_failed"
    assert tokens["chains"] == []


def test_the_rollouts_file_beside_the_capture_directory_is_found_and_said(
    tmp_path: Path,
) -> None:
    capture = tmp_path / "model-calls"
    capture.mkdir()
    (capture / "0-0.capture.jsonl").write_bytes(b"")
    run = find_run(capture)
    assert run.rollouts_file is None
    assert run.rollouts_note is not None
    assert "none found" in run.rollouts_note
    (tmp_path / "mcqa_rollouts.jsonl").write_bytes(b"")
    (tmp_path / "mcqa_rollouts_failures.jsonl").write_bytes(b"")  # never taken for it
    run = find_run(capture)
    assert run.rollouts_file == tmp_path / "mcqa_rollouts.jsonl"
    assert run.rollouts_note == (
        f"rollouts: {tmp_path / 'mcqa_rollouts.jsonl'} (found beside the capture directory)"
    )
    # A job-style directory finds it too; two candidates are not guessed between.
    assert find_run(tmp_path).rollouts_file == tmp_path / "mcqa_rollouts.jsonl"
    (tmp_path / "other_rollouts.jsonl").write_bytes(b"")
    run = find_run(capture)
    assert run.rollouts_file is None
    assert "2 rollouts files beside" in (run.rollouts_note or "")
    named = find_run(capture, rollouts=tmp_path / "other_rollouts.jsonl")
    assert (named.rollouts_file, named.rollouts_note) == (tmp_path / "other_rollouts.jsonl", None)


def _compress_in_frames(path: Path, target: Path, frames: int) -> None:
    """``path``'s lines written to ``target`` as ``frames`` frames (as collection appends them),
    ``path`` removed."""
    lines = path.read_bytes().splitlines(keepends=True)
    step = -(-len(lines) // frames)
    target.write_bytes(
        b"".join(encode_frame(b"".join(lines[i : i + step])) for i in range(0, len(lines), step))
    )
    path.unlink()


def test_a_compressed_rollouts_file_is_found_and_read_as_the_plain_one(job_copy: Path) -> None:
    plain = job_copy / "rollouts.jsonl"
    expected = read_rollout_lines(find_run(job_copy))
    packed = job_copy / "rollouts.jsonl.zst"
    _compress_in_frames(plain, packed, frames=2)
    for directory in (job_copy, job_copy / "model-calls"):
        run = find_run(directory)
        assert run.rollouts_file == packed
        assert run.failures_file == job_copy / "rollouts_failures.jsonl"  # plain, as collected
        assert read_rollout_lines(run) == expected


def test_a_compressed_rollouts_file_s_bad_frame_is_counted_not_raised(job_copy: Path) -> None:
    packed = job_copy / "rollouts.jsonl.zst"
    _compress_in_frames(job_copy / "rollouts.jsonl", packed, frames=1)
    data = bytearray(packed.read_bytes())
    data[-1] ^= 0xFF  # the frame's checksum: it no longer decodes
    packed.write_bytes(bytes(data))
    lines, notes = read_rollout_lines(find_run(job_copy))
    assert [(n.code, n.detail) for n in notes] == [(NOTE_ROLLOUTS_UNREADABLE, f"{packed}: count=1")]
    assert lines["2-0"].failure is not None  # the failures file is read all the same


def test_a_directory_of_compacted_captures_is_a_capture_directory(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", {"model_call_id": "a" * 32})
    assert store.compact("0-0")
    assert [path.name for path in tmp_path.iterdir()] == ["0-0.capture.jsonl.zst"]
    (tmp_path / "model-calls").mkdir()  # a job directory would hold this, and no capture file
    assert find_run(tmp_path).capture_dir == tmp_path
