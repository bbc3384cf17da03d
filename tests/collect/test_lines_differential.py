"""Collection's lines, byte for byte, against those its pipeline wrote before it stopped
validating again the evidence it builds itself (the corpus of ``_differential``: rollouts of
the real stack, calls of every dialect sent straight to a capturing model server, damaged and
foreign captures)."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson
import pytest

from rollcap.collect import rollout_line
from tests.collect._differential import (
    CORPUS,
    LINES,
    Case,
    collection_line,
    load_cases,
    materialize,
)

CASES = load_cases()
GOLDEN = LINES.read_bytes().splitlines(keepends=True)
NAMES = [case.name for case in CASES]


def test_every_case_has_its_line() -> None:
    assert CORPUS.is_file()
    assert len(GOLDEN) == len(CASES) > 40
    assert len(set(NAMES)) == len(NAMES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_collection_writes_the_line_it_wrote_before(index: int, tmp_path: Path) -> None:
    case = CASES[index]
    materialize(case, tmp_path)
    assert collection_line(case, tmp_path) == GOLDEN[index]


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_the_line_of_a_capture_directory_is_the_same(index: int, tmp_path: Path) -> None:
    # Read by path, as ``capture attach`` and a caller without a store do.
    case = CASES[index]
    materialize(case, tmp_path)
    line = rollout_line(
        case.rollout,
        copy.deepcopy(case.answer),
        capture_dirs=[tmp_path / "elsewhere", tmp_path] if case.capture else (),
        observability_enabled=case.capture,
        rollout_latency_ms=case.latency_ms,
    )
    assert orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE) == GOLDEN[index]


def test_a_changed_line_is_told_apart(tmp_path: Path) -> None:
    # The comparison can fail: a case whose wall-clock differs by a microsecond gives a line
    # that is not its golden one.
    case = next(c for c in CASES if c.name.startswith("live-mcqa-capture"))
    materialize(case, tmp_path)
    moved = Case(case.name, case.rollout, case.answer, case.latency_ms + 0.001, True, case.files)
    assert collection_line(moved, tmp_path) != GOLDEN[CASES.index(case)]


def _line(name: str) -> dict[str, object]:
    value: dict[str, object] = orjson.loads(GOLDEN[NAMES.index(name)])
    return value


def _codes(line: dict[str, object], key: str) -> set[str]:
    evidence = line.get(key)
    gaps = evidence.get("gaps", []) if isinstance(evidence, dict) else []
    return {gap["code"] for gap in gaps}


def test_the_corpus_holds_what_it_says() -> None:
    """Not vacuous: the corpus reaches the branches it is there for."""
    lines = [orjson.loads(line) for line in GOLDEN]
    capture_codes = set().union(*(_codes(line, "ng_model_call_capture") for line in lines))
    assert {
        "model_call_capture_no_records",
        "model_call_capture_incomplete",
        "model_call_capture_records_unreadable",
        "model_call_capture_unreadable",
        "agent_observation_join_failed",
        "trajectory_projection_failed",
    } <= capture_codes
    trajectory_codes = set().union(*(_codes(line, "ng_trajectory") for line in lines))
    assert {
        "agent_observations_invalid",
        "producer_trajectory_invalid",
        "producer_trajectory_identity_mismatch",
        "multimodal_history_redacted",
        "model_call_ownership_unavailable",
    } <= trajectory_codes
    calls = [
        call for line in lines for call in line.get("ng_model_call_capture", {}).get("calls", [])
    ]
    assert {"responses", "chat", "messages"} <= {call["dialect"] for call in calls}
    assert {"rate_limit", "upstream_error", "stream_truncated", "context_length_exceeded"} <= {
        call["error_category"] for call in calls
    }
    assert sum(1 for line in lines if "ng_perf" in line) > 20
    assert sum(1 for line in lines if "ng_model_call_capture" not in line) >= 5
    assert any(len(line["ng_trajectory"]["model_calls"]) >= 10 for line in lines)
    # The redacted case's calls keep no payload anywhere, the trajectory's included.
    redacted = _line("direct-responses-redacted")
    trajectory = redacted["ng_trajectory"]
    assert isinstance(trajectory, dict)
    assert all(call["request"] is None for call in trajectory["model_calls"])
