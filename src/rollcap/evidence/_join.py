"""The exact join of an agent's call references with the captured calls (pure).

``join_model_call_observations(bundle, calls)`` returns a new bundle whose invocations own the
calls they name, by key only: a call's ``model_call_id``, or its ``(model_ref, response_id)``.
Timestamps, list positions, model names and payloads never decide ownership (EVIDENCE.md
section 4). In order:

0. session auto-attach: a call whose ``client_session_id`` is an invocation's id joins that
   invocation's refs, unless one of them already names it;
1. invocations, in record order, claim the calls their refs resolve to; the first claim wins,
   and a resolved ref becomes the call's canonical ref;
2. compaction refs resolve against the claims (they never claim);
3. gaps: the bundle's own, less those of an earlier join; the join's; one per unowned call.

Joining a joined bundle again gives the same bundle.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollcap.evidence._codes import (
    GAP_OWNERSHIP_UNAVAILABLE,
    GAP_REFERENCE_AMBIGUOUS,
    GAP_REFERENCE_CONFLICT,
    GAP_REFERENCE_UNMATCHED,
)
from rollcap.evidence._models import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    server_ref_key,
)
from rollcap.records import Gap, ModelCallRecord

__all__ = ["CallIndex", "canonical_ref", "dedupe_gaps", "join_model_call_observations"]

_JOIN_CODES = frozenset((GAP_REFERENCE_UNMATCHED, GAP_REFERENCE_AMBIGUOUS, GAP_REFERENCE_CONFLICT))


class CallIndex:
    """The captured calls by call key and by response key, to resolve refs against."""

    def __init__(self, calls: Sequence[ModelCallRecord]) -> None:
        self.calls = calls
        self._by_id: dict[str, list[int]] = {}
        self._by_response: dict[tuple[str, str, str], list[int]] = {}
        for position, call in enumerate(calls):
            if call.model_call_id:
                self._by_id.setdefault(call.model_call_id, []).append(position)
            server = server_ref_key(call.model_ref)
            if server is not None and call.response_id:
                self._by_response.setdefault((*server, call.response_id), []).append(position)

    def candidates(self, ref: ModelCallRef) -> list[int]:
        """Positions of the calls ``ref`` can denote (section 4.1)."""
        call_id, server, response_id = ref.key()
        if call_id:
            return [
                position
                for position in self._by_id.get(call_id, ())
                if (server is None or server == server_ref_key(self.calls[position].model_ref))
                and (response_id is None or response_id == self.calls[position].response_id)
            ]
        if server is None or response_id is None:
            return []
        return list(self._by_response.get((*server, response_id), ()))


def canonical_ref(call: ModelCallRecord) -> ModelCallRef:
    """The ref that names ``call`` exactly; raises when the call has no key to be named by."""
    return ModelCallRef.model_validate(
        {
            "model_call_id": call.model_call_id,
            "model_ref": call.model_ref,
            "response_id": call.response_id,
        }
    )


def dedupe_gaps(gaps: Sequence[Gap]) -> list[Gap]:
    """``gaps`` without repeats of ``(code, invocation_id, detail)``, first positions kept."""
    seen: set[tuple[str, str | None, str | None]] = set()
    out: list[Gap] = []
    for gap in gaps:
        key = (gap.code, gap.invocation_id, gap.detail)
        if key not in seen:
            seen.add(key)
            out.append(gap)
    return out


def _denotes(ref: ModelCallRef, call: ModelCallRecord) -> bool:
    """Whether ``ref`` already names ``call`` for session auto-attach (section 4.2)."""
    server = server_ref_key(call.model_ref)
    response_id = call.response_id
    key = ref.key()
    forms: set[tuple[str | None, tuple[str, str] | None, str | None]] = {
        (call.model_call_id, None, None),
        (call.model_call_id, server, None),
        (call.model_call_id, None, response_id),
        (call.model_call_id, server, response_id),
    }
    if server is not None and response_id is not None:
        forms.add((None, server, response_id))
    return key in forms


def _attach_sessions(
    invocations: Sequence[AgentInvocation], calls: Sequence[ModelCallRecord]
) -> None:
    by_id = {invocation.invocation_id: invocation for invocation in invocations}
    for call in calls:
        session = call.client_session_id
        if not session or not call.model_call_id or session not in by_id:
            continue
        invocation = by_id[session]
        if not any(_denotes(ref, call) for ref in invocation.model_calls):
            invocation.model_calls = [*invocation.model_calls, canonical_ref(call)]


def _ref_detail(ref: ModelCallRef) -> str | None:
    return ref.model_call_id or ref.response_id


def _call_detail(call: ModelCallRecord) -> str | None:
    return call.model_call_id or call.response_id


def join_model_call_observations(
    bundle: AgentObservationBundle, calls: Sequence[ModelCallRecord], *, copy: bool = True
) -> AgentObservationBundle:
    """``bundle`` with its refs resolved against ``calls`` (capture order); see the module.

    ``copy=False`` joins into ``bundle`` itself and returns it, for a caller that holds the
    only reference to it; a join that raises then leaves it half joined.
    """
    result = bundle.model_copy(deep=True) if copy else bundle
    invocations = result.invocations()
    compactions = [r for r in result.records if isinstance(r, ContextCompactionObservation)]
    index = CallIndex(calls)
    _attach_sessions(invocations, calls)

    owner: dict[int, str] = {}
    join_gaps: list[Gap] = []
    for invocation in invocations:
        claimant = invocation.invocation_id
        resolved: list[ModelCallRef] = []
        for ref in invocation.model_calls:
            found = index.candidates(ref)
            if len(found) != 1:
                code = GAP_REFERENCE_AMBIGUOUS if found else GAP_REFERENCE_UNMATCHED
                join_gaps.append(Gap(code, _ref_detail(ref), claimant))
                resolved.append(ref)
            elif found[0] in owner:
                call = calls[found[0]]
                join_gaps.append(Gap(GAP_REFERENCE_CONFLICT, _call_detail(call), claimant))
                resolved.append(ref)
            else:
                owner[found[0]] = claimant
                resolved.append(canonical_ref(calls[found[0]]))
        invocation.model_calls = resolved

    for compaction in compactions:
        join_gaps.extend(_join_compaction(compaction, index, owner))

    kept = [
        gap
        for gap in result.gaps
        if gap.code not in _JOIN_CODES
        and not (
            gap.code == GAP_OWNERSHIP_UNAVAILABLE
            and gap.invocation_id is None
            and gap.detail is not None
            and gap.detail.startswith("capture:")
        )
    ]
    unowned = [
        Gap(
            GAP_OWNERSHIP_UNAVAILABLE,
            f"capture:{_call_detail(call) or 'unknown'}:call_index={call.call_index}",
        )
        for position, call in enumerate(calls)
        if position not in owner
    ]
    result.gaps = dedupe_gaps([*kept, *join_gaps, *unowned])
    return result


def _join_compaction(
    compaction: ContextCompactionObservation, index: CallIndex, owner: dict[int, str]
) -> list[Gap]:
    """Resolve one compaction's refs in place; its gaps (section 4.4)."""
    own = compaction.invocation_id
    gaps: list[Gap] = []
    resolved: list[ModelCallRef] = []
    for ref in compaction.model_calls:
        found = index.candidates(ref)
        if len(found) != 1:
            code = GAP_REFERENCE_AMBIGUOUS if found else GAP_REFERENCE_UNMATCHED
            gaps.append(Gap(code, f"model_calls:{_ref_detail(ref)}", own))
            resolved.append(ref)
            continue
        call = index.calls[found[0]]
        holder = owner.get(found[0])
        if holder == own:
            resolved.append(canonical_ref(call))
            continue
        code = GAP_REFERENCE_CONFLICT if holder is not None else GAP_OWNERSHIP_UNAVAILABLE
        gaps.append(Gap(code, f"model_calls:{_call_detail(call)}", own))
        resolved.append(ref)
    compaction.model_calls = resolved
    for field in ("before_model_call", "after_model_call"):
        ref = getattr(compaction, field)
        if ref is None:
            continue
        found = index.candidates(ref)
        if len(found) != 1:
            code = GAP_REFERENCE_AMBIGUOUS if found else GAP_REFERENCE_UNMATCHED
            gaps.append(Gap(code, f"{field}:{_ref_detail(ref)}", own))
            continue
        call = index.calls[found[0]]
        holder = owner.get(found[0])
        if holder is not None and holder != own:
            gaps.append(Gap(GAP_REFERENCE_CONFLICT, f"{field}:{_call_detail(call)}", own))
            continue
        setattr(compaction, field, canonical_ref(call))
    return gaps
