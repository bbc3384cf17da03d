from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from rollcap._runtime.serving import serving
from rollcap.affinity import choose_replica
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.server._upstream import backend_for
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream

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


def test_the_clients_query_follows_the_configured_one() -> None:
    plain = backend_for("anthropic_model", base_url="http://up", api_key="k")
    assert plain.url_for("/v1/messages", None, "beta=true") == "http://up/v1/messages?beta=true"
    assert plain.url_for("/v1/messages") == "http://up/v1/messages"
    azure = backend_for(
        "azure_openai_model",
        base_url="https://x.openai.azure.com/openai/v1",
        api_key="k",
        extra={"api_version": "preview"},
    )
    assert azure.url_for("/v1/responses", None, "a=1") == (
        "https://x.openai.azure.com/openai/v1/responses?api-version=preview&a=1"
    )


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


def test_several_upstreams_each_rollout_sticks_to_one() -> None:
    urls = ("http://e0:1/v1", "http://e1:1/v1", "http://e2:1/v1")
    backend = backend_for("vllm_model", base_url=urls, api_key=None)
    assert backend.translate_to_chat
    path = "/v1/chat/completions"
    for rollout_id in ("0-0", "1-0", "2-0-a1", "7-3"):
        chosen = choose_replica(rollout_id, urls)
        assert backend.url_for(path, rollout_id) == chosen + "/chat/completions"
    spread = {backend.url_for(path, f"{t}-0") for t in range(30)}
    assert len(spread) == 3
    # A call outside any rollout goes to the first.
    assert backend.url_for(path) == "http://e0:1/v1/chat/completions"
    single = backend_for("openai_model", base_url=["http://one/v1"], api_key=None)
    assert single.url_for(path, "0-0") == "http://one/v1/chat/completions"
    with pytest.raises(ValueError, match="must start with http"):
        backend_for("openai_model", base_url=("http://ok", "ftp://no"), api_key=None)
    with pytest.raises(ValueError, match="needs policy_base_url"):
        backend_for("openai_model", base_url=(), api_key=None)


async def test_a_model_server_with_two_upstreams_keeps_each_rollout_on_one(
    tmp_path: Path,
) -> None:
    async with FakeUpstream() as first, FakeUpstream() as second:
        upstreams = {first.url + "/v1": first, second.url + "/v1": second}
        settings = ModelServerSettings(
            "openai_model", tuple(upstreams), capture_dir=tmp_path / "calls"
        )
        async with serving(create_model_app(settings)) as url, aiohttp.ClientSession() as session:
            rollouts = [f"{t}-0" for t in range(12)]
            for _ in range(2):
                for rollout_id in rollouts:
                    async with session.post(
                        f"{url}/ng-rollout/{rollout_id}/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": rollout_id}]},
                    ) as response:
                        assert response.status == 200
    for base, upstream in upstreams.items():
        mine = {r for r in rollouts if choose_replica(r, tuple(upstreams)) == base}
        got = [req.json["messages"][0]["content"] for req in upstream.requests]
        assert sorted(got) == sorted([*mine, *mine])  # both calls of each of its rollouts
    assert first.requests
    assert second.requests
    store = CaptureStore(tmp_path / "calls")
    assert all(len(store.read(r)) == 2 for r in rollouts)
