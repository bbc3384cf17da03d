"""Which headers cross a proxy, each way, and where a call's path lands upstream."""

from __future__ import annotations

import pytest

from rollcap._proxy.headers import for_client, outgoing, upstream_url

CLIENT = [
    ("Host", "rollcap:8000"),
    ("Content-Length", "12"),
    ("Accept-Encoding", "gzip"),
    ("Connection", "keep-alive"),
    ("Authorization", "Bearer client-key"),
    ("X-Api-Key", "client-key"),
    ("Content-Type", "text/plain"),
    ("X-Session-Id", "s-1"),
]


def test_the_clients_credentials_never_go_upstream_unless_passed_on() -> None:
    out = outgoing(CLIENT, auth=("authorization", "Bearer upstream-key"))
    assert out == [
        ("Content-Type", "text/plain"),
        ("X-Session-Id", "s-1"),
        ("accept-encoding", "identity"),
        ("authorization", "Bearer upstream-key"),
    ]
    passed = outgoing(CLIENT, pass_client_credentials=True)
    assert ("Authorization", "Bearer client-key") in passed
    assert ("X-Api-Key", "client-key") in passed
    assert not any(name.lower() in ("host", "connection", "content-length") for name, _ in passed)


def test_a_body_the_forwarder_wrote_carries_its_own_content_type() -> None:
    out = outgoing(CLIENT, content_type="application/json")
    assert [v for k, v in out if k.lower() == "content-type"] == ["application/json"]


def test_framing_headers_stay_behind_and_a_rewritten_body_drops_its_type() -> None:
    upstream = {
        "Content-Type": "application/json",
        "Content-Length": "10",
        "Transfer-Encoding": "chunked",
        "Content-Encoding": "identity",
        "X-Request-Id": "r",
    }
    assert for_client(upstream) == {
        "Content-Type": "application/json",
        "Content-Encoding": "identity",
        "X-Request-Id": "r",
    }
    assert for_client(upstream, rewritten=True) == {"X-Request-Id": "r"}


@pytest.mark.parametrize(
    ("base", "query", "url"),
    [
        ("http://u:1", "", "http://u:1/v1/chat/completions"),
        ("http://u:1/", "", "http://u:1/v1/chat/completions"),
        ("http://u:1/v1", "", "http://u:1/v1/chat/completions"),
        ("http://u:1/v1/", "api-version=1", "http://u:1/v1/chat/completions?api-version=1"),
        ("http://u:1/openai", "", "http://u:1/openai/v1/chat/completions"),
    ],
)
def test_upstream_url_with_or_without_a_trailing_v1(base: str, query: str, url: str) -> None:
    assert upstream_url(base, "/v1/chat/completions", query) == url
