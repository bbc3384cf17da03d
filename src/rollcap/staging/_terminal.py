"""Which chain of a rollout gets the reward: witnesses, then a structural heuristic.

A rollout's manifest may hold several chains (an agent that forks, retries, or runs sub-agents),
and the reward belongs to the one whose answer was scored. :func:`resolve_terminal` joins the
scored ``response`` to a manifest row through witnesses (an explicit call id, the response id the
agent declared it kept, the response's id, its assistant-authored content); only when nothing
was declared and no witness attributed does :func:`select_terminal_call` pick a terminal from the
lineage alone (STAGING §7.3). :func:`attribute_and_receive` runs both and builds the receipt.

Every reason code here is a wire literal of 0.7.0, never repurposed; the ones rollcap adds are
marked as such.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rollcap.staging._fingerprint import (
    FINGERPRINT_VERSION,
    UnfingerprintableError,
    assistant_fingerprint,
)
from rollcap.staging._rebuild import receipt_for
from rollcap.staging._records import (
    CallRecord,
    RolloutManifest,
    RolloutReceipt,
    TerminalSelectionMethod,
)

__all__ = [
    "AMBIGUOUS_TERMINAL",
    "CONTENT_AMBIGUOUS",
    "DECLARED_AMBIGUOUS",
    "DECLARED_TERMINAL_NOT_CAPTURED",
    "DUPLICATE_CALL_ID",
    "EXPLICIT_TERMINAL_NOT_CAPTURED",
    "NO_CONTENT_MATCH",
    "NO_MODEL_AUTHORED_OUTPUT",
    "NO_RECORDS",
    "NO_RESPONSE_OBJECT",
    "NO_ROOT",
    "ORPHANED_ROW",
    "RESPONSE_HAS_NO_ID",
    "RESPONSE_HAS_NO_OUTPUT",
    "RESPONSE_ID_AMBIGUOUS",
    "RESPONSE_ID_NO_MATCH",
    "RESPONSE_OUTPUT_UNFINGERPRINTABLE",
    "SELECTED",
    "AttributionMethod",
    "TerminalAttribution",
    "TerminalSelection",
    "attribute_and_receive",
    "resolve_terminal",
    "select_terminal_call",
]

# select_terminal_call's reasons (STAGING §7.4).
SELECTED = "selected"
NO_RECORDS = "no_records"
DUPLICATE_CALL_ID = "duplicate_call_id"
ORPHANED_ROW = "orphaned_row"
NO_ROOT = "no_root"
AMBIGUOUS_TERMINAL = "ambiguous_terminal"

# The witnesses' reasons (STAGING §7.3).
EXPLICIT_TERMINAL_NOT_CAPTURED = "explicit_terminal_not_captured"
DECLARED_AMBIGUOUS = "declared_ambiguous"
DECLARED_TERMINAL_NOT_CAPTURED = "declared_terminal_not_captured"
RESPONSE_ID_AMBIGUOUS = "response_id_ambiguous"
RESPONSE_ID_NO_MATCH = "response_id_no_match"
RESPONSE_HAS_NO_ID = "response_has_no_id"
NO_RESPONSE_OBJECT = "no_response_object"
RESPONSE_HAS_NO_OUTPUT = "response_has_no_output"
RESPONSE_OUTPUT_UNFINGERPRINTABLE = "response_output_unfingerprintable"
NO_MODEL_AUTHORED_OUTPUT = "no_model_authored_output"
CONTENT_AMBIGUOUS = "content_ambiguous"
NO_CONTENT_MATCH = "no_content_match"

AttributionMethod = Literal["declared", "response_id", "content", "explicit"]

# 0.7.0 has no terminal_selection literal for an explicit call id; rollcap records it as
# "declared" (a party named the terminal rather than a witness finding it) and says so in the
# attribution reason with _SELECTED_BY_EXPLICIT.
_SELECTION: dict[AttributionMethod, TerminalSelectionMethod] = {
    "explicit": "declared",
    "declared": "declared",
    "response_id": "response_id",
    "content": "content",
}
_SELECTED_BY_EXPLICIT = "selected_by=explicit"


@dataclass(frozen=True)
class TerminalSelection:
    """What :func:`select_terminal_call` chose: a call id and ``selected``, or ``None`` and why
    not."""

    terminal_model_call_id: str | None
    reason: str


@dataclass(frozen=True)
class TerminalAttribution:
    """What :func:`resolve_terminal` found.

    ``terminal_model_call_id`` and ``method`` (the first witness that named it) are both set or
    both ``None``. ``reason`` is the witnesses' reasons joined with ``","`` in witness order
    (``""`` when there is nothing to say), then ``corroborated_by=<m>+<m>`` or
    ``witness_disagreement[<method>=<id>;...]``.
    """

    terminal_model_call_id: str | None
    method: AttributionMethod | None
    reason: str


def select_terminal_call(rows: Sequence[CallRecord]) -> TerminalSelection:
    """The terminal of ``rows`` by lineage alone (STAGING §7.3's heuristic); reads no tokens.

    Refused as ``no_records``, ``duplicate_call_id``, ``orphaned_row`` (a parent not in the rows)
    or ``no_root``, in that order. Then the root: among the roots with children if any, else
    all roots, the first by (unstamped ``admitted_at`` last, ``admitted_at``, position). Then
    down: at a call without children that call is ``selected``; else among its children those
    with children of their own if any, else all of them; more than one is
    ``ambiguous_terminal``, one is descended into.
    """
    rows = list(rows)
    if not rows:
        return TerminalSelection(None, NO_RECORDS)
    position: dict[str, int] = {}
    for index, row in enumerate(rows):
        if row.model_call_id in position:
            return TerminalSelection(None, DUPLICATE_CALL_ID)
        position[row.model_call_id] = index
    children: dict[str, list[CallRecord]] = {row.model_call_id: [] for row in rows}
    for row in rows:
        if row.parent_call_id is None:
            continue
        if row.parent_call_id not in children:
            return TerminalSelection(None, ORPHANED_ROW)
        children[row.parent_call_id].append(row)
    roots = [row for row in rows if row.parent_call_id is None]
    if not roots:
        return TerminalSelection(None, NO_ROOT)
    pool = [row for row in roots if children[row.model_call_id]] or roots
    current = min(
        pool,
        key=lambda row: (
            row.admitted_at is None,
            row.admitted_at if row.admitted_at is not None else 0.0,
            position[row.model_call_id],
        ),
    )
    # Walking down from a root never meets a cycle: a call on a cycle has its parent on the
    # cycle, so it is nobody else's child.
    while True:
        kids = children[current.model_call_id]
        if not kids:
            return TerminalSelection(current.model_call_id, SELECTED)
        left = [kid for kid in kids if children[kid.model_call_id]] or kids
        if len(left) > 1:
            return TerminalSelection(None, AMBIGUOUS_TERMINAL)
        current = left[0]


def _reduce(candidates: Sequence[CallRecord]) -> str | None:
    """One call id for ``candidates``: the smallest when they all stage the same chain (same
    cumulative hash, chain hash and length: training either is the same), else ``None``."""
    if not candidates:
        return None
    chains = {(row.cumulative_hash, row.chain_hash, row.cum_len) for row in candidates}
    if len(chains) != 1:
        return None
    return min(row.model_call_id for row in candidates)


def _authored(item: object) -> bool:
    # The fingerprint's notion of assistant-authored, for finding the answer's trailing run.
    return isinstance(item, Mapping) and (
        item.get("role") == "assistant" or item.get("type") == "function_call"
    )


def _content_witness(
    rows: Sequence[CallRecord], response: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """(call id, None) when the response's content names one call, else (None, reason)."""
    output = response.get("output")
    if not isinstance(output, list | tuple) or not output:
        return None, RESPONSE_HAS_NO_OUTPUT
    items = list(output)
    try:
        target = assistant_fingerprint(items)
        # A final answer that replays earlier turns in its output still ends with the terminal
        # call's own items: their fingerprint is that call's output_fingerprint.
        run = 0
        while run < len(items) and _authored(items[len(items) - 1 - run]):
            run += 1
        tail = assistant_fingerprint(items[len(items) - run :]) if 0 < run < len(items) else ""
    except UnfingerprintableError:
        return None, RESPONSE_OUTPUT_UNFINGERPRINTABLE
    if not target:
        return None, NO_MODEL_AUTHORED_OUTPUT
    outputs = {target, tail} - {""}
    matched = [
        row
        for row in rows
        if row.fingerprint_version == FINGERPRINT_VERSION
        and (
            row.continuation_fingerprint == target
            or (row.output_fingerprint is not None and row.output_fingerprint in outputs)
        )
    ]
    if not matched:
        return None, NO_CONTENT_MATCH
    call = _reduce(matched)
    return (call, None) if call is not None else (None, CONTENT_AMBIGUOUS)


def _response_id_witness(
    rows: Sequence[CallRecord], response: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    response_id = response.get("id")
    if not isinstance(response_id, str) or not response_id:
        return None, RESPONSE_HAS_NO_ID
    matched = [row for row in rows if row.response_id == response_id]
    if not matched:
        return None, RESPONSE_ID_NO_MATCH
    call = _reduce(matched)
    return (call, None) if call is not None else (None, RESPONSE_ID_AMBIGUOUS)


def resolve_terminal(
    rows: Sequence[CallRecord],
    response: object,
    explicit_call_id: str | None = None,
    *,
    declared_response_id: str | None = None,
) -> TerminalAttribution:
    """Join the scored ``response`` to one of the manifest ``rows`` (STAGING §7.3's witnesses).

    In order: ``explicit_call_id`` names a row (else ``explicit_terminal_not_captured``, and
    the others still run); ``declared_response_id`` is the ``response_id`` of rows that reduce
    to one call (else attribution stops, unattributed, with ``declared_terminal_not_captured``
    or ``declared_ambiguous``); ``response["id"]`` is a row's ``response_id``; the
    assistant-authored content of ``response["output"]`` matches a row's
    ``continuation_fingerprint`` (whole output) or ``output_fingerprint`` (whole output or its
    trailing assistant run), fingerprint version 2 only. A ``response`` that is not a mapping
    gives ``no_response_object`` for both of the last two.

    Candidates that stage one chain reduce to the smallest call id, within a witness and across
    witnesses; witnesses naming different chains leave the rollout unattributed with
    ``witness_disagreement[...]``. Never raises for a malformed ``response``.
    """
    rows = list(rows)
    by_id = {row.model_call_id: row for row in rows}
    found: list[tuple[AttributionMethod, str]] = []
    reasons: list[str] = []
    # An empty id names nothing: it counts as not given, as in 0.7.0.
    if explicit_call_id:
        if explicit_call_id in by_id:
            found.append(("explicit", explicit_call_id))
        else:
            reasons.append(EXPLICIT_TERMINAL_NOT_CAPTURED)
    if declared_response_id:
        declared = [row for row in rows if row.response_id == declared_response_id]
        call = _reduce(declared)
        if call is None:
            reasons.append(DECLARED_AMBIGUOUS if declared else DECLARED_TERMINAL_NOT_CAPTURED)
            return TerminalAttribution(None, None, ",".join(reasons))
        found.append(("declared", call))
    if isinstance(response, Mapping):
        witnesses: tuple[tuple[AttributionMethod, tuple[str | None, str | None]], ...] = (
            ("response_id", _response_id_witness(rows, response)),
            ("content", _content_witness(rows, response)),
        )
        for method, (call, reason) in witnesses:
            if call is not None:
                found.append((method, call))
            elif reason is not None:
                reasons.append(reason)
    else:
        reasons.append(NO_RESPONSE_OBJECT)
    if not found:
        return TerminalAttribution(None, None, ",".join(reasons))
    terminal = _reduce([by_id[call] for _, call in found])
    if terminal is None:
        named = ";".join(f"{method}={call}" for method, call in found)
        reasons.append(f"witness_disagreement[{named}]")
        return TerminalAttribution(None, None, ",".join(reasons))
    if len(found) > 1:
        reasons.append("corroborated_by=" + "+".join(method for method, _ in found[1:]))
    return TerminalAttribution(terminal, found[0][0], ",".join(reasons))


def _join(*reasons: str) -> str:
    return ",".join(reason for reason in reasons if reason)


def attribute_and_receive(
    manifest: RolloutManifest,
    response: object = None,
    *,
    reward: float | None = None,
    explicit_call_id: str | None = None,
    declared_response_id: str | None = None,
) -> RolloutReceipt:
    """The receipt for ``manifest`` with its terminal attributed to the scored ``response``.

    The rule (rollcap's; 0.7.0 fixes the vocabulary, not this code):

    1. :func:`resolve_terminal`. A witness that attributes sets the terminal and the selection
       (``explicit`` is recorded as ``declared`` with ``selected_by=explicit`` leading the
       attribution reason, 0.7.0 having no literal for it).
    2. Else, when nothing was declared (``declared_response_id`` is ``None``),
       :func:`select_terminal_call`: selection ``heuristic``, its reason appended.
    3. Else (a declared id that does not resolve) the rollout is masked: no terminal,
       selection ``declared``.

    ``terminal_attribution_reason`` is the joined reasons (``None`` when there are none). The
    receipt is poisoned when the manifest has failures (``failure_reason`` the first one's, as
    :func:`~rollcap.staging._rebuild.receipt_for` does) or when no terminal was attributed
    (``failure_reason`` the attribution reason); otherwise it is trainable.
    """
    rows = list(manifest.records)
    found = resolve_terminal(
        rows, response, explicit_call_id, declared_response_id=declared_response_id
    )
    terminal = found.terminal_model_call_id
    reason = found.reason
    selection: TerminalSelectionMethod
    if terminal is not None and found.method is not None:
        selection = _SELECTION[found.method]
        if found.method == "explicit":
            reason = _join(_SELECTED_BY_EXPLICIT, reason)
    elif declared_response_id is None:
        heuristic = select_terminal_call(rows)
        selection = "heuristic"
        terminal = heuristic.terminal_model_call_id
        reason = _join(reason, heuristic.reason)
    else:
        selection = "declared"
    if manifest.failures or terminal is not None:
        return receipt_for(
            manifest,
            reward=reward,
            terminal_model_call_id=terminal,
            terminal_selection=selection,
            terminal_attribution_reason=reason or None,
        )
    return RolloutReceipt(
        rollout_id=manifest.rollout_id,
        reward=reward,
        manifest=rows,
        capture_poisoned=True,
        failure_reason=reason,
        terminal_selection=selection,
        terminal_attribution_reason=reason or None,
    )
