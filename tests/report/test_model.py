"""The report's data model: rollout rows, call columns, payloads, task groups and run totals."""

from __future__ import annotations

import dataclasses
from typing import Any

from rollcap.records import (
    GAP_INCOMPLETE,
    GAP_NO_RECORDS,
    GAP_RECORDS_UNREADABLE,
    GAP_UNREADABLE,
    Gap,
    RawRecord,
    model_ref,
)
from rollcap.report._model import (
    CALL_COLUMNS,
    ROLLOUT_COLUMNS,
    RolloutInput,
    RolloutLine,
    build_summary,
    digest_rollout,
    rollout_line_info,
    task_of,
)

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


def record(
    messages: list[Any],
    answer: str | None,
    *,
    start: float,
    latency: float = 100.0,
    ttft: float | None = 20.0,
    stream: bool = False,
    status: int = 200,
    category: str | None = None,
    reasoning_tokens: int | None = None,
    gaps: list[dict[str, Any]] | None = None,
    raw: str | None = None,
    **params: Any,
) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    response: dict[str, Any] | None = None
    if answer is not None:
        response = {
            "id": "cmpl",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": answer},
                }
            ],
            "usage": usage,
        }
    elif category is not None:
        response = {"error": {"message": "slow down", "type": "rate_limit"}}
    return RawRecord(
        model_call_id=f"{int(start * 1000):032x}",
        dialect="chat",
        model_ref=model_ref("policy_model"),
        started_at=start,
        completed_at=start + latency / 1000,
        latency_ms=latency,
        latency_ttft_ms=ttft,
        status_code=status,
        error_category=category,
        request={"model": "m", "messages": messages, "stream": stream, "tools": TOOLS, **params},
        response=response,
        response_raw=raw,
        gaps=gaps,
    ).to_json()


USER = {"role": "user", "content": "Capital of France?"}
FOLLOW_UP = {"role": "user", "content": "Sure?"}


def conversation(*, follow_up: dict[str, Any] = FOLLOW_UP, start: float = 1000.0) -> list[Any]:
    return [
        (0, record([USER], "Paris.", start=start, reasoning_tokens=None)),
        (
            1,
            record(
                [USER, {"role": "assistant", "content": "Paris."}, follow_up],
                None,
                start=start + 1,
                status=429,
                category="rate_limit",
                stream=True,
                ttft=5.0,
            ),
        ),
        (
            2,
            record(
                [USER, {"role": "assistant", "content": "Paris."}, follow_up],
                "Yes.",
                start=start + 2,
                stream=True,
                ttft=30.0,
                raw="data: {}\n\n",
                gaps=[{"code": "producer_note", "detail": "x"}],
            ),
        ),
    ]


def test_a_rollout_row_sums_what_is_known_and_keeps_unknown_unknown() -> None:
    digest = digest_rollout(
        RolloutInput("4-1", conversation(), line=RolloutLine(4, 1, 0, 0.5)), payload=False
    )
    row = digest.row
    assert list(row) == list(ROLLOUT_COLUMNS)
    assert (row["task"], row["rollout"], row["attempt"], row["reward"]) == (4, 1, 0, 0.5)
    assert row["calls"] == 3
    assert row["t0"] == 1000.0
    assert row["wall_ms"] == 2100.0
    assert row["tokens_in"] == 20  # the 429 reports no usage: not counted as 0
    assert row["tokens_reasoning"] is None  # no call reports reasoning tokens
    assert row["ttft_p50"] == 17.5  # streamed calls only: 5 and 30
    assert row["errors"] == 1
    assert row["gaps"] == ["producer_note"]
    assert row["finish"] == ["stop"]
    assert digest.payload is None
    assert digest.raw is None
    columns = dict(zip(CALL_COLUMNS, zip(*digest.calls, strict=True), strict=True))
    assert columns["start"] == (0.0, 1000.0, 2000.0)
    assert columns["ttft"] == (None, 5.0, 30.0)
    assert columns["stream"] == (0, 1, 1)
    assert columns["err"] == (None, "rate_limit", None)
    assert columns["gaps"] == (0, 0, 1)


def test_the_payload_stores_each_call_as_a_delta_with_parameters_once() -> None:
    digest = digest_rollout(RolloutInput("4-1", conversation()))
    assert digest.payload is not None
    calls = digest.payload["calls"]
    assert [(c["parent"], c["keep"], c["new"]) for c in calls] == [
        (None, 0, [USER]),
        (0, 2, [FOLLOW_UP]),
        (1, 3, []),  # the retry of the 429's request
    ]
    # Each distinct value once: call 1 streams (new parameters), call 2 repeats them.
    assert calls[0]["tools"] == TOOLS
    assert calls[0]["params"] == {"model": "m", "stream": False}
    assert calls[1]["params"] == {"model": "m", "stream": True}
    assert "tools" not in calls[1]
    assert calls[1]["tools_ref"] == 0
    assert (calls[2]["tools_ref"], calls[2]["params_ref"]) == (0, 1)
    assert calls[1]["response"] == {"error": {"message": "slow down", "type": "rate_limit"}}
    assert "response" not in calls[2]
    assert calls[2]["answer"] == [{"role": "assistant", "content": "Yes."}]
    assert calls[2]["gaps"] == [{"code": "producer_note", "detail": "x"}]
    assert digest.raw == {"2": {"response_raw": "data: {}\n\n"}}


def test_a_request_that_is_no_conversation_is_stored_whole() -> None:
    odd = record([USER], "x", start=1.0)
    odd["request"]["messages"] = "not a list"
    digest = digest_rollout(RolloutInput("0-0", [(0, odd)]))
    assert digest.payload is not None
    (call,) = digest.payload["calls"]
    assert call["request_error"] == "messages: expected a list"
    assert call["request"]["messages"] == "not a list"


def test_records_of_any_shape_never_stop_the_report() -> None:
    odd: list[Any] = [
        {},
        {"dialect": "responses", "request": {"input": [{"type": 5}]}, "gaps": 7},
        {"dialect": "messages", "request": {"messages": [None]}, "response": {"content": 3}},
        {"dialect": "chat", "request": {"messages": [1, "x"]}, "response": {"choices": [1]}},
    ]
    digest = digest_rollout(RolloutInput("0-0", list(enumerate(odd))))
    assert digest.row["calls"] == 4
    assert digest.payload is not None
    assert [c.get("request_error") is not None for c in digest.payload["calls"]] == [
        True,
        True,
        True,
        False,
    ]


def test_what_could_not_be_read_becomes_the_rollouts_gaps() -> None:
    def gaps(source: RolloutInput) -> list[str]:
        found: list[str] = digest_rollout(source).row["gaps"]
        return found

    assert gaps(RolloutInput("0-0")) == [GAP_NO_RECORDS]
    assert gaps(RolloutInput("0-0", conversation(), bad_lines=2, incomplete=True)) == [
        GAP_RECORDS_UNREADABLE,
        GAP_INCOMPLETE,
        "producer_note",
    ]
    assert gaps(RolloutInput("0-0", read_error="PermissionError: denied")) == [GAP_UNREADABLE]
    digest = digest_rollout(RolloutInput("0-0", bad_lines=1))
    assert digest.payload is not None
    assert digest.payload["gaps"] == [
        {"code": GAP_RECORDS_UNREADABLE, "detail": "count=1"},
        {"code": GAP_NO_RECORDS},
    ]


def _without_facts(info: tuple[str, RolloutLine] | None) -> tuple[str, RolloutLine] | None:
    return None if info is None else (info[0], dataclasses.replace(info[1], facts=None))


def test_rollout_lines_and_ids_give_task_rollout_and_attempt() -> None:
    line = {"rollout_id": "3-1-a2", "reward": 1, "_ng_task_index": 3}
    assert _without_facts(rollout_line_info(line)) == ("3-1-a2", RolloutLine(task=3, reward=1.0))
    failed = rollout_line_info({"rollout_id": "0-0", "error": {"kind": "http", "message": "502"}})
    assert failed == ("0-0", RolloutLine(failure="http: 502"))  # a failure line has no facts
    unrewarded = rollout_line_info({"rollout_id": "0-0", "reward": True})
    assert _without_facts(unrewarded) == ("0-0", RolloutLine())
    assert rollout_line_info({"reward": 1}) is None
    assert task_of("3-1-a2", None) == (3, 1, 2)
    assert task_of("3-1", RolloutLine(task=7)) == (7, 1, 0)
    assert task_of("run.alpha", None) == (None, None, 0)


def test_the_summary_is_columns_with_tables_groups_and_totals() -> None:
    digests = [
        digest_rollout(RolloutInput("0-0", conversation(), line=RolloutLine(reward=1.0))),
        digest_rollout(
            RolloutInput(
                "0-1",
                conversation(follow_up={"role": "user", "content": "Why?"}, start=2000.0),
                line=RolloutLine(reward=0.0),
            )
        ),
        digest_rollout(RolloutInput("1-0", conversation()[:1], line=RolloutLine(failure="x"))),
        digest_rollout(RolloutInput("loose")),
    ]
    summary = build_summary(
        digests, source={"capture_dir": "/c"}, notes=[Gap("capture_file_name_invalid", "bad")]
    )
    assert summary["rollouts"]["id"] == ["0-0", "0-1", "1-0", "loose"]
    assert summary["rollouts"]["calls"] == [3, 3, 1, 0]
    assert len(summary["calls"]["start"]) == 7
    assert summary["tables"]["err"] == ["rate_limit"]
    assert summary["calls"]["err"][:3] == [None, 0, None]
    assert summary["tables"]["finish"] == ["stop"]
    run = summary["run"]
    assert (run["rollouts"], run["calls"], run["failed_rollouts"]) == (4, 7, 1)
    assert run["errors"] == {"rate_limit": 2}
    assert run["gaps"] == {GAP_NO_RECORDS: 1, "producer_note": 2}
    assert run["mean_reward"] == 0.5
    assert (run["start"], run["end"]) == (1000.0, 2002.1)
    assert summary["notes"] == [{"code": "capture_file_name_invalid", "detail": "bad"}]
    # The two repeats of task 0 ask the same first call; call 1 failed (429) and call 2 sent
    # the same request again, so the failed call is left out and they part at call 2.
    assert summary["groups"] == [
        {"task": 0, "rows": [0, 1], "div": [[None, [2, 2]], [[2, 2], None]]},
        {"task": 1, "rows": [2], "div": [[None]]},
    ]
