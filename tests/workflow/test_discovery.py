"""The head server's client, against a head server on a real socket."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from rollcap.affinity import choose_replica
from rollcap.config import ConfigError
from rollcap.workflow import HEAD_URL_ENV, list_servers, resolve_model_base_url
from rollcap.workflow._discovery import find_server

SERVERS = [
    {"name": "mcqa", "kind": "resources_servers", "type": "mcqa", "url": "http://r"},
    {"name": "policy_model", "kind": "responses_api_models", "type": "x", "url": "http://m/"},
    "not a server",
]


@contextlib.contextmanager
def _head(answer: object) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = orjson.dumps(answer) if self.path == "/servers" else b"{}"
            self.send_response(200 if self.path == "/servers" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_list_servers_keeps_only_the_servers() -> None:
    with _head(SERVERS) as head:
        assert list_servers(head) == SERVERS[:2]


def test_the_model_base_url_carries_the_rollout_prefix() -> None:
    with _head(SERVERS) as head:
        url = resolve_model_base_url("policy_model", "7-0", head=head)
    assert url == "http://m/ng-rollout/7-0/v1"


def test_the_head_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with _head(SERVERS) as head:
        monkeypatch.setenv(HEAD_URL_ENV, head + "/")
        assert resolve_model_base_url("policy_model", "1-2") == "http://m/ng-rollout/1-2/v1"


def test_resolve_model_base_url_errors() -> None:
    with (
        _head(SERVERS) as head,
        pytest.raises(
            ValueError, match=r"no responses_api_models server named 'mcqa' \(have: policy_model\)"
        ),
    ):
        resolve_model_base_url("mcqa", "0-0", head=head)
    with _head({"servers": []}) as head, pytest.raises(ValueError, match="list of servers"):
        resolve_model_base_url("policy_model", "0-0", head=head)
    with pytest.raises(ConnectionError, match="cannot reach the head server"):
        resolve_model_base_url("policy_model", "0-0", head="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="Invalid rollout id"):
        resolve_model_base_url("policy_model", "../x", head="http://127.0.0.1:9")


def test_a_replicated_model_server_gives_each_rollout_its_own_replica() -> None:
    replicas = [{"url": f"http://10.0.0.{i}:80", "node_id": f"n{i}"} for i in range(3)]
    model: dict[str, object] = {"name": "policy_model", "kind": "responses_api_models"}
    servers = [{**model, "type": "x", "url": replicas[0]["url"], "replicas": replicas}]
    urls = [r["url"] for r in replicas]
    with _head(servers) as head:
        for rollout_id in ("0-0", "1-0", "2-0", "3-0-a1", "4-1"):
            url = resolve_model_base_url("policy_model", rollout_id, head=head)
            assert url == f"{choose_replica(rollout_id, urls)}/ng-rollout/{rollout_id}/v1"
            # Sticky: asking again gives the same replica.
            assert resolve_model_base_url("policy_model", rollout_id, head=head) == url
        chosen = {resolve_model_base_url("policy_model", f"{t}-0", head=head) for t in range(30)}
    assert {url.split("/ng-rollout/")[0] for url in chosen} == set(urls)


def test_find_server_picks_by_name_and_kind_and_names_the_others() -> None:
    servers = [
        {"name": "a", "kind": "responses_api_agents", "url": "http://a"},
        {"name": "a", "kind": "responses_api_models", "url": "http://m"},
        {"name": "b", "kind": "responses_api_agents", "url": "http://b"},
    ]
    assert find_server(servers, "a", "responses_api_models")["url"] == "http://m"
    assert find_server(servers, "b", "responses_api_agents")["url"] == "http://b"
    with pytest.raises(
        ConfigError, match=r"no responses_api_agents server named 'c' \(have: a, b\)"
    ):
        find_server(servers, "c", "responses_api_agents")
    with pytest.raises(ConfigError, match=r"\(have: none\)"):
        find_server([], "c", "resources_servers")
