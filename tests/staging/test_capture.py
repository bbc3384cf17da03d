"""RolloutTokenCapture: every call ends in one CommitCoords, staged only after the sink returned."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rollcap.staging import (
    CAPTURE_FAILED,
    REASON_CALL_FAILED,
    REASON_DUPLICATE_CALL,
    REASON_EXTRACTION_FAILED,
    REASON_INVALID_ADMISSION,
    REASON_INVALID_INPUT,
    REASON_NOT_IN_FLIGHT,
    REASON_PARENT_PREFIX_MISMATCH,
    REASON_REQUIRED_PREFIX_MISMATCH,
    REASON_SINK_FAILED,
    REASON_UNKNOWN_PARENT,
    ROOT_CHAIN_HASH,
    Admission,
    CommitCoords,
    DirectoryStagingSink,
    InMemoryStagingSink,
    RolloutTokenCapture,
    StagedCallRecord,
    VLLMCaptureAdapter,
    linearize,
)
from tests.staging._helpers import call_id, vllm_response


def new_capture(sink: Any = None, **kwargs: Any) -> tuple[RolloutTokenCapture, Any]:
    sink = InMemoryStagingSink() if sink is None else sink
    return RolloutTokenCapture(sink, VLLMCaptureAdapter(), 5, **kwargs), sink


def stage(
    capture: RolloutTokenCapture,
    rollout_id: str,
    model_call_id: str,
    prompt: list[int],
    generated: list[int],
    *,
    parent: str | None = None,
    pinned: tuple[int, ...] | None = None,
    **kwargs: Any,
) -> CommitCoords:
    call = capture.begin_call(Admission(rollout_id, model_call_id, parent, pinned))
    return capture.complete_call(
        call,
        prompt_token_ids=prompt,
        generated_token_ids=generated,
        generated_logprobs=[-0.5] * len(generated),
        **kwargs,
    )


def test_root_then_child_stage_deltas() -> None:
    capture, sink = new_capture()
    root = stage(capture, "0-0", "aa", [1, 2, 3], [4, 5])
    assert root.staged
    assert (root.prev_len, root.cum_len, root.parent_chain_hash) == (0, 5, ROOT_CHAIN_HASH)
    child = stage(capture, "0-0", "bb", [1, 2, 3, 4, 5, 6, 7], [8], parent="aa")
    assert child.staged
    assert (child.prev_len, child.cum_len) == (5, 8)
    assert child.parent_chain_hash == root.chain_hash
    first, second = sink.records
    assert first.token_ids == (1, 2, 3, 4, 5)
    assert first.loss_mask == (0, 0, 0, 1, 1)
    assert first.logprobs == (0.0, 0.0, 0.0, -0.5, -0.5)
    assert second.token_ids == (6, 7, 8)
    assert second.loss_mask == (0, 0, 1)
    assert second.weight_version == 5
    assert second.coords() == child


def test_coords_are_staged_only_after_the_sink_returned() -> None:
    events: list[str] = []

    class Sink:
        def stage(self, record: StagedCallRecord, *, attachments: Any = None) -> None:
            events.append("stage")
            raise OSError("disk gone")

    capture, _ = new_capture(Sink())
    coords = stage(capture, "0-0", "aa", [1], [2])
    assert events == ["stage"]
    assert coords.disposition == CAPTURE_FAILED
    assert coords.reason_code == REASON_SINK_FAILED
    assert "OSError: disk gone" in (coords.reason or "")
    assert coords.staging_key == "0-0/aa"
    # A failed parent is not remembered, so its child cannot stage either.
    capture.sink = InMemoryStagingSink()
    child = stage(capture, "0-0", "bb", [1, 2], [3], parent="aa")
    assert child.reason_code == REASON_UNKNOWN_PARENT


def test_child_prompt_must_start_with_the_parents_full_ids() -> None:
    capture, sink = new_capture()
    stage(capture, "0-0", "aa", [1, 2, 3], [4, 5])
    coords = stage(capture, "0-0", "bb", [1, 2, 3, 4, 9, 6], [7], parent="aa")
    assert coords.reason_code == REASON_PARENT_PREFIX_MISMATCH
    assert "first difference at 4" in (coords.reason or "")
    assert len(sink.records) == 1


def test_pinned_prefix_with_a_parent() -> None:
    capture, sink = new_capture()
    stage(capture, "0-0", "aa", [1, 2, 3], [4, 5])
    # The pin may cut into the parent's ids (a dropped reasoning tail), never disagree with them.
    coords = stage(capture, "0-0", "bb", [1, 2, 3, 4, 8, 9], [10], parent="aa", pinned=(1, 2, 3, 4))
    assert coords.staged
    assert (coords.prev_len, coords.cum_len) == (4, 7)
    assert sink.records[1].token_ids == (8, 9, 10)

    bad_pin = stage(capture, "0-0", "cc", [1, 2, 7], [1], parent="aa", pinned=(1, 2, 7))
    assert bad_pin.reason_code == REASON_PARENT_PREFIX_MISMATCH
    too_long = stage(
        capture, "0-0", "dd", [1, 2, 3, 4, 5, 6], [1], parent="aa", pinned=(1, 2, 3, 4, 5, 6)
    )
    assert too_long.reason_code == REASON_PARENT_PREFIX_MISMATCH


def test_a_prompt_that_ignores_the_pinned_prefix_fails_with_its_own_code() -> None:
    capture, _ = new_capture()
    coords = stage(capture, "0-0", "aa", [1, 2, 4], [5], pinned=(1, 2, 3))
    assert coords.reason_code == REASON_REQUIRED_PREFIX_MISMATCH
    stage(capture, "0-0", "bb", [1, 2, 3], [5])
    child = stage(capture, "0-0", "cc", [1, 9, 9], [5], parent="bb", pinned=(1, 2))
    assert child.reason_code == REASON_REQUIRED_PREFIX_MISMATCH


def test_a_root_with_a_pinned_prefix_inherits_nothing(tmp_path: Path) -> None:
    capture, _sink = new_capture(DirectoryStagingSink(tmp_path))
    coords = stage(capture, "0-0", "aa", [1, 2, 3, 4], [5], pinned=(1, 2))
    assert (coords.prev_len, coords.cum_len) == (0, 5)
    [chain] = linearize(tmp_path, "0-0")
    assert chain.token_ids == [1, 2, 3, 4, 5]


def test_unknown_parent_and_duplicates() -> None:
    capture, _ = new_capture()
    assert stage(capture, "0-0", "bb", [1], [2], parent="aa").reason_code == REASON_UNKNOWN_PARENT
    assert stage(capture, "0-0", "aa", [1], [2]).staged
    assert stage(capture, "0-0", "aa", [1], [2]).reason_code == REASON_DUPLICATE_CALL
    pending = capture.begin_call(Admission("0-0", "cc"))
    again = capture.begin_call(Admission("0-0", "cc"))
    assert again.failure is not None
    assert again.failure.startswith(REASON_DUPLICATE_CALL)
    assert capture.fail_call(again, "x").reason_code == REASON_CALL_FAILED
    assert capture.complete_call(
        pending, prompt_token_ids=[1], generated_token_ids=[], generated_logprobs=[]
    ).staged


@pytest.mark.parametrize(
    ("prompt", "generated", "logprobs", "extras", "attachments", "message"),
    [
        ("1 2 3", [1], [-1.0], None, None, "prompt_token_ids"),
        ([1, True], [1], [-1.0], None, None, "prompt_token_ids"),
        ([1], [1.0], [-1.0], None, None, "generated_token_ids"),
        ([1], [-1], [-1.0], None, None, "generated_token_ids"),
        ([1], [1, 2], [-1.0], None, None, "2 generated ids"),
        ([1], [1], [float("nan")], None, None, "NaN"),
        ([1], [1], [1e300], None, None, "NaN or an infinity"),
        ([1], [1], ["-1"], None, None, "numbers"),
        ([1], [1], None, None, None, "generated_logprobs"),
        ([1], [1], [-1.0], [("a", 1)], None, "extras"),
        ([1], [1], [-1.0], {"x": float("inf")}, None, "extras"),
        ([1], [1], [-1.0], {"x": b"raw"}, None, "extras"),
        ([1], [1], [-1.0], None, [("a", b"1")], "attachments"),
    ],
)
def test_bad_input_types_give_capture_failed_not_exceptions(
    prompt: Any,
    generated: Any,
    logprobs: Any,
    extras: Any,
    attachments: Any,
    message: str,
) -> None:
    capture, sink = new_capture()
    call = capture.begin_call(Admission("0-0", "aa"))
    coords = capture.complete_call(
        call,
        prompt_token_ids=prompt,
        generated_token_ids=generated,
        generated_logprobs=logprobs,
        extras=extras,
        attachments=attachments,
    )
    assert coords.reason_code == REASON_INVALID_INPUT
    assert message in (coords.reason or "")
    assert sink.records == []
    # The key is released: the worker may retry the call under the same id.
    assert stage(capture, "0-0", "aa", [1], [2]).staged


def test_logprobs_are_rounded_to_binary32() -> None:
    capture, sink = new_capture()
    call = capture.begin_call(Admission("0-0", "aa"))
    coords = capture.complete_call(
        call, prompt_token_ids=[1], generated_token_ids=[2], generated_logprobs=[-0.1]
    )
    assert coords.staged
    assert sink.records[0].logprobs == (0.0, -0.10000000149011612)


def test_complete_twice_and_foreign_calls() -> None:
    capture, _ = new_capture()
    call = capture.begin_call(Admission("0-0", "aa"))
    assert capture.complete_call(
        call, prompt_token_ids=[1], generated_token_ids=[], generated_logprobs=[]
    ).staged
    twice = capture.complete_call(
        call, prompt_token_ids=[1], generated_token_ids=[], generated_logprobs=[]
    )
    assert twice.reason_code == REASON_NOT_IN_FLIGHT
    other, _ = new_capture()
    foreign = other.begin_call(Admission("0-0", "bb"))
    assert (
        capture.complete_call(
            foreign, prompt_token_ids=[1], generated_token_ids=[], generated_logprobs=[]
        ).reason_code
        == REASON_NOT_IN_FLIGHT
    )
    not_a_call = capture.complete_call(
        "0-0/aa",  # type: ignore[arg-type]
        prompt_token_ids=[1],
        generated_token_ids=[],
        generated_logprobs=[],
    )
    assert not_a_call.reason_code == REASON_INVALID_INPUT


def test_begin_call_accepts_the_json_admission_and_never_raises() -> None:
    capture, _ = new_capture()
    call = capture.begin_call({"rollout_id": "0-0", "model_call_id": "aa"})
    assert call.failure is None
    assert call.staging_key == "0-0/aa"
    bad = capture.begin_call({"rollout_id": "0-0", "model_call_id": "../x"})
    assert bad.failure is not None
    assert bad.failure.startswith(REASON_INVALID_ADMISSION)
    coords = capture.complete_call(
        bad, prompt_token_ids=[1], generated_token_ids=[], generated_logprobs=[]
    )
    assert coords.reason_code == REASON_INVALID_ADMISSION
    assert coords.model_call_id == "../x"
    garbage = capture.begin_call(42)  # type: ignore[arg-type]
    assert capture.fail_call(garbage, "x").staging_key == ""


def test_fail_call_releases_the_key() -> None:
    capture, sink = new_capture()
    call = capture.begin_call(Admission("0-0", "aa"))
    coords = capture.fail_call(call, "upstream returned 500")
    assert coords.reason == "call_failed: upstream returned 500"
    assert coords.staging_key == "0-0/aa"
    assert sink.records == []
    assert stage(capture, "0-0", "aa", [1], [2]).staged


def test_complete_from_response_and_extraction_failures() -> None:
    capture, sink = new_capture()
    call = capture.begin_call(Admission("0-0", "aa"))
    response = vllm_response([1, 2], [3, 4], [-0.25, -0.5])
    response["choices"][0]["routed_experts"] = [[1, 2], [3, 4]]
    coords = capture.complete_call_from_response(call, response)
    assert coords.staged
    assert sink.records[0].extras == {"routed_experts": [[1, 2], [3, 4]]}
    assert sink.records[0].logprobs == (0.0, 0.0, -0.25, -0.5)

    call = capture.begin_call(Admission("0-0", "bb", "aa"))
    response = vllm_response([1, 2, 3, 4, 5], [6], [-1.0])
    response["choices"].append(response["choices"][0])
    coords = capture.complete_call_from_response(call, response)
    assert coords.reason_code == REASON_EXTRACTION_FAILED
    assert "exactly one" in (coords.reason or "")

    class Broken(VLLMCaptureAdapter):
        def extract_extras(self, response: Mapping[str, Any]) -> dict[str, Any] | None:
            raise KeyError("boom")

    broken = RolloutTokenCapture(InMemoryStagingSink(), Broken(), 0)
    call = broken.begin_call(Admission("0-0", "aa"))
    failed = broken.complete_call_from_response(call, vllm_response([1], [2], [-1.0]))
    assert failed.reason_code == REASON_EXTRACTION_FAILED
    assert "KeyError" in (failed.reason or "")


# -- attachments ------------------------------------------------------------------------------


class LegacySink:
    """A sink written before attachments existed: stage(record) only.

    ``stage`` counts every invocation before Python binds the arguments to the legacy
    signature, so a call that fails on the unexpected keyword still counts as an attempt.
    """

    def __init__(self) -> None:
        self.attempts = 0
        self.records: list[StagedCallRecord] = []

    def _legacy_stage(self, record: StagedCallRecord) -> None:
        self.records.append(record)

    def stage(self, *args: Any, **kwargs: Any) -> None:
        self.attempts += 1
        self._legacy_stage(*args, **kwargs)


def test_attachments_never_change_records_digests_or_coords(tmp_path: Path) -> None:
    results = []
    for attachments in (None, {"image": b"\x00\x01"}):
        sink = DirectoryStagingSink(tmp_path / ("with" if attachments else "without"))
        capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 1)
        call = capture.begin_call(Admission("0-0", "aa"))
        coords = capture.complete_call(
            call,
            prompt_token_ids=[1, 2],
            generated_token_ids=[3],
            generated_logprobs=[-1.0],
            extras={"media_spans": [[0, 1]]},
            attachments=attachments,
        )
        [record] = sink.read("0-0")
        results.append((coords, record, sink.read_attachments("0-0/aa")))
    (coords_a, record_a, stored_a), (coords_b, record_b, stored_b) = results
    assert coords_a.staged
    assert coords_b.staged
    assert coords_a == coords_b
    assert record_a == record_b
    assert record_b.extras == {"media_spans": [[0, 1]]}
    assert (stored_a, stored_b) == ({}, {"image": b"\x00\x01"})


def test_a_legacy_sink_given_attachments_fails_after_exactly_one_attempt() -> None:
    sink = LegacySink()
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 1)
    coords = stage(capture, "0-0", "aa", [1], [2], attachments={"a": b"1"})
    assert coords.reason_code == REASON_SINK_FAILED
    assert "TypeError" in (coords.reason or "")
    assert "attachments" in (coords.reason or "")
    assert sink.attempts == 1
    assert sink.records == []


def test_a_legacy_sink_without_attachments_stages() -> None:
    sink = LegacySink()
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 1)
    assert stage(capture, "0-0", "aa", [1], [2]).staged
    assert sink.attempts == 1


def test_an_empty_attachments_mapping_is_still_forwarded() -> None:
    seen: list[Any] = []

    class Sink:
        def stage(self, record: StagedCallRecord, *, attachments: Any = "absent") -> None:
            seen.append(attachments)

    capture = RolloutTokenCapture(Sink(), VLLMCaptureAdapter(), 1)
    stage(capture, "0-0", "aa", [1], [2])
    stage(capture, "0-0", "bb", [1], [2], attachments={})
    assert seen == ["absent", {}]


def test_a_directory_stage_that_fails_part_way_stages_nothing(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 1)
    coords = stage(capture, "0-0", "aa", [1], [2], attachments={"ok": b"1", "bad": "str"})
    assert coords.reason_code == REASON_SINK_FAILED
    assert sink.read("0-0") == []


# -- memory and configuration -----------------------------------------------------------------


class _WriteOnlySink:
    """A sink that cannot read its records back: nothing forgotten can be recovered."""

    def stage(self, record: StagedCallRecord, *, attachments: Any = None) -> None:
        pass


def test_memory_is_bounded_and_forget_drops_a_rollout() -> None:
    capture, _ = new_capture(_WriteOnlySink(), max_rollouts=2)
    for rollout in ("1-0", "2-0", "3-0"):
        assert stage(capture, rollout, "aa", [1], [2]).staged
    assert capture.remembered_rollouts == ["2-0", "3-0"]
    assert (
        stage(capture, "1-0", "bb", [1, 2], [3], parent="aa").reason_code == REASON_UNKNOWN_PARENT
    )
    # Using a rollout makes it the most recent one.
    assert stage(capture, "2-0", "bb", [1, 2], [3], parent="aa").staged
    assert stage(capture, "4-0", "aa", [1], [2]).staged
    assert capture.remembered_rollouts == ["2-0", "4-0"]
    capture.forget("2-0")
    assert capture.remembered_rollouts == ["4-0"]
    assert stage(capture, "2-0", "cc", [1, 2, 3], [4], parent="bb").reason_code == (
        REASON_UNKNOWN_PARENT
    )


def test_a_forgotten_or_evicted_rollout_is_recovered_from_a_readable_sink() -> None:
    capture, sink = new_capture(max_rollouts=1)
    assert stage(capture, "1-0", "aa", [1], [2]).staged
    assert stage(capture, "2-0", "aa", [1], [2]).staged  # evicts 1-0 from memory
    assert capture.remembered_rollouts == ["2-0"]
    assert stage(capture, "1-0", "bb", [1, 2, 7], [3], parent="aa").staged
    capture.forget("1-0")
    assert stage(capture, "1-0", "cc", [1, 2, 7, 3, 8], [4], parent="bb").staged
    (chain,) = linearize(sink, "1-0")
    assert list(chain.token_ids) == [1, 2, 7, 3, 8, 4]
    assert list(chain.loss_mask) == [0, 1, 0, 1, 0, 1]


def test_a_restarted_capture_continues_a_rollout_staged_in_its_directory(tmp_path: Path) -> None:
    first = RolloutTokenCapture(DirectoryStagingSink(tmp_path), VLLMCaptureAdapter(), 1)
    assert stage(first, "0-0", "aa", [1], [2]).staged
    restarted = RolloutTokenCapture(DirectoryStagingSink(tmp_path), VLLMCaptureAdapter(), 1)
    assert stage(restarted, "0-0", "bb", [1, 2, 9], [3], parent="aa").staged
    (chain,) = linearize(tmp_path, "0-0")
    assert list(chain.model_call_ids) == ["aa", "bb"]


def test_a_tampered_record_is_not_trusted_for_recovery(tmp_path: Path) -> None:
    first = RolloutTokenCapture(DirectoryStagingSink(tmp_path), VLLMCaptureAdapter(), 1)
    assert stage(first, "0-0", "aa", [1], [2]).staged
    path = tmp_path / "0-0" / "aa" / "record.json"
    original = path.read_bytes()
    tampered = original.replace(b'"token_ids":[1,2]', b'"token_ids":[1,5]')
    assert tampered != original
    path.write_bytes(tampered)
    restarted = RolloutTokenCapture(DirectoryStagingSink(tmp_path), VLLMCaptureAdapter(), 1)
    coords = stage(restarted, "0-0", "bb", [1, 5, 9], [3], parent="aa")
    assert coords.reason_code == REASON_UNKNOWN_PARENT


def test_a_call_keeps_the_weight_version_it_began_with() -> None:
    capture, sink = new_capture()
    call = capture.begin_call(Admission("0-0", "aa"))
    capture.set_weight_version(6)
    capture.complete_call(call, prompt_token_ids=[1], generated_token_ids=[], generated_logprobs=[])
    stage(capture, "0-0", "bb", [1], [], parent="aa")
    assert [r.weight_version for r in sink.records] == [5, 6]
    assert capture.weight_version == 6


@pytest.mark.parametrize("bad", [-1, True, "1", 2**64])
def test_weight_version_must_be_a_uint64(bad: Any) -> None:
    with pytest.raises(ValueError, match="weight_version"):
        RolloutTokenCapture(InMemoryStagingSink(), VLLMCaptureAdapter(), bad)


def test_constructor_checks_its_configuration() -> None:
    with pytest.raises(TypeError, match="stage"):
        RolloutTokenCapture(object(), VLLMCaptureAdapter(), 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_rollouts"):
        RolloutTokenCapture(InMemoryStagingSink(), VLLMCaptureAdapter(), 0, max_rollouts=0)


# -- threads ----------------------------------------------------------------------------------


def test_threads_stage_many_rollouts_and_share_parents(tmp_path: Path) -> None:
    sink = DirectoryStagingSink(tmp_path)
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 1, max_rollouts=1000)
    rollouts = [f"{n}-0" for n in range(6)]
    roots = {r: call_id() for r in rollouts}
    for rollout in rollouts:
        assert stage(capture, rollout, roots[rollout], [1, 2], [3]).staged
    results: list[CommitCoords] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker(index: int) -> None:
        barrier.wait()
        for rollout in rollouts:
            # Each thread grows its own branch under every rollout's shared root.
            parent = roots[rollout]
            prompt = [1, 2, 3]
            for turn in range(3):
                model_call_id = call_id()
                generated = [100 + index, turn]
                coords = stage(
                    capture,
                    rollout,
                    model_call_id,
                    prompt,
                    generated,
                    parent=parent,
                )
                with lock:
                    results.append(coords)
                prompt = [*prompt, *generated, 9]
                parent = model_call_id

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 6 * 6 * 3
    assert all(c.staged for c in results), [c.reason for c in results if not c.staged][:3]
    for rollout in rollouts:
        chains = linearize(tmp_path, rollout)
        assert len(chains) == 6
        leaves = {tuple(chain.token_ids) for chain in chains}
        expected = set()
        for index in range(6):
            ids = [1, 2, 3]
            for turn in range(3):
                ids = [*ids, 100 + index, turn] + ([9] if turn < 2 else [])
            expected.add(tuple(ids))
        assert leaves == expected


def test_threads_racing_for_one_key_stage_it_once() -> None:
    capture, sink = new_capture()
    barrier = threading.Barrier(8)
    results: list[CommitCoords] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        coords = stage(capture, "0-0", "aa", [1], [2])
        with lock:
            results.append(coords)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(c.staged for c in results) == 1
    assert {c.reason_code for c in results if not c.staged} == {REASON_DUPLICATE_CALL}
    assert len(sink.records) == 1
