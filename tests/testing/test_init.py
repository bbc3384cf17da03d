"""Freeze the public names of ``rollcap.testing``."""

from __future__ import annotations

import rollcap.testing

PUBLIC = {
    "DEFAULT_MODEL",
    "HEADER_CACHED_TOKENS",
    "HEADER_CHUNK_DELAY_MS",
    "HEADER_CONTENT_BYTES",
    "HEADER_DELAY_MS",
    "HEADER_EVENTS",
    "HEADER_SCENARIO",
    "HEADER_TOOL_TURNS",
    "PREFIX_IDS_FIELD",
    "SCENARIOS",
    "FakeUpstream",
    "ReceivedRequest",
    "assistant_body",
    "decode",
    "encode",
    "expected_response",
    "fake_logprob",
    "render_prompt",
}


def test_exported_names_are_frozen() -> None:
    assert set(rollcap.testing.__all__) == PUBLIC
    for name in rollcap.testing.__all__:
        assert hasattr(rollcap.testing, name), name


def test_header_names_and_scenarios() -> None:
    assert rollcap.testing.HEADER_SCENARIO == "x-fake-scenario"
    assert rollcap.testing.HEADER_EVENTS == "x-fake-events"
    assert rollcap.testing.HEADER_CONTENT_BYTES == "x-fake-content-bytes"
    assert rollcap.testing.HEADER_DELAY_MS == "x-fake-delay-ms"
    assert rollcap.testing.HEADER_CHUNK_DELAY_MS == "x-fake-chunk-delay-ms"
    assert rollcap.testing.HEADER_CACHED_TOKENS == "x-fake-cached-tokens"
    assert rollcap.testing.HEADER_TOOL_TURNS == "x-fake-tool-turns"
    assert rollcap.testing.PREFIX_IDS_FIELD == "required_prefix_token_ids"
    assert set(rollcap.testing.SCENARIOS) == {
        "text",
        "tool",
        "tool_turns",
        "reasoning",
        "incomplete",
        "choice",
        "malformed_json",
        "truncate",
        "stream_error",
        "hang",
        "disconnect",
        "endless",
        "http_400",
        "http_401",
        "http_404",
        "http_429",
        "http_500",
        "http_503",
        "context_length",
    }
