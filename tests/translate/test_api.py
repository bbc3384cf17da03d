"""Freeze the translation package's public names: adding one is a decision."""

from __future__ import annotations

from pathlib import Path

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


def test_translation_is_pure() -> None:
    # No I/O layer and no clock (DESIGN.md's import rule; results must be deterministic).
    package = Path(rollcap.translate.__file__).parent
    for source in package.glob("*.py"):
        text = source.read_text(encoding="utf-8")
        for banned in ("rollcap.server", "rollcap.store", "rollcap.gym", "aiohttp", "time"):
            assert f"import {banned}" not in text, (source.name, banned)
            assert f"from {banned} " not in text, (source.name, banned)
