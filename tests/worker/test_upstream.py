"""What the worker sends upstream: the URL and the headers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollcap.worker import WorkerSettings
from rollcap.worker._upstream import Upstream


def _upstream(url: str, api_key: str | None = "up-key") -> Upstream:
    return Upstream(WorkerSettings(url, Path("/tmp/staging"), api_key=api_key))


@pytest.mark.parametrize("base", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_url_for(base: str) -> None:
    assert _upstream(base).url_for("/v1/chat/completions") == "http://h:1/v1/chat/completions"


def test_url_for_keeps_a_base_path() -> None:
    upstream = _upstream("https://h/serving/v1")
    assert upstream.url_for("/v1/models") == "https://h/serving/v1/models"


def test_url_for_keeps_the_query() -> None:
    upstream = _upstream("http://h:1/v1")
    assert upstream.url_for("/v1/models", "limit=5") == "http://h:1/v1/models?limit=5"


CLIENT = [
    ("Authorization", "Bearer client"),
    ("x-api-key", "client"),
    ("Cookie", "c=1"),
    ("Host", "worker"),
    ("Content-Length", "10"),
    ("Accept-Encoding", "gzip"),
    ("Connection", "keep-alive"),
    ("Content-Type", "application/json; charset=utf-8"),
    ("x-request-tag", "t"),
]


def test_client_credentials_never_go_upstream() -> None:
    headers = _upstream("http://h:1").headers(CLIENT)
    assert headers == [
        ("Content-Type", "application/json; charset=utf-8"),
        ("x-request-tag", "t"),
        ("accept-encoding", "identity"),
        ("authorization", "Bearer up-key"),
    ]


def test_a_rewritten_body_gets_its_own_content_type() -> None:
    headers = _upstream("http://h:1", api_key=None).headers(CLIENT, json_body=True)
    assert headers == [
        ("x-request-tag", "t"),
        ("content-type", "application/json"),
        ("accept-encoding", "identity"),
    ]
