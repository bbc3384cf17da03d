from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from rollcap.routing import (
    SCOPE_ROLLOUT_ID_KEY,
    SCOPE_TRAINING_KEY,
    apply_prefix,
    base_url_for_run,
    split_prefix,
    strip_prefix,
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
    with pytest.raises(ValueError, match="Invalid rollout id"):
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


class _RunRequest(pydantic.BaseModel):
    """A run request model as agents written for NeMo Gym pass theirs."""

    model_config = pydantic.ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] = {}


def test_a_pydantic_or_plain_object_run_body_is_prefixed_too() -> None:
    model = _RunRequest.model_validate(
        {"_ng_task_index": 7, "_ng_rollout_index": 0, "_ng_attempt_index": "1"}
    )
    plain = SimpleNamespace(_ng_task_index=7, _ng_rollout_index=0, _ng_attempt_index=1)
    for body in (model, plain):
        assert url_path_for_run("/v1/responses", body) == "/ng-rollout/7-0-a1/v1/responses"
        assert base_url_for_run("http://h:1/", body) == "http://h:1/ng-rollout/7-0-a1"
    assert url_path_for_run("/v1/responses", _RunRequest()) == "/v1/responses"
    assert base_url_for_run("http://h:1", SimpleNamespace()) == "http://h:1"


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


def test_strip_prefix_gives_a_child_scope_that_keeps_the_id() -> None:
    scope = {
        "type": "http",
        "path": "/ng-rollout/3-1/v1/responses",
        "raw_path": b"/ng-rollout/3-1/v1/responses",
        "query_string": b"a=1",
    }
    rollout_id, child = strip_prefix(scope)
    assert rollout_id == "3-1"
    assert child == {
        "type": "http",
        "path": "/v1/responses",
        "raw_path": b"/v1/responses",
        "query_string": b"a=1",
        SCOPE_ROLLOUT_ID_KEY: "3-1",
        SCOPE_TRAINING_KEY: False,
    }
    assert scope["path"] == "/ng-rollout/3-1/v1/responses"  # the parent scope is left alone
    assert strip_prefix({"path": "/ng-rollout/3-1"})[1]["path"] == "/"


def test_strip_prefix_strips_the_training_segment_and_says_it_was_there() -> None:
    path = "/ng-rollout/3-1/training-token-capture/v1/chat/completions"
    rollout_id, child = strip_prefix({"path": path, "raw_path": path.encode()})
    assert rollout_id == "3-1"
    assert child["path"] == "/v1/chat/completions"
    assert child["raw_path"] == b"/v1/chat/completions"
    assert child[SCOPE_TRAINING_KEY] is True
    # Only the exact segment: a longer name is part of the rest of the path.
    other = "/ng-rollout/3-1/training-token-captures/v1"
    _, child = strip_prefix({"path": other, "raw_path": other.encode()})
    assert child["path"] == "/training-token-captures/v1"
    assert child[SCOPE_TRAINING_KEY] is False
    _, bare = strip_prefix({"path": "/ng-rollout/3-1/training-token-capture"})
    assert bare["path"] == "/"
    assert bare[SCOPE_TRAINING_KEY] is True


def test_the_training_segment_is_applied_and_carried_onwards() -> None:
    assert (
        apply_prefix("/v1/responses", "7-0", training=True)
        == "/ng-rollout/7-0/training-token-capture/v1/responses"
    )
    assert (
        url_path_for_run("/v1/responses", RUN, training=True)
        == "/ng-rollout/7-0/training-token-capture/v1/responses"
    )
    assert url_path_for_run("/v1/responses", {}, training=True) == "/v1/responses"
    assert (
        base_url_for_run("http://h:1/", RUN, training=True)
        == "http://h:1/ng-rollout/7-0/training-token-capture"
    )
    inbound = "/ng-rollout/7-0/training-token-capture/v1/responses"
    onward = "/ng-rollout/7-0/training-token-capture/v1/responses"
    assert url_path_for_request("/v1/responses", inbound) == onward
    _, scope = strip_prefix({"path": inbound, "raw_path": inbound.encode()})
    assert url_path_for_request("/v1/responses", scope) == onward
    plain = {"path": "/v1/responses", SCOPE_ROLLOUT_ID_KEY: "7-0"}
    assert url_path_for_request("/v1/responses", plain) == "/ng-rollout/7-0/v1/responses"


def test_strip_prefix_leaves_an_unprefixed_scope_as_it_is() -> None:
    scope = {"path": "/v1/responses", "raw_path": b"/v1/responses"}
    rollout_id, child = strip_prefix(scope)
    assert rollout_id is None
    assert child is scope


def test_strip_prefix_reads_the_id_from_the_path_as_sent() -> None:
    # Decoded, "a%2Fb" would pass as the id "a" followed by "/b".
    scope = {"path": "/ng-rollout/a/b/v1/responses", "raw_path": b"/ng-rollout/a%2Fb/v1/responses"}
    with pytest.raises(ValueError, match="Invalid rollout id"):
        strip_prefix(scope)
