from __future__ import annotations

from typing import Any

import pytest

from rollcap.dialects import context_length_exceeded, error_message, get_dialect
from rollcap.dialects._base import cached_count, openai_error, reasoning_count


def test_openai_error_has_the_shape_the_openai_sdks_parse() -> None:
    assert openai_error("no", param="p") == {
        "error": {"message": "no", "type": "invalid_request_error", "param": "p", "code": None}
    }
    assert openai_error("down", kind="server_error", code="server_error")["error"] == {
        "message": "down",
        "type": "server_error",
        "param": None,
        "code": "server_error",
    }


def test_extra_fields_follow_the_four_the_api_always_sends() -> None:
    assert list(openai_error("x", kind="upstream_error", server="model", status=502)["error"]) == [
        "message",
        "type",
        "param",
        "code",
        "server",
        "status",
    ]


@pytest.mark.parametrize(
    ("dialect", "body"),
    [
        (
            "responses",
            {"error": {"message": "slow", "type": "timeout", "param": None, "code": None}},
        ),
        ("chat", {"error": {"message": "slow", "type": "timeout", "param": None, "code": None}}),
        ("messages", {"type": "error", "error": {"type": "timeout", "message": "slow"}}),
    ],
)
def test_each_dialect_shapes_its_own_error_body(dialect: str, body: dict[str, Any]) -> None:
    assert get_dialect(dialect).error_body("timeout", "slow") == body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"error": {"message": "slow down", "type": "rate_limit_error"}}, "slow down"),
        ({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, "busy"),
        ({"error": "model not loaded"}, "model not loaded"),
        ({"message": "boom"}, "boom"),
        ({"error": {"message": ""}, "message": "fallback"}, "fallback"),
        ({"error": {"code": 500}}, None),
        ({}, None),
    ],
)
def test_error_message_reads_any_dialects_error_body(
    body: dict[str, Any], message: str | None
) -> None:
    assert error_message(body) == message


_VLLM = "This model's maximum context length is 8 tokens. However, you requested 9 tokens."


@pytest.mark.parametrize(
    ("status", "body", "exceeded"),
    [
        (400, {"error": {"message": "x", "code": "context_length_exceeded"}}, True),
        (400, {"object": "error", "message": _VLLM, "type": "BadRequestError", "code": 400}, True),
        (
            400,
            {"error": {"message": "The decoder prompt is longer than the maximum model length"}},
            True,
        ),
        (400, {"error": {"message": "Your input exceeds the context window of this model."}}, True),
        (
            413,
            {"type": "error", "error": {"message": "prompt is too long: 9 tokens > 8 maximum"}},
            True,
        ),
        (400, {"error": {"message": "temperature must be at most 2"}}, False),
        (500, {"error": {"message": _VLLM, "code": "context_length_exceeded"}}, False),
        (429, {"error": {"code": "context_length_exceeded"}}, False),
        (400, None, False),
        (None, {"error": {"code": "context_length_exceeded"}}, False),
    ],
)
def test_context_length_exceeded_reads_each_apis_wording(
    status: int | None, body: dict[str, Any] | None, exceeded: bool
) -> None:
    assert context_length_exceeded(status, body) is exceeded


# NeMo Gym reads the cached and the reasoning count under every naming, in every dialect, the
# first count found winning; these are the namings in its order.
CACHED_NAMINGS: list[dict[str, Any]] = [
    {"prompt_tokens_details": {"cached_tokens": 1}},
    {"prompt_tokens_details": {"cached_input_tokens": 2}},
    {"input_tokens_details": {"cached_tokens": 3}},
    {"input_tokens_details": {"cached_input_tokens": 4}},
    {"cache_read_input_tokens": 5},
    {"cached_input_tokens": 6},
]
REASONING_NAMINGS: list[dict[str, Any]] = [
    {"output_tokens_details": {"reasoning_tokens": 1}},
    {"completion_tokens_details": {"reasoning_tokens": 2}},
    {"reasoning_output_tokens": 3},
]


def _merged(namings: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for naming in namings:
        for key, value in naming.items():
            out[key] = {**out[key], **value} if isinstance(value, dict) and key in out else value
    return out


@pytest.mark.parametrize("first", range(len(CACHED_NAMINGS)))
def test_the_cached_count_is_the_first_naming_that_holds_a_count(first: int) -> None:
    usage = _merged(CACHED_NAMINGS[first:])
    assert cached_count(usage) == first + 1
    # A value that is not a count is passed over, not taken as unknown.
    details = {**usage.get("prompt_tokens_details", {}), "cached_tokens": -1}
    spoiled = {**usage, "prompt_tokens_details": details}
    assert cached_count(spoiled) == max(first + 1, 2)


@pytest.mark.parametrize("first", range(len(REASONING_NAMINGS)))
def test_the_reasoning_count_is_the_first_naming_that_holds_a_count(first: int) -> None:
    assert reasoning_count(_merged(REASONING_NAMINGS[first:])) == first + 1


@pytest.mark.parametrize(
    "usage",
    [{}, {"cached_input_tokens": True}, {"cached_input_tokens": 2.0}, {"input_tokens_details": 3}],
)
def test_no_count_under_any_naming_is_unknown(usage: dict[str, Any]) -> None:
    assert cached_count(usage) is None
    assert reasoning_count({"reasoning_output_tokens": usage.get("cached_input_tokens")}) is None


@pytest.mark.parametrize(
    ("dialect", "counts"),
    [
        ("chat", {"prompt_tokens": 10, "completion_tokens": 4}),
        ("responses", {"input_tokens": 10, "output_tokens": 4}),
        ("messages", {"input_tokens": 10, "output_tokens": 4}),
    ],
)
def test_every_dialect_reads_cached_input_tokens_and_reasoning_output_tokens(
    dialect: str, counts: dict[str, int]
) -> None:
    usage = {**counts, "cached_input_tokens": 7, "reasoning_output_tokens": 3}
    got = get_dialect(dialect).usage({"usage": usage})
    assert got.cached_tokens == 7
    # The contract keeps Anthropic's reasoning count unknown, whatever a proxy adds.
    assert got.tokens_reasoning == (None if dialect == "messages" else 3)
    assert got.tokens_in == 10  # a cached count is inside the input count, never added in
    standard = get_dialect(dialect).usage(
        {
            "usage": {
                **usage,
                "prompt_tokens_details": {"cached_tokens": 1},
                "completion_tokens_details": {"reasoning_tokens": 2},
            }
        }
    )
    assert standard.cached_tokens == 1
    assert standard.tokens_reasoning == (None if dialect == "messages" else 2)


def test_anthropic_cache_reads_still_count_and_still_add_into_tokens_in() -> None:
    usage = {"input_tokens": 2, "cache_read_input_tokens": 5, "cached_input_tokens": 9}
    got = get_dialect("messages").usage({"usage": usage})
    assert (got.cached_tokens, got.tokens_in) == (5, 7)
