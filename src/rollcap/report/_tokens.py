"""The token view's data: a rollout's staged calls, its chains and the trainer's verdict (no I/O).

What goes in (read by ``_source``): every staged call of the rollout as a ``StagedRead`` (the
record's base snapshot, or why it did not read as a valid record), and, when the gate's ledger
is there, the rollout's ``RolloutManifest`` (STAGING §4.3).

What comes out (``token_payload``), a JSON-ready dict:

- ``calls``: every call the records or the manifest name, in manifest order then by key: its
  lengths, weight version, parent, whether the manifest lists it and whether its record read
  (``read`` is ``None`` when it parsed, its digests recomputed, else why not);
- ``failures``: the manifest's failure rows (``call``, ``reason``);
- ``chains``: one per leaf of the ``parent_call_id`` links (and the terminal's, when staged
  calls the manifest does not list continue it), root first, the terminal's first, each
  verified alone with ``linearize`` against the manifest's rows for its calls (``custody:
  "ledger"``) or, for calls the manifest does not list, rows made from the records themselves
  (``"records"``; ``"partial"`` when mixed). ``refusal`` is ``None`` or the
  coded refusal (``code``, ``detail``); a refused chain keeps its tokens as staged, unverified,
  when every call of it has a record. Tokens are ``ids``, ``mask`` (``0.0`` carried prompt,
  ``1.0`` generated), ``logprobs`` (rounded to ``LOGPROB_DIGITS``), ``spans`` (each call's
  ``[start, end)`` with its weight version) and ``links`` (each call's carry and generated
  lengths);
- ``verdict``: ``None`` without a manifest; else what a trainer gets: the receipt of
  ``attribute_and_receive`` (terminal by ``select_terminal_call``, the report knowing no scored
  response) run through ``verify_and_linearize`` over every manifest row: ``trainable``, or the
  refusal's ``code`` and ``detail`` (``rollout_failed`` when a call failed, ``corrupt_digest``
  ...), with the terminal, how it was selected and the attribution reason;
- ``ledger``: where the manifest was looked for, whether it was found, and why it could not be
  read; ``error``: why the rollout's staging could not be read at all.

Two refusal codes are the report's own (not wire codes): ``snapshot_unavailable``, a call the
manifest or a chain needs has no readable record, so a trainer's fetch would fail before any
verification; ``receipt_invalid``, the manifest's rows cannot make a receipt at all (a damaged
ledger repeating a call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollcap.staging import (
    CallRecord,
    LinearizedRow,
    ReceiptVerificationError,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    attribute_and_receive,
    linearize,
    verify_and_linearize,
)

__all__ = [
    "LOGPROB_DIGITS",
    "RECEIPT_INVALID",
    "SNAPSHOT_UNAVAILABLE",
    "StagedRead",
    "token_payload",
]

# Enough to colour a cell and read its value; the exact floats stay in the staging records.
LOGPROB_DIGITS = 4
# The report's own refusal codes (see the module doc), never a wire code.
SNAPSHOT_UNAVAILABLE = "snapshot_unavailable"
RECEIPT_INVALID = "receipt_invalid"


@dataclass(frozen=True, slots=True)
class StagedRead:
    """One staged call as read from a staging source.

    ``snapshot`` is its base snapshot: validated when ``error`` is ``None``; when the record did
    not parse, the stored values as they are (``model_construct``: unverified, so that the
    rebuild gives its coded refusal), or ``None`` when nothing usable could be read. ``error``
    is why it did not read as a valid record.
    """

    key: str
    snapshot: StagedCallBaseSnapshot | None
    error: str | None = None

    @property
    def model_call_id(self) -> str:
        if self.snapshot is not None and isinstance(self.snapshot.model_call_id, str):
            return self.snapshot.model_call_id
        return self.key.rpartition("/")[2] or self.key


@dataclass(slots=True)
class _Call:
    call_id: str
    read: StagedRead | None = None
    row: CallRecord | None = None

    @property
    def snapshot(self) -> StagedCallBaseSnapshot | None:
        return None if self.read is None else self.read.snapshot

    @property
    def parent(self) -> str | None:
        if self.row is not None:
            return self.row.parent_call_id
        parent = getattr(self.snapshot, "parent_call_id", None)
        return parent if isinstance(parent, str) else None

    def field(self, name: str) -> Any:
        """The row's value when the manifest lists the call, else the record's (or ``None``)."""
        if self.row is not None:
            return getattr(self.row, name)
        return getattr(self.snapshot, name, None)


def _snapshots(calls: Sequence[_Call]) -> list[StagedCallBaseSnapshot] | _Call:
    """The calls' snapshots in order, or the first call without one."""
    shots: list[StagedCallBaseSnapshot] = []
    for call in calls:
        if call.snapshot is None:
            return call
        shots.append(call.snapshot)
    return shots


def _refusal(exc: ReceiptVerificationError) -> dict[str, str]:
    return {"code": exc.code, "detail": exc.detail}


def _unavailable(call: _Call) -> dict[str, str]:
    why = call.read.error if call.read is not None else None
    return {
        "code": SNAPSHOT_UNAVAILABLE,
        "detail": f"call {call.call_id}: {why or 'no staged record'}",
    }


def _own_row(shot: StagedCallBaseSnapshot) -> CallRecord:
    """A manifest row made from a record itself, for a call no ledger lists: the rebuild then
    checks the record's digest, lineage, chain and cumulative hashes and masks, not custody."""
    values = {name: getattr(shot, name, None) for name in _ROW_FROM_RECORD}
    return CallRecord.model_construct(
        **values, staging_key=f"{shot.rollout_id}/{shot.model_call_id}"
    )


# What a manifest row shares with a staged record: every column of the row the record has.
_ROW_FROM_RECORD = tuple(
    name for name in CallRecord.model_fields if name in StagedCallBaseSnapshot.model_fields
)


def _ordered_calls(
    reads: Sequence[StagedRead], manifest: RolloutManifest | None
) -> dict[str, _Call]:
    by_key = {read.key: read for read in reads}
    calls: dict[str, _Call] = {}
    used: set[str] = set()
    for row in manifest.records if manifest is not None else ():
        read = by_key.get(row.staging_key)
        if read is not None:
            used.add(read.key)
        calls.setdefault(row.model_call_id, _Call(row.model_call_id, read, row))

    def lineage_order(read: StagedRead) -> tuple[int, str]:
        prev = getattr(read.snapshot, "prev_len", None)
        return (prev if type(prev) is int else 0, read.key)

    for read in sorted(reads, key=lineage_order):
        if read.key in used:
            continue
        call = calls.setdefault(read.model_call_id, _Call(read.model_call_id))
        if call.read is None:
            call.read = read
    return calls


def _ancestry(leaf: str, calls: Mapping[str, _Call]) -> list[_Call]:
    """``leaf`` and its ancestors among ``calls``, root first; stops at a cycle."""
    chain: list[_Call] = []
    seen: set[str] = set()
    current: str | None = leaf
    while current is not None and current in calls and current not in seen:
        seen.add(current)
        chain.append(calls[current])
        current = calls[current].parent
    chain.reverse()
    return chain


def _rounded(values: Sequence[Any]) -> list[Any]:
    return [round(v, LOGPROB_DIGITS) if isinstance(v, float) else v for v in values]


def _tokens_of(row: LinearizedRow, chain: Sequence[_Call]) -> dict[str, Any]:
    return {
        "ids": row.token_ids,
        "mask": row.token_mask,
        "logprobs": _rounded(row.logprobs),
        "spans": [
            {
                "call": span.model_call_id,
                "start": span.start,
                "end": span.end,
                "weight_version": span.weight_version,
            }
            for span in row.weight_version_spans
        ],
        "links": [list(link) for link in row.link_spans],
        "prompt_len": row.prompt_len,
    }


def _as_staged(shots: Sequence[StagedCallBaseSnapshot]) -> dict[str, Any]:
    """A refused chain's tokens as they were staged (unverified); none when a record's columns
    are not even lists of one length."""
    ids: list[Any] = []
    mask: list[Any] = []
    logprobs: list[Any] = []
    spans: list[dict[str, Any]] = []
    links: list[list[Any]] = []
    for shot in shots:
        delta = getattr(shot, "token_ids_delta", None)
        delta_mask = getattr(shot, "token_mask_delta", None)
        delta_logprobs = getattr(shot, "generation_log_probs_delta", None)
        if not (
            isinstance(delta, list)
            and isinstance(delta_mask, list)
            and isinstance(delta_logprobs, list)
            and len(delta) == len(delta_mask) == len(delta_logprobs)
        ):
            return {"ids": [], "mask": [], "logprobs": [], "spans": [], "links": []}
        carry = 0
        while carry < len(delta_mask) and delta_mask[carry] == 0.0:
            carry += 1
        start = len(ids)
        ids.extend(delta)
        mask.extend(delta_mask)
        logprobs.extend(_rounded(delta_logprobs))
        spans.append(
            {
                "call": shot.model_call_id,
                "start": start,
                "end": len(ids),
                "weight_version": getattr(shot, "weight_version", None),
            }
        )
        links.append([shot.model_call_id, carry, len(delta) - carry])
    return {"ids": ids, "mask": mask, "logprobs": logprobs, "spans": spans, "links": links}


def _chain_view(rollout_id: str, chain: Sequence[_Call], terminal: str | None) -> dict[str, Any]:
    ids = [call.call_id for call in chain]
    listed = sum(call.row is not None for call in chain)
    view: dict[str, Any] = {
        "calls": ids,
        "terminal": terminal is not None and ids[-1] == terminal,
        "custody": "ledger" if listed == len(chain) else "records" if not listed else "partial",
        "refusal": None,
        "chain_hash": chain[-1].field("chain_hash"),
        "cumulative_hash": chain[-1].field("cumulative_hash"),
    }
    shots = _snapshots(chain)
    if isinstance(shots, _Call):
        view["refusal"] = _unavailable(shots)
        view.update(ids=[], mask=[], logprobs=[], spans=[], links=[])
        return view
    rows = [
        call.row if call.row is not None else _own_row(shot)
        for call, shot in zip(chain, shots, strict=True)
    ]
    try:
        row = linearize(rollout_id, shots, rows, terminal_hint=ids[-1])
    except ReceiptVerificationError as exc:
        view["refusal"] = _refusal(exc)
        view.update(_as_staged(shots))
        return view
    view.update(_tokens_of(row, chain))
    return view


def _verdict(
    manifest: RolloutManifest, calls: Mapping[str, _Call]
) -> tuple[dict[str, Any], RolloutReceipt | None]:
    """What a trainer gets for the rollout: the attributed receipt, verified over every row."""
    try:
        receipt = attribute_and_receive(manifest)
    except ValueError as exc:  # a damaged ledger: rows no receipt can hold (a repeated call)
        return {
            "trainable": False,
            "code": RECEIPT_INVALID,
            "detail": str(exc),
            "terminal": None,
            "selection": None,
            "attribution": None,
            "poisoned": True,
            "failure_reason": None,
        }, None
    verdict: dict[str, Any] = {
        "trainable": False,
        "code": None,
        "detail": None,
        "terminal": receipt.terminal_model_call_id,
        "selection": receipt.terminal_selection,
        "attribution": receipt.terminal_attribution_reason,
        "poisoned": receipt.capture_poisoned,
        "failure_reason": receipt.failure_reason,
    }
    shots = _snapshots([calls[row.model_call_id] for row in manifest.records])
    try:
        if isinstance(shots, _Call):
            # The checks of the receipt itself (its poison first) need no snapshot; past them,
            # a trainer's fetch of the missing record fails before anything else is verified.
            try:
                verify_and_linearize(receipt, [])
            except ReceiptVerificationError as exc:
                if exc.code != "row_count_mismatch":
                    raise
            verdict.update(_unavailable(shots))
            return verdict, receipt
        verify_and_linearize(receipt, shots)
    except ReceiptVerificationError as exc:
        verdict.update(_refusal(exc))
        return verdict, receipt
    verdict["trainable"] = True
    return verdict, receipt


def _call_view(call: _Call) -> dict[str, Any]:
    key = call.row.staging_key if call.row is not None else None
    if key is None and call.read is not None:
        key = call.read.key
    return {
        "id": call.call_id,
        "key": key,
        "parent": call.parent,
        "mode": call.field("mode"),
        "prev_len": call.field("prev_len"),
        "delta_len": call.field("delta_len"),
        "cum_len": call.field("cum_len"),
        "weight_version": call.field("weight_version"),
        "response_id": call.row.response_id if call.row is not None else None,
        "in_manifest": call.row is not None,
        "staged": call.snapshot is not None,
        "read": None if call.read is None else call.read.error,
    }


def token_payload(
    rollout_id: str,
    reads: Sequence[StagedRead],
    manifest: RolloutManifest | None = None,
    *,
    ledger: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The token view of one rollout (see the module doc); ``ledger`` is passed through."""
    calls = _ordered_calls(reads, manifest)
    verdict: dict[str, Any] | None = None
    terminal: str | None = None
    if manifest is not None:
        verdict, receipt = _verdict(manifest, calls)
        terminal = None if receipt is None else receipt.terminal_model_call_id
    parents = {call.parent for call in calls.values()}
    leaves = [call_id for call_id in calls if call_id not in parents]
    # A leaf of the manifest that staged records the manifest does not list continue.
    if terminal is not None and terminal in calls and terminal not in leaves:
        leaves.append(terminal)
    chains = [_ancestry(leaf, calls) for leaf in leaves]
    # A cycle has no leaf: its calls still get a chain (the rebuild refuses it).
    covered = {call.call_id for chain in chains for call in chain}
    for call_id in calls:
        if call_id not in covered:
            chain = _ancestry(call_id, calls)
            chains.append(chain)
            covered.update(call.call_id for call in chain)
    views = [_chain_view(rollout_id, chain, terminal) for chain in chains if chain]
    views.sort(key=lambda view: not view["terminal"])
    return {
        "error": error,
        "ledger": dict(ledger) if ledger is not None else None,
        "verdict": verdict,
        "failures": [
            {"call": failure.model_call_id, "reason": failure.reason}
            for failure in (manifest.failures if manifest is not None else ())
        ],
        "calls": [_call_view(call) for call in calls.values()],
        "chains": views,
    }
