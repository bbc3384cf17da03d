"""verify_and_linearize: STAGING §7.2's row for §3.5's chain, and every refusal code built."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from rollcap.staging._digest import (
    EMPTY_EXTRAS_DIGEST,
    compute_chain_hash,
    compute_staging_digest,
    hash_token_ids,
)
from rollcap.staging._rebuild import (
    RebuildError,
    ReceiptVerificationError,
    linearize,
    receipt_for,
    verify_and_linearize,
)
from rollcap.staging._records import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCallRecord,
)

# STAGING §3.5's three staged records, as 0.7.0's capture wrote them.
RECORDS: list[dict[str, Any]] = [
    {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "0-0",
        "model_call_id": "0a1b",
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": 5,
        "cum_len": 5,
        "weight_version": 7,
        "digest": "45abfc67c351e4e4dd43b42c9cbefedd1c4c79d12864609d6706b6219ed1313d",
        "token_ids_delta": [1, 104, 105, 42, 2],
        "token_mask_delta": [0.0, 0.0, 0.0, 1.0, 1.0],
        "generation_log_probs_delta": [0.0, 0.0, 0.0, -0.5, -1.25],
        "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",
        "chain_hash": "e606f3fac05e3eaa16232343e63807f62088cf8a2fb8c0140de69d82e5a289e6",
        "cumulative_hash": "f068b6cf29511f34cf31a38e89e396bf66de10d8ba764f2ed4b95865026fb4f0",
        "extras": None,
    },
    {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "0-0",
        "model_call_id": "0c2d",
        "parent_call_id": "0a1b",
        "mode": "token_in",
        "prev_len": 5,
        "delta_len": 6,
        "cum_len": 11,
        "weight_version": 8,
        "digest": "428efd9e71d58aee3871a7e18de8a67260d899be7309a71362b66d15355535be",
        "token_ids_delta": [1, 117, 2, 1, 97, 43],
        "token_mask_delta": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        "generation_log_probs_delta": [0.0, 0.0, 0.0, 0.0, 0.0, -0.0625],
        "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",
        "chain_hash": "b72abdf966d1055e6224cfb6ff24c3c01c6f79dc7e1eb728e77cab08ebf784dd",
        "cumulative_hash": "e4b2315a156ac3c1873e6b2abf53de4d35cacd2262f8ba4338c352d81f07f4ae",
        "extras": None,
    },
    {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "0-0",
        "model_call_id": "0e3f",
        "parent_call_id": "0c2d",
        "mode": "token_in",
        "prev_len": 11,
        "delta_len": 7,
        "cum_len": 18,
        "weight_version": 8,
        "digest": "d2c57897ee9b455c72707b96692371294777105a3722bc60b8436b7ac7f8b037",
        "token_ids_delta": [1, 9, 9, 9, 2, 44, 2],
        "token_mask_delta": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0],
        "generation_log_probs_delta": [0.0, 0.0, 0.0, 0.0, 0.0, -0.5, -0.125],
        "extras_digest": "17b5862b8d636bf5824006a3317e5eb56ee8f388b17f6f73bf9bd26eb40dee73",
        "chain_hash": "6de871a39a8c4f5e6de6e8ae70329b81a0f9396941ad88ee581f5b989016d65b",
        "cumulative_hash": "58889b5c0afc226ea21fb8c2fc67794e4b58c906772db083ddb4e38766dc1494",
        "extras": {
            "routed_experts": "nrlre1:int16:2x1x2:AwABAAIABQA=",
            "media_spans": [{"modality": "image", "offset": 12, "length": 3, "placeholder_id": 9}],
        },
    },
]

# STAGING §7.2's row for that chain (terminal 0e3f, declared), its abbreviated extras digests
# written out: a1edc33c… is EMPTY_EXTRAS_DIGEST, 17b5862b… the 0e3f record's.
EXPECTED_ROW: dict[str, Any] = {
    "rollout_id": "0-0",
    "token_ids": [1, 104, 105, 42, 2, 1, 117, 2, 1, 97, 43, 1, 9, 9, 9, 2, 44, 2],
    "token_mask": [
        *[0.0, 0.0, 0.0, 1.0, 1.0],
        *[0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        *[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0],
    ],
    "logprobs": [
        *[0.0, 0.0, 0.0, -0.5, -1.25],
        *[0.0, 0.0, 0.0, 0.0, 0.0, -0.0625],
        *[0.0, 0.0, 0.0, 0.0, 0.0, -0.5, -0.125],
    ],
    "model_call_ids": ["0a1b", "0c2d", "0e3f"],
    "prompt_len": 3,
    "weight_versions": [7, 8, 8],
    "weight_version_spans": [
        {"model_call_id": "0a1b", "start": 0, "end": 5, "weight_version": 7},
        {"model_call_id": "0c2d", "start": 5, "end": 11, "weight_version": 8},
        {"model_call_id": "0e3f", "start": 11, "end": 18, "weight_version": 8},
    ],
    "link_spans": [["0a1b", 3, 2], ["0c2d", 5, 1], ["0e3f", 5, 2]],
    "extras_commitments": [
        {
            "model_call_id": "0a1b",
            "extras_digest_version": 1,
            "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",
        },
        {
            "model_call_id": "0c2d",
            "extras_digest_version": 1,
            "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",
        },
        {
            "model_call_id": "0e3f",
            "extras_digest_version": 1,
            "extras_digest": "17b5862b8d636bf5824006a3317e5eb56ee8f388b17f6f73bf9bd26eb40dee73",
        },
    ],
}

ROW_FIELDS = (
    "model_call_id",
    "parent_call_id",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "mode",
    "chain_hash",
    "cumulative_hash",
)


def snapshot_of(record: dict[str, Any]) -> StagedCallBaseSnapshot:
    return StagedCallBaseSnapshot.model_validate({k: v for k, v in record.items() if k != "extras"})


def row_of(record: dict[str, Any], *, rollout_id: str = "0-0") -> CallRecord:
    """The gate's manifest row for a staged record (the response id is made up)."""
    call = record["model_call_id"]
    return CallRecord(
        **{name: record[name] for name in ROW_FIELDS},
        staging_key=f"{rollout_id}/{call}",
        response_id=f"chatcmpl-{call}",
    )


def snapshots() -> list[StagedCallBaseSnapshot]:
    return [snapshot_of(record) for record in RECORDS]


def rows() -> list[CallRecord]:
    return [row_of(record) for record in RECORDS]


def receipt(manifest: Sequence[CallRecord] | None = None, **fields: Any) -> RolloutReceipt:
    values: dict[str, Any] = {
        "rollout_id": "0-0",
        "terminal_model_call_id": "0e3f",
        "terminal_selection": "declared",
        "manifest": rows() if manifest is None else list(manifest),
    }
    values.update(fields)
    return RolloutReceipt(**values)


def refusal(got: RolloutReceipt, shots: Sequence[Any], code: str) -> ReceiptVerificationError:
    with pytest.raises(ReceiptVerificationError) as caught:
        verify_and_linearize(got, shots)
    assert caught.value.code == code, str(caught.value)
    assert str(caught.value).startswith(f"{code}: ")
    return caught.value


# -- a builder for chains that §3.5 does not have ---------------------------------------------


@dataclass(frozen=True)
class Built:
    """One staged call: its base snapshot, its manifest row, and the full ids through it."""

    snapshot: StagedCallBaseSnapshot
    row: CallRecord
    ids: list[int]


def stage(
    call: str,
    parent: Built | None,
    carry: Sequence[int],
    generated: Sequence[int],
    *,
    rollout_id: str = "0-0",
    weight_version: int = 1,
    prev_len: int | None = None,
    mask: Sequence[float] | None = None,
    logprobs: Sequence[float] | None = None,
    chain_hash: str | None = None,
    cumulative_hash: str | None = None,
) -> Built:
    """A call staged as 0.7.0's capture does (carry then generation), digest consistent.

    ``prev_len`` (default: the parent's ``cum_len``) below the parent's length is a child that
    cuts into its parent; ``logprobs`` are the generated ids' (default -0.5 each); ``mask``,
    ``chain_hash`` and ``cumulative_hash`` override what a
    faithful capture computes, the digest still covering them.
    """
    prev = (parent.row.cum_len if parent else 0) if prev_len is None else prev_len
    delta = [*carry, *generated]
    ids = [*(parent.ids[:prev] if parent else []), *delta]
    token_mask = list(mask) if mask is not None else [0.0] * len(carry) + [1.0] * len(generated)
    generated_logprobs = iter(logprobs if logprobs is not None else [-0.5] * len(token_mask))
    column = [next(generated_logprobs) if m == 1.0 else 0.0 for m in token_mask]
    fields: dict[str, Any] = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": rollout_id,
        "model_call_id": call,
        "parent_call_id": parent.row.model_call_id if parent else None,
        "mode": "token_in" if parent else "text",
        "prev_len": prev,
        "delta_len": len(delta),
        "cum_len": prev + len(delta),
        "weight_version": weight_version,
        "token_ids_delta": delta,
        "token_mask_delta": token_mask,
        "generation_log_probs_delta": column,
        "extras_digest": EMPTY_EXTRAS_DIGEST,
        "chain_hash": chain_hash
        or compute_chain_hash(parent.row.chain_hash if parent else None, delta),
        "cumulative_hash": cumulative_hash or hash_token_ids(ids),
    }
    fields["digest"] = compute_staging_digest(**fields)
    snapshot = StagedCallBaseSnapshot(**fields)
    return Built(snapshot, row_of(fields, rollout_id=rollout_id), ids)


def declared(*built: Built, terminal: str) -> tuple[RolloutReceipt, list[StagedCallBaseSnapshot]]:
    rollout_id = built[0].snapshot.rollout_id
    got = receipt([b.row for b in built], rollout_id=rollout_id, terminal_model_call_id=terminal)
    return got, [b.snapshot for b in built]


def test_the_builder_reproduces_the_generated_vectors() -> None:
    # The builder is what §3.5's capture does: the refusal tests below vary one thing at a time
    # from records 0.7.0 would have written.
    root = stage("0a1b", None, [1, 104, 105], [42, 2], weight_version=7, logprobs=[-0.5, -1.25])
    child = stage("0c2d", root, [1, 117, 2, 1, 97], [43], weight_version=8, logprobs=[-0.0625])
    assert child.snapshot == snapshots()[1]
    assert root.snapshot.digest == RECORDS[0]["digest"]
    assert root.snapshot.chain_hash == RECORDS[0]["chain_hash"]
    assert root.snapshot.cumulative_hash == RECORDS[0]["cumulative_hash"]


# -- the linearized row -----------------------------------------------------------------------


def test_the_generated_records_parse_with_their_extras() -> None:
    for record in RECORDS:
        assert StagedCallRecord.model_validate(record).model_dump(mode="json") == record


def test_the_chain_linearizes_to_the_observed_row() -> None:
    row = verify_and_linearize(receipt(), snapshots())
    assert row.model_dump(mode="json") == EXPECTED_ROW
    assert row.call_ids == row.model_call_ids == ["0a1b", "0c2d", "0e3f"]
    assert row.extras_commitments[0].extras_digest == EMPTY_EXTRAS_DIGEST


def test_full_records_are_accepted_and_their_extras_unread() -> None:
    # A source may hand back whole records; the commitments come from the rows regardless.
    full = [StagedCallRecord.model_validate(record) for record in RECORDS]
    assert verify_and_linearize(receipt(), full).model_dump(mode="json") == EXPECTED_ROW


def test_a_shorter_terminal_linearizes_its_own_ancestry() -> None:
    row = verify_and_linearize(receipt(terminal_model_call_id="0c2d"), snapshots())
    assert row.model_call_ids == ["0a1b", "0c2d"]
    assert row.token_ids == EXPECTED_ROW["token_ids"][:11]
    assert row.link_spans == [("0a1b", 3, 2), ("0c2d", 5, 1)]


def test_linearize_wraps_a_declared_receipt() -> None:
    row = linearize("0-0", snapshots(), rows(), terminal_hint="0e3f")
    assert row.model_dump(mode="json") == EXPECTED_ROW
    manifest = RolloutManifest(rollout_id="0-0", records=rows())
    assert linearize("0-0", snapshots(), manifest, terminal_hint="0e3f") == row


def test_linearize_without_a_hint_is_missing_its_terminal_before_reading_a_row() -> None:
    with pytest.raises(ReceiptVerificationError) as caught:
        linearize("0-0", [], [])
    assert type(caught.value) is ReceiptVerificationError
    assert caught.value.code == "missing_terminal"
    assert str(caught.value) == "missing_terminal: no terminal hint was given"


def test_linearize_refuses_a_manifest_with_failures_and_another_rollouts_manifest() -> None:
    failed = RolloutManifest(
        rollout_id="0-0",
        records=rows(),
        failures=[ManifestFailure(model_call_id="0f40", reason="worker_capture_failed")],
    )
    with pytest.raises(ReceiptVerificationError, match=r"^rollout_failed: worker_capture_failed$"):
        linearize("0-0", snapshots(), failed, terminal_hint="0e3f")
    with pytest.raises(ValueError, match="rollout"):
        linearize("0-1", snapshots(), failed, terminal_hint="0e3f")


def test_a_branch_is_verified_but_not_trained() -> None:
    root = stage("a0", None, [1, 5], [6])
    kept = stage("a1", root, [1, 7], [8, 2])
    branch = stage("a2", root, [1, 9], [10])
    got, shots = declared(root, branch, kept, terminal="a1")
    row = verify_and_linearize(got, shots)
    assert row.model_call_ids == ["a0", "a1"]
    assert row.token_ids == [1, 5, 6, 1, 7, 8, 2]
    assert row.token_mask == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    # The untrained branch is still verified: a tampered byte in it refuses the rollout.
    tampered = branch.snapshot.model_copy(update={"token_ids_delta": [1, 9, 11]})
    error = refusal(got, [shots[0], tampered, shots[2]], "corrupt_digest")
    assert str(error) == "corrupt_digest: call a2: staged digest mismatch"


# -- refusals, in the table's order -----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("schema_version", "unsupported_schema"),
        ("digest_version", "unsupported_digest"),
        ("extras_digest_version", "unsupported_extras_digest"),
    ],
)
def test_receipt_versions(field: str, code: str) -> None:
    refusal(receipt().model_copy(update={field: 3}), snapshots(), code)
    # True == 1, but a bool is not a version.
    refusal(receipt().model_copy(update={field: True}), snapshots(), code)


def test_a_manifest_failure_fails_the_rollout() -> None:
    manifest = RolloutManifest(
        rollout_id="0-0",
        records=rows(),
        failures=[ManifestFailure(model_call_id="0f40", reason="worker_capture_failed")],
    )
    error = refusal(receipt_for(manifest), snapshots(), "rollout_failed")
    assert str(error) == "rollout_failed: worker_capture_failed"
    assert error.detail == "worker_capture_failed"
    assert not isinstance(error, RebuildError)


def test_a_poisoned_receipt_is_refused() -> None:
    poisoned = receipt(capture_poisoned=True, terminal_selection="heuristic")
    error = refusal(poisoned, snapshots(), "capture_poisoned")
    assert str(error) == "capture_poisoned: receipt marks token capture as poisoned"


def test_an_empty_manifest_is_refused() -> None:
    empty = RolloutReceipt.model_construct(
        rollout_id="0-0", terminal_model_call_id=None, terminal_selection="declared"
    )
    refusal(empty, [], "empty_manifest")


def test_duplicate_manifest_rows_and_keys() -> None:
    listed = rows()
    twice = RolloutReceipt.model_construct(**{**dict(receipt()), "manifest": [*listed, listed[0]]})
    refusal(twice, [*snapshots(), snapshots()[0]], "duplicate_manifest_row")
    shared = listed[1].model_copy(update={"staging_key": listed[0].staging_key})
    refusal(receipt([listed[0], shared, listed[2]]), snapshots(), "duplicate_staging_key")


def test_row_count_mismatch() -> None:
    error = refusal(receipt(), snapshots()[:2], "row_count_mismatch")
    assert str(error) == "row_count_mismatch: 2 snapshots for 3 manifest rows"


def test_a_snapshot_that_is_not_one_is_a_type_error() -> None:
    shots: list[Any] = [RECORDS[0], *snapshots()[1:]]
    with pytest.raises(TypeError, match="snapshot 0 must be a StagedCallBaseSnapshot"):
        verify_and_linearize(receipt(), shots)


def test_snapshot_identity() -> None:
    a, b, c = snapshots()
    refusal(receipt(), [a, a, c], "duplicate_snapshot")
    stranger = b.model_copy(update={"model_call_id": "0d00"})
    refusal(receipt(), [a, stranger, c], "snapshot_identity_mismatch")
    error = refusal(receipt(), [b, a, c], "snapshot_order_mismatch")
    assert str(error) == "snapshot_order_mismatch: key 0-0/0a1b expected 0a1b, received 0c2d"


def test_a_snapshot_of_another_rollout() -> None:
    a, b, c = snapshots()
    refusal(receipt(), [a, b.model_copy(update={"rollout_id": "0-1"}), c], "wrong_rollout")


# model_call_id is compared too, but snapshot_order_mismatch always refuses a differing one
# first; it has no test of its own.
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("parent_call_id", "0e3f"),
        ("mode", "text"),
        ("prev_len", 4),
        ("delta_len", 7),
        ("cum_len", 12),
        ("weight_version", 9),
        ("digest", "0" * 64),
        ("extras_digest", "1" * 64),
        ("chain_hash", "2" * 64),
        ("cumulative_hash", "3" * 64),
    ],
)
def test_a_snapshot_must_repeat_its_row(field: str, value: object) -> None:
    a, b, c = snapshots()
    refusal(receipt(), [a, b.model_copy(update={field: value}), c], f"wrong_{field}")


def test_wrong_weight_version_names_both_values() -> None:
    listed = rows()
    listed[2] = listed[2].model_copy(update={"weight_version": 9})
    error = refusal(receipt(listed), snapshots(), "wrong_weight_version")
    assert str(error) == "wrong_weight_version: call 0e3f: snapshot 8, manifest 9"


@pytest.mark.parametrize("field", ["schema_version", "digest_version", "extras_digest_version"])
@pytest.mark.parametrize("side", ["snapshot", "row"])
def test_versions_agree_across_snapshot_row_and_receipt(field: str, side: str) -> None:
    shots, listed = snapshots(), rows()
    if side == "snapshot":
        shots[1] = shots[1].model_copy(update={field: 3})
    else:
        listed[1] = listed[1].model_copy(update={field: 3})
    refusal(receipt(listed), shots, f"wrong_{field}")


@pytest.mark.parametrize(
    "update",
    [
        {"token_ids_delta": [1, 117, 2]},  # delta_len no longer counts the ids
        {"token_mask_delta": [0.0, 0.0, 0.0, 0.0, 0.5, 1.0]},  # not a mask
        {"generation_log_probs_delta": [0.0, 0.0, 0.0, 0.0, 0, -0.0625]},  # an int logprob
    ],
)
def test_a_snapshot_whose_digest_cannot_be_computed(update: dict[str, Any]) -> None:
    a, b, c = snapshots()
    error = refusal(receipt(), [a, b.model_copy(update=update), c], "invalid_snapshot")
    assert str(error).startswith("invalid_snapshot: call 0c2d: ")


def test_a_tampered_snapshot_is_corrupt() -> None:
    a, b, c = snapshots()
    # The tampered column would not even parse: storage corruption is built, not parsed.
    data = {**dict(b), "generation_log_probs_delta": [0.0, 0.0, 0.0, 0.0, 0.0, -0.125]}
    with pytest.raises(ValidationError, match="staged digest mismatch"):
        StagedCallBaseSnapshot.model_validate(data)
    tampered = StagedCallBaseSnapshot.model_construct(**data)
    error = refusal(receipt(), [a, tampered, c], "corrupt_digest")
    assert str(error) == "corrupt_digest: call 0c2d: staged digest mismatch"
    # -0.0 passes as a carry logprob but hashes apart from 0.0.
    signed = {**dict(b), "generation_log_probs_delta": [-0.0, 0.0, 0.0, 0.0, 0.0, -0.0625]}
    refusal(receipt(), [a, StagedCallBaseSnapshot.model_construct(**signed), c], "corrupt_digest")


def test_a_missing_parent() -> None:
    a, _, c = snapshots()
    listed = rows()
    got = receipt([listed[0], listed[2]])
    with pytest.raises(RebuildError) as caught:
        verify_and_linearize(got, [a, c])
    assert str(caught.value) == (
        "missing_parent: call 0e3f names parent 0c2d, which is not in the manifest"
    )


def test_a_child_cutting_into_its_parent_is_refused() -> None:
    # Context compaction would do this: the new request keeps only part of the parent's ids.
    root = stage("1a01", None, [1, 5, 6, 7, 8, 9], [10, 2])
    child = stage("1a02", root, [1, 11], [12], prev_len=6)
    assert child.row.prev_len == 6
    assert root.row.cum_len == 8
    got, shots = declared(root, child, terminal="1a02")
    with pytest.raises(RebuildError) as caught:
        verify_and_linearize(got, shots)
    assert caught.value.code == "parent_length_mismatch"
    assert str(caught.value) == "parent_length_mismatch: call 1a02 starts at 6, parent ends at 8"


def _linked(call: str, parent: str, prev: int, ids: list[int]) -> dict[str, Any]:
    """A child's digested fields, consistent on their own whatever its parent really is."""
    fields: dict[str, Any] = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "0-0",
        "model_call_id": call,
        "parent_call_id": parent,
        "mode": "token_in",
        "prev_len": prev,
        "delta_len": len(ids),
        "cum_len": prev + len(ids),
        "weight_version": 0,
        "token_ids_delta": ids,
        "token_mask_delta": [1.0] * len(ids),
        "generation_log_probs_delta": [-0.5] * len(ids),
        "extras_digest": EMPTY_EXTRAS_DIGEST,
        "chain_hash": compute_chain_hash("3" * 64, ids),
        "cumulative_hash": hash_token_ids(ids),
    }
    return {**fields, "digest": compute_staging_digest(**fields)}


def test_a_lineage_cycle() -> None:
    # Two calls naming each other as parents, the first starting where the second ends: each
    # row's parent is there and long enough, and walking x's ancestry comes back to x (0.7.0
    # walks each row's ancestry before checking the next row's length, and so does rollcap).
    x = _linked("x", "y", 5, [7])
    y = _linked("y", "x", 3, [8, 9])
    snapshots = [StagedCallBaseSnapshot.model_validate(f) for f in (x, y)]
    token_columns = (
        "rollout_id",
        "token_ids_delta",
        "token_mask_delta",
        "generation_log_probs_delta",
    )
    rows = [
        CallRecord.model_validate(
            {k: v for k, v in f.items() if k not in token_columns}
            | {"staging_key": f"0-0/{f['model_call_id']}", "response_id": "r"}
        )
        for f in (x, y)
    ]
    got = RolloutReceipt(
        rollout_id="0-0", manifest=rows, terminal_model_call_id="x", terminal_selection="declared"
    )
    with pytest.raises(RebuildError) as caught:
        verify_and_linearize(got, snapshots)
    assert str(caught.value) == "lineage_cycle: call x is its own ancestor"


def test_a_terminal_not_in_the_manifest() -> None:
    got = receipt().model_copy(update={"terminal_model_call_id": "0f40"})
    error = refusal(got, snapshots(), "missing_terminal")
    assert isinstance(error, RebuildError)


def test_a_chain_hash_that_does_not_extend_its_parent() -> None:
    root = stage("0a1b", None, [1, 104, 105], [42, 2], weight_version=7)
    # A child whose chain restarts from nothing: consistent on its own, not a link of the chain.
    child = stage(
        "0c2d", root, [1, 117, 2, 1, 97], [43], chain_hash=compute_chain_hash(None, [1, 117])
    )
    got, shots = declared(root, child, terminal="0c2d")
    error = refusal(got, shots, "chain_hash_mismatch")
    assert isinstance(error, RebuildError)
    assert str(error) == "chain_hash_mismatch: call 0c2d does not extend its parent's staged chain"
    lone = stage("0a1b", None, [1], [2], chain_hash="4" * 64)
    refusal(*declared(lone, terminal="0a1b"), "chain_hash_mismatch")


def test_a_mask_out_of_order() -> None:
    root = stage("b0", None, [1, 2], [3], mask=[0.0, 1.0, 0.0])
    error = refusal(*declared(root, terminal="b0"), "invalid_mask_order")
    assert isinstance(error, RebuildError)


def test_a_call_that_generated_nothing() -> None:
    root = stage("b0", None, [1, 2], [3])
    silent = stage("b1", root, [4, 5], [], weight_version=2)
    refusal(*declared(root, silent, terminal="b1"), "empty_generation")


# empty_training_row (no generated token in the whole row) cannot be reached: every call of the
# chain has already been refused as empty_generation unless it generated at least one token.


def test_a_cumulative_hash_that_is_not_the_chains() -> None:
    root = stage("b0", None, [1, 2], [3])
    child = stage("b1", root, [4], [5], cumulative_hash=hash_token_ids([4, 5]))
    error = refusal(*declared(root, child, terminal="b1"), "cumulative_hash_mismatch")
    assert isinstance(error, RebuildError)
    # Only the terminal's is checked against the row: the root alone still linearizes.
    got, shots = declared(root, child, terminal="b0")
    assert verify_and_linearize(got, shots).token_ids == [1, 2, 3]


def test_rebuild_errors_are_receipt_verification_errors() -> None:
    error = RebuildError("missing_terminal", "why")
    assert isinstance(error, ReceiptVerificationError)
    assert (error.code, error.detail, str(error)) == (
        "missing_terminal",
        "why",
        "missing_terminal: why",
    )


# -- receipt_for ------------------------------------------------------------------------------


def test_receipt_for_a_clean_manifest_is_trainable() -> None:
    manifest = RolloutManifest(rollout_id="0-0", records=rows())
    got = receipt_for(
        manifest,
        reward=1,
        terminal_model_call_id="0e3f",
        terminal_selection="response_id",
        terminal_attribution_reason="corroborated_by=content",
    )
    assert got.reward == 1.0
    assert not got.capture_poisoned
    assert got.failure_reason is None
    assert (got.terminal_model_call_id, got.terminal_selection) == ("0e3f", "response_id")
    assert got.terminal_attribution_reason == "corroborated_by=content"
    assert verify_and_linearize(got, snapshots()).model_dump(mode="json") == EXPECTED_ROW


def test_receipt_for_poisons_on_the_first_failure() -> None:
    manifest = RolloutManifest(
        rollout_id="0-0",
        records=rows(),
        failures=[
            ManifestFailure(model_call_id="0f40", reason="worker_capture_failed"),
            ManifestFailure(
                model_call_id="0f40", reason="request_finished_without_staged_coordinates"
            ),
        ],
    )
    bare = receipt_for(manifest)
    assert bare.capture_poisoned
    assert bare.failure_reason == "worker_capture_failed"
    assert bare.terminal_model_call_id is None
    assert bare.terminal_selection is None
    attributed = receipt_for(manifest, terminal_model_call_id="0e3f", terminal_selection="content")
    assert attributed.capture_poisoned
    assert attributed.terminal_model_call_id == "0e3f"


def test_receipt_for_needs_a_terminal_and_its_selection() -> None:
    manifest = RolloutManifest(rollout_id="0-0", records=rows())
    with pytest.raises(ValueError, match="terminal_model_call_id"):
        receipt_for(manifest)
    with pytest.raises(ValueError, match="terminal_selection"):
        receipt_for(manifest, terminal_model_call_id="0e3f")
    with pytest.raises(ValidationError, match="in the manifest"):
        receipt_for(manifest, terminal_model_call_id="0f40", terminal_selection="declared")
