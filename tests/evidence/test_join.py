from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from rollcap.evidence import AgentObservationBundle, join_model_call_observations
from rollcap.evidence._models import dump
from tests.evidence.conftest import (
    JUDGE,
    POLICY,
    bundle,
    by_id,
    by_response,
    call_id,
    calls_of,
    canonical,
    gap,
    invocation,
    responses_raw,
)


def join(value: dict[str, Any], *raws: dict[str, Any]) -> dict[str, Any]:
    parsed = AgentObservationBundle.model_validate(value)
    return dump(join_model_call_observations(parsed, calls_of(*raws)))


def refs(joined: dict[str, Any], index: int = 0) -> list[dict[str, Any]]:
    return list(joined["records"][index]["model_calls"])


def full(ref: dict[str, Any]) -> dict[str, Any]:
    """A ref as a dump writes it: every key, nulls included."""
    return {"model_call_id": None, "model_ref": None, "response_id": None, **ref}


def unowned(n: int) -> dict[str, Any]:
    return gap("model_call_ownership_unavailable", f"capture:{call_id(n)}:call_index={n}")


def test_a_ref_by_model_call_id_claims_the_call_and_becomes_canonical() -> None:
    joined = join(bundle(invocation("root", by_id(0))), responses_raw(0))
    assert refs(joined) == [canonical(0)]
    assert joined["gaps"] == []


def test_a_ref_by_server_and_response_id_claims_the_call() -> None:
    joined = join(bundle(invocation("root", by_response(1))), responses_raw(0), responses_raw(1))
    assert refs(joined) == [canonical(1)]
    assert joined["gaps"] == [unowned(0)]


def test_an_id_ref_is_filtered_by_its_server_and_response_id() -> None:
    wrong_server = {**by_id(0), "model_ref": JUDGE}
    wrong_response = {**by_id(0), "response_id": "resp_9"}
    joined = join(bundle(invocation("root", wrong_server, wrong_response)), responses_raw(0))
    assert refs(joined) == [full(wrong_server), full(wrong_response)]
    assert joined["gaps"] == [
        gap("model_call_reference_unmatched", call_id(0), "root"),
        unowned(0),
    ]


def test_a_response_key_is_per_server() -> None:
    raws = (responses_raw(0, response_id="r"), responses_raw(1, response_id="r", server=JUDGE))
    ref = {"model_ref": JUDGE, "response_id": "r"}
    joined = join(bundle(invocation("root", ref)), *raws)
    assert refs(joined) == [{"model_call_id": call_id(1), "model_ref": JUDGE, "response_id": "r"}]


def test_session_auto_attach_appends_the_canonical_ref_in_capture_order() -> None:
    raws = (
        responses_raw(0, session="sub"),
        responses_raw(1, session="root"),
        responses_raw(2, session="root"),
        responses_raw(3, session="nobody"),
    )
    joined = join(bundle(invocation("root"), invocation("sub")), *raws)
    assert refs(joined, 0) == [canonical(1), canonical(2)]
    assert refs(joined, 1) == [canonical(0)]
    assert joined["gaps"] == [unowned(3)]


@pytest.mark.parametrize(
    "existing",
    [
        {"model_call_id": call_id(0)},
        {"model_call_id": call_id(0), "model_ref": POLICY},
        {"model_call_id": call_id(0), "response_id": "resp_0"},
        canonical(0),
        {"model_ref": POLICY, "response_id": "resp_0"},
    ],
)
def test_session_auto_attach_skips_a_call_the_invocation_already_names(
    existing: dict[str, Any],
) -> None:
    joined = join(bundle(invocation("root", existing)), responses_raw(0, session="root"))
    assert refs(joined) == [canonical(0)]
    assert joined["gaps"] == []


def test_session_auto_attach_needs_a_model_call_id() -> None:
    joined = join(bundle(invocation("root")), responses_raw(0, session="root", model_call_id=""))
    assert refs(joined) == []
    assert joined["gaps"] == [
        gap("model_call_ownership_unavailable", "capture:resp_0:call_index=0")
    ]


def test_first_claim_wins_and_the_second_is_a_conflict_with_the_calls_id() -> None:
    joined = join(
        bundle(invocation("a", by_id(0)), invocation("b", by_response(0))), responses_raw(0)
    )
    assert refs(joined, 0) == [canonical(0)]
    assert refs(joined, 1) == [full(by_response(0))]  # kept verbatim
    assert joined["gaps"] == [gap("model_call_reference_conflict", call_id(0), "b")]


def test_one_invocation_naming_a_call_twice_conflicts_with_itself() -> None:
    joined = join(bundle(invocation("a", by_id(0), by_response(0))), responses_raw(0))
    assert refs(joined) == [canonical(0), full(by_response(0))]
    assert joined["gaps"] == [gap("model_call_reference_conflict", call_id(0), "a")]


def test_unmatched_and_ambiguous_refs_are_kept_verbatim() -> None:
    raws = (responses_raw(0, response_id="dup"), responses_raw(1, response_id="dup"))
    missing = {"model_ref": POLICY, "response_id": "nowhere"}
    twice = {"model_ref": POLICY, "response_id": "dup"}
    joined = join(bundle(invocation("a", missing, twice)), *raws)
    assert refs(joined) == [full(missing), full(twice)]
    assert joined["gaps"] == [
        gap("model_call_reference_unmatched", "nowhere", "a"),
        gap("model_call_reference_ambiguous", "dup", "a"),
        gap("model_call_ownership_unavailable", f"capture:{call_id(0)}:call_index=0"),
        gap("model_call_ownership_unavailable", f"capture:{call_id(1)}:call_index=1"),
    ]


def test_a_call_without_any_id_is_unowned_as_unknown() -> None:
    raw = responses_raw(0, model_call_id="")
    raw["response"].pop("id")
    joined = join(bundle(), raw)
    assert joined["gaps"] == [
        gap("model_call_ownership_unavailable", "capture:unknown:call_index=0")
    ]


def compaction(**fields: Any) -> dict[str, Any]:
    return {"kind": "context_compaction", "invocation_id": "a", **fields}


def test_compaction_refs_owned_by_their_invocation_become_canonical() -> None:
    joined = join(
        bundle(
            invocation("a", by_id(0), by_id(1), by_id(2)),
            compaction(
                before_model_call=by_id(0), model_calls=[by_id(1)], after_model_call=by_id(2)
            ),
        ),
        responses_raw(0),
        responses_raw(1),
        responses_raw(2),
    )
    record = joined["records"][1]
    assert record["before_model_call"] == canonical(0)
    assert record["model_calls"] == [canonical(1)]
    assert record["after_model_call"] == canonical(2)
    assert joined["gaps"] == []


def test_compaction_model_calls_must_be_owned_by_the_compactions_invocation() -> None:
    joined = join(
        bundle(
            invocation("a"),
            invocation("b", by_id(0)),
            compaction(model_calls=[by_id(0), by_id(1), by_id(7)]),
        ),
        responses_raw(0),
        responses_raw(1),
    )
    assert joined["records"][2]["model_calls"] == [full(by_id(0)), full(by_id(1)), full(by_id(7))]
    assert joined["gaps"] == [
        gap("model_call_reference_conflict", f"model_calls:{call_id(0)}", "a"),
        gap("model_call_ownership_unavailable", f"model_calls:{call_id(1)}", "a"),
        gap("model_call_reference_unmatched", f"model_calls:{call_id(7)}", "a"),
        unowned(1),  # compaction refs never confer ownership
    ]


def test_compaction_before_and_after_refs() -> None:
    raws = (
        responses_raw(0),
        responses_raw(1),
        responses_raw(2, response_id="dup"),
        responses_raw(3, response_id="dup"),
    )
    joined = join(
        bundle(
            invocation("a"),
            invocation("b", by_id(0)),
            compaction(before_model_call=by_id(0), after_model_call=by_id(1)),
            compaction(
                before_model_call={"model_ref": POLICY, "response_id": "dup"},
                after_model_call={"model_ref": POLICY, "response_id": "gone"},
            ),
        ),
        *raws,
    )
    first, second = joined["records"][2], joined["records"][3]
    assert first["before_model_call"] == full(by_id(0))
    assert first["after_model_call"] == canonical(1)  # unowned: canonical, no gap
    assert second["before_model_call"]["response_id"] == "dup"
    assert joined["gaps"][:3] == [
        gap("model_call_reference_conflict", f"before_model_call:{call_id(0)}", "a"),
        gap("model_call_reference_ambiguous", "before_model_call:dup", "a"),
        gap("model_call_reference_unmatched", "after_model_call:gone", "a"),
    ]


def test_result_gaps_drop_an_earlier_joins_and_dedupe() -> None:
    own = [
        gap("tool_timing_unavailable", "t1", "a"),
        gap("model_call_reference_unmatched", "old", "a"),
        gap("model_call_reference_ambiguous", "old"),
        gap("model_call_reference_conflict", "old", "b"),
        gap("model_call_ownership_unavailable", "capture:old:call_index=9"),
        gap("model_call_ownership_unavailable"),  # no detail: kept
        gap("model_call_ownership_unavailable", "capture:x", "a"),  # has an invocation: kept
        gap("tool_timing_unavailable", "t1", "a"),
    ]
    joined = join(bundle(invocation("a", by_id(5)), gaps=own), responses_raw(0))
    assert joined["gaps"] == [
        gap("tool_timing_unavailable", "t1", "a"),
        gap("model_call_ownership_unavailable"),
        gap("model_call_ownership_unavailable", "capture:x", "a"),
        gap("model_call_reference_unmatched", call_id(5), "a"),
        unowned(0),
    ]


def test_the_join_is_idempotent_and_leaves_its_input_alone() -> None:
    value = bundle(
        invocation("a", by_response(0), by_id(9)),
        invocation("b", by_id(0)),
        compaction(model_calls=[by_id(3)], before_model_call=by_id(0)),
        gaps=[gap("producer_gap")],
    )
    raws = (responses_raw(0), responses_raw(1), responses_raw(2, session="b"))
    parsed = AgentObservationBundle.model_validate(value)
    before = copy.deepcopy(dump(parsed))
    once = join_model_call_observations(parsed, calls_of(*raws))
    assert dump(parsed) == before
    twice = join_model_call_observations(once, calls_of(*raws))
    assert dump(twice) == dump(once)


def test_canonicalizing_a_call_that_has_no_key_raises() -> None:
    raw = responses_raw(0, model_call_id="", model_ref=None)
    parsed = AgentObservationBundle.model_validate(bundle(invocation("a", by_response(0))))
    # The call matches nothing (it has no server), so the join itself is fine...
    assert join_model_call_observations(parsed, calls_of(raw)).gaps
    # ...but a call found by id whose canonical ref cannot be built makes the join raise.
    bad = responses_raw(0, model_ref=None)
    bad["response"].pop("id")
    parsed = AgentObservationBundle.model_validate(bundle(invocation("a", by_id(0))))
    canon = join_model_call_observations(parsed, calls_of(bad)).invocations()[0].model_calls
    assert canon[0].model_call_id == call_id(0)
    with pytest.raises(ValidationError):
        AgentObservationBundle.model_validate(bundle(invocation("a", {"model_call_id": ""})))


def test_a_compaction_ownership_gap_survives_a_rejoin_at_the_bundles_place() -> None:
    # Section 4.5 drops only ownership gaps without an invocation and with a capture: detail,
    # so a compaction's ownership gap of an earlier join is the bundle's own on a rejoin: it
    # moves ahead of the join's gaps, and the duplicate the rejoin makes is dropped.
    value = bundle(invocation("a", by_id(9)), compaction(model_calls=[by_id(1)]))
    raws = (responses_raw(0), responses_raw(1))
    once = join_model_call_observations(
        AgentObservationBundle.model_validate(value), calls_of(*raws)
    )
    twice = join_model_call_observations(once, calls_of(*raws))
    ownership = gap("model_call_ownership_unavailable", f"model_calls:{call_id(1)}", "a")
    unmatched = gap("model_call_reference_unmatched", call_id(9), "a")
    assert dump(once)["gaps"] == [unmatched, ownership, unowned(0), unowned(1)]
    assert dump(twice)["gaps"] == [ownership, unmatched, unowned(0), unowned(1)]
