"""What a comparison reads of one rollout line: its task key, its label and its figures."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.compare._lines import (
    DEFAULT_KEY,
    LABEL_MAX,
    METRICS,
    field_value,
    line_figures,
    task_id,
    task_key,
    task_label,
)

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "an answer"},
    {"role": "user", "content": "second   question\n please"},
]


def rollout_line(
    task: int,
    rollout: int = 0,
    *,
    text: str | None = None,
    reward: float | None = 1.0,
    tokens: int | None = 100,
    calls: int = 1,
    latency_ms: float = 250.0,
    status: int = 200,
    **extra: Any,
) -> dict[str, Any]:
    """A rollouts-file line as rollcap writes one: the task's input, ids, reward, capture."""
    metrics: dict[str, Any] = {"num_calls": calls, "tokens_in": 60, "tokens_out": 40}
    if tokens is not None:
        metrics["tokens_total"] = tokens
    line: dict[str, Any] = {
        "responses_create_params": {
            "input": [{"role": "user", "content": text if text is not None else f"task {task}"}]
        },
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "rollout_id": f"{task}-{rollout}",
        "response": {"output": [{"type": "message", "content": [{"text": "A"}]}]},
        "reward": reward,
        "ng_model_call_capture": {
            "metrics": metrics,
            "calls": [{"status_code": status, "gaps": []}],
            "gaps": [],
        },
        "ng_perf": {"total_latency_ms": latency_ms},
    }
    line.update(extra)
    return line


def failure_line(task: int, rollout: int = 0) -> dict[str, Any]:
    """A failures-file line: only its ids and the error."""
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "rollout_id": f"{task}-{rollout}",
        "error": {"kind": "timeout", "message": "agent timed out"},
    }


# -- the task key ---------------------------------------------------------------------------


def test_the_default_key_is_the_tasks_input_as_canonical_json() -> None:
    line = rollout_line(3, text="what is 2 + 2?")
    assert DEFAULT_KEY == "responses_create_params.input"
    assert task_key(line, None) == b'[{"content":"what is 2 + 2?","role":"user"}]'


def test_key_order_does_not_count() -> None:
    one = {"responses_create_params": {"input": [{"role": "user", "content": "x"}]}}
    two = {"responses_create_params": {"input": [{"content": "x", "role": "user"}]}}
    assert orjson.dumps(one) != orjson.dumps(two)
    assert task_key(one, None) == task_key(two, None) == b'[{"content":"x","role":"user"}]'


def test_a_line_without_an_input_is_keyed_by_its_task_index() -> None:
    assert task_key({"_ng_task_index": 7, "reward": 1.0}, None) == b'{"_ng_task_index":7}'
    assert task_key({"reward": 1.0}, None) is None


def test_a_named_key_is_a_dotted_path_with_list_indexes() -> None:
    line = rollout_line(0, text="hello", metadata={"id": "t-17", "tags": ["a", {"n": 2}]})
    assert task_key(line, "metadata.id") == b'"t-17"'
    assert task_key(line, "responses_create_params.input.0.content") == b'"hello"'
    assert task_key(line, "metadata.tags.1") == b'{"n":2}'


def test_a_named_key_the_line_lacks_gives_no_key_not_the_task_index() -> None:
    line = rollout_line(4)
    assert task_key(line, "metadata.id") is None
    assert task_key(line, "responses_create_params.input.5") is None


def test_field_value_follows_mappings_and_lists_only() -> None:
    line = {"a": {"b": [10, 20]}, "c": "text", "z": None}
    assert field_value(line, "a.b.1") == 20
    assert field_value(line, "a.b.2") is None  # past the end
    assert field_value(line, "a.b.x") is None  # a list takes only a number
    assert field_value(line, "c.0") is None  # a string is not indexed
    assert field_value(line, "a.missing") is None
    assert field_value(line, "a") == {"b": [10, 20]}


def test_a_task_id_is_stable_and_differs_by_benchmark() -> None:
    key = b'"t-1"'
    assert task_id("mcqa", key) == task_id("mcqa", key)
    assert len(task_id("mcqa", key)) == 12
    assert task_id("mcqa", key) != task_id("gsm", key)
    assert task_id("mcqa", key) != task_id("mcqa", b'"t-2"')


# -- the label ------------------------------------------------------------------------------


def test_the_label_is_the_last_user_message_with_its_spaces_folded() -> None:
    line = {"responses_create_params": {"input": MESSAGES}}
    key = task_key(line, None)
    assert key is not None
    assert task_label(line, key) == "second question please"


def test_the_label_reads_content_parts_and_a_plain_string_input() -> None:
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "part one"}]}]
    line = {"responses_create_params": {"input": parts}}
    assert task_label(line, b"k") == "part one"
    assert task_label({"responses_create_params": {"input": "  just  text "}}, b"k") == "just text"


def test_without_a_user_message_the_label_is_the_key() -> None:
    line = {"responses_create_params": {"input": [{"role": "system", "content": "sys"}]}}
    assert task_label(line, b'{"_ng_task_index":2}') == '{"_ng_task_index":2}'
    assert task_label({"_ng_task_index": 2}, b'{"_ng_task_index":2}') == '{"_ng_task_index":2}'


def test_a_long_label_is_cut_at_label_max() -> None:
    text = "word " * 100
    label = task_label(rollout_line(0, text=text), b"k")
    assert len(label) == LABEL_MAX
    assert label.endswith("…")
    assert label[:-1] == " ".join(text.split())[: LABEL_MAX - 1]
    exact = "x" * LABEL_MAX
    assert task_label(rollout_line(0, text=exact), b"k") == exact


# -- the figures ----------------------------------------------------------------------------


def test_a_finished_rollouts_figures() -> None:
    got = line_figures(rollout_line(2, 1, reward=0.5, tokens=321, calls=3, latency_ms=1234.5))
    assert got.rollout_id == "2-1"
    assert (got.task_index, got.rollout_index, got.failed) == (2, 1, False)
    assert tuple(got.figures) == METRICS
    assert got.figures == {
        "reward": 0.5,
        "tokens": 321.0,
        "calls": 3.0,
        "latency_ms": 1234.5,
        "error": 0.0,
        "gap": 0.0,
    }


def test_tokens_fall_back_to_in_plus_out() -> None:
    assert line_figures(rollout_line(0, tokens=None)).figures["tokens"] == 100.0
    line = rollout_line(0, tokens=None)
    del line["ng_model_call_capture"]["metrics"]["tokens_out"]
    assert line_figures(line).figures["tokens"] is None


def test_a_line_without_capture_or_perf_reports_none() -> None:
    line = {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": True}
    got = line_figures(line)
    assert got.rollout_id == "0-0"  # made of the indexes
    assert got.figures == {
        "reward": None,  # a bool is not a reward
        "tokens": None,
        "calls": None,
        "latency_ms": None,
        "error": 0.0,
        "gap": 0.0,
    }


def test_the_rollout_id_may_be_the_ng_field() -> None:
    got = line_figures({"_ng_rollout_id": "custom-7", "_ng_task_index": 1})
    assert (got.rollout_id, got.task_index, got.rollout_index) == ("custom-7", 1, None)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ({"status_code": 200}, 0.0),
        ({"status_code": 399}, 0.0),
        ({"status_code": 400}, 1.0),
        ({"status_code": 503}, 1.0),
        ({"status_code": 200, "error_category": "stream_cut"}, 1.0),
        ({"status_code": 200, "error_category": None}, 0.0),
    ],
)
def test_a_call_that_failed_makes_an_error(call: dict[str, Any], error: float) -> None:
    line = rollout_line(0)
    line["ng_model_call_capture"]["calls"] = [{"status_code": 200}, call]
    assert line_figures(line).figures["error"] == error


def test_a_failure_line_is_an_error_with_no_reward_and_no_gap() -> None:
    got = line_figures(failure_line(5, 2), failed=True)
    assert got.rollout_id == "5-2"
    assert got.failed is True
    assert got.figures["error"] == 1.0
    assert got.figures["reward"] is None
    assert got.figures["gap"] is None
    # the same line read as finished has a reward and a gap figure
    finished = line_figures(rollout_line(5, 2, reward=1.0), failed=True)
    assert (finished.figures["reward"], finished.figures["gap"]) == (None, None)


@pytest.mark.parametrize("place", ["capture", "call", "ng_trajectory", "ng_agent_observations"])
def test_a_gap_named_in_any_place_counts(place: str) -> None:
    line = rollout_line(0)
    gap = [{"code": "stream_cut"}]
    if place == "capture":
        line["ng_model_call_capture"]["gaps"] = gap
    elif place == "call":
        line["ng_model_call_capture"]["calls"][0]["gaps"] = gap
    else:
        line[place] = {"gaps": gap}
    assert line_figures(line).figures["gap"] == 1.0


def test_empty_or_malformed_gaps_are_no_gap() -> None:
    line = rollout_line(0, ng_trajectory={"gaps": []}, ng_agent_observations={"gaps": "x"})
    assert line_figures(line).figures["gap"] == 0.0
