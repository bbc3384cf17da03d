"""The trainer's rebuild: a receipt and its base snapshots verified, one chain linearized.

A trainer reads a rollout's manifest (the gate's ledger rows), builds a ``RolloutReceipt`` that
names the terminal call (``receipt_for``; ``attribute_and_receive`` in ``_terminal`` attributes
the terminal first), fetches one base snapshot per manifest row from its staging source and calls
:func:`verify_and_linearize` (STAGING §7.2). The result is one training row: the terminal call's
ancestry, root first, its token deltas concatenated.

Nothing is repaired and nothing is guessed. Every row of the manifest is checked against its
snapshot and every snapshot's digest recomputed, even for branches that are not trained, so a
tampered or mismatched byte anywhere in the rollout refuses the whole rollout with a coded
:class:`ReceiptVerificationError`. Extras are never read: the row carries what each call's extras
must hash to (``extras_commitments``) for the consumer that fetches them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollcap.staging._digest import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_staging_digest,
    hash_token_ids,
)
from rollcap.staging._records import (
    CallRecord,
    ExtrasCommitment,
    LinearizedRow,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    TerminalSelectionMethod,
    WeightVersionSpan,
)

__all__ = [
    "RebuildError",
    "ReceiptVerificationError",
    "linearize",
    "receipt_for",
    "verify_and_linearize",
]


class ReceiptVerificationError(Exception):
    """A receipt and its snapshots refused: ``.code`` is the wire code, ``.detail`` the why.

    The message is ``"<code>: <detail>"``. A refused rollout must not be trained, in whole or in
    part.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class RebuildError(ReceiptVerificationError):
    """A refusal of the lineage graph or the terminal chain (missing parents, lengths, cycles,
    the terminal, chain and cumulative hashes, masks), rather than of a row or a snapshot."""


# The fields a snapshot must repeat from its manifest row, in the order they are compared; a
# mismatch is refused as ``wrong_<field>``.
_ROW_FIELDS = (
    "model_call_id",
    "parent_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)

_VERSION_FIELDS = (
    ("schema_version", STAGING_SCHEMA_VERSION, "unsupported_schema"),
    ("digest_version", STAGING_DIGEST_VERSION, "unsupported_digest"),
    ("extras_digest_version", EXTRAS_DIGEST_VERSION, "unsupported_extras_digest"),
)


def verify_and_linearize(
    receipt: RolloutReceipt, snapshots: Sequence[StagedCallBaseSnapshot]
) -> LinearizedRow:
    """Verify ``receipt`` against ``snapshots`` and return its terminal chain as one row.

    ``snapshots`` are the base snapshots a source returned for the manifest's staging keys: one
    per manifest row, in manifest order (a full ``StagedCallRecord`` is accepted too; its extras
    are not read). The checks run in STAGING §7.2's order and the first failure raises
    :class:`ReceiptVerificationError` (``RebuildError`` for the graph and chain checks) with
    its code; an element that is not a ``StagedCallBaseSnapshot`` raises ``TypeError``.

    The receipt and the snapshots are read as given, not re-validated: a receipt or snapshot
    made with ``model_construct`` gets the same coded refusals as bytes tampered in storage.
    Every row is verified; only the terminal's ancestry is linearized, so a sibling branch
    costs its verification but is never trained.
    """
    _check_receipt(receipt)
    rows = list(receipt.manifest)
    shots = list(snapshots)
    if len(shots) != len(rows):
        raise ReceiptVerificationError(
            "row_count_mismatch", f"{len(shots)} snapshots for {len(rows)} manifest rows"
        )
    by_id = {row.model_call_id: row for row in rows}
    seen: set[str] = set()
    for index, (row, shot) in enumerate(zip(rows, shots, strict=True)):
        _check_pair(receipt, row, shot, index, by_id, seen)
    by_shot = {shot.model_call_id: shot for shot in shots}
    _check_lineage(rows)
    chain = _terminal_chain(receipt.terminal_model_call_id, by_id)
    return _linearize_chain(receipt.rollout_id, chain, [by_shot[r.model_call_id] for r in chain])


def _check_receipt(receipt: RolloutReceipt) -> None:
    """Steps 1-5: the receipt's versions, its poison, and a manifest with unique rows."""
    for name, expected, code in _VERSION_FIELDS:
        value = getattr(receipt, name)
        if not _is_exact(value, expected):
            raise ReceiptVerificationError(code, f"receipt {name} {value!r}, expected {expected}")
    if receipt.failure_reason is not None:
        raise ReceiptVerificationError("rollout_failed", receipt.failure_reason)
    if receipt.capture_poisoned:
        raise ReceiptVerificationError(
            "capture_poisoned", "receipt marks token capture as poisoned"
        )
    if not receipt.manifest:
        raise ReceiptVerificationError("empty_manifest", "receipt manifest has no rows")
    call_ids: set[str] = set()
    for row in receipt.manifest:
        if row.model_call_id in call_ids:
            raise ReceiptVerificationError(
                "duplicate_manifest_row", f"call {row.model_call_id} appears more than once"
            )
        call_ids.add(row.model_call_id)
    keys: dict[str, str] = {}
    for row in receipt.manifest:
        if row.staging_key in keys:
            raise ReceiptVerificationError(
                "duplicate_staging_key",
                f"key {row.staging_key} names calls {keys[row.staging_key]} "
                f"and {row.model_call_id}",
            )
        keys[row.staging_key] = row.model_call_id


def _is_exact(value: object, expected: int) -> bool:
    # ``True == 1``: a bool must never pass for version 1.
    return type(value) is int and value == expected


def _check_pair(
    receipt: RolloutReceipt,
    row: CallRecord,
    shot: object,
    index: int,
    by_id: dict[str, CallRecord],
    seen: set[str],
) -> None:
    """Steps 7-11 for one (row, snapshot) pair."""
    if not isinstance(shot, StagedCallBaseSnapshot):
        raise TypeError(
            f"snapshot {index} must be a StagedCallBaseSnapshot, not {type(shot).__name__}"
        )
    call = shot.model_call_id
    if call in seen:
        raise ReceiptVerificationError(
            "duplicate_snapshot", f"call {call} has more than one snapshot"
        )
    seen.add(call)
    if call not in by_id:
        raise ReceiptVerificationError(
            "snapshot_identity_mismatch", f"snapshot of call {call} matches no manifest row"
        )
    if call != row.model_call_id:
        raise ReceiptVerificationError(
            "snapshot_order_mismatch",
            f"key {row.staging_key} expected {row.model_call_id}, received {call}",
        )
    if shot.rollout_id != receipt.rollout_id:
        raise ReceiptVerificationError(
            "wrong_rollout",
            f"call {call}: snapshot {shot.rollout_id}, receipt {receipt.rollout_id}",
        )
    for name in _ROW_FIELDS:
        staged, listed = getattr(shot, name), getattr(row, name)
        # Compared with their types: a snapshot's 8 and a row's True or 8.0 are not one value.
        if type(staged) is not type(listed) or staged != listed:
            raise ReceiptVerificationError(
                f"wrong_{name}", f"call {call}: snapshot {staged}, manifest {listed}"
            )
    for name, _, _ in _VERSION_FIELDS:
        values = (getattr(shot, name), getattr(row, name), getattr(receipt, name))
        if not all(_is_exact(value, values[2]) for value in values):
            raise ReceiptVerificationError(
                f"wrong_{name}",
                f"call {call}: snapshot {values[0]!r}, manifest {values[1]!r}, "
                f"receipt {values[2]!r}",
            )
    # The digest function ignores the keys it does not hash (``digest``, a record's ``extras``).
    fields: dict[str, Any] = dict(shot)
    try:
        recomputed = compute_staging_digest(**fields)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ReceiptVerificationError("invalid_snapshot", f"call {call}: {exc}") from None
    if recomputed != shot.digest:
        raise ReceiptVerificationError("corrupt_digest", f"call {call}: staged digest mismatch")


def _check_lineage(rows: Sequence[CallRecord]) -> None:
    """Step 12, row by row: its parent listed and ending where it starts, then its ancestry
    walked for a cycle, before the next row (0.7.0's order, so the same rows get the same code).

    The walk is bounded so that rows that bypassed validation cannot loop it.
    """
    by_id = {row.model_call_id: row for row in rows}
    for row in rows:
        if row.parent_call_id is None:
            continue
        parent = by_id.get(row.parent_call_id)
        if parent is None:
            raise RebuildError(
                "missing_parent",
                f"call {row.model_call_id} names parent {row.parent_call_id}, "
                "which is not in the manifest",
            )
        if parent.cum_len != row.prev_len:
            raise RebuildError(
                "parent_length_mismatch",
                f"call {row.model_call_id} starts at {row.prev_len}, "
                f"parent ends at {parent.cum_len}",
            )
        steps = 0
        current: CallRecord | None = row
        while current is not None and current.parent_call_id is not None:
            steps += 1
            if steps > len(rows):
                raise RebuildError("lineage_cycle", f"call {row.model_call_id} is its own ancestor")
            current = by_id.get(current.parent_call_id)


def _terminal_chain(terminal: str | None, by_id: dict[str, CallRecord]) -> list[CallRecord]:
    """Step 13: the terminal's ancestry, root first (the graph is already checked)."""
    if terminal is None:
        raise RebuildError("missing_terminal", "receipt names no terminal call")
    row = by_id.get(terminal)
    if row is None:
        raise RebuildError("missing_terminal", f"terminal call {terminal} is not in the manifest")
    chain = [row]
    while row.parent_call_id is not None:
        row = by_id[row.parent_call_id]
        chain.append(row)
    chain.reverse()
    return chain


def _linearize_chain(
    rollout_id: str, chain: Sequence[CallRecord], shots: Sequence[StagedCallBaseSnapshot]
) -> LinearizedRow:
    """Steps 14-17 along the chain, then the row."""
    token_ids: list[int] = []
    token_mask: list[float] = []
    logprobs: list[float] = []
    spans: list[WeightVersionSpan] = []
    links: list[tuple[str, int, int]] = []
    commitments: list[ExtrasCommitment] = []
    parent_chain: str | None = None
    for row, shot in zip(chain, shots, strict=True):
        call = row.model_call_id
        if compute_chain_hash(parent_chain, shot.token_ids_delta) != row.chain_hash:
            detail = (
                f"call {call} does not extend its parent's staged chain"
                if parent_chain is not None
                else f"root call {call} does not start a staged chain"
            )
            raise RebuildError("chain_hash_mismatch", detail)
        parent_chain = row.chain_hash
        carry = _carry_len(call, shot.token_mask_delta)
        generated = len(shot.token_mask_delta) - carry
        if generated == 0:
            raise RebuildError("empty_generation", f"call {call} generated no token")
        start = len(token_ids)
        token_ids.extend(shot.token_ids_delta)
        token_mask.extend(shot.token_mask_delta)
        logprobs.extend(shot.generation_log_probs_delta)
        spans.append(
            WeightVersionSpan(
                model_call_id=call,
                start=start,
                end=len(token_ids),
                weight_version=row.weight_version,
            )
        )
        links.append((call, carry, generated))
        commitments.append(
            ExtrasCommitment(
                model_call_id=call,
                extras_digest_version=row.extras_digest_version,
                extras_digest=row.extras_digest,
            )
        )
    # Unreachable after empty_generation, kept as the row-level guarantee it states.
    if 1.0 not in token_mask:
        raise RebuildError("empty_training_row", "the terminal chain has no generated token")
    terminal = chain[-1]
    if hash_token_ids(token_ids) != terminal.cumulative_hash:
        raise RebuildError(
            "cumulative_hash_mismatch",
            f"terminal call {terminal.model_call_id}: the chain's ids do not hash to its "
            "cumulative hash",
        )
    return LinearizedRow(
        rollout_id=rollout_id,
        token_ids=token_ids,
        token_mask=token_mask,
        logprobs=logprobs,
        model_call_ids=[row.model_call_id for row in chain],
        prompt_len=links[0][1],
        weight_versions=[row.weight_version for row in chain],
        weight_version_spans=spans,
        link_spans=links,
        extras_commitments=commitments,
    )


def _carry_len(call: str, mask: Sequence[float]) -> int:
    """The number of leading 0.0s; refused when a 0.0 follows a 1.0 (carry then generation)."""
    carry = 0
    while carry < len(mask) and mask[carry] == 0.0:
        carry += 1
    for position in range(carry, len(mask)):
        if mask[position] != 1.0:
            raise RebuildError(
                "invalid_mask_order",
                f"call {call}: mask value {mask[position]} at {position} follows generation",
            )
    return carry


def linearize(
    rollout_id: str,
    snapshots: Sequence[StagedCallBaseSnapshot],
    manifest: RolloutManifest | Sequence[CallRecord],
    *,
    terminal_hint: str | None = None,
) -> LinearizedRow:
    """:func:`verify_and_linearize` under a ``declared`` receipt naming ``terminal_hint``.

    ``manifest`` is the manifest's rows, or the ``RolloutManifest`` itself; then its
    ``rollout_id`` must be ``rollout_id`` (``ValueError``) and a failure row poisons the rollout
    as :func:`receipt_for` does (``rollout_failed``). Without a hint it refuses at once with
    ``missing_terminal`` (a ``ReceiptVerificationError``, before any row is read, as 0.7.0's
    does). The receipt is assembled without validation so that every defect of the rows gets
    its coded refusal rather than a pydantic error.
    """
    if terminal_hint is None:
        raise ReceiptVerificationError("missing_terminal", "no terminal hint was given")
    failure_reason: str | None = None
    if isinstance(manifest, RolloutManifest):
        if manifest.rollout_id != rollout_id:
            raise ValueError(
                f"manifest of rollout {manifest.rollout_id!r} given for {rollout_id!r}"
            )
        rows = list(manifest.records)
        if manifest.failures:
            failure_reason = manifest.failures[0].reason
    else:
        rows = list(manifest)
    receipt = RolloutReceipt.model_construct(
        rollout_id=rollout_id,
        terminal_model_call_id=terminal_hint,
        manifest=rows,
        capture_poisoned=failure_reason is not None,
        failure_reason=failure_reason,
        terminal_selection="declared" if terminal_hint is not None else None,
    )
    return verify_and_linearize(receipt, snapshots)


def receipt_for(
    manifest: RolloutManifest,
    *,
    reward: float | None = None,
    terminal_model_call_id: str | None = None,
    terminal_selection: TerminalSelectionMethod | None = None,
    terminal_attribution_reason: str | None = None,
) -> RolloutReceipt:
    """The framework's receipt for ``manifest`` (STAGING §7.1).

    A manifest with any ``failures`` row is poisoned: ``capture_poisoned`` true and
    ``failure_reason`` the first failure row's reason (the choice of the first is rollcap's;
    0.7.0 leaves it to the framework). The terminal, selection and attribution reason given
    are kept on it, so a poisoned receipt still says what attribution found. Such a receipt
    is refused by :func:`verify_and_linearize` (``rollout_failed``) and never trains.

    Otherwise the receipt is trainable and needs ``terminal_model_call_id`` (a call of the
    manifest) and ``terminal_selection``: ``ValueError`` without them, and pydantic's
    ``ValidationError`` (a ``ValueError``) for a terminal not in the manifest.
    """
    failure_reason: str | None = None
    if manifest.failures:
        failure_reason = manifest.failures[0].reason
    elif terminal_model_call_id is None:
        raise ValueError("a trainable receipt needs a terminal_model_call_id")
    elif terminal_selection is None:
        raise ValueError("a trainable receipt needs the terminal_selection that chose it")
    return RolloutReceipt(
        rollout_id=manifest.rollout_id,
        reward=reward,
        terminal_model_call_id=terminal_model_call_id,
        manifest=list(manifest.records),
        capture_poisoned=failure_reason is not None,
        failure_reason=failure_reason,
        terminal_selection=terminal_selection,
        terminal_attribution_reason=terminal_attribution_reason,
    )
