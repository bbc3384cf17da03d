"""The worker's wire decisions, as plain values in and out."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    PREFIX_IDS_FIELD,
    CaptureAdmission,
    CommitCoords,
    InMemoryStagingSink,
    RolloutTokenCapture,
    VLLMCaptureAdapter,
)
from rollcap.worker._protocol import (
    ENGINE_FIELDS,
    Refusal,
    chain_prefix,
    engine_request,
    failed_coords,
    read_admission,
    with_coords,
)

ROOT = CaptureAdmission(rollout_id="r-0", model_call_id="a1", mode="text")
ROOT_JSON = ROOT.model_dump(mode="json")


def _body(capture: object = ROOT_JSON, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [], CAPTURE_FIELD: capture, **extra}


class _Chain:
    """Calls staged one after another in one rollout, through the real capture."""

    def __init__(self) -> None:
        self.sink = InMemoryStagingSink()
        self.capture = RolloutTokenCapture(sink=self.sink, weight_version_fn=lambda: 3)
        self.coords: list[CommitCoords] = []
        self.ids: list[int] = []

    def keys(self) -> list[str]:
        return [c.staging_key for c in self.coords if c.staging_key is not None]

    def next_admission(self, call_id: str) -> CaptureAdmission:
        if not self.coords:
            return CaptureAdmission(rollout_id="r-0", model_call_id=call_id, mode="text")
        parent = self.coords[-1]
        return CaptureAdmission(
            rollout_id="r-0",
            model_call_id=call_id,
            parent_call_id=parent.model_call_id,
            prev_len=parent.cum_len,
            mode="token_in",
            staging_chain=self.keys(),
            parent_chain_hash=parent.chain_hash,
        )

    def stage(self, call_id: str, new_prompt: list[int], generated: list[int]) -> CommitCoords:
        admission = self.next_admission(call_id)
        prefix = list(self.ids) if self.coords else None
        call = self.capture.begin_call(admission, prefix_token_ids=prefix)
        coords = self.capture.complete_call(
            call,
            prompt_token_ids=self.ids + new_prompt,
            generated_token_ids=generated,
            generated_logprobs=[-0.5] * len(generated),
        )
        assert coords.staged
        self.coords.append(coords)
        self.ids += new_prompt + generated
        return coords


def _three_calls() -> _Chain:
    chain = _Chain()
    chain.stage("c1", [1, 4, 5], [6, 2])
    chain.stage("c2", [1, 7], [8, 2])
    chain.stage("c3", [1, 9], [10, 2])
    return chain


def test_read_admission() -> None:
    assert read_admission(_body()) == ROOT
    assert read_admission(_body(stream=False)) == ROOT
    child = {
        **ROOT_JSON,
        "parent_call_id": "a0",
        "prev_len": 2,
        "mode": "token_in",
        "required_prefix_token_ids": [1, 2],
        "parent_chain_hash": "a" * 64,
    }
    assert read_admission(_body(child)).required_prefix_token_ids == [1, 2]
    assert read_admission(_body(child, **{PREFIX_IDS_FIELD: [1, 2]})).prev_len == 2


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
        (7, "ng_capture must be a JSON object, not a number"),
        ({"rollout_id": "r-0", "mode": "text"}, "ng_capture.model_call_id: Field required"),
        ({**ROOT_JSON, "extra": 1}, "ng_capture.extra: Extra inputs are not permitted"),
        ({**ROOT_JSON, "prev_len": 1}, "ng_capture: Value error, a text admission has no"),
        ({**ROOT_JSON, "prev_len": 1.0}, "ng_capture.prev_len: Input should be a valid integer"),
        ({**ROOT_JSON, "model_call_id": 5}, "ng_capture.model_call_id: Input should be a valid"),
    ],
)
def test_a_bad_admission_is_refused(capture: object, words: str) -> None:
    with pytest.raises(Refusal) as refused:
        read_admission(_body(capture))
    assert refused.value.param == CAPTURE_FIELD
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("inline", "in_body", "refused"),
    [
        ([], [1], True),
        ([1, 2], [1], True),
        ([1, 2], "1 2", True),
        ([1, 2], [1, True], True),
        ([1, 2], [1, 2.0], True),
        ([1, 2], [1, 2], False),
        ([1, 2], None, False),
        ([], [], False),
    ],
)
def test_a_pin_in_the_body_must_be_the_admissions(
    inline: list[int], in_body: object, refused: bool
) -> None:
    capture = {
        **ROOT_JSON,
        "parent_call_id": "a0",
        "prev_len": 2,
        "mode": "token_in",
        "required_prefix_token_ids": inline,
        "staging_chain": [] if inline else ["r-0/a0"],
        "parent_chain_hash": "a" * 64,
    }
    body = _body(capture, **{PREFIX_IDS_FIELD: in_body})
    if refused:
        with pytest.raises(Refusal) as refusal:
            read_admission(body)
        assert refusal.value.param == PREFIX_IDS_FIELD
    else:
        assert read_admission(body).required_prefix_token_ids == inline


def test_chain_prefix_concatenates_the_deltas_root_first() -> None:
    chain = _three_calls()
    admission = chain.next_admission("c4")
    assert chain_prefix(admission, chain.sink.fetch(admission.staging_chain)) == chain.ids
    assert chain.ids == [1, 4, 5, 6, 2, 1, 7, 8, 2, 1, 9, 10, 2]


def test_chain_prefix_refuses_a_chain_the_admission_does_not_commit_to() -> None:
    chain = _three_calls()
    admission = chain.next_admission("c4")
    snapshots = chain.sink.fetch(admission.staging_chain)
    cases: list[tuple[CaptureAdmission, list[Any], str]] = [
        (admission, snapshots[:2], "2 staged records for 3 staging_chain keys"),
        (admission, [snapshots[0], snapshots[2], snapshots[1]], "does not continue the chain"),
        (admission, snapshots[1:] + snapshots[:1], "does not continue the chain"),
        (
            admission.model_copy(update={"parent_chain_hash": "0" * 64}),
            snapshots,
            "not the admission's parent_chain_hash",
        ),
        (
            admission.model_copy(update={"parent_call_id": "c2"}),
            snapshots,
            "ends at call 'c3', not the parent 'c2'",
        ),
        (
            admission.model_copy(update={"prev_len": 12}),
            snapshots,
            "13 ids for prev_len 12",
        ),
        (
            admission.model_copy(update={"rollout_id": "r-1"}),
            snapshots,
            "is a call of rollout 'r-0'",
        ),
        (
            admission,
            [snapshots[0], snapshots[1].model_copy(update={"chain_hash": "1" * 64}), snapshots[2]],
            "r-0/c2: its chain hash does not follow from its ids",
        ),
    ]
    for bad_admission, bad_snapshots, words in cases:
        with pytest.raises(ValueError, match=re.escape(words)):
            chain_prefix(bad_admission, bad_snapshots)


def test_engine_request() -> None:
    adapter = VLLMCaptureAdapter()
    body = _body(temperature=0.5, stream=False, stream_options={"include_usage": True})
    body[PREFIX_IDS_FIELD] = []
    plain = engine_request(body, None, adapter)
    assert plain == {
        "model": "m",
        "messages": [],
        "temperature": 0.5,
        "stream": False,
        **ENGINE_FIELDS,
    }
    pinned = engine_request(body, (1, 5), adapter)
    assert pinned == {**plain, PREFIX_IDS_FIELD: [1, 5]}
    assert body[CAPTURE_FIELD] == ROOT_JSON  # the client's body is left as it was
    assert body[PREFIX_IDS_FIELD] == []


def test_failed_coords_have_the_failed_shape() -> None:
    admission = _three_calls().next_admission("c4")
    coords = failed_coords(admission, 9)
    assert not coords.staged
    assert (coords.parent_call_id, coords.prev_len, coords.cum_len, coords.delta_len) == (
        "c3",
        13,
        13,
        0,
    )
    assert coords.weight_version == 9
    assert (coords.staging_key, coords.digest, coords.chain_hash) == (None, None, None)


def test_with_coords_keeps_the_upstreams_bytes() -> None:
    coords = _three_calls().coords[0]
    raw = b'{"a": 1.50, "b": [1,2]}\n'
    out = with_coords(raw, orjson.loads(raw), coords)
    assert out.startswith(b'{"a": 1.50, "b": [1,2]')
    assert orjson.loads(out) == {
        "a": 1.5,
        "b": [1, 2],
        COORDS_FIELD: coords.model_dump(mode="json"),
    }


@pytest.mark.parametrize("raw", [b"{}", b'{"ng_commit_coords": 1, "x": 2}'])
def test_with_coords_rewrites_when_it_cannot_splice(raw: bytes) -> None:
    coords = _three_calls().coords[0]
    parsed = orjson.loads(raw)
    out = orjson.loads(with_coords(raw, parsed, coords))
    assert out == {**parsed, COORDS_FIELD: coords.model_dump(mode="json")}
