from __future__ import annotations

from typing import Any

import pytest

from rollcap.dialects import context_length_exceeded, error_message, get_dialect
from rollcap.dialects._base import openai_error


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
