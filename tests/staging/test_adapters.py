"""VLLMCaptureAdapter: the request fields, the two shapes of generated ids, and strip()."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rollcap.staging import (
    PREFIX_IDS_FIELD,
    ExtractionError,
    VLLMCaptureAdapter,
)
from tests.staging._helpers import vllm_response

adapter = VLLMCaptureAdapter()


def test_prepare_request_asks_for_ids_and_drops_the_admission() -> None:
    body = {"model": "m", "messages": [], "logprobs": False, "ng_capture": {"rollout_id": "0-0"}}
    prepared = adapter.prepare_request(body)
    assert prepared == {
        "model": "m",
        "messages": [],
        "logprobs": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    assert "ng_capture" in body  # the input is not mutated
    assert adapter.request_fields == {
        "return_token_ids": True,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
    }


def test_enter_prefix_pins_the_ids_in_a_copy() -> None:
    body = {"model": "m"}
    assert adapter.enter_prefix(body, (4, 5, 6)) == {"model": "m", PREFIX_IDS_FIELD: [4, 5, 6]}
    assert body == {"model": "m"}
    with pytest.raises(ValueError, match="prefix_ids"):
        adapter.enter_prefix(body, [1, -2])


def test_extracts_from_token_ids_and_logprobs() -> None:
    response = vllm_response([1, 2, 3], [7, 8], [-0.5, -1.0])
    assert adapter.extract_prompt_ids(response) == [1, 2, 3]
    assert adapter.extract_generation(response) == ([7, 8], [-0.5, -1.0])
    assert adapter.extract_extras(response) is None


def test_extracts_ids_from_token_id_strings_without_token_ids() -> None:
    response = vllm_response([1], [70000, 3], [-0.125, -2.0], with_token_ids=False)
    assert adapter.extract_generation(response) == ([70000, 3], [-0.125, -2.0])


def test_empty_generation_is_allowed() -> None:
    response = vllm_response([1, 2], [], [])
    response["choices"][0]["logprobs"]["content"] = None
    assert adapter.extract_generation(response) == ([], [])


def _mutated(change: str) -> dict[str, Any]:
    response = vllm_response([1, 2, 3], [7, 8], [-0.5, -1.0])
    choice = response["choices"][0]
    content = choice["logprobs"]["content"]
    if change == "two choices":
        response["choices"].append(copy.deepcopy(choice))
    elif change == "no choices":
        response["choices"] = []
    elif change == "no prompt ids":
        del response["prompt_token_ids"]
    elif change == "no logprobs":
        choice["logprobs"] = None
    elif change == "token mismatch":
        content[1]["token"] = "token_id:9"
    elif change == "length mismatch":
        choice["token_ids"] = [7]
    elif change == "text tokens only":
        del choice["token_ids"]
        content[0]["token"] = "hello"
    elif change == "bad logprob":
        content[0]["logprob"] = None
    elif change == "infinite logprob":
        content[0]["logprob"] = float("-inf")
    elif change == "float ids":
        choice["token_ids"] = [7.0, 8.0]
    elif change == "negative prompt id":
        response["prompt_token_ids"] = [1, -2]
    return response


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("two choices", "exactly one"),
        ("no choices", "exactly one"),
        ("token mismatch", "token_ids\\[1\\] is 8"),
        ("length mismatch", "has 1 ids"),
        ("text tokens only", "token_id:N"),
        ("no logprobs", "logprobs is missing"),
        ("bad logprob", "logprob is None"),
        ("infinite logprob", "not finite"),
        ("float ids", "only integers"),
    ],
)
def test_generation_extraction_errors_are_clear(change: str, message: str) -> None:
    with pytest.raises(ExtractionError, match=message):
        adapter.extract_generation(_mutated(change))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no prompt ids", "prompt_token_ids"),
        ("negative prompt id", "outside"),
        ("two choices", "one"),
    ],
)
def test_prompt_extraction_errors_are_clear(change: str, message: str) -> None:
    with pytest.raises(ExtractionError, match=message):
        adapter.extract_prompt_ids(_mutated(change))


def test_extras_keep_routed_experts_and_media_spans() -> None:
    response = vllm_response([1], [2], [-1.0], media_spans=[{"start": 0, "length": 1}])
    response["choices"][0]["routed_experts"] = [[[3, 4]]]
    assert adapter.extract_extras(response) == {
        "routed_experts": [[[3, 4]]],
        "media_spans": [{"start": 0, "length": 1}],
    }


def test_strip_leaves_an_ordinary_chat_completion() -> None:
    response = vllm_response(
        [1, 2],
        [3],
        [-1.0],
        prompt_logprobs=[None, {"2": {"logprob": -1}}],
        kv_transfer_params={"k": 1},
        routed_experts=[[1]],
        media_spans=[],
        ng_commit_coords={"disposition": "staged"},
    )
    response["choices"][0]["routed_experts"] = [[1]]
    original = copy.deepcopy(response)
    stripped = adapter.strip(response)
    assert response == original
    assert set(stripped) == {"id", "object", "created", "model", "choices", "usage"}
    choice = stripped["choices"][0]
    assert set(choice) == {"index", "message", "finish_reason", "logprobs"}
    assert choice["logprobs"] is None
    assert choice["message"] == {"role": "assistant", "content": "ok", "tool_calls": []}

    kept = adapter.strip(response, keep_logprobs=True)
    assert kept["choices"][0]["logprobs"] == original["choices"][0]["logprobs"]
    assert "token_ids" not in kept["choices"][0]
    # The copy is deep: changing it leaves the engine response alone.
    kept["choices"][0]["logprobs"]["content"].clear()
    assert response == original
