"""The gate's ledger: one token-free row per committed or failed call, and the manifest.

The gate (the model server) writes a row for a call only after the worker's commit coordinates
check out, so a row is what makes a call resolvable as a parent (STAGING §0, §1.2-§1.3). Rows
live in ``<root>/<rollout_id>.lineage.jsonl``, one JSON object per line (keys sorted, compact
separators), appended under ``fcntl.flock`` on ``<root>/<rollout_id>.tokens.lock`` and fsynced
before the append returns, so several model-server processes may share one directory
(STAGING §4.4). Two row kinds:

- a committed row: the call's custody columns (what its :class:`CallRecord` is rebuilt from)
  plus its lineage columns ``fingerprint``, ``context_len``, ``context_digest`` and ``digest``
  (the cumulative hash);
- a failure row: ``{"failure_reason", "model_call_id"}``.

Every method here does blocking file I/O and is meant to be called from threads; all are
thread-safe and safe across processes that share the directory.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

from rollcap.staging._fingerprint import (
    FINGERPRINT_VERSION,
    UnfingerprintableError,
    assistant_fingerprint,
    conversation_digest,
)
from rollcap.staging._records import (
    REASON_LEDGER_ROW_MISSING_CHAIN_HASH,
    REASON_LEDGER_ROW_MISSING_RESPONSE_ID,
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    check_rollout_id,
)
from rollcap.store import ZSTD_SUFFIX, CaptureStore

__all__ = [
    "DEFAULT_MAX_CACHED_ROLLOUTS",
    "LINEAGE_MARKER_SUFFIX",
    "LINEAGE_SUFFIX",
    "LOCK_SUFFIX",
    "CaptureLedgerCommit",
    "FileLineageStore",
    "ParentRow",
    "failure_row",
    "ledger_row",
    "output_fingerprints",
]

LINEAGE_SUFFIX = ".lineage.jsonl"
LINEAGE_MARKER_SUFFIX = ".lineage.incomplete"
LOCK_SUFFIX = ".tokens.lock"
DEFAULT_MAX_CACHED_ROLLOUTS = 4096

# The ids a rollout's file names are made from: no separator, so no id escapes the root.

# Threads of one process serialize per rollout on one of these; a fixed number keeps the memory
# bounded however many rollouts pass through, at the price of unrelated rollouts sometimes
# sharing a stripe.
_LOCK_STRIPES = 64

# The columns a committed row shares with its CallRecord under the same name. The record's
# digest is stored as ``staging_digest``: ``digest`` is the lineage column (the cumulative hash).
_SHARED_COLUMNS = (
    "model_call_id",
    "parent_call_id",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "extras_digest",
    "staging_key",
    "mode",
    "chain_hash",
    "cumulative_hash",
    "response_id",
    "admitted_at",
    "output_fingerprint",
    "continuation_fingerprint",
    "fingerprint_version",
)

_Id = Annotated[str, StringConstraints(min_length=1)]


class CaptureLedgerCommit(BaseModel):
    """What the gate hands the ledger for one committed call (STAGING §4.3).

    ``staging_chain`` is the parent's chain plus this record's ``staging_key``: ``[key]`` for a
    root, at least two keys for a child, always ending with the record's key. The items are the
    call's request items and its served answer as output items (STAGING §1.3); they are hashed
    into the row, never stored.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    schema_version: Literal[2] = 2
    rollout_id: _Id
    record: CallRecord
    staging_chain: list[_Id]
    request_items: list[dict[str, Any]]
    response_items: list[dict[str, Any]]

    @model_validator(mode="after")
    def _chain_ends_here(self) -> CaptureLedgerCommit:
        if not self.staging_chain or self.staging_chain[-1] != self.record.staging_key:
            raise ValueError("a commit's staging_chain must end with its record's staging_key")
        if (self.record.parent_call_id is None) != (len(self.staging_chain) == 1):
            raise ValueError(
                "a root's staging_chain is its own key; a child's extends its parent's"
            )
        return self


@dataclass(frozen=True, slots=True)
class ParentRow:
    """The resolved parent of a continuation: what the gate builds a ``token_in`` admission from.

    ``chain_hash`` is ``None`` when the row lacks one; the admission then fails validation and
    the gate records ``unresolved_parent`` (STAGING §1.2).
    """

    model_call_id: str
    cum_len: int
    staging_chain: tuple[str, ...]
    chain_hash: str | None


def _fingerprint_or_none(items: Sequence[Mapping[str, Any]]) -> str | None:
    try:
        return assistant_fingerprint(items) or None
    except UnfingerprintableError:
        return None


def output_fingerprints(
    request_items: Sequence[Mapping[str, Any]], response_items: Sequence[Mapping[str, Any]]
) -> tuple[str | None, str | None]:
    """``(output_fingerprint, continuation_fingerprint)`` of a call record (STAGING §4.3).

    The assistant fingerprint of the response items, and of the request items followed by the
    response items; each is ``None`` when there is no assistant-authored item or when the items
    cannot be fingerprinted. Never raises for unfingerprintable items.
    """
    return (
        _fingerprint_or_none(response_items),
        _fingerprint_or_none([*request_items, *response_items]),
    )


def _dumps(row: Mapping[str, Any]) -> bytes:
    # Keys sorted, compact separators: one spelling per row, so identical rows compare equal.
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS)


def ledger_row(commit: CaptureLedgerCommit) -> dict[str, Any]:
    """The committed row ``commit`` makes, keys sorted, as ``FileLineageStore`` writes it.

    For a writer that appends rows itself (the model server group-commits them with its capture
    store): it must take an exclusive ``flock`` on the ledger file, write whole lines and fsync
    before the call is answered; ``FileLineageStore.record``'s no-op and conflict checks are then
    the writer's to keep (a gate that mints each call id writes each row once).
    """
    row = _commit_row(commit)
    return dict(sorted(row.items()))


def failure_row(model_call_id: str, reason: str) -> dict[str, Any]:
    """The failure row of ``model_call_id`` (keys sorted); ``ValueError`` for an empty id or
    reason."""
    if not _is_id(model_call_id):
        raise ValueError(f"a failure row needs a non-empty model call id, not {model_call_id!r}")
    if not _is_id(reason):
        raise ValueError(f"a failure row needs a non-empty reason, not {reason!r}")
    return {"failure_reason": reason, "model_call_id": model_call_id}


def _commit_row(commit: CaptureLedgerCommit) -> dict[str, Any]:
    record = commit.record
    request = commit.request_items
    try:
        # The row's fingerprint is the record's continuation fingerprint (both are
        # assistant_fingerprint(request items + response items)): taken from it when set, so a
        # commit is not fingerprinted twice. "" when no item is assistant-authored: such a row
        # is never a candidate, since the gate resolves only items that have a fingerprint.
        fingerprint: str | None = record.continuation_fingerprint
        if fingerprint is None or record.fingerprint_version != FINGERPRINT_VERSION:
            fingerprint = assistant_fingerprint([*request, *commit.response_items])
    except UnfingerprintableError:
        # The call is still committed (it may be a rollout's trainable terminal); it just can
        # never be resolved as a parent, so a continuation of it is unresolved.
        fingerprint = None
    try:
        context_digest: str | None = conversation_digest(request)
    except UnfingerprintableError:
        context_digest = None
    row: dict[str, Any] = {name: getattr(record, name) for name in _SHARED_COLUMNS}
    row.update(
        fingerprint=fingerprint,
        context_len=len(request),
        context_digest=context_digest,
        digest=record.cumulative_hash,
        staging_digest=record.digest,
        staging_chain=list(commit.staging_chain),
    )
    # As it will read back, so that comparing with a stored row compares like with like.
    loaded: dict[str, Any] = orjson.loads(_dumps(row))
    return loaded


def _is_id(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


@dataclass(slots=True)
class _Rows:
    """One rollout's rows as read so far, and where reading stopped."""

    device: int
    inode: int
    size: int  # bytes of the file seen, a torn last line included
    consumed: int  # bytes parsed: up to and including the last newline
    rows: list[dict[str, Any]] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set)  # every row serialized: duplicates count once
    committed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    by_fingerprint: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        canonical = _dumps(row)
        if canonical in self.seen:
            return
        self.seen.add(canonical)
        self.rows.append(row)
        if "failure_reason" in row:
            return
        call_id = row.get("model_call_id")
        if isinstance(call_id, str):
            self.committed.setdefault(call_id, []).append(row)
        fingerprint = row.get("fingerprint")
        if isinstance(fingerprint, str) and fingerprint:
            self.by_fingerprint.setdefault(fingerprint, []).append(row)


class FileLineageStore:
    """NeMo Gym's file ledger (``FileLineageStore``, STAGING §4.4) under ``root``.

    ``<root>/<rollout_id>.lineage.jsonl`` holds the rows, ``<root>/<rollout_id>.tokens.lock``
    is the ``flock`` every append (exclusive) and read (shared) holds; ``root`` is created on the
    first append. A torn last line, left by a crash in the middle of an append, is ignored on
    read and the next append starts on a fresh line.

    Reads are cached per rollout (at most ``max_cached_rollouts``, least recently used first
    out; 0 disables the cache): a file whose device, inode and size are unchanged is not read
    again, and one that only grew is read from where the last read stopped, so another
    process's appends are always seen.
    """

    def __init__(
        self, root: Path, *, max_cached_rollouts: int = DEFAULT_MAX_CACHED_ROLLOUTS
    ) -> None:
        if type(max_cached_rollouts) is not int or max_cached_rollouts < 0:
            raise ValueError(
                f"max_cached_rollouts must be an int >= 0, not {max_cached_rollouts!r}"
            )
        self._root = Path(root)
        self._max_cached = max_cached_rollouts
        self._cache: OrderedDict[str, _Rows] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._stripes = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))

    @property
    def root(self) -> Path:
        """The directory the rollouts' files are in."""
        return self._root

    def path(self, rollout_id: str) -> Path:
        """The ledger file of ``rollout_id`` (which need not exist); ``ValueError`` for a bad id."""
        return self._root / f"{check_rollout_id(rollout_id)}{LINEAGE_SUFFIX}"

    # --- writing ------------------------------------------------------------------------------

    def record(self, commit: CaptureLedgerCommit) -> None:
        """Append the committed row of ``commit.record``; durable when this returns.

        The same row for the same call id again is a no-op; a different committed row for a call
        id that already has one raises ``ValueError`` and writes nothing. Items that cannot be
        fingerprinted give a row with a null ``fingerprint`` / ``context_digest``: the call is
        committed but never resolves as a parent.
        """
        rollout_id = check_rollout_id(commit.rollout_id)
        row = _commit_row(commit)
        call_id = commit.record.model_call_id
        with self._stripe(rollout_id), self._flock(rollout_id, exclusive=True):
            rows = self._load_locked(rollout_id)
            existing = rows.committed.get(call_id, []) if rows is not None else []
            if any(other != row for other in existing):
                raise ValueError(
                    f"call {call_id!r} of rollout {rollout_id!r} is already in the ledger "
                    "with a different row"
                )
            if existing:
                return
            self._append_locked(rollout_id, row)

    def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        """Append the failure row ``{"failure_reason": reason, "model_call_id": ...}``.

        Durable when this returns; an identical failure row already there makes it a no-op (a
        call may still get several rows with different reasons, kept in order).
        """
        check_rollout_id(rollout_id)
        row = failure_row(model_call_id, reason)
        with self._stripe(rollout_id), self._flock(rollout_id, exclusive=True):
            rows = self._load_locked(rollout_id)
            if rows is not None and _dumps(row) in rows.seen:
                return
            self._append_locked(rollout_id, row)

    # --- reading ------------------------------------------------------------------------------

    def has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout has any row, committed or failed."""
        check_rollout_id(rollout_id)
        with self._stripe(rollout_id):
            rows = self._read(rollout_id)
            return rows is not None and bool(rows.rows)

    def resolve(
        self,
        rollout_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        fingerprint: str | None = None,
    ) -> ParentRow | None:
        """The parent ``items`` continue, per STAGING §1.3's match; ``None`` when unresolved.

        ``fingerprint`` is ``assistant_fingerprint(items)`` when the caller has computed it
        already (the gate has, to tell a root); else it is computed here.

        Candidates are the committed rows whose ``fingerprint`` is ``assistant_fingerprint(items)``
        with ``fingerprint_version`` 2; exactly one must remain (no tie-break), ``items`` must
        have at least its ``context_len`` items, and ``conversation_digest`` of that many leading
        items must equal its ``context_digest``. Items without an assistant-authored item match
        nothing (the gate treats them as a root before asking). Raises
        ``UnfingerprintableError`` when the items cannot be fingerprinted, and ``ValueError``
        for a bad rollout id.
        """
        check_rollout_id(rollout_id)
        if fingerprint is None:
            fingerprint = assistant_fingerprint(items)
        if not fingerprint:
            return None
        with self._stripe(rollout_id):
            rows = self._read(rollout_id)
            if rows is None:
                return None
            candidates = [
                row
                for row in rows.by_fingerprint.get(fingerprint, ())
                if _is_count(row.get("fingerprint_version"))
                and row["fingerprint_version"] == FINGERPRINT_VERSION
            ]
        if len(candidates) != 1:
            return None
        row = candidates[0]
        context_len = row.get("context_len")
        context_digest = row.get("context_digest")
        if not _is_count(context_len) or not isinstance(context_digest, str):
            return None
        assert isinstance(context_len, int)  # for the type checker: _is_count said so
        if len(items) < context_len:
            return None
        if conversation_digest(items[:context_len]) != context_digest:
            return None
        return _parent_row(row)

    def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's manifest (STAGING §4.3-§4.4), rows in append order.

        Failure rows become failures with their reason; a committed row without
        ``response_id`` becomes the failure ``ledger_row_missing_response_id``, one without
        ``chain_hash`` or ``cumulative_hash`` the failure ``ledger_row_missing_chain_hash``;
        every other row a ``CallRecord``. An unknown rollout gives empty lists. Raises
        ``ValueError`` for a bad rollout id or a row that is no valid record otherwise.
        """
        check_rollout_id(rollout_id)
        with self._stripe(rollout_id):
            loaded = self._read(rollout_id)
            rows = list(loaded.rows) if loaded is not None else []
        records: list[CallRecord] = []
        failures: list[ManifestFailure] = []
        for row in rows:
            if "failure_reason" in row:
                failures.append(_failure(row, row["failure_reason"]))
            elif not row.get("response_id"):
                failures.append(_failure(row, REASON_LEDGER_ROW_MISSING_RESPONSE_ID))
            elif not row.get("chain_hash") or not row.get("cumulative_hash"):
                failures.append(_failure(row, REASON_LEDGER_ROW_MISSING_CHAIN_HASH))
            else:
                records.append(_call_record(row))
        return RolloutManifest(rollout_id=rollout_id, records=records, failures=failures)

    # --- the file -----------------------------------------------------------------------------

    def _stripe(self, rollout_id: str) -> threading.Lock:
        return self._stripes[hash(rollout_id) % _LOCK_STRIPES]

    @contextmanager
    def _flock(self, rollout_id: str, *, exclusive: bool) -> Iterator[None]:
        if exclusive:
            self._root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._root / f"{rollout_id}{LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _read(self, rollout_id: str) -> _Rows | None:
        """The rollout's rows, current as of now; the caller holds the rollout's stripe."""
        path = self._root / f"{rollout_id}{LINEAGE_SUFFIX}"
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            self._forget(rollout_id)
            return self._read_compressed(rollout_id)
        cached = self._cached(rollout_id)
        if cached is not None and (cached.device, cached.inode, cached.size) == (
            stat.st_dev,
            stat.st_ino,
            stat.st_size,
        ):
            return cached
        with self._flock(rollout_id, exclusive=False):
            return self._load_locked(rollout_id)

    def _load_locked(self, rollout_id: str) -> _Rows | None:
        """The rollout's rows; the caller holds its stripe and its flock (either kind)."""
        path = self._root / f"{rollout_id}{LINEAGE_SUFFIX}"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget(rollout_id)
            return self._read_compressed(rollout_id)
        try:
            stat = os.fstat(fd)
            rows = self._cached(rollout_id)
            if rows is None or (rows.device, rows.inode) != (stat.st_dev, stat.st_ino):
                rows = _Rows(device=stat.st_dev, inode=stat.st_ino, size=0, consumed=0)
            elif stat.st_size < rows.size:
                # Only appends are expected: a file that shrank is read again from the start.
                rows = _Rows(device=stat.st_dev, inode=stat.st_ino, size=0, consumed=0)
            if stat.st_size != rows.size:
                tail = _read_from(fd, rows.consumed)
                end = tail.rfind(b"\n") + 1
                for line in tail[:end].splitlines():
                    row = _parse_line(line)
                    if row is not None:
                        rows.add(row)
                rows.consumed += end
                rows.size = rows.consumed + (len(tail) - end)
        finally:
            os.close(fd)
        self._remember(rollout_id, rows)
        return rows

    def _read_compressed(self, rollout_id: str) -> _Rows | None:
        """The rows of a ledger ``capture compress`` compacted (``.lineage.jsonl.zst``), read
        whole and never cached; None when there is none. Unreadable stretches are skipped as
        torn lines are."""
        if not (self._root / f"{rollout_id}{LINEAGE_SUFFIX}{ZSTD_SUFFIX}").exists():
            return None
        rows = _Rows(device=0, inode=0, size=0, consumed=0)
        for _, row in self._compressed_store().read_available(rollout_id).records:
            rows.add(row)
        return rows

    def _compressed_store(self) -> CaptureStore:
        return CaptureStore(self._root, suffix=LINEAGE_SUFFIX, marker_suffix=LINEAGE_MARKER_SUFFIX)

    def _append_locked(self, rollout_id: str, row: Mapping[str, Any]) -> None:
        """Append one row, fsynced; the caller holds the rollout's stripe and exclusive flock.

        A compacted ledger gets the row as a frame of its compressed file (``CaptureStore``).
        """
        path = self._root / f"{rollout_id}{LINEAGE_SUFFIX}"
        data = _dumps(row) + b"\n"
        created = not path.exists()
        if created and self._read_compressed(rollout_id) is not None:
            with self._compressed_store() as store:
                store.append(rollout_id, row)
            return
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # The file itself too: a writer that appends rows through its own store (see
            # ledger_row) locks the file, not the lock file, and lines must never interleave.
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink == 0:  # compacted while this waited for the lock
                os.close(fd)
                fd = -1
                self._append_locked(rollout_id, row)
                return
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # A torn line from a crash mid-append: end it, so this row is a line of its own
                # (the fragment then reads as one malformed line, and is skipped).
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        if created:
            _fsync_directory(self._root)

    # --- the cache ----------------------------------------------------------------------------

    def _cached(self, rollout_id: str) -> _Rows | None:
        with self._cache_lock:
            rows = self._cache.get(rollout_id)
            if rows is not None:
                self._cache.move_to_end(rollout_id)
            return rows

    def _remember(self, rollout_id: str, rows: _Rows) -> None:
        if not self._max_cached:
            return
        with self._cache_lock:
            self._cache[rollout_id] = rows
            self._cache.move_to_end(rollout_id)
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)

    def _forget(self, rollout_id: str) -> None:
        with self._cache_lock:
            self._cache.pop(rollout_id, None)

    def cached_rollouts(self) -> list[str]:
        """The rollouts whose rows are cached, least recently used first (for tests and metrics)."""
        with self._cache_lock:
            return list(self._cache)


def _read_from(fd: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _parse_line(line: bytes) -> dict[str, Any] | None:
    # Anything but a JSON object is the remains of a torn append: not a row.
    if not line.strip():
        return None
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parent_row(row: Mapping[str, Any]) -> ParentRow | None:
    # A row whose columns have the wrong types cannot be a parent: the gate then records the
    # continuation as unresolved, which poisons the rollout rather than guessing.
    call_id = row.get("model_call_id")
    cum_len = row.get("cum_len")
    chain = row.get("staging_chain")
    chain_hash = row.get("chain_hash")
    if not isinstance(call_id, str) or not _is_id(call_id):
        return None
    if not isinstance(cum_len, int) or not _is_count(cum_len):
        return None
    if not isinstance(chain, list) or not all(_is_id(key) for key in chain):
        return None
    if chain_hash is not None and not isinstance(chain_hash, str):
        return None
    return ParentRow(
        model_call_id=call_id,
        cum_len=cum_len,
        staging_chain=tuple(chain),
        chain_hash=chain_hash or None,
    )


def _call_record(row: Mapping[str, Any]) -> CallRecord:
    data = {name: row[name] for name in _SHARED_COLUMNS if name in row}
    if "staging_digest" in row:
        data["digest"] = row["staging_digest"]
    try:
        return CallRecord.model_validate(data)
    except ValueError as exc:
        raise ValueError(
            f"ledger row of call {row.get('model_call_id')!r} is not a valid call record: {exc}"
        ) from None


def _failure(row: Mapping[str, Any], reason: object) -> ManifestFailure:
    try:
        return ManifestFailure.model_validate(
            {"model_call_id": row.get("model_call_id"), "reason": reason}
        )
    except ValueError as exc:
        raise ValueError(
            f"ledger row of call {row.get('model_call_id')!r} is not a valid failure: {exc}"
        ) from None
