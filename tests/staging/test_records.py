"""Admission, CommitCoords and StagedCallRecord: JSON both ways, and refusal of bad shapes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.staging import (
    CAPTURE_FAILED,
    ROOT_CHAIN_HASH,
    STAGED,
    Admission,
    CommitCoords,
    StagedCallRecord,
    validate_model_call_id,
)

H = "ab" * 32


def make_record(**overrides: Any) -> StagedCallRecord:
    fields: dict[str, Any] = {
        "rollout_id": "3-1",
        "model_call_id": "c0ffee",
        "parent_model_call_id": None,
        "parent_chain_hash": ROOT_CHAIN_HASH,
        "prev_len": 0,
        "token_ids": [5, 6, 7],
        "loss_mask": [0, 1, 1],
        "logprobs": [0.0, -0.5, -0.25],
        "weight_version": 2,
        "extras": {"routed_experts": [[1, 2]]},
    }
    fields.update(overrides)
    return StagedCallRecord.create(**fields)


# -- Admission --------------------------------------------------------------------------------


def test_admission_round_trips_and_names_its_key() -> None:
    body = {
        "rollout_id": "0-0",
        "model_call_id": "aa",
        "parent_model_call_id": "bb",
        "required_prefix_token_ids": [1, 2],
    }
    admission = Admission.from_json(body)
    assert admission.required_prefix_token_ids == (1, 2)
    assert admission.staging_key == "0-0/aa"
    assert admission.to_json() == body
    assert Admission.from_json({"rollout_id": "0-0", "model_call_id": "aa"}).to_json() == {
        "rollout_id": "0-0",
        "model_call_id": "aa",
        "parent_model_call_id": None,
        "required_prefix_token_ids": None,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("not an object", "ng_capture"),
        ({"model_call_id": "aa"}, "rollout_id"),
        ({"rollout_id": "0-0"}, "model_call_id"),
        ({"rollout_id": "../etc", "model_call_id": "aa"}, "rollout_id"),
        ({"rollout_id": "0-0", "model_call_id": "../aa"}, "model_call_id"),
        ({"rollout_id": "0-0", "model_call_id": "AA"}, "model_call_id"),
        ({"rollout_id": "0-0", "model_call_id": "aa", "parent_model_call_id": 5}, "parent"),
        ({"rollout_id": "0-0", "model_call_id": "aa", "parent_model_call_id": "aa"}, "parent"),
        ({"rollout_id": "0-0", "model_call_id": "aa", "required_prefix_token_ids": "12"}, "prefix"),
        (
            {"rollout_id": "0-0", "model_call_id": "aa", "required_prefix_token_ids": [1, True]},
            "prefix",
        ),
        ({"rollout_id": "0-0", "model_call_id": "aa", "required_prefix_token_ids": [-1]}, "prefix"),
    ],
)
def test_admission_refuses_bad_fields_by_name(body: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Admission.from_json(body)


def test_model_call_ids_are_lowercase_hex() -> None:
    assert validate_model_call_id("0123456789abcdef" * 4) == "0123456789abcdef" * 4
    for bad in ("", "g", "a" * 65, "a/b", "a\n", "..", 12):
        with pytest.raises(ValueError, match="model_call_id"):
            validate_model_call_id(bad)


# -- CommitCoords -----------------------------------------------------------------------------


def test_staged_coords_round_trip_through_json() -> None:
    coords = make_record().coords()
    assert coords.staged
    assert coords.reason is None
    assert coords.reason_code is None
    again = CommitCoords.from_json(orjson.loads(orjson.dumps(coords.to_json())))
    assert again == coords
    assert set(coords.to_json()) == {
        "disposition",
        "staging_key",
        "rollout_id",
        "model_call_id",
        "prev_len",
        "cum_len",
        "digest",
        "extras_digest",
        "chain_hash",
        "parent_chain_hash",
        "reason",
    }


def test_failed_coords_carry_a_reason_code() -> None:
    coords = CommitCoords.failed(
        "sink_failed", "OSError: disk full", rollout_id="1-0", model_call_id="ab"
    )
    assert not coords.staged
    assert coords.disposition == CAPTURE_FAILED
    assert coords.staging_key == "1-0/ab"
    assert coords.reason == "sink_failed: OSError: disk full"
    assert coords.reason_code == "sink_failed"
    assert coords.cum_len is None
    assert coords.digest is None
    assert CommitCoords.from_json(coords.to_json()) == coords


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"disposition": "maybe"}, "disposition"),
        ({"staging_key": "1-0/other"}, "staging_key"),
        ({"cum_len": -1}, "cum_len"),
        ({"cum_len": True}, "cum_len"),
        ({"digest": "AB" * 32}, "digest"),
        ({"chain_hash": None}, "chain_hash"),
        ({"reason": "staged with a reason"}, "reason"),
        ({"disposition": CAPTURE_FAILED}, "reason"),
        ({"disposition": CAPTURE_FAILED, "reason": ""}, "reason"),
    ],
)
def test_coords_refuse_inconsistent_fields(change: dict[str, Any], field: str) -> None:
    body = make_record(rollout_id="1-0", model_call_id="ab").coords().to_json()
    body.update(change)
    with pytest.raises(ValueError, match=field):
        CommitCoords.from_json(body)


def test_coords_from_json_requires_the_identity_fields() -> None:
    with pytest.raises(ValueError, match="disposition"):
        CommitCoords.from_json({"staging_key": "", "rollout_id": "", "model_call_id": ""})
    with pytest.raises(ValueError, match="ng_commit_coords"):
        CommitCoords.from_json([STAGED])


# -- StagedCallRecord -------------------------------------------------------------------------


def test_record_round_trips_through_json_exactly() -> None:
    record = make_record()
    data = record.to_json()
    assert data["schema_version"] == 1
    assert data["staging_key"] == "3-1/c0ffee"
    assert data["cum_len"] == 3
    again = StagedCallRecord.from_json(orjson.loads(orjson.dumps(data)))
    assert again == record
    assert again.to_json() == data


def test_record_keeps_a_private_copy_of_extras() -> None:
    extras: dict[str, Any] = {"spans": [[0, 2]]}
    record = make_record(extras=extras)
    extras["spans"].append([3, 4])
    assert record.extras == {"spans": [[0, 2]]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema_version": 2}, "schema_version"),
        ({"schema_version": True}, "schema_version"),
        ({"token_ids": [1, 2, "3"]}, "token_ids"),
        ({"token_ids": [1, 2, 3.0]}, "token_ids"),
        ({"token_ids": [1, 2, 2**64]}, "token_ids"),
        ({"loss_mask": [0, 1, 2]}, "loss_mask"),
        ({"loss_mask": [0, 1, 1.0]}, "loss_mask"),
        ({"logprobs": [0.0, -0.5, 0.1]}, "binary32"),
        ({"logprobs": [0.0, -0.5, None]}, "logprobs"),
        ({"logprobs": [0.0, -0.5]}, "length"),
        ({"extras": None}, "extras"),
        ({"extras": {"x": None, "y": [1e400]}}, "extras"),
        ({"digest": "0" * 63}, "digest"),
        ({"prev_len": -1}, "prev_len"),
        ({"weight_version": "7"}, "weight_version"),
        ({"staging_key": "3-1/other"}, "staging_key"),
        ({"cum_len": 99}, "cum_len"),
        ({"rollout_id": "3-2"}, "staging_key"),
        ({"model_call_id": "C0FFEE"}, "model_call_id"),
    ],
)
def test_record_from_json_refuses_bad_fields_by_name(change: dict[str, Any], field: str) -> None:
    body = make_record().to_json()
    body.update(change)
    with pytest.raises(ValueError, match=field):
        StagedCallRecord.from_json(body)


def test_record_from_json_requires_every_field() -> None:
    body = make_record().to_json()
    del body["parent_chain_hash"]
    with pytest.raises(ValueError, match="parent_chain_hash is missing"):
        StagedCallRecord.from_json(body)
