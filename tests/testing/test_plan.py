"""The dialect-neutral plan: usage every dialect reports alike, ids stable per request."""

from __future__ import annotations

import pytest

from rollcap.dialects import get_dialect
from rollcap.testing._knobs import DIALECTS, Knobs
from rollcap.testing._plan import plan_answer
from tests.testing._support import (
    COMPLETING,
    json_of,
    reply,
    request,
)


@pytest.mark.parametrize("scenario", COMPLETING)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_normalized_usage_is_the_planned_usage(dialect: str, scenario: str) -> None:
    body = request(dialect)
    knobs = Knobs(scenario=scenario)
    plan = plan_answer(dialect, body, knobs)
    usage = (
        get_dialect(dialect)
        .normalize(json_of(reply(dialect, body, {"x-fake-scenario": scenario})))
        .usage
    )

    # The prompt is 68 characters: 17 tokens; half of them cached.
    assert usage.tokens_in == plan.usage.input_tokens == 17
    assert usage.cached_tokens == plan.usage.cached_tokens == 8
    assert usage.tokens_out == plan.usage.output_tokens > 0
    assert usage.tokens_total == plan.usage.input_tokens + plan.usage.output_tokens
    if dialect == "messages":
        assert usage.tokens_reasoning is None
        assert usage.cache_creation_tokens == 0
    else:
        assert usage.tokens_reasoning == plan.usage.reasoning_tokens
        assert usage.cache_creation_tokens is None
    assert (plan.usage.reasoning_tokens > 0) == (scenario == "reasoning")


def test_every_dialect_counts_the_same_tokens() -> None:
    usages = {
        dialect: get_dialect(dialect)
        .normalize(json_of(reply(dialect, request(dialect), {"x-fake-scenario": "reasoning"})))
        .usage
        for dialect in DIALECTS
    }
    counts = {(u.tokens_in, u.tokens_out, u.tokens_total, u.cached_tokens) for u in usages.values()}
    assert len(counts) == 1


def test_anthropic_reports_cached_input_apart() -> None:
    message = json_of(reply("messages", request("messages"), {"x-fake-cached-tokens": "10"}))
    assert message["usage"]["input_tokens"] == 7
    assert message["usage"]["cache_read_input_tokens"] == 10
    assert message["usage"]["cache_creation_input_tokens"] == 0


def test_cached_tokens_header_is_capped_at_the_input() -> None:
    body = json_of(reply("chat", request("chat"), {"x-fake-cached-tokens": "1000"}))
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 17
    assert body["usage"]["prompt_tokens"] == 17


def test_same_request_same_answer_and_ids() -> None:
    first = reply("responses", request("responses"))
    again = reply("responses", request("responses"))
    other = reply("responses", request("responses", input="Something else entirely"))
    assert first.body == again.body
    assert json_of(first)["id"] != json_of(other)["id"]
    assert json_of(first)["created_at"] == json_of(again)["created_at"]
