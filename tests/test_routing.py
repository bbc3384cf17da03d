from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollcap.routing import (
    SCOPE_ROLLOUT_ID_KEY,
    apply_prefix,
    base_url_for_run,
    split_prefix,
    url_path_for_request,
    url_path_for_run,
)

RUN = {"_ng_task_index": 7, "_ng_rollout_index": 0}


def test_split_prefix() -> None:
    assert split_prefix("/ng-rollout/7-0/v1/responses") == ("7-0", "/v1/responses")
    assert split_prefix("/ng-rollout/7-0/") == ("7-0", "/")
    assert split_prefix("/ng-rollout/7-0") == ("7-0", "/")
    assert split_prefix("/v1/responses") == (None, "/v1/responses")
    # Not the prefix: the segment must be exactly "ng-rollout".
    assert split_prefix("/ng-rollouts/7-0/v1") == (None, "/ng-rollouts/7-0/v1")


@pytest.mark.parametrize(
    "path",
    ["/ng-rollout//v1/x", "/ng-rollout/../v1", "/ng-rollout/%2e%2e/v1", "/ng-rollout/a b/v1"],
)
def test_split_prefix_refuses_bad_ids(path: str) -> None:
    with pytest.raises(ValueError, match="invalid rollout id"):
        split_prefix(path)


def test_apply_prefix_roundtrip() -> None:
    path = apply_prefix("/v1/chat/completions", "3-1-a2")
    assert path == "/ng-rollout/3-1-a2/v1/chat/completions"
    assert split_prefix(path) == ("3-1-a2", "/v1/chat/completions")
    with pytest.raises(ValueError, match="must start with"):
        apply_prefix("v1/x", "3-1")
    with pytest.raises(ValueError, match="already carries"):
        apply_prefix(path, "3-1")


def test_url_path_for_run() -> None:
    assert url_path_for_run("/v1/responses", RUN) == "/ng-rollout/7-0/v1/responses"
    assert url_path_for_run("/v1/responses", {"input": []}) == "/v1/responses"


def test_base_url_for_run() -> None:
    assert base_url_for_run("http://127.0.0.1:8000/", RUN) == "http://127.0.0.1:8000/ng-rollout/7-0"
    assert base_url_for_run("http://h:1", {}) == "http://h:1"


def test_url_path_for_request_forms() -> None:
    inbound = "/ng-rollout/7-0/v1/responses"
    scope = {"type": "http", "path": inbound, "root_path": ""}
    request = SimpleNamespace(scope=scope)
    for form in (inbound, scope, request, SimpleNamespace(url=SimpleNamespace(path=inbound))):
        assert url_path_for_request("/v1/chat/completions", form) == (
            "/ng-rollout/7-0/v1/chat/completions"
        )
    # A server that stripped the prefix keeps the id in the scope.
    stripped = {"type": "http", "path": "/v1/responses", SCOPE_ROLLOUT_ID_KEY: "9-9"}
    assert url_path_for_request("/v1/messages", stripped) == "/ng-rollout/9-9/v1/messages"
    assert url_path_for_request("/v1/messages", {"path": "/run"}) == "/v1/messages"
    assert url_path_for_request("/v1/messages", object()) == "/v1/messages"
