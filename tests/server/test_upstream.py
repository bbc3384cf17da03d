from __future__ import annotations

import pytest

from rollcap.server._upstream import backend_for

CLIENT = [
    ("Content-Type", "application/json"),
    ("Authorization", "Bearer client-key"),
    ("x-api-key", "client-key"),
    ("Cookie", "a=b"),
    ("Host", "127.0.0.1:8000"),
    ("Content-Length", "12"),
    ("Accept-Encoding", "gzip"),
    ("anthropic-version", "2023-06-01"),
    ("anthropic-beta", "interleaved-thinking-2025-05-14"),
    ("x-session-id", "s1"),
]


def test_openai_urls_with_and_without_v1() -> None:
    for base in ("http://up:1/v1", "http://up:1/v1/", "http://up:1"):
        backend = backend_for("openai_model", base_url=base, api_key="k")
        assert backend.url_for("/v1/chat/completions") == "http://up:1/v1/chat/completions"


def test_configured_credentials_replace_the_clients() -> None:
    backend = backend_for("openai_model", base_url="http://up", api_key="sk-config")
    headers = dict(backend.headers(CLIENT))
    assert headers["authorization"] == "Bearer sk-config"
    assert "Authorization" not in headers
    assert "x-api-key" not in headers
    assert "Cookie" not in headers
    assert "Host" not in headers
    assert "Content-Length" not in headers
    assert headers["accept-encoding"] == "identity"
    assert headers["x-session-id"] == "s1"


def test_anthropic_passes_version_and_beta_and_uses_x_api_key() -> None:
    backend = backend_for("anthropic_model", base_url="http://up", api_key="sk-ant")
    headers = dict(backend.headers(CLIENT))
    assert headers["x-api-key"] == "sk-ant"
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert backend.url_for("/v1/messages") == "http://up/v1/messages"


def test_pass_through_of_client_credentials_when_configured() -> None:
    backend = backend_for(
        "anthropic_model", base_url="http://up", api_key=None, pass_client_credentials=True
    )
    headers = backend.headers(CLIENT)
    assert ("Authorization", "Bearer client-key") in headers
    assert ("x-api-key", "client-key") in headers


def test_azure_api_key_header_and_version() -> None:
    backend = backend_for(
        "azure_openai_model",
        base_url="https://x.openai.azure.com/openai/v1",
        api_key="az",
        extra={"api_version": "preview"},
    )
    assert dict(backend.headers([]))["api-key"] == "az"
    assert backend.url_for("/v1/responses") == (
        "https://x.openai.azure.com/openai/v1/responses?api-version=preview"
    )


@pytest.mark.parametrize(
    ("model_type", "base_url", "match"),
    [
        ("nope_model", "http://x", "unknown or not yet supported model type"),
        ("openai_model", None, "needs policy_base_url"),
        ("openai_model", "ftp://x", "must start with http"),
    ],
)
def test_bad_backends(model_type: str, base_url: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        backend_for(model_type, base_url=base_url, api_key=None)
