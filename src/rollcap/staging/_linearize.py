"""Rebuild training sequences from staged deltas, verifying everything on the way.

``linearize_records`` is pure: records in, chains out. Each call's full ids are its parent's
first ``prev_len`` full ids followed by its own delta (masks and logprobs alike), and one
``LinearizedChain`` is returned per leaf call (a call no other call names as parent), root to
leaf. Every digest, extras digest and chain hash is recomputed and every link checked; the
first fault is a ``LinearizeError`` naming the call, never a repair.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from rollcap.staging import _digest
from rollcap.staging._records import (
    CommitCoords,
    LinearizeError,
    StagedCallRecord,
    StagedRecordError,
)
from rollcap.staging._sinks import DirectoryStagingSink, StagingSource

__all__ = [
    "LinearizedChain",
    "lineage",
    "linearize",
    "linearize_records",
    "verify_record",
    "verify_records",
]


@dataclass(frozen=True, slots=True)
class LinearizedChain:
    """One root-to-leaf chain of calls as a single training sequence.

    ``token_ids``, ``loss_mask`` (1 for generated tokens) and ``logprobs`` (0.0 where the mask
    is 0) have the same length. The per-call tuples run root to leaf: call ``i``'s own tokens
    are ``token_ids[prev_lens[i]:cum_lens[i]]`` as seen by that call; a later call whose
    ``prev_len`` cuts into them replaces what follows the cut.
    """

    rollout_id: str
    model_call_ids: tuple[str, ...]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    weight_versions: tuple[int, ...]
    prev_lens: tuple[int, ...]
    cum_lens: tuple[int, ...]
    chain_hash: str

    @property
    def leaf_model_call_id(self) -> str:
        return self.model_call_ids[-1]

    @property
    def staging_keys(self) -> tuple[str, ...]:
        return tuple(f"{self.rollout_id}/{c}" for c in self.model_call_ids)


def _error(record: StagedCallRecord, why: str) -> LinearizeError:
    return LinearizeError(
        f"staged call {record.model_call_id} ({record.staging_key}): {why}",
        model_call_id=record.model_call_id,
        staging_key=record.staging_key,
    )


def verify_record(record: StagedCallRecord) -> None:
    """Recompute one record's digests and chain hash; ``LinearizeError`` on any mismatch."""
    digest = _digest.call_digest(
        rollout_id=record.rollout_id,
        model_call_id=record.model_call_id,
        parent_model_call_id=record.parent_model_call_id,
        prev_len=record.prev_len,
        weight_version=record.weight_version,
        token_ids=record.token_ids,
        loss_mask=record.loss_mask,
        logprobs=record.logprobs,
    )
    if digest != record.digest:
        raise _error(record, f"digest mismatch: stored {record.digest}, computed {digest}")
    try:
        extras_digest = _digest.extras_digest(record.extras)
    except ValueError as exc:
        raise _error(record, f"extras cannot be digested: {exc}") from None
    if extras_digest != record.extras_digest:
        raise _error(
            record,
            f"extras digest mismatch: stored {record.extras_digest}, computed {extras_digest}",
        )
    chain = _digest.chain_hash(
        parent_chain_hash=record.parent_chain_hash,
        prev_len=record.prev_len,
        digest=record.digest,
        extras_digest=record.extras_digest,
    )
    if chain != record.chain_hash:
        raise _error(record, f"chain hash mismatch: stored {record.chain_hash}, computed {chain}")


def _check_coords(by_id: Mapping[str, StagedCallRecord], coords: Iterable[CommitCoords]) -> None:
    for coord in coords:
        if not coord.staged:
            continue
        record = by_id.get(coord.model_call_id)
        if record is None:
            raise LinearizeError(
                f"staged call {coord.model_call_id} ({coord.staging_key}): reported staged "
                "but no record was found",
                model_call_id=coord.model_call_id,
                staging_key=coord.staging_key,
            )
        for name in ("digest", "extras_digest", "chain_hash", "parent_chain_hash", "cum_len"):
            reported, stored = getattr(coord, name), getattr(record, name)
            if reported != stored:
                raise _error(record, f"{name} {stored} differs from the reported {reported}")


class _Linked(Protocol):
    @property
    def parent_model_call_id(self) -> str | None: ...


L = TypeVar("L", bound=_Linked)


def lineage(calls: Mapping[str, L], leaf: str) -> list[L]:
    """The calls from the root down to ``leaf``, following parent links (known to be sound)."""
    path: list[L] = []
    current: str | None = leaf
    while current is not None:
        call = calls[current]
        path.append(call)
        current = call.parent_model_call_id
    path.reverse()
    return path


def verify_records(
    rollout_id: str,
    records: Iterable[StagedCallRecord],
    *,
    coords: Iterable[CommitCoords] | None = None,
) -> dict[str, StagedCallRecord]:
    """Verify a rollout's records, each and every link between them; by model call id.

    ``coords``, when given, are the commit coords the worker reported: each staged one must
    match its record, which anchors the chain hashes outside the staged files.
    """
    by_id: dict[str, StagedCallRecord] = {}
    for record in records:
        if record.rollout_id != rollout_id:
            raise _error(record, f"belongs to rollout {record.rollout_id}, not {rollout_id}")
        if record.model_call_id in by_id:
            raise _error(record, "staged more than once")
        verify_record(record)
        by_id[record.model_call_id] = record
    if coords is not None:
        _check_coords(by_id, coords)

    # Check every link, including calls that are not on any leaf's path (a cycle has no leaf).
    depth: dict[str, int] = {}
    for model_call_id in by_id:
        _link(by_id, model_call_id, depth)
    return by_id


def linearize_records(
    rollout_id: str,
    records: Iterable[StagedCallRecord],
    *,
    coords: Iterable[CommitCoords] | None = None,
) -> list[LinearizedChain]:
    """Verify a rollout's records (``verify_records``) and rebuild one chain per leaf, ordered
    by call ids."""
    by_id = verify_records(rollout_id, records, coords=coords)
    parents = {r.parent_model_call_id for r in by_id.values()}
    leaves = [c for c in by_id if c not in parents]
    chains = [_chain(rollout_id, by_id, leaf) for leaf in leaves]
    chains.sort(key=lambda chain: chain.model_call_ids)
    return chains


def _link(by_id: Mapping[str, StagedCallRecord], model_call_id: str, depth: dict[str, int]) -> None:
    """Check the links from a call up to its root, iteratively, detecting cycles."""
    path: list[StagedCallRecord] = []
    on_path: set[str] = set()
    current: str | None = model_call_id
    while current is not None and current not in depth:
        record = by_id[current]
        if current in on_path:
            raise _error(record, "its parent links form a cycle")
        on_path.add(current)
        path.append(record)
        parent_id = record.parent_model_call_id
        if parent_id is None:
            if record.parent_chain_hash != _digest.ROOT_CHAIN_HASH:
                raise _error(record, "a root call whose parent chain hash is not the root hash")
            if record.prev_len != 0:
                raise _error(record, f"a root call with prev_len {record.prev_len} (must be 0)")
            break
        parent = by_id.get(parent_id)
        if parent is None:
            raise _error(record, f"parent {parent_id} is missing from the rollout")
        if record.parent_chain_hash != parent.chain_hash:
            raise _error(
                record,
                f"parent chain hash {record.parent_chain_hash} is not parent {parent_id}'s "
                f"chain hash {parent.chain_hash}",
            )
        if record.prev_len > parent.cum_len:
            raise _error(
                record,
                f"prev_len {record.prev_len} exceeds parent {parent_id}'s {parent.cum_len} ids",
            )
        current = parent_id
    for record in reversed(path):
        parent_id = record.parent_model_call_id
        depth[record.model_call_id] = 0 if parent_id is None else depth[parent_id] + 1


def _chain(
    rollout_id: str,
    by_id: Mapping[str, StagedCallRecord],
    leaf: str,
) -> LinearizedChain:
    path = lineage(by_id, leaf)
    token_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    for record in path:
        del token_ids[record.prev_len :], loss_mask[record.prev_len :], logprobs[record.prev_len :]
        token_ids.extend(record.token_ids)
        loss_mask.extend(record.loss_mask)
        logprobs.extend(record.logprobs)
    return LinearizedChain(
        rollout_id=rollout_id,
        model_call_ids=tuple(r.model_call_id for r in path),
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        weight_versions=tuple(r.weight_version for r in path),
        prev_lens=tuple(r.prev_len for r in path),
        cum_lens=tuple(r.cum_len for r in path),
        chain_hash=path[-1].chain_hash,
    )


def linearize(
    sink_dir: str | os.PathLike[str] | StagingSource,
    rollout_id: str,
    *,
    coords: Iterable[CommitCoords] | None = None,
) -> list[LinearizedChain]:
    """Read a rollout's staged calls (a ``DirectoryStagingSink`` root, or any source with
    ``read``) and linearize them; every fault is a ``LinearizeError`` naming the call."""
    source: StagingSource = (
        DirectoryStagingSink(sink_dir) if isinstance(sink_dir, str | os.PathLike) else sink_dir
    )
    try:
        records = source.read(rollout_id)
    except StagedRecordError as exc:
        raise LinearizeError(
            str(exc),
            model_call_id=exc.model_call_id,
            staging_key=exc.staging_key,
        ) from exc
    except (OSError, ValueError) as exc:
        raise LinearizeError(
            f"cannot read staged rollout {rollout_id}: {exc}",
            model_call_id=None,
            staging_key=None,
        ) from exc
    return linearize_records(rollout_id, records, coords=coords)
