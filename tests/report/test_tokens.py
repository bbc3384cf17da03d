"""The token view's data, from staged records and the gate's manifest."""

from __future__ import annotations

from typing import Any

from rollcap.report._tokens import (
    RECEIPT_INVALID,
    SNAPSHOT_UNAVAILABLE,
    StagedRead,
    token_payload,
)
from rollcap.staging import (
    EMPTY_EXTRAS_DIGEST,
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    compute_chain_hash,
    compute_staging_digest,
    hash_token_ids,
)

ROLLOUT = "0-0"


class Rollout:
    """Valid staged records, each a delta over its parent, and their manifest rows."""

    def __init__(self) -> None:
        self.records: dict[str, StagedCallRecord] = {}
        self.ids: dict[str, list[int]] = {}

    def call(
        self,
        call_id: str,
        parent: str | None,
        prompt: list[int],
        generated: list[int],
        logprobs: list[float],
        weight_version: int = 3,
    ) -> StagedCallRecord:
        before = self.ids[parent] if parent is not None else []
        prev = self.records[parent] if parent is not None else None
        delta = [*prompt, *generated]
        fields: dict[str, Any] = {
            "schema_version": 2,
            "digest_version": 2,
            "extras_digest_version": 1,
            "rollout_id": ROLLOUT,
            "model_call_id": call_id,
            "parent_call_id": parent,
            "mode": "text" if parent is None else "token_in",
            "prev_len": len(before),
            "delta_len": len(delta),
            "cum_len": len(before) + len(delta),
            "weight_version": weight_version,
            "token_ids_delta": delta,
            "token_mask_delta": [0.0] * len(prompt) + [1.0] * len(generated),
            "generation_log_probs_delta": [0.0] * len(prompt) + logprobs,
            "extras_digest": EMPTY_EXTRAS_DIGEST,
            "chain_hash": compute_chain_hash(None if prev is None else prev.chain_hash, delta),
            "cumulative_hash": hash_token_ids([*before, *delta]),
        }
        record = StagedCallRecord(**fields, digest=compute_staging_digest(**fields))
        self.records[call_id] = record
        self.ids[call_id] = [*before, *delta]
        return record

    def reads(self) -> list[StagedRead]:
        return [StagedRead(f"{ROLLOUT}/{c}", r.base()) for c, r in self.records.items()]

    def row(self, call_id: str, admitted_at: float | None = None) -> CallRecord:
        record = self.records[call_id]
        names = (
            "rollout_id",
            "token_ids_delta",
            "token_mask_delta",
            "generation_log_probs_delta",
            "extras",
        )
        values = {k: v for k, v in record.model_dump().items() if k not in names}
        return CallRecord(
            **values,
            staging_key=f"{ROLLOUT}/{call_id}",
            response_id=f"chatcmpl-{call_id}",
            admitted_at=admitted_at,
        )

    def manifest(self, *failures: tuple[str, str]) -> RolloutManifest:
        return RolloutManifest(
            rollout_id=ROLLOUT,
            records=[self.row(c, float(i)) for i, c in enumerate(self.records)],
            failures=[ManifestFailure(model_call_id=c, reason=r) for c, r in failures],
        )


def two_turns() -> Rollout:
    rollout = Rollout()
    rollout.call("a" * 32, None, [1, 72], [73, 2], [-0.123456789, -1.0])
    rollout.call("b" * 32, "a" * 32, [1, 74], [75, 2], [-2.000049, -0.5], weight_version=4)
    return rollout


def tampered(record: StagedCallRecord) -> StagedCallBaseSnapshot:
    """The record's base with its last token changed, as a source that does not check reads
    it back."""
    values = record.base().model_dump()
    values["token_ids_delta"] = [*values["token_ids_delta"][:-1], 99]
    return StagedCallBaseSnapshot.model_construct(**values)


def test_a_committed_chain_is_trainable_with_its_spans_and_weight_versions() -> None:
    rollout = two_turns()
    view = token_payload(ROLLOUT, rollout.reads(), rollout.manifest(), ledger={"found": True})
    assert view["error"] is None
    assert view["ledger"] == {"found": True}
    assert view["verdict"] == {
        "trainable": True,
        "code": None,
        "detail": None,
        "terminal": "b" * 32,
        "selection": "heuristic",
        "attribution": "no_response_object,selected",
        "poisoned": False,
        "failure_reason": None,
    }
    assert view["failures"] == []
    assert [(c["id"], c["in_manifest"], c["read"]) for c in view["calls"]] == [
        ("a" * 32, True, None),
        ("b" * 32, True, None),
    ]
    assert view["calls"][1]["response_id"] == "chatcmpl-" + "b" * 32
    (chain,) = view["chains"]
    assert chain == {
        "calls": ["a" * 32, "b" * 32],
        "terminal": True,
        "custody": "ledger",
        "refusal": None,
        "chain_hash": rollout.records["b" * 32].chain_hash,
        "cumulative_hash": rollout.records["b" * 32].cumulative_hash,
        "ids": [1, 72, 73, 2, 1, 74, 75, 2],
        "mask": [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
        "logprobs": [0.0, 0.0, -0.1235, -1.0, 0.0, 0.0, -2.0, -0.5],
        "spans": [
            {"call": "a" * 32, "start": 0, "end": 4, "weight_version": 3},
            {"call": "b" * 32, "start": 4, "end": 8, "weight_version": 4},
        ],
        "links": [["a" * 32, 2, 2], ["b" * 32, 2, 2]],
        "prompt_len": 2,
    }
    assert all(type(m) is float for m in chain["mask"])


def test_branches_are_chains_and_the_terminal_chain_comes_first() -> None:
    rollout = Rollout()
    rollout.call("a", None, [1], [5], [-0.5])
    rollout.call("b", "a", [1], [6], [-0.5])
    rollout.call("c", "a", [1], [7], [-0.5])
    rollout.call("d", "c", [1], [8], [-0.5])
    view = token_payload(ROLLOUT, rollout.reads(), rollout.manifest())
    assert view["verdict"]["terminal"] == "d"
    assert view["verdict"]["trainable"]
    assert [(c["calls"], c["terminal"], c["refusal"]) for c in view["chains"]] == [
        (["a", "c", "d"], True, None),
        (["a", "b"], False, None),
    ]


def test_an_ambiguous_terminal_is_refused_though_each_chain_verifies() -> None:
    rollout = Rollout()
    rollout.call("a", None, [1], [5], [-0.5])
    rollout.call("b", "a", [1], [6], [-0.5])
    rollout.call("c", "a", [1], [7], [-0.5])
    view = token_payload(ROLLOUT, rollout.reads(), rollout.manifest())
    verdict = view["verdict"]
    assert (verdict["trainable"], verdict["code"], verdict["terminal"]) == (
        False,
        "rollout_failed",
        None,
    )
    assert verdict["detail"] == "no_response_object,ambiguous_terminal"
    assert [c["refusal"] for c in view["chains"]] == [None, None]
    assert not any(c["terminal"] for c in view["chains"])


def test_a_failed_call_poisons_the_rollout_and_is_listed() -> None:
    rollout = two_turns()
    manifest = rollout.manifest(("c" * 32, "worker_capture_failed"))
    view = token_payload(ROLLOUT, rollout.reads(), manifest)
    verdict = view["verdict"]
    assert not verdict["trainable"]
    assert (verdict["code"], verdict["detail"]) == ("rollout_failed", "worker_capture_failed")
    assert verdict["poisoned"]
    assert verdict["terminal"] == "b" * 32  # attribution still ran
    assert view["failures"] == [{"call": "c" * 32, "reason": "worker_capture_failed"}]
    (chain,) = view["chains"]
    assert chain["refusal"] is None  # its tokens verify; the rollout still must not train


def test_without_a_manifest_the_records_are_verified_alone() -> None:
    rollout = two_turns()
    view = token_payload(ROLLOUT, rollout.reads(), None, ledger={"found": False})
    assert view["verdict"] is None
    assert view["failures"] == []
    assert [c["in_manifest"] for c in view["calls"]] == [False, False]
    (chain,) = view["chains"]
    assert (chain["custody"], chain["refusal"], chain["terminal"]) == ("records", None, False)
    assert chain["ids"] == [1, 72, 73, 2, 1, 74, 75, 2]


def test_a_tampered_record_is_refused_with_its_code_and_its_tokens_kept() -> None:
    rollout = two_turns()
    reads = rollout.reads()
    bad = tampered(rollout.records["b" * 32])
    reads[1] = StagedRead(reads[1].key, bad, "call bbbb: staged digest mismatch")
    view = token_payload(ROLLOUT, reads, rollout.manifest())
    assert (view["verdict"]["code"], view["verdict"]["trainable"]) == ("corrupt_digest", False)
    assert view["verdict"]["detail"] == f"call {'b' * 32}: staged digest mismatch"
    assert [c["read"] for c in view["calls"]] == [None, "call bbbb: staged digest mismatch"]
    assert view["calls"][1]["staged"]
    (chain,) = view["chains"]
    assert chain["refusal"] == {
        "code": "corrupt_digest",
        "detail": f"call {'b' * 32}: staged digest mismatch",
    }
    assert chain["ids"] == [1, 72, 73, 2, 1, 74, 75, 99]  # as staged, unverified
    assert [s["end"] for s in chain["spans"]] == [4, 8]
    # Without the ledger the records alone refuse it just the same.
    alone = token_payload(ROLLOUT, reads, None)
    assert alone["chains"][0]["refusal"]["code"] == "corrupt_digest"


def test_a_manifest_row_without_a_record_cannot_be_fetched() -> None:
    rollout = two_turns()
    reads = rollout.reads()[:1]
    reads.append(StagedRead(f"{ROLLOUT}/{'b' * 32}", None, "no staged record for key x"))
    view = token_payload(ROLLOUT, reads, rollout.manifest())
    unavailable = {
        "code": SNAPSHOT_UNAVAILABLE,
        "detail": f"call {'b' * 32}: no staged record for key x",
    }
    assert {k: view["verdict"][k] for k in ("code", "detail")} == unavailable
    (chain,) = view["chains"]
    assert chain["refusal"] == unavailable
    assert chain["ids"] == []
    assert not view["calls"][1]["staged"]
    # A poisoned rollout is refused for its poison first, as the trainer's checks go.
    poisoned = token_payload(ROLLOUT, reads, rollout.manifest(("x", "unresolved_parent")))
    assert (poisoned["verdict"]["code"], poisoned["verdict"]["detail"]) == (
        "rollout_failed",
        "unresolved_parent",
    )


def test_a_record_whose_parent_is_not_staged_is_refused() -> None:
    rollout = two_turns()
    reads = rollout.reads()[1:]
    view = token_payload(ROLLOUT, reads, None)
    (chain,) = view["chains"]
    assert chain["calls"] == ["b" * 32]
    assert chain["refusal"]["code"] == "missing_parent"


def test_a_staged_call_the_ledger_does_not_list_is_shown_apart() -> None:
    rollout = two_turns()
    manifest = RolloutManifest(rollout_id=ROLLOUT, records=[rollout.row("a" * 32, 0.0)])
    view = token_payload(ROLLOUT, rollout.reads(), manifest)
    assert [c["in_manifest"] for c in view["calls"]] == [True, False]
    assert view["verdict"]["terminal"] == "a" * 32
    assert view["verdict"]["trainable"]
    # The trainer's chain ends at a, which the staged records continue.
    assert [(c["calls"], c["terminal"], c["custody"], c["refusal"]) for c in view["chains"]] == [
        (["a" * 32], True, "ledger", None),
        (["a" * 32, "b" * 32], False, "partial", None),
    ]


def test_a_manifest_that_repeats_a_call_makes_no_receipt() -> None:
    rollout = two_turns()
    row = rollout.row("a" * 32, 0.0)
    manifest = RolloutManifest(rollout_id=ROLLOUT, records=[row, row])
    view = token_payload(ROLLOUT, rollout.reads(), manifest)
    assert (view["verdict"]["trainable"], view["verdict"]["code"]) == (False, RECEIPT_INVALID)
    assert "unique" in view["verdict"]["detail"]
    assert len(view["chains"]) == 1


def test_nothing_read_and_no_manifest_is_an_empty_view() -> None:
    view = token_payload(ROLLOUT, [], None, error="cannot read the staged calls: x")
    assert view == {
        "error": "cannot read the staged calls: x",
        "ledger": None,
        "verdict": None,
        "failures": [],
        "calls": [],
        "chains": [],
    }
