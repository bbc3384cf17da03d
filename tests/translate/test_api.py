"""Freeze the translation package's public names: adding one is a decision."""

from __future__ import annotations

import rollcap.translate

PUBLIC = {
    "ANTHROPIC_ERROR_TYPES",
    "THINKING_SIGNATURE",
    "VLLM_PASSTHROUGH",
    "ChatToMessagesStream",
    "ChatToResponsesStream",
    "chat_response_to_messages",
    "chat_response_to_responses",
    "messages_request_to_chat",
    "namespaced_tool_names",
    "render_sse",
    "responses_request_to_chat",
}


def test_exported_names_are_frozen() -> None:
    assert set(rollcap.translate.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(rollcap.translate, name), name
