from __future__ import annotations

from typing import Any

from rollcap.evidence import AgentObservationBundle, associate_compaction_calls
from rollcap.evidence._models import dump
from tests.evidence.conftest import POLICY, by_response, call_id, calls_of, canonical, gap

PROMPT = "Your task is to create a detailed summary of the conversation so far, paying attention"
PREFIX = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The summary below covers the earlier portion of the conversation.\n\n"
)
ANSWER = (
    "<analysis>thinking</analysis>\n\n<summary>\n1. The user asked X.\n\n\n2. Done.\n</summary>"
)
PERSISTED = PREFIX + "Summary:\n1. The user asked X.\n\n2. Done."


def messages_raw(
    n: int, *, prompt: str = PROMPT, text: str = ANSWER, **extra: Any
) -> dict[str, Any]:
    raw = {
        "model_call_id": call_id(n),
        "dialect": "messages",
        "model_ref": POLICY,
        "started_at": 1.0,
        "completed_at": 2.0,
        "latency_ms": 1.0,
        "latency_ttft_ms": None,
        "status_code": 200,
        "error_category": None,
        "request": {"messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}]},
        "response": {"id": f"resp_{n}", "content": [{"type": "text", "text": text}]},
    }
    raw.update(extra)
    return raw


def turn_raw(n: int) -> dict[str, Any]:
    return messages_raw(n, prompt="hello", text="plain answer")


def claude_bundle(summary: str = PERSISTED, **compaction: Any) -> AgentObservationBundle:
    return AgentObservationBundle.model_validate(
        {
            "source": "claude_code",
            "records": [
                {
                    "kind": "agent_invocation",
                    "invocation_id": "s",
                    "model_calls": [by_response(0), by_response(2)],
                },
                {
                    "kind": "context_compaction",
                    "invocation_id": "s",
                    "outcome": "completed",
                    "summary": summary,
                    "before_model_call": by_response(0),
                    "after_model_call": by_response(2),
                    **compaction,
                },
            ],
            "gaps": [gap("compaction_model_call_reference_unavailable", None, "s")],
        }
    )


def test_the_unique_summary_call_is_found_and_inserted_between_its_neighbours() -> None:
    calls = calls_of(turn_raw(0), messages_raw(1), turn_raw(2))
    result = dump(associate_compaction_calls(claude_bundle(), calls))
    invocation, compaction = result["records"]
    assert invocation["model_calls"][1] == canonical(1)
    assert [ref["response_id"] for ref in invocation["model_calls"]] == [
        "resp_0",
        "resp_1",
        "resp_2",
    ]
    assert compaction["model_calls"] == [canonical(1)]
    assert result["gaps"] == []  # the producer's "unavailable" gap is answered


def test_the_persisted_summary_may_carry_claude_codes_closing_sentences() -> None:
    summary = PERSISTED + "\n\nRecent messages are preserved verbatim."
    calls = calls_of(turn_raw(0), messages_raw(1), turn_raw(2))
    result = associate_compaction_calls(claude_bundle(summary), calls)
    assert result.records[1].model_calls  # type: ignore[union-attr]
    other = associate_compaction_calls(claude_bundle(PERSISTED + "\n\nSomething else."), calls)
    assert not other.records[1].model_calls  # type: ignore[union-attr]


def test_two_candidates_are_ambiguous() -> None:
    calls = calls_of(turn_raw(0), messages_raw(1), messages_raw(3), turn_raw(2))
    bundle = claude_bundle(after_model_call={"model_call_id": call_id(2)})
    result = associate_compaction_calls(bundle, calls)
    assert result.records[1].model_calls == []  # type: ignore[union-attr]
    assert dump(result)["gaps"][-1] == gap(
        "compaction_model_call_match_ambiguous", "candidate_count=2", "s"
    )


def test_calls_that_cannot_be_the_summary_call() -> None:
    outside = calls_of(turn_raw(0), turn_raw(2), messages_raw(1))  # after the after call
    failed = calls_of(turn_raw(0), messages_raw(1, status_code=500), turn_raw(2))
    other_prompt = calls_of(turn_raw(0), messages_raw(1, prompt="summarize"), turn_raw(2))
    chat = calls_of(turn_raw(0), messages_raw(1, dialect="chat"), turn_raw(2))
    for calls in (outside, failed, other_prompt, chat):
        result = associate_compaction_calls(claude_bundle(), calls)
        assert result.records[1].model_calls == []  # type: ignore[union-attr]
        assert dump(result)["gaps"] == [
            gap("compaction_model_call_reference_unavailable", None, "s")
        ]


def test_other_sources_are_left_alone() -> None:
    bundle = AgentObservationBundle.model_validate({"source": "hermes"})
    assert associate_compaction_calls(bundle, calls_of(messages_raw(1))) is bundle
