"""Where two rollouts part, aligned by conversation, and what first differs between them."""

from __future__ import annotations

from typing import Any

from rollcap.report._delta import CanonicalCall, canonical_call
from rollcap.report._diverge import (
    PAIR_ROWS,
    CallShape,
    GroupPairs,
    align,
    divergence,
    explain,
    shape_calls,
)

USER = {"role": "user", "content": "Capital of France?"}
FOLLOW_UP = {"role": "user", "content": "Are you sure?"}
ANSWER = {"role": "assistant", "content": "Paris."}
OTHER = {"role": "assistant", "content": "Lyon."}
OK: tuple[str | None, int | None] = (None, 200)
FAILED: tuple[str | None, int | None] = ("upstream_error", 500)


def _call(messages: list[Any], answer: dict[str, Any] | None, **params: Any) -> CanonicalCall:
    response = None
    if answer is not None:
        response = {"choices": [{"index": 0, "message": answer}]}
    return canonical_call("chat", {"model": "m", "messages": messages, **params}, response)


def _rollout(
    *calls: tuple[list[Any], dict[str, Any] | None, dict[str, Any], tuple[str | None, int | None]],
) -> list[CallShape]:
    canon = [_call(messages, answer, **params) for messages, answer, params, _ in calls]
    return shape_calls(canon, [outcome for *_, outcome in calls])


def test_divergence_is_the_first_index_whose_signature_differs() -> None:
    a = [b"1", b"2", b"3"]
    assert divergence(a, a) is None
    assert divergence(a, [b"1", b"2", b"x"]) == 2
    assert divergence(a, [b"1"]) == 1
    assert divergence([], a) == 0


def test_a_failed_call_sent_again_is_a_retry_left_out_of_the_alignment() -> None:
    shapes = _rollout(
        ([USER], ANSWER, {}, OK),
        ([USER, ANSWER, FOLLOW_UP], None, {}, FAILED),
        ([USER, ANSWER, FOLLOW_UP], None, {}, FAILED),
        ([USER, ANSWER, FOLLOW_UP], ANSWER, {}, OK),
        ([USER], None, {}, FAILED),  # failed, then nothing: not a retry
    )
    kept, retries = align(shapes)
    assert [s.position for s in kept] == [0, 3, 4]
    assert [r.to_list() for r in retries] == [
        [1, 2, "upstream_error", 500],
        [2, 3, "upstream_error", 500],
    ]


def test_a_parameter_alone_is_named_with_both_values() -> None:
    a = _rollout(([USER], ANSWER, {}, OK))
    b = _rollout(([USER], ANSWER, {"stream": True, "temperature": 0.7}, OK))
    why = explain(a, b)
    assert why is not None
    assert (why["kind"], why["a"], why["b"], why["step"]) == ("params", 0, 0, 0)
    assert why["params"] == {"stream": [None, "true"], "temperature": [None, "0.7"]}


def test_a_differing_message_is_named_and_an_earlier_answer_blamed() -> None:
    a = _rollout(([USER], ANSWER, {}, OK), ([USER, ANSWER, FOLLOW_UP], ANSWER, {}, OK))
    b = _rollout(([USER], OTHER, {}, OK), ([USER, OTHER, FOLLOW_UP], ANSWER, {}, OK))
    why = explain(a, b)
    assert why is not None
    assert (why["kind"], why["a"], why["b"], why["message"]) == ("message", 1, 1, 1)
    assert (why["role_a"], why["role_b"]) == ("assistant", "assistant")
    assert why["answered_at"] == [0, 0]
    # A follow-up that differs is a user message; no earlier answer is blamed.
    c = _rollout(
        ([USER], ANSWER, {}, OK),
        ([USER, ANSWER, {"role": "user", "content": "Why?"}], ANSWER, {}, OK),
    )
    why = explain(a, c)
    assert why is not None
    assert (why["kind"], why["message"], why["role_a"]) == ("message", 2, "user")
    assert "answered_at" not in why


def test_a_retried_500_does_not_make_a_divergence_and_is_named() -> None:
    steady = _rollout(([USER], ANSWER, {}, OK), ([USER, ANSWER, FOLLOW_UP], ANSWER, {}, OK))
    retried = _rollout(
        ([USER], ANSWER, {}, OK),
        ([USER, ANSWER, FOLLOW_UP], None, {}, FAILED),
        ([USER, ANSWER, FOLLOW_UP], ANSWER, {}, OK),
    )
    assert explain(steady, retried) is None  # the same requests, the same last answer
    assert explain(steady, steady) is None
    other_end = _rollout(
        ([USER], ANSWER, {}, OK),
        ([USER, ANSWER, FOLLOW_UP], None, {}, FAILED),
        ([USER, ANSWER, FOLLOW_UP], OTHER, {}, OK),
    )
    why = explain(steady, other_end)
    assert why is not None
    assert (why["kind"], why["a"], why["b"]) == ("answer", 1, 2)
    assert why["retries"] == {"a": [], "b": [[1, 2, "upstream_error", 500]]}


def test_a_rollout_that_stopped_early_is_named() -> None:
    short = _rollout(([USER], ANSWER, {}, OK))
    long = _rollout(([USER], ANSWER, {}, OK), ([USER, ANSWER, FOLLOW_UP], ANSWER, {}, OK))
    why = explain(short, long)
    assert why is not None
    assert (why["kind"], why["ended"], why["a"], why["b"]) == ("ended", "a", None, 1)


def test_an_unreadable_request_differs_as_a_request() -> None:
    broken = shape_calls([canonical_call("chat", {"model": "m", "messages": "x"}, None)], [OK])
    other = shape_calls([canonical_call("chat", {"model": "m", "messages": "y"}, None)], [OK])
    why = explain(broken, other)
    assert why is not None
    assert why["kind"] == "request"


def _pairs(rollouts: list[list[CallShape]]) -> dict[str, Any]:
    group = GroupPairs()
    for shapes in rollouts:
        group.add(shapes)
    return group.pairs


def test_group_pairs_explain_the_first_rows_pairs_and_the_first_rollouts() -> None:
    one = _rollout(([USER], ANSWER, {}, OK))
    two = _rollout(([USER], ANSWER, {"stream": True}, OK))
    pairs = _pairs([one, two, one])
    assert set(pairs) == {"0-1", "0-2", "1-2"}
    assert pairs["0-2"] is None
    assert pairs["1-2"] is not None
    assert pairs["1-2"]["kind"] == "params"
    large = _pairs([one] * (PAIR_ROWS + 2))
    first_rows = {f"{i}-{j}" for j in range(PAIR_ROWS) for i in range(j)}
    later = {f"0-{j}" for j in (PAIR_ROWS, PAIR_ROWS + 1)}
    assert set(large) == first_rows | later
