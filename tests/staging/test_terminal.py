"""Terminal attribution: §7.3's witnesses and heuristic, their reason literals, and receipts."""

from __future__ import annotations

from typing import Any

import pytest

from rollcap.staging._digest import EMPTY_EXTRAS_DIGEST, compute_chain_hash, hash_token_ids
from rollcap.staging._fingerprint import assistant_fingerprint
from rollcap.staging._rebuild import ReceiptVerificationError, verify_and_linearize
from rollcap.staging._records import CallRecord, ManifestFailure, RolloutManifest
from rollcap.staging._terminal import (
    TerminalAttribution,
    TerminalSelection,
    attribute_and_receive,
    resolve_terminal,
    select_terminal_call,
)

# -- rows -------------------------------------------------------------------------------------


def row(
    call: str,
    parent: CallRecord | None = None,
    *,
    admitted_at: float | None = None,
    delta: tuple[int, ...] = (1, 2),
    response_id: str | None = None,
    output_fingerprint: str | None = None,
    continuation_fingerprint: str | None = None,
    fingerprint_version: int = 2,
) -> CallRecord:
    """A manifest row whose chain hash, cumulative hash and lengths are a real chain's."""
    prev = parent.cum_len if parent else 0
    # A row cannot carry its ids; the cumulative hash stands for "parent's ids, then delta".
    ids = [*([0] * prev), *delta]
    return CallRecord(
        model_call_id=call,
        parent_call_id=parent.model_call_id if parent else None,
        prev_len=prev,
        delta_len=len(delta),
        cum_len=prev + len(delta),
        weight_version=1,
        digest="d" * 64,
        extras_digest=EMPTY_EXTRAS_DIGEST,
        staging_key=f"r/{call}",
        mode="token_in" if parent else "text",
        chain_hash=compute_chain_hash(parent.chain_hash if parent else None, delta),
        cumulative_hash=hash_token_ids(ids),
        response_id=response_id or f"chatcmpl-{call}",
        admitted_at=admitted_at,
        output_fingerprint=output_fingerprint,
        continuation_fingerprint=continuation_fingerprint,
        fingerprint_version=fingerprint_version,
    )


# -- the heuristic ----------------------------------------------------------------------------


def test_the_longest_branch_is_selected() -> None:
    a = row("a")
    b, c = row("b", a), row("c", a, delta=(3,))
    d = row("d", c)
    assert select_terminal_call([a, b, c, d]) == TerminalSelection("d", "selected")


def test_two_leaves_are_ambiguous() -> None:
    a = row("a")
    got = select_terminal_call([a, row("b", a), row("c", a, delta=(3,))])
    assert got == TerminalSelection(None, "ambiguous_terminal")


def test_the_earlier_lone_root_is_selected() -> None:
    got = select_terminal_call([row("late", admitted_at=2.0), row("early", admitted_at=1.0)])
    assert got == TerminalSelection("early", "selected")


def test_an_unstamped_root_loses_to_a_stamped_one() -> None:
    got = select_terminal_call([row("unstamped"), row("stamped", admitted_at=5.0)])
    assert got == TerminalSelection("stamped", "selected")
    # Among the unstamped, manifest order decides.
    assert select_terminal_call([row("x"), row("y")]) == TerminalSelection("x", "selected")


def test_a_root_with_a_child_beats_an_earlier_lone_root() -> None:
    lone = row("lone", admitted_at=1.0)
    parent = row("parent", admitted_at=2.0)
    got = select_terminal_call([lone, parent, row("child", parent)])
    assert got == TerminalSelection("child", "selected")


def test_heuristic_refusals() -> None:
    a = row("a")
    assert select_terminal_call([]) == TerminalSelection(None, "no_records")
    assert select_terminal_call([a, a]) == TerminalSelection(None, "duplicate_call_id")
    orphan = row("b", row("gone"))
    assert select_terminal_call([a, orphan]) == TerminalSelection(None, "orphaned_row")
    # Rows all of whose parents are listed but none is a root: only a cycle does that.
    x = row("x", a).model_copy(update={"parent_call_id": "y"})
    y = row("y", a).model_copy(update={"parent_call_id": "x"})
    assert select_terminal_call([x, y]) == TerminalSelection(None, "no_root")


def test_a_cycle_beside_a_root_is_never_walked_into() -> None:
    a = row("a")
    x = row("x", a).model_copy(update={"parent_call_id": "y"})
    y = row("y", a).model_copy(update={"parent_call_id": "x"})
    assert select_terminal_call([a, x, y]) == TerminalSelection("a", "selected")


# -- the witnesses, on §4.3's two-call Responses rollout --------------------------------------

CALL_1 = "1f320141da30434288cc5420be1db187"
CALL_2 = "2a4ba8c560c94b50b2508d29b2888b7d"


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


ANSWER_1, ANSWER_2 = message("answer 1"), message("answer 2")
REQUEST_1 = [user("first question")]
REQUEST_2 = [*REQUEST_1, ANSWER_1, user("second question")]

# §4.3's first record, as the gate wrote it.
ROW_1 = CallRecord.model_validate(
    {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "model_call_id": CALL_1,
        "parent_call_id": None,
        "prev_len": 0,
        "delta_len": 5,
        "cum_len": 5,
        "weight_version": 4,
        "digest": "ec2b6fbac9e43f1a899edf26134df36ef93b788be42e86a66537997353a76100",
        "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",
        "staging_key": f"r1/{CALL_1}",
        "mode": "text",
        "chain_hash": "0489a3eeb520deb2e49ffd40fdfc94cc0a71b6aaa0c83fff340e99015a9f9608",
        "cumulative_hash": "49328c7d45c84ab0da30f5bded881d985ee7b696616ea23bed15df86b7b99c90",
        "response_id": "chatcmpl-1",
        "admitted_at": 1796150114.0349722,
        "output_fingerprint": "9291144f4986ae935b19d80da641e2962c49ca5fc07a930541635e65fc0ba242",
        "continuation_fingerprint": (
            "9291144f4986ae935b19d80da641e2962c49ca5fc07a930541635e65fc0ba242"
        ),
        "fingerprint_version": 2,
    }
)
# The second call continues it; its row's fingerprints as the gate computes them.
ROW_2 = CallRecord(
    model_call_id=CALL_2,
    parent_call_id=CALL_1,
    prev_len=5,
    delta_len=4,
    cum_len=9,
    weight_version=4,
    digest="e" * 64,
    extras_digest=EMPTY_EXTRAS_DIGEST,
    staging_key=f"r1/{CALL_2}",
    mode="token_in",
    chain_hash=compute_chain_hash(ROW_1.chain_hash, [1, 7, 8, 2]),
    cumulative_hash="f" * 64,
    response_id="chatcmpl-2",
    admitted_at=1796150115.5,
    output_fingerprint=assistant_fingerprint([ANSWER_2]),
    continuation_fingerprint=assistant_fingerprint([*REQUEST_2, ANSWER_2]),
    fingerprint_version=2,
)
ROWS = [ROW_1, ROW_2]


def test_the_first_rows_fingerprints_are_the_gates() -> None:
    # §4.3's row was fingerprinted from an answer like ANSWER_1: our rows are built alike.
    assert assistant_fingerprint([ANSWER_1]) == ROW_1.output_fingerprint
    assert assistant_fingerprint([*REQUEST_1, ANSWER_1]) == ROW_1.continuation_fingerprint


def test_served_id_and_content() -> None:
    got = resolve_terminal(ROWS, {"id": "chatcmpl-2", "output": [ANSWER_2]})
    assert got == TerminalAttribution(CALL_2, "response_id", "corroborated_by=content")


def test_content_alone() -> None:
    got = resolve_terminal(ROWS, {"output": [ANSWER_2]})
    assert got == TerminalAttribution(CALL_2, "content", "response_has_no_id")


def test_declared() -> None:
    got = resolve_terminal(
        ROWS, {"id": "chatcmpl-2", "output": [ANSWER_2]}, declared_response_id="chatcmpl-2"
    )
    assert got == TerminalAttribution(CALL_2, "declared", "corroborated_by=response_id+content")


def test_witnesses_that_disagree() -> None:
    got = resolve_terminal(ROWS, {"id": "chatcmpl-1", "output": [ANSWER_2]})
    reason = f"witness_disagreement[response_id={CALL_1};content={CALL_2}]"
    assert got == TerminalAttribution(None, None, reason)


def test_explicit() -> None:
    got = resolve_terminal(ROWS, {"id": "chatcmpl-2", "output": [ANSWER_2]}, CALL_2)
    assert got == TerminalAttribution(CALL_2, "explicit", "corroborated_by=response_id+content")
    missed = resolve_terminal(ROWS, {"id": "chatcmpl-2"}, "call-gone")
    assert missed == TerminalAttribution(
        CALL_2, "response_id", "explicit_terminal_not_captured,response_has_no_output"
    )


def test_a_declared_id_that_does_not_resolve_stops_attribution() -> None:
    served = {"id": "chatcmpl-2", "output": [ANSWER_2]}
    got = resolve_terminal(ROWS, served, declared_response_id="chatcmpl-9")
    assert got == TerminalAttribution(None, None, "declared_terminal_not_captured")
    twin = ROW_1.model_copy(update={"response_id": "chatcmpl-2"})
    got = resolve_terminal([twin, ROW_2], served, declared_response_id="chatcmpl-2")
    assert got == TerminalAttribution(None, None, "declared_ambiguous")


def test_response_id_reasons() -> None:
    assert resolve_terminal(ROWS, None) == TerminalAttribution(None, None, "no_response_object")
    assert resolve_terminal(ROWS, ["chatcmpl-2"]).reason == "no_response_object"
    got = resolve_terminal(ROWS, {"id": "chatcmpl-9"})
    assert got.reason == "response_id_no_match,response_has_no_output"
    twin = ROW_1.model_copy(update={"response_id": "chatcmpl-2"})
    got = resolve_terminal([twin, ROW_2], {"id": "chatcmpl-2"})
    assert got.reason == "response_id_ambiguous,response_has_no_output"


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (None, "response_has_no_output"),
        ([], "response_has_no_output"),
        ("answer 2", "response_has_no_output"),
        ([message("x") | {"content": {"not": "a part"}}], "response_output_unfingerprintable"),
        (["not an item"], "response_output_unfingerprintable"),
        (
            [user("only a user turn"), {"type": "reasoning", "summary": []}],
            "no_model_authored_output",
        ),
        ([message("never said")], "no_content_match"),
    ],
)
def test_content_reasons(output: object, reason: str) -> None:
    got = resolve_terminal(ROWS, {"output": output})
    assert got == TerminalAttribution(None, None, f"response_has_no_id,{reason}")


def test_content_matches_the_continuation_or_the_trailing_run() -> None:
    # The whole conversation's assistant items: the continuation fingerprint of call 2.
    got = resolve_terminal(ROWS, {"output": [ANSWER_1, ANSWER_2]})
    assert got.terminal_model_call_id == CALL_2
    # Tool work before the answer: only the trailing assistant run is call 2's output.
    tool = [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    got = resolve_terminal(ROWS, {"output": [*tool, ANSWER_2]})
    assert got == TerminalAttribution(CALL_2, "content", "response_has_no_id")


def test_rows_without_fingerprint_version_2_are_not_content_candidates() -> None:
    unversioned = ROW_2.model_copy(update={"fingerprint_version": 0})
    got = resolve_terminal([ROW_1, unversioned], {"output": [ANSWER_2]})
    assert got.reason == "response_has_no_id,no_content_match"


def test_candidates_of_one_chain_reduce_to_the_smallest_call_id() -> None:
    fingerprint = assistant_fingerprint([ANSWER_2])
    root = row("root")
    # The same tokens staged twice (a retried call): one chain, two rows.
    late = row("b2", root, output_fingerprint=fingerprint)
    early = row("b1", root, output_fingerprint=fingerprint)
    got = resolve_terminal([root, late, early], {"output": [ANSWER_2]})
    assert got == TerminalAttribution("b1", "content", "response_has_no_id")
    # Across witnesses too: the served id names b2, the content b1, both the same chain.
    got = resolve_terminal([root, late, early], {"id": "chatcmpl-b2", "output": [ANSWER_2]})
    assert got == TerminalAttribution("b1", "response_id", "corroborated_by=content")
    # Different chains with the same answer are ambiguous.
    other = row("b3", root, delta=(9,), output_fingerprint=fingerprint)
    got = resolve_terminal([root, late, other], {"output": [ANSWER_2]})
    assert got == TerminalAttribution(None, None, "response_has_no_id,content_ambiguous")


# -- receipts ---------------------------------------------------------------------------------


def manifest(*failures: ManifestFailure, rows: list[CallRecord] | None = None) -> RolloutManifest:
    return RolloutManifest(
        rollout_id="r1", records=ROWS if rows is None else rows, failures=list(failures)
    )


def test_an_attributed_receipt_is_trainable() -> None:
    got = attribute_and_receive(manifest(), {"id": "chatcmpl-2", "output": [ANSWER_2]}, reward=0.5)
    assert got.terminal_model_call_id == CALL_2
    assert got.terminal_selection == "response_id"
    assert got.terminal_attribution_reason == "corroborated_by=content"
    assert not got.capture_poisoned
    assert got.failure_reason is None
    assert got.reward == 0.5


def test_an_explicit_terminal_is_recorded_as_declared() -> None:
    got = attribute_and_receive(manifest(), None, explicit_call_id=CALL_1)
    assert got.terminal_model_call_id == CALL_1
    assert got.terminal_selection == "declared"
    assert got.terminal_attribution_reason == "selected_by=explicit,no_response_object"
    assert not got.capture_poisoned


def test_without_witnesses_the_heuristic_chooses() -> None:
    got = attribute_and_receive(manifest())
    assert got.terminal_model_call_id == CALL_2
    assert got.terminal_selection == "heuristic"
    assert got.terminal_attribution_reason == "no_response_object,selected"
    assert not got.capture_poisoned


def test_an_ambiguous_heuristic_poisons() -> None:
    rows = [ROW_1, ROW_2, row("sibling", ROW_1)]
    got = attribute_and_receive(manifest(rows=rows), {"output": [message("unknown")]})
    assert got.terminal_model_call_id is None
    assert got.terminal_selection == "heuristic"
    reason = "response_has_no_id,no_content_match,ambiguous_terminal"
    assert got.terminal_attribution_reason == reason
    assert got.capture_poisoned
    assert got.failure_reason == reason


def test_a_declared_id_that_does_not_resolve_masks_the_rollout() -> None:
    got = attribute_and_receive(
        manifest(), {"id": "chatcmpl-2", "output": [ANSWER_2]}, declared_response_id="chatcmpl-9"
    )
    assert got.capture_poisoned
    assert got.terminal_model_call_id is None
    assert got.terminal_selection == "declared"
    assert got.terminal_attribution_reason == "declared_terminal_not_captured"
    assert got.failure_reason == "declared_terminal_not_captured"
    with pytest.raises(ReceiptVerificationError) as caught:
        verify_and_linearize(got, [])
    assert str(caught.value) == "rollout_failed: declared_terminal_not_captured"


def test_a_manifest_failure_poisons_an_attributed_rollout() -> None:
    failed = manifest(ManifestFailure(model_call_id="c9", reason="unresolved_parent"))
    got = attribute_and_receive(failed, {"id": "chatcmpl-2", "output": [ANSWER_2]})
    assert got.capture_poisoned
    assert got.failure_reason == "unresolved_parent"
    # Attribution is still recorded, for whoever audits the masked rollout.
    assert got.terminal_model_call_id == CALL_2
    assert got.terminal_selection == "response_id"
