"""The complete-record path: whole ``TokenEntry`` records, their sinks, sources and lineage.

Separate from staging (STAGING §5.3): a ``TokenEntry`` carries one model call's prompt and
generation ids, logprobs, client-visible output items and lineage stamps. A :class:`TokenSink`
makes entries durable, a :class:`TokenSource` freezes a rollout into a
:class:`TokenCaptureSnapshot` and retires it, and a :class:`LineageResolver` finds the entry a
continuation call extends, by the assistant fingerprint and context digest of §1.3.

:class:`TokenCaptureStore` is the file-backed implementation of both protocols. Per rollout, in
one directory::

    <root>/<rollout_id>.tokens.jsonl        one entry per line (sorted-key JSON), append only
    <root>/<rollout_id>.tokens.incomplete   present once the rollout is incomplete; one line a mark
    <root>/<rollout_id>.tokens.intents      one line per begin_call intent
    <root>/<rollout_id>.tokens.state.json   version counter and the current snapshot
    <root>/<rollout_id>.tokens.lock         flock'd around every operation on the rollout

Every operation takes the rollout's ``flock`` and reads the files afresh, so any number of
store instances (threads, processes, hosts with POSIX advisory locks) over one directory see each
other's writes; appends are ``fsync``'d, and the state is replaced by write-temp, ``fsync``,
rename, ``fsync`` of the directory. The blocking work runs in ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import math
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar, runtime_checkable

import anyio.to_thread
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from rollcap.staging._fingerprint import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    conversation_digest,
)
from rollcap.staging._records import check_rollout_id

__all__ = [
    "ENTRIES_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "INTENTS_SUFFIX",
    "LOCK_SUFFIX",
    "STATE_SUFFIX",
    "TOKEN_ENTRY_SCHEMA_VERSION",
    "LineageDecision",
    "LineageResolver",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenEntryReader",
    "TokenIntentSink",
    "TokenSink",
    "TokenSource",
    "entry_digest",
]

TOKEN_ENTRY_SCHEMA_VERSION = 1

ENTRIES_SUFFIX = ".tokens.jsonl"
INCOMPLETE_SUFFIX = ".tokens.incomplete"
INTENTS_SUFFIX = ".tokens.intents"
STATE_SUFFIX = ".tokens.state.json"
LOCK_SUFFIX = ".tokens.lock"

# A rollout id becomes a file name prefix: the grammar leaves nothing to escape or traverse with.

_DIR_MODE = 0o700
_FILE_MODE = 0o600
_I64_MIN = -(2**63)
_U64_MAX = 2**64 - 1
_MAX_DEPTH = 64

_T = TypeVar("_T")


# --- the entry ------------------------------------------------------------------------------


def _json_clone(value: Any, where: str, depth: int = 0) -> Any:
    """A deep copy of a JSON-shaped value, refusing anything that would not round-trip.

    The entry's digest is over its JSON form and the store compares stored lines by it, so an
    item that serializes lossily (NaN as null, a tuple as a list, an int key as a string) would
    make a re-put of the same object look like a conflict, or two different objects look alike.
    """
    if depth > _MAX_DEPTH:
        raise ValueError(f"{where} nests deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not _I64_MIN <= value <= _U64_MAX:
            raise ValueError(f"{where} holds an integer outside 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} holds a non-finite float")
        return value
    if isinstance(value, list):
        return [_json_clone(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has a non-string key {key!r}")
            out[key] = _json_clone(item, f"{where}[{key!r}]", depth + 1)
        return out
    raise ValueError(f"{where} holds a {type(value).__name__}, which is not JSON")


def _plain_items(items: Sequence[Mapping[str, Any]], what: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValueError(f"{what} {i} must be an object, not {type(item).__name__}")
        out.append(_json_clone(dict(item), f"{what} {i}"))
    return out


_Id = Annotated[str, StringConstraints(min_length=1)]
_TokenId = Annotated[int, Field(ge=0)]
_Count = Annotated[int, Field(ge=0)]
# pydantic's (Rust) regex: ``$`` is the end of the text, never before a trailing newline.
_Fingerprint = Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{64})?$")]
_Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class TokenEntry(BaseModel):
    """One model call, whole: what the complete-record path stores (schema_version 1).

    Strict (ids and ints by exact type, ``null`` for a list refused), unknown keys refused,
    NaN and infinities refused, items JSON-shaped (copied on construction, so the entry owns
    them). ``generation_log_probs`` has one float per generated id.

    Lineage stamps, computed by :meth:`stamp` from the request the call answered and its
    client-visible output items: ``fingerprint`` = ``assistant_fingerprint(request_items ‖
    output_items)`` (``""`` when neither has an assistant-authored item), ``context_len`` =
    ``len(request_items)``, ``context_digest`` = ``conversation_digest(request_items)``,
    ``fingerprint_version`` = 2. A continuation resolves to this entry when it replays the
    request items, then the output items (STAGING §1.3).
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    schema_version: Literal[1] = 1
    rollout_id: _Id
    model_call_id: _Id
    model: str
    prompt_token_ids: list[_TokenId]
    generation_token_ids: list[_TokenId]
    generation_log_probs: list[float]
    output_items: list[dict[str, Any]]
    parent_call_id: _Id | None = None
    request_items: list[dict[str, Any]] = Field(default_factory=list)
    fingerprint: _Fingerprint
    context_len: _Count
    context_digest: _Hex64
    fingerprint_version: _Count = FINGERPRINT_VERSION
    created_at: float

    @field_validator("output_items", "request_items")
    @classmethod
    def _json_items(cls, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [_json_clone(item, f"item {i}") for i, item in enumerate(items)]

    @model_validator(mode="after")
    def _aligned(self) -> TokenEntry:
        if len(self.generation_log_probs) != len(self.generation_token_ids):
            raise ValueError(
                f"{len(self.generation_log_probs)} generation logprobs for "
                f"{len(self.generation_token_ids)} generated ids",
            )
        return self

    @classmethod
    def stamp(
        cls,
        *,
        rollout_id: str,
        model_call_id: str,
        model: str,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        output_items: Sequence[Mapping[str, Any]],
        request_items: Sequence[Mapping[str, Any]],
        parent_call_id: str | None = None,
        created_at: float | None = None,
    ) -> TokenEntry:
        """An entry with its lineage stamps computed from ``request_items`` and ``output_items``.

        ``created_at`` defaults to now. Raises ``ValueError`` for an invalid entry, including
        items that cannot be fingerprinted (``UnfingerprintableError`` is a ``ValueError``).
        """
        request = _plain_items(request_items, "request item")
        output = _plain_items(output_items, "output item")
        return cls(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            model=model,
            prompt_token_ids=list(prompt_token_ids),
            generation_token_ids=list(generation_token_ids),
            generation_log_probs=list(generation_log_probs),
            output_items=output,
            parent_call_id=parent_call_id,
            request_items=request,
            fingerprint=assistant_fingerprint([*request, *output]),
            context_len=len(request),
            context_digest=conversation_digest(request),
            created_at=time.time() if created_at is None else created_at,
        )

    @classmethod
    def stamped_root(
        cls,
        *,
        rollout_id: str,
        model_call_id: str,
        model: str,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        output_items: Sequence[Mapping[str, Any]],
        request_items: Sequence[Mapping[str, Any]],
        created_at: float | None = None,
    ) -> TokenEntry:
        """:meth:`stamp` for a call without a parent (``parent_call_id`` null)."""
        return cls.stamp(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            model=model,
            prompt_token_ids=prompt_token_ids,
            generation_token_ids=generation_token_ids,
            generation_log_probs=generation_log_probs,
            output_items=output_items,
            request_items=request_items,
            parent_call_id=None,
            created_at=created_at,
        )


def _entry_json(entry: TokenEntry) -> bytes:
    return orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def entry_digest(entry: TokenEntry) -> str:
    """SHA-256 hex of ``orjson.dumps(entry.model_dump(mode="json"), option=OPT_SORT_KEYS)``.

    Two entries are "identical" for a re-put exactly when their digests are equal: every field
    counts, timestamps included.
    """
    return hashlib.sha256(_entry_json(entry)).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenCaptureSnapshot:
    """A frozen rollout: its entries (unique per call id, order meaningless) and custody state.

    ``incomplete`` means the rollout must not train (a mark, a conflicting payload, an intent
    without its entry, an unreadable line). ``snapshot_id`` and ``version`` name exactly this
    state: :meth:`TokenSource.drop` retires it only while both are still current.
    """

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int


# --- protocols ------------------------------------------------------------------------------


@runtime_checkable
class TokenSink(Protocol):
    """Where complete entries become durable (STAGING §5.3).

    - ``put(entry)``: durable and visible to every reader once it returns. The identical entry
      again (same :func:`entry_digest`) is a no-op; a different payload for the same call id
      fails (or the reader treats the conflict as zero candidates and the rollout as
      incomplete). A put after a freeze fails or bumps the frozen version. When it raises, the
      caller marks the rollout incomplete.
    - ``mark_incomplete(rollout_id, model_call_id="")``: durable, allowed after a freeze, always
      changes the observable version.
    - ``close()``: idempotent.
    """

    async def put(self, entry: TokenEntry) -> None: ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class TokenIntentSink(TokenSink, Protocol):
    """A :class:`TokenSink` with the optional ``begin_call``: a durable intent to put.

    An intent without its entry when the rollout is frozen makes the snapshot incomplete, so a
    call that died between admission and ``put`` cannot leave a silently shorter rollout.
    """

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None: ...


@runtime_checkable
class TokenSource(Protocol):
    """Reads frozen rollouts back and retires them (STAGING §5.3).

    - ``freeze(rollout_id)``: idempotent while nothing changed (same ``snapshot_id`` and
      ``version``); a write racing it may land but then bumps the version.
    - ``drop(rollout_id, *, snapshot_id, version)``: retires exactly that snapshot and returns
      ``True``; ``False`` when the state moved on. A transport without delete returns ``True``.
    - ``close()``: idempotent.
    """

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot: ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool: ...

    async def close(self) -> None: ...


@runtime_checkable
class TokenEntryReader(Protocol):
    """Reads a rollout's current entries without freezing it (what a resolver needs).

    Entries whose call id has conflicting payloads are left out (zero candidates).
    """

    async def entries(self, rollout_id: str) -> Sequence[TokenEntry]: ...


# --- the file store -------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _content_digest(*blobs: bytes | None) -> str:
    # Absence and emptiness hash apart, and lengths keep one file's bytes from passing as the
    # next's: any change to any of the custody files changes this.
    sha = hashlib.sha256(b"rollcap-token-capture-content-v1")
    for blob in blobs:
        if blob is None:
            sha.update(b"\x00")
        else:
            sha.update(b"\x01" + len(blob).to_bytes(8, "big") + blob)
    return sha.hexdigest()


@dataclass(frozen=True, slots=True)
class _Frozen:
    snapshot_id: str
    version: int
    content: str


@dataclass(frozen=True, slots=True)
class _State:
    version: int = 0
    snapshot: _Frozen | None = None


@dataclass(frozen=True, slots=True)
class _Parsed:
    entries: tuple[TokenEntry, ...]
    # Something in the file cannot be trusted: an unreadable line, a foreign rollout id, or
    # two different payloads for one call id (those ids are left out of ``entries``).
    damaged: bool


def _complete_lines(data: bytes) -> list[bytes]:
    # A trailing fragment without its newline is a put that never returned: not durable, so
    # not part of the rollout.
    end = data.rfind(b"\n")
    return [] if end < 0 else data[:end].split(b"\n")


def _parse_entries(rollout_id: str, data: bytes | None) -> _Parsed:
    if not data:
        return _Parsed((), damaged=False)
    by_call: dict[str, tuple[TokenEntry, str]] = {}
    conflicted: set[str] = set()
    damaged = False
    for line in _complete_lines(data):
        try:
            entry = TokenEntry.model_validate_json(line)
        except ValueError:
            damaged = True
            continue
        if entry.rollout_id != rollout_id:
            damaged = True
            continue
        digest = entry_digest(entry)
        seen = by_call.get(entry.model_call_id)
        if seen is None:
            by_call[entry.model_call_id] = (entry, digest)
        elif seen[1] != digest:
            conflicted.add(entry.model_call_id)
    entries = tuple(entry for call, (entry, _) in by_call.items() if call not in conflicted)
    return _Parsed(entries, damaged=damaged or bool(conflicted))


def _intent_ids(data: bytes | None) -> tuple[set[str], bool]:
    ids: set[str] = set()
    damaged = False
    for line in _complete_lines(data or b""):
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            damaged = True
            continue
        call_id = value.get("model_call_id") if isinstance(value, dict) else None
        if isinstance(call_id, str) and call_id:
            ids.add(call_id)
        else:
            damaged = True
    return ids, damaged


class TokenCaptureStore:
    """File-backed :class:`TokenSink` (with ``begin_call``), :class:`TokenSource` and
    :class:`TokenEntryReader` over one directory (layout in the module docstring).

    Semantics (STAGING §5.3):

    - ``put``: an entry whose call id is new is appended and bumps the version; the identical
      entry again is a no-op; a different payload for a stored call id marks the rollout
      incomplete, bumps the version and raises ``ValueError`` (the stored entry stays).
    - ``mark_incomplete``: appends a durable mark and bumps the version, frozen or not.
    - ``begin_call``: a durable intent (bumps the version; the same intent again is a no-op).
    - ``freeze``: the same ``snapshot_id`` and ``version`` while nothing changed; any write in
      between (or a change to the files made without bumping the version) gives a new snapshot
      at a higher version. It records the snapshot, so freezing an unknown rollout creates its
      state file.
    - ``drop``: removes the rollout's files and returns ``True`` only while the given snapshot
      is the current one at the current version with unchanged files; else ``False`` (also
      for a rollout that was already dropped or never frozen).

    Rollout ids must match ``[A-Za-z0-9._-]+`` (else ``ValueError``). After ``close()``
    (idempotent) every other method raises ``RuntimeError``. Nothing is cached between calls.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
        self._closed = False

    @property
    def root(self) -> Path:
        """The directory the store writes to."""
        return self._root

    # -- the protocol methods --

    async def put(self, entry: TokenEntry) -> None:
        """Make ``entry`` durable (see the class docstring for re-puts and conflicts)."""
        if not isinstance(entry, TokenEntry):
            raise TypeError(f"entry must be a TokenEntry, not {type(entry).__name__}")
        rollout_id = check_rollout_id(entry.rollout_id)
        await self._run(self._put_sync, rollout_id, entry)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Durably mark the rollout incomplete (``model_call_id`` "" = no call in particular)."""
        check_rollout_id(rollout_id)
        if not isinstance(model_call_id, str):
            raise TypeError("model_call_id must be a string")
        await self._run(self._mark_sync, rollout_id, model_call_id, "marked")

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Durably record that ``model_call_id`` will put an entry in ``rollout_id``."""
        check_rollout_id(rollout_id)
        if not isinstance(model_call_id, str) or not model_call_id:
            raise ValueError("begin_call needs a non-empty model_call_id")
        await self._run(self._begin_sync, rollout_id, model_call_id)

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """The rollout's current snapshot, recorded so that ``drop`` can retire it."""
        check_rollout_id(rollout_id)
        return await self._run(self._freeze_sync, rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly that snapshot (remove the rollout's files); ``False`` if it moved on."""
        check_rollout_id(rollout_id)
        if not isinstance(snapshot_id, str):
            raise TypeError("snapshot_id must be a string")
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError("version must be an int")
        return await self._run(self._drop_sync, rollout_id, snapshot_id, version)

    async def entries(self, rollout_id: str) -> list[TokenEntry]:
        """The rollout's current entries, without freezing (conflicting call ids left out)."""
        check_rollout_id(rollout_id)
        return await self._run(self._entries_sync, rollout_id)

    async def close(self) -> None:
        """Refuse further calls. Idempotent; there is nothing held open between calls."""
        self._closed = True

    # -- plumbing --

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise RuntimeError("TokenCaptureStore is closed")
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))

    def _path(self, rollout_id: str, suffix: str) -> Path:
        return self._root / f"{rollout_id}{suffix}"

    @contextlib.contextmanager
    def _locked(self, rollout_id: str, operation: int = fcntl.LOCK_EX) -> Iterator[None]:
        path = self._path(rollout_id, LOCK_SUFFIX)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
            try:
                fcntl.flock(fd, operation)
                held = os.fstat(fd)
                try:
                    current = os.stat(path)
                except FileNotFoundError:
                    current = None
            except BaseException:
                os.close(fd)
                raise
            # drop unlinks the lock file while holding it: a waiter that then gets the lock on
            # the unlinked inode must retry on the path, or it would run beside whoever locked
            # the new file.
            if current is not None and (current.st_dev, current.st_ino) == (
                held.st_dev,
                held.st_ino,
            ):
                break
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)  # releases the flock

    def _append(self, path: Path, data: bytes) -> None:
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self._root)

    def _load_state(self, rollout_id: str) -> _State:
        path = self._path(rollout_id, STATE_SUFFIX)
        data = _read(path)
        if data is None:
            return _State()
        try:
            raw = orjson.loads(data)
            version = raw["version"]
            snap = raw["snapshot"]
            frozen = (
                None
                if snap is None
                else _Frozen(str(snap["snapshot_id"]), int(snap["version"]), str(snap["content"]))
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            # The state is only ever replaced whole, so this is damage from outside: refuse to
            # guess a version a stale snapshot might match.
            raise RuntimeError(f"unreadable token capture state {path}: {exc}") from exc
        if not isinstance(version, int) or isinstance(version, bool):
            raise RuntimeError(f"unreadable token capture state {path}: bad version")
        return _State(version, frozen)

    def _save_state(self, rollout_id: str, state: _State) -> None:
        path = self._path(rollout_id, STATE_SUFFIX)
        snap = state.snapshot
        frozen = (
            None
            if snap is None
            else {"snapshot_id": snap.snapshot_id, "version": snap.version, "content": snap.content}
        )
        body = orjson.dumps(
            {"version": state.version, "snapshot": frozen},
            option=orjson.OPT_SORT_KEYS,
        )
        temp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(8)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
        try:
            try:
                _write_all(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
            raise
        _fsync_dir(self._root)

    def _bump(self, rollout_id: str) -> None:
        # Bumped (durably) before the change it announces: a crash in between leaves a version
        # no snapshot holds, never a change a stale snapshot could still be dropped over.
        state = self._load_state(rollout_id)
        self._save_state(rollout_id, _State(state.version + 1, state.snapshot))

    def _files(self, rollout_id: str) -> tuple[bytes | None, bytes | None, bytes | None]:
        return (
            _read(self._path(rollout_id, ENTRIES_SUFFIX)),
            _read(self._path(rollout_id, INCOMPLETE_SUFFIX)),
            _read(self._path(rollout_id, INTENTS_SUFFIX)),
        )

    def _mark_line(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        line = orjson.dumps({"model_call_id": model_call_id, "reason": reason}) + b"\n"
        self._append(self._path(rollout_id, INCOMPLETE_SUFFIX), line)

    # -- the blocking operations, each under the rollout's lock --

    def _put_sync(self, rollout_id: str, entry: TokenEntry) -> None:
        line = _entry_json(entry)
        digest = hashlib.sha256(line).hexdigest()
        path = self._path(rollout_id, ENTRIES_SUFFIX)
        with self._locked(rollout_id):
            data = _read(path) or b""
            for stored in _parse_entries(rollout_id, data).entries:
                if stored.model_call_id != entry.model_call_id:
                    continue
                if entry_digest(stored) == digest:
                    return
                self._bump(rollout_id)
                self._mark_line(rollout_id, entry.model_call_id, "conflicting_entry")
                raise ValueError(
                    f"rollout {rollout_id!r} already holds a different entry for model call "
                    f"{entry.model_call_id!r}; the rollout is marked incomplete",
                )
            self._bump(rollout_id)
            if data and not data.endswith(b"\n"):
                # A torn tail from a put that crashed: cut it, or this line would join it.
                os.truncate(path, data.rfind(b"\n") + 1)
            self._append(path, line + b"\n")

    def _mark_sync(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        with self._locked(rollout_id):
            self._bump(rollout_id)
            self._mark_line(rollout_id, model_call_id, reason)

    def _begin_sync(self, rollout_id: str, model_call_id: str) -> None:
        path = self._path(rollout_id, INTENTS_SUFFIX)
        with self._locked(rollout_id):
            data = _read(path) or b""
            if model_call_id in _intent_ids(data)[0]:
                return
            self._bump(rollout_id)
            if data and not data.endswith(b"\n"):
                os.truncate(path, data.rfind(b"\n") + 1)
            self._append(path, orjson.dumps({"model_call_id": model_call_id}) + b"\n")

    def _freeze_sync(self, rollout_id: str) -> TokenCaptureSnapshot:
        with self._locked(rollout_id):
            entries_data, incomplete_data, intents_data = self._files(rollout_id)
            content = _content_digest(entries_data, incomplete_data, intents_data)
            state = self._load_state(rollout_id)
            current = state.snapshot
            if current is None or current.version != state.version or current.content != content:
                # Files that changed without a bump must not keep the old snapshot's version.
                stale = current is not None and current.version == state.version
                version = state.version + 1 if stale else state.version
                current = _Frozen(secrets.token_hex(16), version, content)
                self._save_state(rollout_id, _State(version, current))
            parsed = _parse_entries(rollout_id, entries_data)
            intents, intents_damaged = _intent_ids(intents_data)
            present = {entry.model_call_id for entry in parsed.entries}
            incomplete = (
                incomplete_data is not None
                or parsed.damaged
                or intents_damaged
                or not intents <= present
            )
            return TokenCaptureSnapshot(
                rollout_id=rollout_id,
                entries=parsed.entries,
                incomplete=incomplete,
                snapshot_id=current.snapshot_id,
                version=current.version,
            )

    def _drop_sync(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        if not self._path(rollout_id, STATE_SUFFIX).exists():
            return False  # never frozen, or already retired: no snapshot to match
        with self._locked(rollout_id):
            state = self._load_state(rollout_id)
            current = state.snapshot
            if (
                current is None
                or current.snapshot_id != snapshot_id
                or current.version != version
                or state.version != version
                or current.content != _content_digest(*self._files(rollout_id))
            ):
                return False
            # Data first, state last: a crash part-way leaves a state whose content no longer
            # matches, so the half-dropped rollout can only be frozen anew, never dropped again
            # under the old snapshot.
            for suffix in (ENTRIES_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX, STATE_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    self._path(rollout_id, suffix).unlink()
            with contextlib.suppress(FileNotFoundError):
                self._path(rollout_id, LOCK_SUFFIX).unlink()
            _fsync_dir(self._root)
            return True

    def _entries_sync(self, rollout_id: str) -> list[TokenEntry]:
        path = self._path(rollout_id, ENTRIES_SUFFIX)
        if not path.exists():
            return []  # reading must not litter the directory with lock files
        with self._locked(rollout_id, fcntl.LOCK_SH):
            return list(_parse_entries(rollout_id, _read(path)).entries)


# --- lineage --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineageDecision:
    """How a request relates to the rollout's entries (STAGING §1.2-§1.3).

    - ``root``: the request has no assistant-authored item;
    - ``resolved``: exactly one entry matches; ``model_call_id`` names it and
      ``cumulative_token_ids`` is its prompt followed by its generation;
    - ``unresolved``: no entry, several, or one whose context does not match (``reason`` says
      which: ``no_match``, ``ambiguous``, ``context_mismatch``).
    """

    kind: Literal["root", "resolved", "unresolved"]
    model_call_id: str | None = None
    cumulative_token_ids: tuple[int, ...] = ()
    reason: str = ""


class LineageResolver:
    """Resolves a request's parent among the entries of a :class:`TokenEntryReader` (or, for a
    source without ``entries``, of a fresh ``freeze``).

    Reads the source on every call, so it sees entries put after it was made. Match: the
    entries whose ``fingerprint`` equals ``assistant_fingerprint(request_items)`` and whose
    ``fingerprint_version`` is 2; exactly one, else unresolved (no tie-break); then the request
    must have at least ``context_len`` items and ``conversation_digest`` of its first
    ``context_len`` equal the entry's ``context_digest``. An unfingerprintable request raises
    (the caller fails the request). ``close()`` closes the source when ``close_source``.
    """

    def __init__(
        self,
        source: TokenEntryReader | TokenSource,
        *,
        close_source: bool = True,
    ) -> None:
        self._source = source
        self._close_source = close_source
        self._closed = False

    async def resolve(
        self,
        rollout_id: str,
        request_items: Sequence[Mapping[str, Any]],
    ) -> LineageDecision:
        """The decision for a call of ``rollout_id`` with these request items."""
        if self._closed:
            raise RuntimeError("LineageResolver is closed")
        items = list(request_items)
        fingerprint = assistant_fingerprint(items)
        if not fingerprint:
            return LineageDecision("root")
        entries = await self._entries(rollout_id)
        matches = [
            entry
            for entry in entries
            if entry.fingerprint == fingerprint and entry.fingerprint_version == FINGERPRINT_VERSION
        ]
        if not matches:
            return LineageDecision("unresolved", reason="no_match")
        if len(matches) > 1:
            return LineageDecision("unresolved", reason="ambiguous")
        (match,) = matches
        if len(items) < match.context_len or (
            conversation_digest(items[: match.context_len]) != match.context_digest
        ):
            return LineageDecision("unresolved", reason="context_mismatch")
        return LineageDecision(
            "resolved",
            model_call_id=match.model_call_id,
            cumulative_token_ids=(*match.prompt_token_ids, *match.generation_token_ids),
        )

    async def _entries(self, rollout_id: str) -> Sequence[TokenEntry]:
        if isinstance(self._source, TokenEntryReader):
            return await self._source.entries(rollout_id)
        snapshot = await self._source.freeze(rollout_id)
        return snapshot.entries

    async def close(self) -> None:
        """Idempotent; closes the source once when this resolver owns it."""
        if self._closed:
            return
        self._closed = True
        if self._close_source:
            close = getattr(self._source, "close", None)
            if close is not None:
                await close()
