"""The worker's wire decisions, as plain values in and out."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    PREFIX_IDS_FIELD,
    REASON_PARENT_PREFIX_MISMATCH,
    REASON_REQUIRED_PREFIX_MISMATCH,
    Admission,
    CommitCoords,
    InMemoryStagingSink,
    RolloutTokenCapture,
    VLLMCaptureAdapter,
)
from rollcap.worker._protocol import (
    Refusal,
    fails_closed,
    prefix_mismatch_body,
    read_admission,
    upstream_request,
    with_coords,
)

ADMISSION = {"rollout_id": "r-0", "model_call_id": "a1"}


def _staged_coords() -> CommitCoords:
    capture = RolloutTokenCapture(InMemoryStagingSink(), VLLMCaptureAdapter(), 3)
    call = capture.begin_call(Admission("r-0", "a1"))
    return capture.complete_call(
        call, prompt_token_ids=[1, 4], generated_token_ids=[5, 2], generated_logprobs=[-1, -0.5]
    )


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [], CAPTURE_FIELD: ADMISSION, **extra}


def test_read_admission() -> None:
    pinned = {**ADMISSION, "parent_model_call_id": "a0", "required_prefix_token_ids": [1, 2]}
    admission = read_admission(_body(**{CAPTURE_FIELD: pinned}))
    assert admission == Admission("r-0", "a1", "a0", (1, 2))
    assert read_admission(_body(stream=False)) == Admission("r-0", "a1")


@pytest.mark.parametrize("stream", [True, 1, "yes"])
def test_streaming_is_refused(stream: object) -> None:
    with pytest.raises(Refusal) as refused:
        read_admission(_body(stream=stream))
    assert refused.value.param == "stream"
    error = orjson.loads(refused.value.body())["error"]
    assert error["param"] == "stream"
    assert error["type"] == "invalid_request_error"
    assert "unsupported" in error["message"]


@pytest.mark.parametrize(
    ("capture", "words"),
    [
        (7, "must be a JSON object, not a number"),
        ({"rollout_id": "r-0"}, "ng_capture.model_call_id is missing"),
        ({**ADMISSION, "model_call_id": "a/1"}, "invalid model_call_id"),
    ],
)
def test_a_bad_admission_is_refused(capture: object, words: str) -> None:
    with pytest.raises(Refusal) as refused:
        read_admission(_body(**{CAPTURE_FIELD: capture}))
    assert refused.value.param == CAPTURE_FIELD
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("pinned", "in_body", "refused"),
    [
        (None, [1], True),
        ([1, 2], [1], True),
        ([1, 2], "1 2", True),
        ([1, 2], [1, 2], False),
        ([1, 2], None, False),
    ],
)
def test_a_pin_in_the_body_must_be_the_admissions(
    pinned: list[int] | None, in_body: object, refused: bool
) -> None:
    body = _body(**{CAPTURE_FIELD: {**ADMISSION, PREFIX_IDS_FIELD: pinned}})
    body[PREFIX_IDS_FIELD] = in_body
    if refused:
        with pytest.raises(Refusal) as refusal:
            read_admission(body)
        assert refusal.value.param == PREFIX_IDS_FIELD
    else:
        assert read_admission(body).required_prefix_token_ids == tuple(pinned or ())


def test_upstream_request() -> None:
    adapter = VLLMCaptureAdapter()
    body = _body(temperature=0.5)
    plain = upstream_request(adapter, body, Admission("r-0", "a1"))
    assert plain == {
        "model": "m",
        "messages": [],
        "temperature": 0.5,
        "return_token_ids": True,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
    }
    pinned = upstream_request(adapter, body, Admission("r-0", "a1", None, (1, 5)))
    assert pinned == {**plain, PREFIX_IDS_FIELD: [1, 5]}
    assert CAPTURE_FIELD in body  # the client's body is left as it was


def test_with_coords_keeps_the_upstreams_bytes() -> None:
    coords = _staged_coords()
    raw = b'{"a": 1.50, "b": [1,2]}\n'
    out = with_coords(raw, orjson.loads(raw), coords)
    assert out.startswith(b'{"a": 1.50, "b": [1,2]')
    assert orjson.loads(out) == {"a": 1.5, "b": [1, 2], COORDS_FIELD: coords.to_json()}


@pytest.mark.parametrize("raw", [b"{}", b'{"ng_commit_coords": 1, "x": 2}'])
def test_with_coords_rewrites_when_it_cannot_splice(raw: bytes) -> None:
    coords = _staged_coords()
    parsed = orjson.loads(raw)
    out = orjson.loads(with_coords(raw, parsed, coords))
    assert out == {**parsed, COORDS_FIELD: coords.to_json()}


def test_only_a_required_prefix_mismatch_fails_closed() -> None:
    mismatch = CommitCoords.failed(REASON_REQUIRED_PREFIX_MISMATCH, "x", rollout_id="r-0")
    assert fails_closed(mismatch)
    assert not fails_closed(CommitCoords.failed(REASON_PARENT_PREFIX_MISMATCH, "x"))
    assert not fails_closed(_staged_coords())
    body = orjson.loads(prefix_mismatch_body(mismatch))
    assert body["error"]["code"] == "required_prefix_mismatch"
    assert body["error"]["type"] == "invalid_request_error"
    assert body[COORDS_FIELD] == mismatch.to_json()
