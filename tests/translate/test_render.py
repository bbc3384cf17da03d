"""``render_sse``: a complete response, streamed, reassembles to itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from rollcap.dialects import DIALECT_NAMES, StreamOutcome, reassemble
from rollcap.translate import render_sse
from tests.translate._support import (
    FIXTURES,
    Answer,
    answers,
    encode,
    expected_messages,
    expected_responses,
)


def _golden() -> list[Any]:
    cases = []
    for dialect in DIALECT_NAMES:
        for path in sorted((FIXTURES / dialect).glob("*.expected.json")):
            response = orjson.loads(path.read_bytes())["response"]
            if response is not None:
                cases.append(pytest.param(dialect, path, id=f"{dialect}/{path.name}"))
    return cases


def _round_trip(dialect: str, response: dict[str, Any]) -> Any:
    return reassemble(dialect, [encode(render_sse(dialect, response))])


@pytest.mark.parametrize(("dialect", "path"), _golden())
def test_golden_responses_render_and_reassemble_to_themselves(dialect: str, path: Path) -> None:
    response = orjson.loads(path.read_bytes())["response"]
    assert _round_trip(dialect, response).response == response


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers())
def test_translated_answers_render_and_reassemble_to_themselves(answer: Answer) -> None:
    chunks = answer.chunks()
    for dialect, response in (
        ("responses", expected_responses(chunks)),
        ("messages", expected_messages(chunks)),
        ("chat", reassemble("chat", [encode(chunks)]).response),
    ):
        assert response is not None
        assert _round_trip(dialect, response).response == response


def test_rendered_streams_end_by_status() -> None:
    completed = expected_responses(Answer(content=["hi"]).chunks())
    assert _round_trip("responses", completed).outcome is StreamOutcome.COMPLETED
    incomplete = expected_responses(Answer(content=["hi"], finish_reason="length").chunks())
    assert _round_trip("responses", incomplete).outcome is StreamOutcome.INCOMPLETE
    cut = {**completed, "status": "in_progress", "usage": None}
    got = _round_trip("responses", cut)
    assert (got.outcome, got.response) == (StreamOutcome.TRUNCATED, cut)
    message = expected_messages(Answer(content=["hi"]).chunks())
    assert _round_trip("messages", message).outcome is StreamOutcome.COMPLETED
    chat = reassemble("chat", [encode(Answer(content=["hi"]).chunks())]).response
    assert chat is not None
    assert _round_trip("chat", chat).outcome is StreamOutcome.COMPLETED


def test_rendered_responses_events_are_numbered_and_named() -> None:
    response = expected_responses(
        Answer(reasoning=["r"], content=["t"], tools=[("c", "f", ["{}"])]).chunks()
    )
    events = render_sse("responses", response)
    payloads = [orjson.loads(event.data) for event in events]
    assert [p["sequence_number"] for p in payloads] == list(range(len(events)))
    assert all(event.event == p["type"] for event, p in zip(events, payloads, strict=True))
    opening = payloads[0]["response"]
    assert (opening["status"], opening["output"], opening["usage"]) == ("in_progress", [], None)


def test_render_never_raises_on_junk() -> None:
    for dialect in DIALECT_NAMES:
        for junk in ({}, {"output": [1, None, {"type": "x"}]}, {"content": "x", "choices": [3]}):
            render_sse(dialect, junk)
        render_sse(dialect, [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown dialect"):
        render_sse("completions", {})
