"""run_conformance: our file store passes all ten checks, and each check can fail.

The broken backends below each break one rule of STAGING §5.3; the suite must name exactly the
check about that rule, which proves the check tests something. Two families: subclasses of
``TokenCaptureStore`` with one method broken, and an in-memory backend with switchable flaws.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.staging._conformance import (
    CONFORMANCE_CHECKS,
    ConformanceError,
    LineageResolving,
    conformance_entry,
    run_conformance,
)
from rollcap.staging._fingerprint import assistant_fingerprint
from rollcap.staging._tokens import (
    LineageDecision,
    LineageResolver,
    TokenCaptureSnapshot,
    TokenCaptureStore,
    TokenEntry,
    TokenSink,
    TokenSource,
    entry_digest,
)

LINEAGE = ("lineage_visibility", "fresh_client_lineage_visibility")


class Tracked:
    """Factories over one directory that remember every store they made."""

    def __init__(self, root: Path, cls: type[TokenCaptureStore] = TokenCaptureStore) -> None:
        self.root = root
        self.cls = cls
        self.made: list[TokenCaptureStore] = []

    def store(self) -> TokenCaptureStore:
        store = self.cls(self.root)
        self.made.append(store)
        return store

    def resolver(self) -> LineageResolver:
        return LineageResolver(self.store())

    async def all_closed(self) -> bool:
        closed = 0
        for store in self.made:
            try:
                await store.freeze("probe")
            except RuntimeError:
                closed += 1
        return closed == len(self.made)


async def expect_failure(check: str, *args: Any, **kwargs: Any) -> ConformanceError:
    with pytest.raises(ConformanceError) as caught:
        await run_conformance(*args, **kwargs)
    assert caught.value.check_name == check, caught.value
    return caught.value


# --- the file store --------------------------------------------------------------------------


async def test_token_capture_store_passes_every_check(tmp_path: Path) -> None:
    tracked = Tracked(tmp_path)
    passed = await run_conformance(tracked.store, tracked.store, tracked.resolver)
    assert passed == list(CONFORMANCE_CHECKS)
    assert len(passed) == 10
    assert await tracked.all_closed()
    # Every check ran on its own rollout; conditional_retirement dropped its own.
    stems = {name.split(".tokens.")[0] for name in (p.name for p in tmp_path.iterdir())}
    expected = {f"conformance-rollout-{check.replace('_', '-')}" for check in CONFORMANCE_CHECKS}
    assert stems == expected - {"conformance-rollout-conditional-retirement"}


async def test_lineage_checks_need_a_lineage_factory(tmp_path: Path) -> None:
    tracked = Tracked(tmp_path)
    passed = await run_conformance(tracked.store, tracked.store, rollout_id="other")
    assert passed == [check for check in CONFORMANCE_CHECKS if check not in LINEAGE]
    assert all(p.name.startswith("other-") for p in tmp_path.iterdir())


class PlainSink:
    """A sink without the optional begin_call."""

    def __init__(self, store: TokenCaptureStore) -> None:
        self.store = store

    async def put(self, entry: TokenEntry) -> None:
        await self.store.put(entry)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        await self.store.mark_incomplete(rollout_id, model_call_id)

    async def close(self) -> None:
        await self.store.close()


async def test_begin_call_custody_needs_begin_call(tmp_path: Path) -> None:
    tracked = Tracked(tmp_path)
    passed = await run_conformance(
        lambda: PlainSink(tracked.store()),
        tracked.store,
        tracked.resolver,
    )
    assert passed == list(CONFORMANCE_CHECKS[:-1])
    assert await tracked.all_closed()


async def test_async_factories_are_awaited(tmp_path: Path) -> None:
    tracked = Tracked(tmp_path)

    async def sink() -> TokenSink:
        return tracked.store()

    async def source() -> TokenSource:
        return tracked.store()

    async def resolver() -> LineageResolving:
        return tracked.resolver()

    assert await run_conformance(sink, source, resolver) == list(CONFORMANCE_CHECKS)


class OverwritingStore(TokenCaptureStore):
    """Broken: a different payload for a stored call id silently replaces it."""

    async def put(self, entry: TokenEntry) -> None:
        path = self.root / f"{entry.rollout_id}.tokens.jsonl"
        lines = path.read_bytes().splitlines() if path.exists() else []
        kept = [
            line
            for line in lines
            if TokenEntry.model_validate_json(line).model_call_id != entry.model_call_id
        ]
        path.write_bytes(b"".join(line + b"\n" for line in kept))
        await super().put(entry)


class ForgetfulStore(TokenCaptureStore):
    """Broken: mark_incomplete lives in the instance, not in the shared backend."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.marked: set[str] = set()

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        self.marked.add(rollout_id)


class RestlessStore(TokenCaptureStore):
    """Broken: every freeze names a new snapshot."""

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        snapshot = await super().freeze(rollout_id)
        return dataclasses.replace(snapshot, snapshot_id=uuid.uuid4().hex)


@pytest.mark.parametrize(
    ("cls", "check", "detail"),
    [
        (OverwritingStore, "conflicting_reput", "accepted and the snapshot is not incomplete"),
        (ForgetfulStore, "mark_incomplete_durability", "does not see the rollout marked"),
        (RestlessStore, "freeze_idempotency", "snapshot_id changed between freezes"),
    ],
)
async def test_broken_file_stores_fail_their_check(
    tmp_path: Path,
    cls: type[TokenCaptureStore],
    check: str,
    detail: str,
) -> None:
    tracked = Tracked(tmp_path, cls)
    error = await expect_failure(check, tracked.store, tracked.store, tracked.resolver)
    assert detail in error.detail
    assert str(error) == f"{check}: {error.detail}"
    assert await tracked.all_closed()


# --- an in-memory backend with switchable flaws ---------------------------------------------


@dataclass(frozen=True)
class Flaws:
    put_raises: bool = False  # every put fails with RuntimeError
    lossy_logprobs: bool = False  # logprobs stored as float32
    reput_raises: bool = False  # an identical re-put is refused
    overwrite_conflicts: bool = False  # a conflicting put replaces the entry
    sink_local_marks: bool = False  # marks are not shared with other clients
    marks_keep_version: bool = False  # a mark does not bump the version
    fresh_snapshot_ids: bool = False  # every freeze names a new snapshot
    puts_keep_version: bool = False  # a put does not bump the version
    drop_ignores_version: bool = False  # drop checks the snapshot is current, not the version
    ignore_intents: bool = False  # begin_call is a no-op
    close_raises: bool = False  # close fails


@dataclass
class Rollout:
    entries: dict[str, TokenEntry] = field(default_factory=dict)
    incomplete: bool = False
    intents: set[str] = field(default_factory=set)
    version: int = 0
    snapshot: tuple[str, int] | None = None


class Backend:
    def __init__(self, flaws: Flaws = Flaws()) -> None:
        self.flaws = flaws
        self.rollouts: dict[str, Rollout] = {}
        self.clients: list[Client] = []
        self.resolvers: list[MemoryResolver] = []
        self.touched: set[str] = set()

    def rollout(self, rollout_id: str) -> Rollout:
        self.touched.add(rollout_id)
        return self.rollouts.setdefault(rollout_id, Rollout())

    def client(self) -> Client:
        client = Client(self)
        self.clients.append(client)
        return client

    def resolver(self) -> MemoryResolver:
        resolver = MemoryResolver(self)
        self.resolvers.append(resolver)
        return resolver

    def all_closed(self) -> bool:
        return all(c.closed for c in self.clients) and all(r.closed for r in self.resolvers)


def _float32(value: float) -> float:
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


class Client:
    """A reference TokenSink (with begin_call), TokenSource and entry reader, in memory."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.flaws = backend.flaws
        self.closed = False
        self.local_incomplete: set[str] = set()

    async def put(self, entry: TokenEntry) -> None:
        if self.flaws.put_raises:
            raise RuntimeError("disk on fire")
        if self.flaws.lossy_logprobs:
            lossy = [_float32(lp) for lp in entry.generation_log_probs]
            entry = entry.model_copy(update={"generation_log_probs": lossy})
        rollout = self.backend.rollout(entry.rollout_id)
        stored = rollout.entries.get(entry.model_call_id)
        if stored is not None and not self.flaws.overwrite_conflicts:
            if self.flaws.reput_raises:
                raise ValueError("already stored")
            if entry_digest(stored) == entry_digest(entry):
                return
            rollout.incomplete = True
            rollout.version += 1
            raise ValueError("conflicting entry")
        rollout.entries[entry.model_call_id] = entry
        if not self.flaws.puts_keep_version:
            rollout.version += 1

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        if self.flaws.sink_local_marks:
            self.local_incomplete.add(rollout_id)
            return
        rollout = self.backend.rollout(rollout_id)
        rollout.incomplete = True
        if not self.flaws.marks_keep_version:
            rollout.version += 1

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        if self.flaws.ignore_intents:
            return
        rollout = self.backend.rollout(rollout_id)
        if model_call_id not in rollout.intents:
            rollout.intents.add(model_call_id)
            rollout.version += 1

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        rollout = self.backend.rollout(rollout_id)
        if (
            rollout.snapshot is None
            or rollout.snapshot[1] != rollout.version
            or self.flaws.fresh_snapshot_ids
        ):
            rollout.snapshot = (uuid.uuid4().hex, rollout.version)
        snapshot_id, version = rollout.snapshot
        return TokenCaptureSnapshot(
            rollout_id=rollout_id,
            entries=tuple(rollout.entries.values()),
            incomplete=rollout.incomplete or not rollout.intents <= set(rollout.entries),
            snapshot_id=snapshot_id,
            version=version,
        )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        rollout = self.backend.rollout(rollout_id)
        if rollout.snapshot is None or rollout.snapshot[0] != snapshot_id:
            return False
        if rollout.snapshot[1] != rollout.version:
            return False  # the state moved on since that freeze
        if rollout.snapshot[1] != version and not self.flaws.drop_ignores_version:
            return False
        del self.backend.rollouts[rollout_id]
        return True

    async def entries(self, rollout_id: str) -> list[TokenEntry]:
        return list(self.backend.rollout(rollout_id).entries.values())

    async def close(self) -> None:
        self.closed = True
        if self.flaws.close_raises:
            raise RuntimeError("close failed")


class MemoryResolver:
    """A resolver that reads the backend live, or (broken) keeps what it saw when made."""

    def __init__(self, backend: Backend, *, cached: bool = False, check_context: bool = True):
        self.backend = backend
        self.check_context = check_context
        self.cached: dict[str, list[TokenEntry]] | None = (
            {r: list(ro.entries.values()) for r, ro in backend.rollouts.items()} if cached else None
        )
        self.closed = False

    async def resolve(
        self,
        rollout_id: str,
        request_items: Sequence[Mapping[str, Any]],
    ) -> LineageDecision:
        inner = LineageResolver(Client(self.backend), close_source=False)
        if self.cached is None and self.check_context:
            return await inner.resolve(rollout_id, request_items)
        fingerprint = assistant_fingerprint(list(request_items))
        if not fingerprint:
            return LineageDecision("root")
        if self.cached is not None:
            entries = self.cached.get(rollout_id, [])
        else:
            entries = list(self.backend.rollouts.get(rollout_id, Rollout()).entries.values())
        matches = [e for e in entries if e.fingerprint == fingerprint]
        if len(matches) != 1:
            return LineageDecision("unresolved")
        ids = (*matches[0].prompt_token_ids, *matches[0].generation_token_ids)
        return LineageDecision(
            "resolved",
            model_call_id=matches[0].model_call_id,
            cumulative_token_ids=ids,
        )

    async def close(self) -> None:
        self.closed = True


async def test_the_reference_backend_passes_every_check() -> None:
    backend = Backend()
    passed = await run_conformance(backend.client, backend.client, backend.resolver)
    assert passed == list(CONFORMANCE_CHECKS)
    assert backend.all_closed()
    assert backend.touched == {
        f"conformance-rollout-{check.replace('_', '-')}" for check in CONFORMANCE_CHECKS
    }


@pytest.mark.parametrize(
    ("flaw", "check", "detail"),
    [
        ("put_raises", "put_then_freeze_visibility", "unexpected RuntimeError: disk on fire"),
        ("lossy_logprobs", "put_then_freeze_visibility", "JSON differs"),
        ("reput_raises", "idempotent_reput", "raised ValueError: already stored"),
        ("overwrite_conflicts", "conflicting_reput", "not incomplete"),
        ("sink_local_marks", "mark_incomplete_durability", "does not see"),
        ("marks_keep_version", "mark_incomplete_durability", "left the version at"),
        ("fresh_snapshot_ids", "freeze_idempotency", "snapshot_id changed"),
        ("puts_keep_version", "post_freeze_write_safety", "late entry could be lost"),
        ("drop_ignores_version", "conditional_retirement", "version + 1 returned True"),
        ("ignore_intents", "begin_call_custody", "left the snapshot complete"),
        ("close_raises", "put_then_freeze_visibility", "unexpected RuntimeError: close failed"),
    ],
)
async def test_each_flaw_fails_its_check(flaw: str, check: str, detail: str) -> None:
    backend = Backend(Flaws(**{flaw: True}))
    error = await expect_failure(check, backend.client, backend.client, backend.resolver)
    assert detail in error.detail
    assert backend.all_closed()  # closed on failure too


async def test_a_failing_checks_own_verdict_wins_over_a_close_error() -> None:
    backend = Backend(Flaws(lossy_logprobs=True, close_raises=True))
    error = await expect_failure(
        "put_then_freeze_visibility",
        backend.client,
        backend.client,
    )
    assert "JSON differs" in error.detail


async def test_an_unexpected_exception_is_the_cause() -> None:
    backend = Backend(Flaws(put_raises=True))
    error = await expect_failure("put_then_freeze_visibility", backend.client, backend.client)
    assert error.detail == "unexpected RuntimeError: disk on fire"
    assert isinstance(error.__cause__, RuntimeError)


async def test_a_failing_factory_counts_as_its_check() -> None:
    backend = Backend()

    def broken() -> Client:
        raise OSError("no backend")

    error = await expect_failure("put_then_freeze_visibility", backend.client, broken)
    assert error.detail == "unexpected OSError: no backend"
    assert backend.all_closed()


async def test_a_resolver_with_a_stale_cache_fails_lineage_visibility() -> None:
    backend = Backend()
    error = await expect_failure(
        "lineage_visibility",
        backend.client,
        backend.client,
        lambda: MemoryResolver(backend, cached=True),
    )
    assert "expected 'resolved'" in error.detail


async def test_a_stale_cache_made_after_the_put_still_passes_the_fresh_client_check() -> None:
    # The same resolver passes when made after the put: what the first lineage check adds.
    backend = Backend()
    entry = conformance_entry(
        "x",
        prompt_token_ids=(101, 102, 103),
        generation_token_ids=(201, 202),
        text="It is sunny.",
    )
    await backend.client().put(entry)
    resolver = MemoryResolver(backend, cached=True)
    continuation = [*entry.request_items, *entry.output_items, {"role": "user", "content": "?"}]
    assert (await resolver.resolve("x", continuation)).kind == "resolved"


async def test_a_resolver_that_ignores_the_context_fails_lineage_visibility() -> None:
    backend = Backend()
    error = await expect_failure(
        "lineage_visibility",
        backend.client,
        backend.client,
        lambda: MemoryResolver(backend, check_context=False),
    )
    assert "rewritten first turn" in error.detail


def test_conformance_error_carries_its_parts() -> None:
    error = ConformanceError("freeze_idempotency", "snapshot_id changed")
    assert (error.check_name, error.detail) == ("freeze_idempotency", "snapshot_id changed")
    assert str(error) == "freeze_idempotency: snapshot_id changed"


def test_the_conformance_entry_is_the_specified_one() -> None:
    entry = conformance_entry("r")
    assert entry.model_dump(mode="json") == {
        "schema_version": 1,
        "rollout_id": "r",
        "model_call_id": "call-1",
        "model": "conformance-model",
        "prompt_token_ids": [11, 12],
        "generation_token_ids": [13, 14],
        "generation_log_probs": [-0.1, -0.1],
        "output_items": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
        ],
        "parent_call_id": None,
        "request_items": [{"role": "user", "content": "What is the weather in Paris?"}],
        "fingerprint": assistant_fingerprint(entry.output_items),
        "context_len": 1,
        "context_digest": entry.context_digest,
        "fingerprint_version": 2,
        "created_at": 1700000000.0,
    }
    assert orjson.loads(entry.model_dump_json()) == entry.model_dump(mode="json")
