"""RolloutTokenCapture: §3.5's rollout byte for byte, §1.5's caller errors, §5.2's outcomes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from rollcap.staging._adapters import VLLMCaptureAdapter
from rollcap.staging._capture import (
    ActiveCall,
    CaptureHost,
    RolloutTokenCapture,
    install_capture,
)
from rollcap.staging._digest import compute_staging_digest
from rollcap.staging._records import (
    CaptureAdmission,
    CaptureError,
    CommitCoords,
    StagedCallRecord,
    StageResult,
    StreamingUnsupportedError,
)
from rollcap.staging._sinks import DirectoryStagingSink, InMemoryStagingSink, StagingSink

# STAGING §3.5, verbatim: what NeMo Gym 0.7.0's capture stages for rollout 0-0.
RECORD_LINES = (
    '{"schema_version": 2, "digest_version": 2, "extras_digest_version": 1, "rollout_id": "0-0", "model_call_id": "0a1b", "parent_call_id": null, "mode": "text", "prev_len": 0, "delta_len": 5, "cum_len": 5, "weight_version": 7, "digest": "45abfc67c351e4e4dd43b42c9cbefedd1c4c79d12864609d6706b6219ed1313d", "token_ids_delta": [1, 104, 105, 42, 2], "token_mask_delta": [0.0, 0.0, 0.0, 1.0, 1.0], "generation_log_probs_delta": [0.0, 0.0, 0.0, -0.5, -1.25], "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6", "chain_hash": "e606f3fac05e3eaa16232343e63807f62088cf8a2fb8c0140de69d82e5a289e6", "cumulative_hash": "f068b6cf29511f34cf31a38e89e396bf66de10d8ba764f2ed4b95865026fb4f0", "extras": null}',  # noqa: E501
    '{"schema_version": 2, "digest_version": 2, "extras_digest_version": 1, "rollout_id": "0-0", "model_call_id": "0c2d", "parent_call_id": "0a1b", "mode": "token_in", "prev_len": 5, "delta_len": 6, "cum_len": 11, "weight_version": 8, "digest": "428efd9e71d58aee3871a7e18de8a67260d899be7309a71362b66d15355535be", "token_ids_delta": [1, 117, 2, 1, 97, 43], "token_mask_delta": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], "generation_log_probs_delta": [0.0, 0.0, 0.0, 0.0, 0.0, -0.0625], "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6", "chain_hash": "b72abdf966d1055e6224cfb6ff24c3c01c6f79dc7e1eb728e77cab08ebf784dd", "cumulative_hash": "e4b2315a156ac3c1873e6b2abf53de4d35cacd2262f8ba4338c352d81f07f4ae", "extras": null}',  # noqa: E501
    '{"schema_version": 2, "digest_version": 2, "extras_digest_version": 1, "rollout_id": "0-0", "model_call_id": "0e3f", "parent_call_id": "0c2d", "mode": "token_in", "prev_len": 11, "delta_len": 7, "cum_len": 18, "weight_version": 8, "digest": "d2c57897ee9b455c72707b96692371294777105a3722bc60b8436b7ac7f8b037", "token_ids_delta": [1, 9, 9, 9, 2, 44, 2], "token_mask_delta": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0], "generation_log_probs_delta": [0.0, 0.0, 0.0, 0.0, 0.0, -0.5, -0.125], "extras_digest": "17b5862b8d636bf5824006a3317e5eb56ee8f388b17f6f73bf9bd26eb40dee73", "chain_hash": "6de871a39a8c4f5e6de6e8ae70329b81a0f9396941ad88ee581f5b989016d65b", "cumulative_hash": "58889b5c0afc226ea21fb8c2fc67794e4b58c906772db083ddb4e38766dc1494", "extras": {"routed_experts": "nrlre1:int16:2x1x2:AwABAAIABQA=", "media_spans": [{"modality": "image", "offset": 12, "length": 3, "placeholder_id": 9}]}}',  # noqa: E501
)
ROOT_COORDS_LINE = '{"schema_version": 2, "digest_version": 2, "extras_digest_version": 1, "rollout_id": "0-0", "model_call_id": "0a1b", "parent_call_id": null, "prev_len": 0, "delta_len": 5, "cum_len": 5, "weight_version": 7, "disposition": "staged", "digest": "45abfc67c351e4e4dd43b42c9cbefedd1c4c79d12864609d6706b6219ed1313d", "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6", "staging_key": "0-0/0a1b", "chain_hash": "e606f3fac05e3eaa16232343e63807f62088cf8a2fb8c0140de69d82e5a289e6", "cumulative_hash": "f068b6cf29511f34cf31a38e89e396bf66de10d8ba764f2ed4b95865026fb4f0"}'  # noqa: E501
FAILED_COORDS_LINE = '{"schema_version": 2, "digest_version": 2, "extras_digest_version": 1, "rollout_id": "0-0", "model_call_id": "0f40", "parent_call_id": "0e3f", "prev_len": 18, "delta_len": 0, "cum_len": 18, "weight_version": 9, "disposition": "capture_failed", "digest": null, "extras_digest": null, "staging_key": null, "chain_hash": null, "cumulative_hash": null}'  # noqa: E501
ENGINE_ANSWER_0E3F = '{"id": "chatcmpl-3", "object": "chat.completion", "created": 0, "model": "m", "prompt_token_ids": [1,104,105,42,2,1,117,2,1,97,43,1,9,9,9,2], "media_spans": [{"modality": "image", "offset": 12, "length": 3, "placeholder_id": 9}], "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok", "routed_experts": "nrlre1:int16:2x1x2:AwABAAIABQA="}, "logprobs": {"content": [{"token": "token_id:44", "logprob": -0.5}, {"token": "token_id:2", "logprob": -0.125}]}}]}'  # noqa: E501
ATTACHMENTS_0E3F = {"pixels-0.bin": b"\x00\x01"}

# The fields a staged call's coords repeat from its record.
COORDS_FROM_RECORD = (
    "schema_version",
    "digest_version",
    "extras_digest_version",
    "rollout_id",
    "model_call_id",
    "parent_call_id",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)

Store = InMemoryStagingSink | DirectoryStagingSink


def child_admission(call: str, parent: CommitCoords, chain: list[str]) -> CaptureAdmission:
    """A continuation's admission as the gate builds one from its parent's ledger row."""
    assert parent.chain_hash is not None
    return CaptureAdmission(
        rollout_id=parent.rollout_id,
        model_call_id=call,
        parent_call_id=parent.model_call_id,
        prev_len=parent.cum_len,
        mode="token_in",
        staging_chain=chain,
        parent_chain_hash=parent.chain_hash,
    )


def chain_prefix(store: Store, chain: list[str]) -> list[int]:
    """What a worker hands ``begin_call``: the chain's deltas fetched and concatenated."""
    return [token for snapshot in store.fetch(chain) for token in snapshot.token_ids_delta]


def run_rollout_0_0(
    store: Store, *, attachments: Mapping[str, Any] | None = ATTACHMENTS_0E3F
) -> list[CommitCoords]:
    """STAGING §3.5's four calls through a fresh capture into ``store``; their coords."""
    version = [7]
    capture = RolloutTokenCapture(
        sink=store, weight_version_fn=lambda: version[0], adapter=VLLMCaptureAdapter()
    )
    root = capture.begin_call(CaptureAdmission(rollout_id="0-0", model_call_id="0a1b", mode="text"))
    root_coords = capture.complete_call(
        root,
        prompt_token_ids=[1, 104, 105],
        generated_token_ids=[42, 2],
        generated_logprobs=[-0.5, -1.25],
    )
    coords = [root_coords]
    version[0] = 8
    chain = [cast(str, root_coords.staging_key)]
    child = capture.begin_call(
        child_admission("0c2d", root_coords, chain),
        prefix_token_ids=chain_prefix(store, chain),
    )
    coords.append(
        capture.complete_call(
            child,
            prompt_token_ids=[1, 104, 105, 42, 2, 1, 117, 2, 1, 97],
            generated_token_ids=[43],
            generated_logprobs=[-0.0625],
        )
    )
    chain = [*chain, cast(str, coords[-1].staging_key)]
    extras_call = capture.begin_call(
        child_admission("0e3f", coords[-1], chain),
        prefix_token_ids=chain_prefix(store, chain),
    )
    coords.append(
        capture.complete_call_from_response(
            extras_call, orjson.loads(ENGINE_ANSWER_0E3F), attachments=attachments
        )
    )
    version[0] = 9
    chain = [*chain, cast(str, coords[-1].staging_key)]
    failed = capture.begin_call(
        child_admission("0f40", coords[-1], chain),
        prefix_token_ids=chain_prefix(store, chain),
    )
    coords.append(capture.fail_call(failed, reason="engine error"))
    return coords


def check_rollout_0_0(store: Store, coords: list[CommitCoords]) -> None:
    """The records and coords of §3.5, exactly."""
    keys = ["0-0/0a1b", "0-0/0c2d", "0-0/0e3f"]
    records = store.fetch_records(keys)
    for record, line in zip(records, RECORD_LINES, strict=True):
        dumped = record.model_dump(mode="json")
        assert dumped == orjson.loads(line)
        assert list(dumped) == list(orjson.loads(line))
    assert coords[0].model_dump(mode="json") == orjson.loads(ROOT_COORDS_LINE)
    assert list(coords[0].model_dump(mode="json")) == list(orjson.loads(ROOT_COORDS_LINE))
    for record, key, staged in zip(records, keys, coords, strict=False):
        assert staged.disposition == "staged"
        assert staged.staging_key == key
        for name in COORDS_FROM_RECORD:
            assert getattr(staged, name) == getattr(record, name), name
    assert coords[3].model_dump(mode="json") == orjson.loads(FAILED_COORDS_LINE)
    assert store.rollout_keys("0-0") == keys


def test_rollout_0_0_in_memory() -> None:
    store = InMemoryStagingSink()
    coords = run_rollout_0_0(store)
    check_rollout_0_0(store, coords)
    assert store.attachments("0-0/0e3f") == ATTACHMENTS_0E3F
    assert store.attachments("0-0/0a1b") == {}


def test_rollout_0_0_into_a_directory(tmp_path: Path) -> None:
    store = DirectoryStagingSink(tmp_path)
    check_rollout_0_0(store, run_rollout_0_0(store))
    assert store.attachments("0-0/0e3f") == ATTACHMENTS_0E3F


@pytest.mark.parametrize("attachments", [None, {}, ATTACHMENTS_0E3F])
def test_attachments_never_change_the_coords(attachments: Mapping[str, Any] | None) -> None:
    with_them = run_rollout_0_0(InMemoryStagingSink())
    store = InMemoryStagingSink()
    coords = run_rollout_0_0(store, attachments=attachments)
    assert [c.model_dump() for c in coords] == [c.model_dump() for c in with_them]
    assert store.attachments("0-0/0e3f") == dict(attachments or {})


class RecordingSink(InMemoryStagingSink):
    """An in-memory sink that remembers how ``stage`` was called."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[StagedCallRecord, bool, Mapping[str, Any] | None]] = []

    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> StageResult:
        self.calls.append((record, attachments is not None, attachments))
        return super().stage(record, attachments=attachments)


def root_admission(call: str = "c1", rollout: str = "r") -> CaptureAdmission:
    return CaptureAdmission(rollout_id=rollout, model_call_id=call, mode="text")


def make_capture(
    sink: object = None,
    *,
    version: int = 3,
    adapter: VLLMCaptureAdapter | None = None,
) -> RolloutTokenCapture:
    return RolloutTokenCapture(
        sink=cast(StagingSink, InMemoryStagingSink() if sink is None else sink),
        weight_version_fn=lambda: version,
        adapter=adapter,
    )


def complete_root(capture: RolloutTokenCapture, call: ActiveCall, **overrides: Any) -> CommitCoords:
    arguments: dict[str, Any] = {
        "prompt_token_ids": [1, 2],
        "generated_token_ids": [3],
        "generated_logprobs": [-0.5],
    }
    arguments.update(overrides)
    return capture.complete_call(call, **arguments)


def assert_failed(coords: CommitCoords, admission: CaptureAdmission, weight_version: int) -> None:
    """The §4.1 failed shape: the admission's lineage, no delta, no custody."""
    assert coords.disposition == "capture_failed"
    assert coords.rollout_id == admission.rollout_id
    assert coords.model_call_id == admission.model_call_id
    assert coords.parent_call_id == admission.parent_call_id
    assert coords.prev_len == admission.prev_len
    assert coords.delta_len == 0
    assert coords.cum_len == admission.prev_len
    assert coords.weight_version == weight_version
    custody = (
        coords.digest,
        coords.extras_digest,
        coords.staging_key,
        coords.chain_hash,
        coords.cumulative_hash,
    )
    assert custody == (None, None, None, None, None)


def test_logprobs_are_stored_as_the_float64_values_given() -> None:
    stores = [InMemoryStagingSink(), InMemoryStagingSink()]
    digests = []
    for store, logprob in zip(stores, [-0.1, -0.10000000149011612], strict=True):
        capture = make_capture(store)
        coords = complete_root(
            capture, capture.begin_call(root_admission()), generated_logprobs=[logprob]
        )
        assert coords.staged
        record = store.fetch_record("r/c1")
        assert record.generation_log_probs_delta == [0.0, 0.0, logprob]
        digests.append(coords.digest)
    assert b"-0.1]" in orjson.dumps(stores[0].fetch_record("r/c1").model_dump(mode="json"))
    # One float32 value, one digest: the digest hashes the binary32 rounding.
    assert digests[0] == digests[1]
    assert stores[0].fetch_record("r/c1").digest == compute_staging_digest(
        **stores[1].fetch_record("r/c1").model_dump()
    )


def test_text_call_stages_carry_then_generation() -> None:
    sink = RecordingSink()
    capture = make_capture(sink, version=11)
    call = capture.begin_call(root_admission())
    assert call.prefix_token_ids == ()
    assert call.weight_version == 11
    assert call.staging_key == "r/c1"
    assert not call.completed
    coords = complete_root(capture, call)
    assert call.completed
    assert coords.staged
    assert coords.staging_key == "r/c1"
    ((record, passed_keyword, _),) = sink.calls
    assert not passed_keyword
    assert record.token_ids_delta == [1, 2, 3]
    assert record.token_mask_delta == [0.0, 0.0, 1.0]
    assert record.generation_log_probs_delta == [0.0, 0.0, -0.5]
    assert record.extras is None
    assert record.weight_version == 11


def test_an_all_generated_delta_and_extras_are_staged() -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink)
    extras = {"routed_experts": [[[1, 2]]], "n": -2, "f": 1.5, "b": True, "none": None}
    coords = complete_root(
        capture, capture.begin_call(root_admission()), prompt_token_ids=[], extras=extras
    )
    assert coords.staged
    record = sink.fetch_record("r/c1")
    assert record.token_mask_delta == [1.0]
    assert record.extras == extras
    # {} is a value of its own, kept as given (not folded into null).
    coords = complete_root(capture, capture.begin_call(root_admission("c2")), extras={})
    assert sink.fetch_record("r/c2").extras == {}
    assert coords.extras_digest != sink.fetch_record("r/c1").extras_digest


def test_the_sinks_key_is_the_coords_key() -> None:
    class OwnKeys(InMemoryStagingSink):
        def stage(
            self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
        ) -> StageResult:
            super().stage(record, attachments=attachments)
            return StageResult(ok=True, staging_key=f"queue:{record.model_call_id}")

    capture = make_capture(OwnKeys())
    coords = complete_root(capture, capture.begin_call(root_admission()))
    assert coords.staging_key == "queue:c1"


# --- §1.5: begin_call's caller errors -------------------------------------------------------


def chain_admission(**overrides: Any) -> CaptureAdmission:
    fields: dict[str, Any] = {
        "rollout_id": "r",
        "model_call_id": "c2",
        "parent_call_id": "c1",
        "prev_len": 3,
        "mode": "token_in",
        "staging_chain": ["r/c1"],
        "parent_chain_hash": "ab" * 32,
    }
    fields.update(overrides)
    return CaptureAdmission(**fields)


def test_begin_call_wants_a_parsed_admission() -> None:
    capture = make_capture()
    with pytest.raises(TypeError, match="CaptureAdmission"):
        capture.begin_call(cast(Any, root_admission().model_dump()))


def test_begin_call_refuses_streaming() -> None:
    capture = make_capture()
    with pytest.raises(StreamingUnsupportedError):
        capture.begin_call(root_admission(), stream=True)
    assert issubclass(StreamingUnsupportedError, CaptureError)


@pytest.mark.parametrize(
    "prefix",
    [
        [1, 2],  # not prev_len ids
        [1, 2, 3, 4],
        (1, 2, 3),  # not a list
        [1, 2, True],  # bool is not an id
        [1, 2, -3],
        [1, 2, 3.0],
        [1, 2, "3"],
    ],
)
def test_begin_call_refuses_a_bad_prefix(prefix: Any) -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink)
    with pytest.raises(CaptureError):
        capture.begin_call(chain_admission(), prefix_token_ids=prefix)
    assert sink.rollouts() == []


def test_a_chain_admission_needs_the_callers_prefix() -> None:
    capture = make_capture()
    with pytest.raises(CaptureError, match="prefix_token_ids"):
        capture.begin_call(chain_admission())
    call = capture.begin_call(chain_admission(), prefix_token_ids=[4, 5, 6])
    assert call.prefix_token_ids == (4, 5, 6)


def test_the_inline_prefix_is_used_and_must_agree() -> None:
    capture = make_capture()
    inline = chain_admission(staging_chain=[], required_prefix_token_ids=[7, 8, 9])
    assert capture.begin_call(inline).prefix_token_ids == (7, 8, 9)
    assert capture.begin_call(inline, prefix_token_ids=[7, 8, 9]).prefix_token_ids == (7, 8, 9)
    with pytest.raises(CaptureError, match="inline"):
        capture.begin_call(inline, prefix_token_ids=[7, 8, 0])


def test_a_text_call_takes_no_prefix() -> None:
    capture = make_capture()
    assert capture.begin_call(root_admission(), prefix_token_ids=[]).prefix_token_ids == ()
    with pytest.raises(CaptureError):
        capture.begin_call(root_admission(), prefix_token_ids=[1])


def test_weight_version_argument_wins_over_the_provider() -> None:
    capture = make_capture(version=3)
    assert capture.begin_call(root_admission()).weight_version == 3
    assert capture.begin_call(root_admission(), weight_version=0).weight_version == 0
    assert capture.begin_call(root_admission(), weight_version=12).weight_version == 12


@pytest.mark.parametrize("version", [True, -1, 1.0, "1", None, 2**64])
def test_begin_call_refuses_a_bad_weight_version(version: Any) -> None:
    if version is not None:  # None as the argument means "ask the provider"
        with pytest.raises(CaptureError, match="weight_version"):
            make_capture().begin_call(root_admission(), weight_version=version)
    capture = RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=lambda: version)
    with pytest.raises(CaptureError, match="weight_version"):
        capture.begin_call(root_admission())


def test_a_failing_provider_is_a_capture_error() -> None:
    def provider() -> int:
        raise RuntimeError("trainer gone")

    capture = RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=provider)
    with pytest.raises(CaptureError, match="trainer gone"):
        capture.begin_call(root_admission())


# --- §5.2: every failure is capture_failed coords ------------------------------------------


def child_call(capture: RolloutTokenCapture) -> tuple[ActiveCall, CaptureAdmission]:
    admission = chain_admission()
    return capture.begin_call(admission, prefix_token_ids=[1, 2, 3]), admission


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"prompt_token_ids": [1, 2, 4, 5]}, id="prefix-mismatch"),
        pytest.param({"prompt_token_ids": [1, 2]}, id="prompt-shorter-than-prev-len"),
        pytest.param({"generated_logprobs": [-0.5, -0.5]}, id="more-logprobs-than-ids"),
        pytest.param({"generated_token_ids": [5, 6]}, id="more-ids-than-logprobs"),
        pytest.param(
            {"prompt_token_ids": [1, 2, 3], "generated_token_ids": [], "generated_logprobs": []},
            id="empty-delta",
        ),
        pytest.param({"generated_logprobs": [-1]}, id="int-logprob"),
        pytest.param({"generated_logprobs": [True]}, id="bool-logprob"),
        pytest.param({"generated_logprobs": [float("nan")]}, id="nan-logprob"),
        pytest.param({"generated_logprobs": [float("-inf")]}, id="inf-logprob"),
        pytest.param({"generated_logprobs": [-1e39]}, id="beyond-float32"),
        pytest.param({"generated_token_ids": [True]}, id="bool-id"),
        pytest.param({"generated_token_ids": [-5]}, id="negative-id"),
        pytest.param({"generated_token_ids": [2**64]}, id="id-beyond-u64"),
        pytest.param({"generated_token_ids": [5.0]}, id="float-id"),
        pytest.param({"prompt_token_ids": "abc"}, id="string-prompt"),
        pytest.param({"prompt_token_ids": None}, id="no-prompt"),
        pytest.param({"extras": (1, 2)}, id="tuple-extras"),
        pytest.param({"extras": {"x": b"raw"}}, id="bytes-extras"),
        pytest.param({"extras": {"x": float("nan")}}, id="nan-extras"),
        pytest.param({"extras": {"x": 2**63}}, id="big-int-extras"),
        pytest.param({"extras": {1: "x"}}, id="non-string-key-extras"),
        pytest.param({"attachments": [b"x"]}, id="attachments-not-a-mapping"),
    ],
)
def test_bad_engine_output_fails_the_call(
    overrides: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink)
    call, admission = child_call(capture)
    arguments: dict[str, Any] = {
        "prompt_token_ids": [1, 2, 3, 4],
        "generated_token_ids": [5],
        "generated_logprobs": [-0.5],
    }
    arguments.update(overrides)
    with caplog.at_level(logging.WARNING, logger="rollcap.staging"):
        coords = capture.complete_call(call, **arguments)
    assert_failed(coords, admission, 3)
    assert sink.rollouts() == []
    assert any(
        "capture_failed" in r.getMessage() and "c2" in r.getMessage() for r in caplog.records
    )
    # The call is done: it answers once, failed or not.
    with pytest.raises(CaptureError):
        capture.fail_call(call, reason="again")


def test_the_same_child_succeeds_with_good_output() -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink)
    call, _ = child_call(capture)
    coords = capture.complete_call(
        call, prompt_token_ids=[1, 2, 3, 4], generated_token_ids=[5], generated_logprobs=[-0.5]
    )
    assert coords.staged
    assert (coords.prev_len, coords.delta_len, coords.cum_len) == (3, 2, 5)
    assert coords.parent_call_id == "c1"
    assert sink.fetch_record("r/c2").token_ids_delta == [4, 5]
    # A prompt that only re-sends the prefix, then generates, is a delta of generation only.
    call = capture.begin_call(chain_admission(model_call_id="c3"), prefix_token_ids=[1, 2, 3])
    coords = capture.complete_call(
        call, prompt_token_ids=[1, 2, 3], generated_token_ids=[5], generated_logprobs=[-0.5]
    )
    assert coords.staged
    assert coords.delta_len == 1


class FailingAdapter(VLLMCaptureAdapter):
    """The real vLLM adapter, except that one ``extract_*`` raises."""

    def __init__(self, method: str, error: Exception) -> None:
        self.method = method
        self.error = error

    def extract_prompt_ids(self, payload: Mapping[str, Any]) -> list[int]:
        self._maybe_fail("extract_prompt_ids")
        return super().extract_prompt_ids(payload)

    def extract_generation(self, payload: Mapping[str, Any]) -> tuple[list[int], list[float]]:
        self._maybe_fail("extract_generation")
        return super().extract_generation(payload)

    def extract_extras(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        self._maybe_fail("extract_extras")
        return super().extract_extras(payload)

    def _maybe_fail(self, method: str) -> None:
        if method == self.method:
            raise self.error


def engine_answer(prompt: list[int], generated: list[int]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
                "logprobs": {
                    "content": [{"token": f"token_id:{t}", "logprob": -0.25} for t in generated]
                },
            }
        ],
    }


@pytest.mark.parametrize("method", ["extract_prompt_ids", "extract_generation", "extract_extras"])
@pytest.mark.parametrize("error", [ValueError("bad"), KeyError("k"), RuntimeError("boom")])
def test_an_extraction_error_fails_the_call(method: str, error: Exception) -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink, adapter=FailingAdapter(method, error))
    admission = root_admission()
    coords = capture.complete_call_from_response(
        capture.begin_call(admission), engine_answer([1, 2], [3])
    )
    assert_failed(coords, admission, 3)
    assert sink.rollouts() == []


def test_an_answer_the_adapter_cannot_read_fails_the_call() -> None:
    capture = make_capture(adapter=VLLMCaptureAdapter())
    admission = root_admission()
    answer = engine_answer([1, 2], [3])
    del answer["prompt_token_ids"]
    assert_failed(
        capture.complete_call_from_response(capture.begin_call(admission), answer), admission, 3
    )
    coords = capture.complete_call_from_response(
        capture.begin_call(root_admission("c2")), engine_answer([1, 2], [3])
    )
    assert coords.staged


def test_without_an_adapter_completing_from_a_response_is_a_caller_error() -> None:
    capture = make_capture()
    call = capture.begin_call(root_admission())
    with pytest.raises(CaptureError, match="adapter"):
        capture.complete_call_from_response(call, engine_answer([1], [2]))
    # The call is still open: the worker can still answer for it.
    assert not call.completed
    assert_failed(capture.fail_call(call, reason="no adapter"), root_admission(), 3)


class RaisingSink:
    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> StageResult:
        raise OSError("disk full")


class WrongReturnSink:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def stage(
        self, record: StagedCallRecord, *, attachments: Mapping[str, Any] | None = None
    ) -> Any:
        return self.answer


class LegacySink:
    """A sink from before attachments: ``stage(record)`` only."""

    def __init__(self) -> None:
        self.inner = InMemoryStagingSink()

    def stage(self, record: StagedCallRecord) -> StageResult:
        return self.inner.stage(record)


@pytest.mark.parametrize(
    "sink",
    [
        pytest.param(RaisingSink(), id="raises"),
        pytest.param(WrongReturnSink(None), id="returns-none"),
        pytest.param(
            WrongReturnSink({"schema_version": 2, "ok": True, "staging_key": "r/c1"}),
            id="returns-a-dict",
        ),
        pytest.param(WrongReturnSink(True), id="returns-true"),
        pytest.param(WrongReturnSink(StageResult(ok=False, error="queue closed")), id="ok-false"),
    ],
)
def test_a_failing_sink_fails_the_call(sink: object, caplog: pytest.LogCaptureFixture) -> None:
    capture = make_capture(sink)
    admission = root_admission()
    with caplog.at_level(logging.WARNING, logger="rollcap.staging"):
        coords = complete_root(capture, capture.begin_call(admission))
    assert_failed(coords, admission, 3)
    assert caplog.records


def test_a_legacy_sink_works_without_attachments_and_fails_with_them() -> None:
    sink = LegacySink()
    capture = make_capture(sink)
    assert complete_root(capture, capture.begin_call(root_admission("c1"))).staged
    assert complete_root(capture, capture.begin_call(root_admission("c2")), attachments=None).staged
    for call, attachments in (("c3", {"a.bin": b"x"}), ("c4", {})):
        admission = root_admission(call)
        coords = complete_root(capture, capture.begin_call(admission), attachments=attachments)
        assert_failed(coords, admission, 3)
    assert sink.inner.rollout_keys("r") == ["r/c1", "r/c2"]


def test_the_attachments_keyword_is_passed_only_for_a_mapping() -> None:
    sink = RecordingSink()
    capture = make_capture(sink)
    complete_root(capture, capture.begin_call(root_admission("c1")))
    complete_root(capture, capture.begin_call(root_admission("c2")), attachments={})
    complete_root(capture, capture.begin_call(root_admission("c3")), attachments={"a": b"1"})
    assert [(passed, given) for _, passed, given in sink.calls] == [
        (False, None),
        (True, {}),
        (True, {"a": b"1"}),
    ]


def test_fail_call_logs_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink, version=5)
    call, admission = child_call(capture)
    with caplog.at_level(logging.WARNING, logger="rollcap.staging"):
        coords = capture.fail_call(call, reason="engine error")
    assert_failed(coords, admission, 5)
    (log,) = [r for r in caplog.records if r.name == "rollcap.staging"]
    assert "engine error" in log.getMessage()
    assert sink.rollouts() == []
    # The version is the one stamped at begin_call, not the provider's now.
    call = capture.begin_call(root_admission(), weight_version=1)
    assert capture.fail_call(call, reason="x").weight_version == 1


# --- completes exactly once -----------------------------------------------------------------


@pytest.mark.parametrize("first", ["complete", "response", "fail"])
@pytest.mark.parametrize("second", ["complete", "response", "fail"])
def test_a_call_completes_once(first: str, second: str) -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink, adapter=VLLMCaptureAdapter())
    call = capture.begin_call(root_admission())

    def finish(how: str) -> CommitCoords:
        if how == "complete":
            return complete_root(capture, call)
        if how == "response":
            return capture.complete_call_from_response(call, engine_answer([1, 2], [3]))
        return capture.fail_call(call, reason="x")

    finish(first)
    with pytest.raises(CaptureError, match="already completed"):
        finish(second)
    assert len(sink.rollout_keys("r")) == (0 if first == "fail" else 1)


def test_racing_completions_of_one_call_answer_once() -> None:
    sink = InMemoryStagingSink()
    capture = make_capture(sink)
    call = capture.begin_call(root_admission())
    start = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def race() -> None:
        start.wait()
        try:
            complete_root(capture, call)
        except CaptureError:
            outcome = "refused"
        else:
            outcome = "done"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["done"] + ["refused"] * 7


def test_completions_run_concurrently_into_a_directory(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    capture = make_capture(sink)
    rollouts, calls_each = 8, 6
    start = threading.Barrier(rollouts)
    results: dict[str, list[CommitCoords]] = {}

    def one_rollout(index: int) -> None:
        rollout = f"roll-{index}"
        start.wait()
        coords = [
            complete_root(
                capture,
                capture.begin_call(root_admission(f"call-{n}", rollout)),
                generated_token_ids=[index, n],
                generated_logprobs=[-0.5, -0.25],
            )
            for n in range(calls_each)
        ]
        results[rollout] = coords

    threads = [threading.Thread(target=one_rollout, args=(i,)) for i in range(rollouts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sink.rollouts() == sorted(results)
    for rollout, coords in results.items():
        assert all(c.staged for c in coords)
        keys = [cast(str, c.staging_key) for c in coords]
        assert sink.rollout_keys(rollout) == sorted(keys)
        for snapshot, staged in zip(sink.fetch(keys), coords, strict=True):
            assert snapshot.digest == staged.digest
    # Nothing per call or per rollout stays behind in the capture.
    assert set(vars(capture)) == {"_sink", "_weight_version_fn", "_adapter"}


# --- construction and install (§5.1) --------------------------------------------------------


def test_the_capture_checks_what_it_is_given() -> None:
    with pytest.raises(TypeError, match="stage"):
        RolloutTokenCapture(sink=cast(Any, object()), weight_version_fn=lambda: 1)
    with pytest.raises(TypeError, match="callable"):
        RolloutTokenCapture(sink=InMemoryStagingSink(), weight_version_fn=cast(Any, 3))
    with pytest.raises(TypeError, match="extract_prompt_ids"):
        RolloutTokenCapture(
            sink=InMemoryStagingSink(), weight_version_fn=lambda: 1, adapter=cast(Any, object())
        )


def test_install_capture_on_a_host() -> None:
    host = CaptureHost()
    assert host.capture is None
    sink = InMemoryStagingSink()
    adapter = VLLMCaptureAdapter()
    capture = install_capture(host, sink=sink, weight_version_fn=lambda: 4, adapter=adapter)
    assert host.capture is capture
    assert capture.sink is sink
    assert capture.adapter is adapter
    assert capture.begin_call(root_admission()).weight_version == 4


@pytest.mark.parametrize(
    ("layer", "sink", "provider", "match"),
    [
        (object(), InMemoryStagingSink(), lambda: 1, "install_token_capture"),
        (CaptureHost(), object(), lambda: 1, "stage"),
        (CaptureHost(), InMemoryStagingSink(), 7, "callable"),
    ],
)
def test_install_capture_checks_its_arguments(
    layer: Any, sink: Any, provider: Any, match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        install_capture(layer, sink=sink, weight_version_fn=provider)
    if isinstance(layer, CaptureHost):
        assert layer.capture is None


def test_a_host_installs_only_captures() -> None:
    with pytest.raises(TypeError):
        CaptureHost().install_token_capture(cast(Any, object()))


def test_active_calls_are_frozen() -> None:
    call = make_capture().begin_call(root_admission())
    with pytest.raises(AttributeError):
        call.weight_version = 9  # type: ignore[misc]
    assert isinstance(call.admission, CaptureAdmission)
