from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from rollcap.ids import (
    attempt_of,
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
    # NeMo Gym's wording ("Invalid rollout id: <repr>"), which callers match on, then the rule.
    with pytest.raises(ValueError, match=r"^Invalid rollout id: .*must"):
        validate_rollout_id(bad)


def test_an_invalid_id_is_shown_whole_up_to_the_grammar_s_length() -> None:
    bad = "a" * 199 + "/"
    with pytest.raises(ValueError, match=rf"^Invalid rollout id: '{bad}' \(length 200\)"):
        validate_rollout_id(bad)
    with pytest.raises(ValueError, match=r"^Invalid rollout id: 'xxx.*\.\.\. \(length 5000\)"):
        validate_rollout_id("x" * 5000)


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
    [
        None,
        [],
        "0-0",
        {},
        {"_ng_task_index": 1},
        {"_ng_rollout_index": 1},
        {"input": "hi"},
        {"_ng_attempt_index": "x"},  # names no rollout, so it is not read (as in NeMo Gym)
    ],
)
def test_rollout_id_from_run_without_id_is_none(body: object) -> None:
    assert rollout_id_from_run(body) is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"_ng_rollout_id": "../etc"}, "_ng_rollout_id must be a string of letters"),
        ({"_ng_rollout_id": 5}, "_ng_rollout_id must be a string of letters"),
        ({"_ng_task_index": -1, "_ng_rollout_index": 0}, "Invalid rollout id: '-1-0'"),
        ({"_ng_task_index": "a/b", "_ng_rollout_index": 0}, "Invalid rollout id: 'a/b-0'"),
        ({"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_attempt_index": "x"}, "integer"),
        ({"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_attempt_index": "2.5"}, "integer"),
        ({"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_attempt_index": [2]}, "integer"),
        ({"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_attempt_index": 1e400}, "integer"),
        ({"_ng_rollout_id": "x" * 200, "_ng_attempt_index": 1}, "Invalid rollout id"),
    ],
)
def test_malformed_run_ids_are_errors_not_none(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rollout_id_from_run(body)


def test_a_malformed_explicit_id_is_refused_in_nemo_gym_s_words() -> None:
    with pytest.raises(ValueError, match=r"^_ng_rollout_id must") as caught:
        rollout_id_from_run({"_ng_rollout_id": "../etc"})
    assert str(caught.value).startswith(
        "_ng_rollout_id must be a string of letters, digits, dots, dashes or underscores "
        "starting with a letter or digit; got '../etc'"
    )


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        ("2", "4-2-a2"),
        (" 2 ", "4-2-a2"),
        (2.0, "4-2-a2"),
        (2.7, "4-2-a2"),  # int() truncates, as NeMo Gym's reading does
        (True, "4-2-a1"),
        (False, "4-2"),
        ("0", "4-2"),
        (-1, "4-2"),  # no attempt suffix, as in NeMo Gym
    ],
)
def test_the_attempt_index_is_what_int_makes_of_it(attempt: object, expected: str) -> None:
    body = {"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": attempt}
    assert rollout_id_from_run(body) == expected
    assert rollout_id_from_run({"_ng_rollout_id": "job", "_ng_attempt_index": attempt}) == (
        "job" + expected[3:]
    )


@pytest.mark.parametrize(
    ("task", "rollout", "expected"),
    [
        ("4", "2", "4-2"),
        (4, "2", "4-2"),
        (1.0, 0, "1.0-0"),  # written as given, so the collector's reading names the same file
        (True, 0, "True-0"),
        (1, -2, "1--2"),
    ],
)
def test_task_and_rollout_indices_are_written_as_they_are_given(
    task: object, rollout: object, expected: str
) -> None:
    body = {"_ng_task_index": task, "_ng_rollout_index": rollout}
    assert rollout_id_from_run(body) == expected
    assert record_rollout_id(body) == expected


class _RunRequest(pydantic.BaseModel):
    """A run request model as agents written for NeMo Gym declare theirs."""

    model_config = pydantic.ConfigDict(extra="allow", populate_by_name=True)

    responses_create_params: dict[str, Any] = {}
    capture_rollout_id: str | None = pydantic.Field(
        default=None, alias="_ng_rollout_id", exclude=True
    )


def test_a_pydantic_run_body_is_read_through_its_extras_and_aliases() -> None:
    body = _RunRequest.model_validate(
        {"responses_create_params": {}, "_ng_task_index": 3, "_ng_rollout_index": 1}
    )
    assert body.model_extra == {"_ng_task_index": 3, "_ng_rollout_index": 1}
    assert rollout_id_from_run(body) == "3-1"
    with_attempt_body = _RunRequest.model_validate(
        {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": "2"}
    )
    assert rollout_id_from_run(with_attempt_body) == "3-1-a2"
    explicit = _RunRequest.model_validate({"_ng_rollout_id": "job7", "_ng_task_index": 3})
    assert explicit.capture_rollout_id == "job7"
    assert rollout_id_from_run(explicit) == "job7"
    assert rollout_id_from_run(_RunRequest()) is None
    with pytest.raises(ValueError, match="_ng_rollout_id must be a string"):
        rollout_id_from_run(_RunRequest.model_validate({"_ng_rollout_id": "../x"}))


def test_a_plain_object_s_attributes_are_read() -> None:
    body = SimpleNamespace(_ng_task_index=5, _ng_rollout_index=0, _ng_attempt_index=1)
    assert rollout_id_from_run(body) == "5-0-a1"
    assert rollout_id_from_run(SimpleNamespace(_ng_rollout_id="job")) == "job"
    assert rollout_id_from_run(SimpleNamespace(input="hi")) is None


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"_ng_task_index": 2, "_ng_rollout_index": 0}, "2-0"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 0}, "2-0"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 3}, "2-0-a3"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": True}, "2-0-a1"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": "3"}, "2-0-a3"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 3.0}, "2-0-a3"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": "x"}, "2-0"),
        ({"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": [1]}, "2-0"),
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
        {"_ng_task_index": "4", "_ng_rollout_index": 2, "_ng_attempt_index": "3"},
        {"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": 3.0},
        {"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": True},
    ],
)
def test_both_readings_agree_on_a_valid_run_request(body: dict[str, Any]) -> None:
    assert record_rollout_id(body) == rollout_id_from_run(body)


def test_with_attempt() -> None:
    assert with_attempt("x", 0) == "x"
    assert with_attempt("x", 2) == "x-a2"


def test_attempt_of_reads_back_what_with_attempt_added() -> None:
    for base in ("3-1", "run.alpha", "x-a"):
        for attempt in (0, 1, 12):
            assert attempt_of(with_attempt(base, attempt)) == attempt
    assert attempt_of("task-ab") == 0
