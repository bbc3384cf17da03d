from __future__ import annotations

from typing import Any

import pytest

from rollcap.ids import (
    build_rollout_id,
    record_rollout_id,
    rollout_id_from_run,
    validate_rollout_id,
    with_attempt,
)


@pytest.mark.parametrize("good", ["0-0", "a", "A.b_c-1", "x" * 200, "12-3-a4", "resp.v2"])
def test_valid_ids_pass_unchanged(good: str) -> None:
    assert validate_rollout_id(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", "-x", "_x", "a/b", "a b", "x" * 201, "a\n", "a\x00", "é", "a%2e", None, 3],
)
def test_invalid_ids_raise_naming_id_and_rule(bad: object) -> None:
    with pytest.raises(ValueError, match=r"invalid rollout id .*must"):
        validate_rollout_id(bad)


def test_build_rollout_id() -> None:
    assert build_rollout_id(3, 1) == "3-1"
    assert build_rollout_id(3, 1, 0) == "3-1"
    assert build_rollout_id(3, 1, 2) == "3-1-a2"
    with pytest.raises(ValueError, match="_ng_task_index"):
        build_rollout_id(-1, 0)
    with pytest.raises(ValueError, match="_ng_attempt_index"):
        build_rollout_id(0, 0, True)


def test_rollout_id_from_run_indices() -> None:
    assert rollout_id_from_run({"_ng_task_index": 4, "_ng_rollout_index": 2}) == "4-2"
    body = {"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": 1}
    assert rollout_id_from_run(body) == "4-2-a1"


def test_rollout_id_from_run_explicit_id_wins_and_keeps_attempt_suffix() -> None:
    body = {"_ng_rollout_id": "job7.t3", "_ng_task_index": 4, "_ng_rollout_index": 2}
    assert rollout_id_from_run(body) == "job7.t3"
    assert rollout_id_from_run({**body, "_ng_attempt_index": 2}) == "job7.t3-a2"


@pytest.mark.parametrize(
    "body",
    [None, [], "0-0", {}, {"_ng_task_index": 1}, {"_ng_rollout_index": 1}, {"input": "hi"}],
)
def test_rollout_id_from_run_without_id_is_none(body: object) -> None:
    assert rollout_id_from_run(body) is None


@pytest.mark.parametrize(
    "body",
    [
        {"_ng_rollout_id": "../etc"},
        {"_ng_rollout_id": 5},
        {"_ng_task_index": "1", "_ng_rollout_index": 0},
        {"_ng_task_index": 1.0, "_ng_rollout_index": 0},
        {"_ng_task_index": True, "_ng_rollout_index": 0},
        {"_ng_task_index": 1, "_ng_rollout_index": -2},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_attempt_index": "x"},
        {"_ng_rollout_id": "x" * 200, "_ng_attempt_index": 1},
    ],
)
def test_malformed_run_ids_are_errors_not_none(body: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="invalid"):
        rollout_id_from_run(body)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"_ng_task_index": 2, "_ng_rollout_index": 0}, "2-0"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 0}, "2-0"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 3}, "2-0-a3"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": True}, "2-0"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": "3"}, "2-0"),
        ({"_ng_rollout_id": "x", "_ng_task_index": 2, "_ng_rollout_index": 0}, "x"),
        ({"_ng_rollout_id": "x", "_ng_attempt_index": 1}, "x-a1"),
        ({"_ng_rollout_id": 7}, "7"),
        ({"_ng_task_index": "t", "_ng_rollout_index": 0}, "t-0"),  # as it is, not checked
        ({"_ng_task_index": 2}, None),
        ({}, None),
    ],
)
def test_record_rollout_id_reads_a_line_as_it_is(
    record: dict[str, Any], expected: str | None
) -> None:
    assert record_rollout_id(record) == expected


@pytest.mark.parametrize(
    "body",
    [
        {"_ng_task_index": 4, "_ng_rollout_index": 2},
        {"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": 3},
        {"_ng_rollout_id": "job7.t3", "_ng_attempt_index": 2},
    ],
)
def test_both_readings_agree_on_a_valid_run_request(body: dict[str, Any]) -> None:
    assert record_rollout_id(body) == rollout_id_from_run(body)


def test_with_attempt() -> None:
    assert with_attempt("x", 0) == "x"
    assert with_attempt("x", 2) == "x-a2"
