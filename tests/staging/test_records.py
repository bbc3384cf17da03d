"""The wire models: strict parsing, the shapes of STAGING §1.1, §2, §4.1, §4.3, §5.1 and §7.1."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from rollcap.staging._digest import EMPTY_EXTRAS_DIGEST
from rollcap.staging._records import (
    CallRecord,
    CaptureAdmission,
    CommitCoords,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedRecordError,
    StageResult,
    parse_staged_record,
    staging_key,
)

CHAIN = "0489a3eeb520deb2e49ffd40fdfc94cc0a71b6aaa0c83fff340e99015a9f9608"
# STAGING §1.4: the admission the gate sent with the second call of a Responses rollout.
OBSERVED_ADMISSION: dict[str, Any] = {
    "schema_version": 2,
    "rollout_id": "r1",
    "model_call_id": "2a4ba8c560c94b50b2508d29b2888b7d",
    "parent_call_id": "1f320141da30434288cc5420be1db187",
    "prev_len": 5,
    "mode": "token_in",
    "required_prefix_token_ids": [],
    "staging_chain": ["r1/1f320141da30434288cc5420be1db187"],
    "parent_chain_hash": CHAIN,
}
# STAGING §3.5: the root record.
ROOT_RECORD: dict[str, Any] = orjson.loads(
    b'{"schema_version": 2, "digest_version": 2, "extras_digest_version": 1, "rollout_id": "0-0",'
    b' "model_call_id": "0a1b", "parent_call_id": null, "mode": "text", "prev_len": 0,'
    b' "delta_len": 5, "cum_len": 5, "weight_version": 7,'
    b' "digest": "45abfc67c351e4e4dd43b42c9cbefedd1c4c79d12864609d6706b6219ed1313d",'
    b' "token_ids_delta": [1, 104, 105, 42, 2], "token_mask_delta": [0.0, 0.0, 0.0, 1.0, 1.0],'
    b' "generation_log_probs_delta": [0.0, 0.0, 0.0, -0.5, -1.25],'
    b' "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",'
    b' "chain_hash": "e606f3fac05e3eaa16232343e63807f62088cf8a2fb8c0140de69d82e5a289e6",'
    b' "cumulative_hash": "f068b6cf29511f34cf31a38e89e396bf66de10d8ba764f2ed4b95865026fb4f0",'
    b' "extras": null}'
)
# STAGING §3.5: the root's staged coordinates and the failed call's.
ROOT_COORDS: dict[str, Any] = {
    **{k: ROOT_RECORD[k] for k in ("schema_version", "digest_version", "extras_digest_version")},
    "rollout_id": "0-0",
    "model_call_id": "0a1b",
    "parent_call_id": None,
    "prev_len": 0,
    "delta_len": 5,
    "cum_len": 5,
    "weight_version": 7,
    "disposition": "staged",
    "digest": ROOT_RECORD["digest"],
    "extras_digest": EMPTY_EXTRAS_DIGEST,
    "staging_key": "0-0/0a1b",
    "chain_hash": ROOT_RECORD["chain_hash"],
    "cumulative_hash": ROOT_RECORD["cumulative_hash"],
}
FAILED_COORDS: dict[str, Any] = {
    "schema_version": 2,
    "digest_version": 2,
    "extras_digest_version": 1,
    "rollout_id": "0-0",
    "model_call_id": "0f40",
    "parent_call_id": "0e3f",
    "prev_len": 18,
    "delta_len": 0,
    "cum_len": 18,
    "weight_version": 9,
    "disposition": "capture_failed",
    "digest": None,
    "extras_digest": None,
    "staging_key": None,
    "chain_hash": None,
    "cumulative_hash": None,
}


def _row(**change: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "model_call_id": "0a1b",
        "parent_call_id": None,
        "prev_len": 0,
        "delta_len": 5,
        "cum_len": 5,
        "weight_version": 7,
        "digest": ROOT_RECORD["digest"],
        "extras_digest": EMPTY_EXTRAS_DIGEST,
        "staging_key": "0-0/0a1b",
        "mode": "text",
        "chain_hash": ROOT_RECORD["chain_hash"],
        "cumulative_hash": ROOT_RECORD["cumulative_hash"],
        "response_id": "chatcmpl-1",
    }
    return {**row, **change}


def test_the_observed_admission_round_trips_with_all_nine_keys() -> None:
    admission = CaptureAdmission.model_validate(OBSERVED_ADMISSION)
    assert admission.model_dump(mode="json") == OBSERVED_ADMISSION
    assert list(admission.model_dump(mode="json")) == list(OBSERVED_ADMISSION)
    root = CaptureAdmission(rollout_id="r1", model_call_id="c", mode="text")
    assert root.model_dump(mode="json") == {
        "schema_version": 2,
        "rollout_id": "r1",
        "model_call_id": "c",
        "parent_call_id": None,
        "prev_len": 0,
        "mode": "text",
        "required_prefix_token_ids": [],
        "staging_chain": [],
        "parent_chain_hash": None,
    }


@pytest.mark.parametrize(
    "change",
    [
        {"schema_version": 1},
        {"schema_version": True},
        {"prev_len": 5.0},
        {"rollout_id": 5},
        {"rollout_id": ""},
        {"staging_chain": None},
        {"unknown": 1},
        {"mode": "tokens"},
        {"parent_call_id": None},
        {"prev_len": 0},
        {"parent_chain_hash": None},
        {"parent_chain_hash": CHAIN.upper()},
        {"staging_chain": [], "required_prefix_token_ids": [1, 2]},
        {"required_prefix_token_ids": [-1]},
        {"mode": "text"},
    ],
)
def test_an_admission_that_breaks_a_rule_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CaptureAdmission.model_validate({**OBSERVED_ADMISSION, **change})


def test_an_inline_prefix_must_hold_prev_len_ids() -> None:
    inline = {**OBSERVED_ADMISSION, "staging_chain": [], "required_prefix_token_ids": [1] * 5}
    assert CaptureAdmission.model_validate(inline).required_prefix_token_ids == [1] * 5


def test_a_record_parses_proving_its_digest_and_keeps_the_wire_order() -> None:
    record = StagedCallRecord.model_validate(ROOT_RECORD)
    assert record.model_dump(mode="json") == ROOT_RECORD
    assert list(record.model_dump(mode="json")) == list(ROOT_RECORD)
    assert record.staging_key == "0-0/0a1b"
    assert record.base().model_dump(mode="json") == {
        k: v for k, v in ROOT_RECORD.items() if k != "extras"
    }


def test_json_integers_in_the_float_columns_become_floats() -> None:
    record = StagedCallRecord.model_validate({**ROOT_RECORD, "token_mask_delta": [0, 0, 0, 1, 1]})
    assert record.token_mask_delta == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert all(type(v) is float for v in record.token_mask_delta)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"weight_version": 8}, "staged digest mismatch"),
        ({"token_ids_delta": [1, 104, 105, 42, 3]}, "staged digest mismatch"),
        ({"extras": {}}, "extras digest mismatch"),
        ({"delta_len": 4, "cum_len": 4}, "number of token ids"),
        ({"mode": "token_in"}, "without a parent"),
        ({"generation_log_probs_delta": [0.0, 0.0, 0.0, -0.5, float("nan")]}, "finite"),
    ],
)
def test_a_tampered_record_is_refused(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StagedCallRecord.model_validate({**ROOT_RECORD, **change})


def test_a_base_snapshot_refuses_extras() -> None:
    with pytest.raises(ValueError, match="extras"):
        StagedCallBaseSnapshot.model_validate(ROOT_RECORD)
    base = {k: v for k, v in ROOT_RECORD.items() if k != "extras"}
    assert StagedCallBaseSnapshot.model_validate(base).digest == ROOT_RECORD["digest"]


def test_parse_names_a_schema_1_record_and_other_faults() -> None:
    with pytest.raises(StagedRecordError, match="schema_version 1"):
        parse_staged_record(b'{"schema_version": 1, "token_ids": [1], "loss_mask": [1]}')
    with pytest.raises(StagedRecordError, match="not JSON"):
        parse_staged_record(b'{"schema_version": 2,')
    with pytest.raises(StagedRecordError, match="JSON object"):
        parse_staged_record(b"[]")
    with pytest.raises(StagedRecordError, match="schema-2"):
        parse_staged_record(orjson.dumps({**ROOT_RECORD, "weight_version": 8}))
    assert parse_staged_record(orjson.dumps(ROOT_RECORD)).model_call_id == "0a1b"


def test_staged_and_failed_coords_have_their_shapes() -> None:
    staged = CommitCoords.model_validate(ROOT_COORDS)
    assert staged.staged
    assert staged.model_dump(mode="json") == ROOT_COORDS
    assert list(staged.model_dump(mode="json")) == list(ROOT_COORDS)
    failed = CommitCoords.model_validate(FAILED_COORDS)
    assert not failed.staged
    assert failed.model_dump(mode="json") == FAILED_COORDS


@pytest.mark.parametrize(
    ("base", "change"),
    [
        (ROOT_COORDS, {"staging_key": None}),
        (ROOT_COORDS, {"delta_len": 0, "cum_len": 0}),
        (ROOT_COORDS, {"cum_len": 6}),
        (ROOT_COORDS, {"parent_call_id": "p"}),
        (ROOT_COORDS, {"reason": "x"}),
        (FAILED_COORDS, {"staging_key": "0-0/0f40"}),
        (FAILED_COORDS, {"delta_len": 1, "cum_len": 19}),
        (FAILED_COORDS, {"prev_len": 0, "cum_len": 0}),
    ],
)
def test_coords_that_break_a_rule_are_refused(base: dict[str, Any], change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CommitCoords.model_validate({**base, **change})


def test_stage_results() -> None:
    assert StageResult(ok=True, staging_key="k").model_dump(mode="json") == {
        "schema_version": 2,
        "ok": True,
        "staging_key": "k",
        "error": None,
    }
    with pytest.raises(ValueError, match="staging_key"):
        StageResult(ok=True)
    with pytest.raises(ValueError, match="error"):
        StageResult(ok=False, error="")


def test_call_records_and_manifests() -> None:
    row = CallRecord.model_validate(_row(admitted_at=1796150114.0349722, fingerprint_version=2))
    assert list(row.model_dump(mode="json"))[-5:] == [
        "response_id",
        "admitted_at",
        "output_fingerprint",
        "continuation_fingerprint",
        "fingerprint_version",
    ]
    assert CallRecord.model_validate(_row(admitted_at=5)).admitted_at == 5.0
    for bad in (_row(response_id=""), _row(delta_len=0, cum_len=0), _row(mode="token_in")):
        with pytest.raises(ValidationError):
            CallRecord.model_validate(bad)
    manifest = RolloutManifest.model_validate(
        {
            "schema_version": 2,
            "rollout_id": "r1",
            "records": [_row()],
            "failures": [
                {"schema_version": 2, "model_call_id": "x", "reason": "unresolved_parent"}
            ],
        }
    )
    assert manifest.failures[0].reason == "unresolved_parent"
    assert RolloutManifest(rollout_id="r").model_dump(mode="json") == {
        "schema_version": 2,
        "rollout_id": "r",
        "records": [],
        "failures": [],
    }


def test_a_receipt_has_three_states_only() -> None:
    rows = [CallRecord.model_validate(_row())]
    trainable = RolloutReceipt(
        rollout_id="0-0",
        manifest=rows,
        terminal_model_call_id="0a1b",
        terminal_selection="declared",
    )
    assert not trainable.capture_poisoned
    RolloutReceipt(
        rollout_id="0-0",
        manifest=rows,
        capture_poisoned=True,
        terminal_model_call_id="0a1b",
        terminal_selection="heuristic",
    )
    RolloutReceipt(rollout_id="0-0", capture_poisoned=True, failure_reason="worker_capture_failed")
    declared = {"terminal_selection": "declared"}
    for bad in (
        {"manifest": rows, **declared},  # trainable without a terminal
        {"manifest": rows, "terminal_model_call_id": "0a1b"},  # a terminal chosen by nothing
        {"failure_reason": "x"},  # a failure that does not poison
        {"capture_poisoned": True},  # no attribution, no reason
        {"manifest": rows, "terminal_model_call_id": "zz", **declared},
        {"manifest": rows * 2, "terminal_model_call_id": "0a1b", **declared},
    ):
        with pytest.raises(ValidationError):
            RolloutReceipt.model_validate({"rollout_id": "0-0", **bad})


def test_staging_keys() -> None:
    assert staging_key("0-0", "0a1b") == "0-0/0a1b"
    with pytest.raises(ValueError, match="non-empty"):
        staging_key("", "c")
