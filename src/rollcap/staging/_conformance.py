"""The complete-record conformance suite: does a TokenSink/TokenSource pair keep §5.3?

``run_conformance`` drives fresh clients made by the caller's factories (all over one shared
backend) through the checks of STAGING §5.4, in this order, each on its own rollout
``<rollout_id>-<check name with "_" → "-">``:

=================================== ==========================================================
``put_then_freeze_visibility``      a put entry is frozen back, complete, byte-equal
``idempotent_reput``                the identical entry again is a no-op
``conflicting_reput``               a different payload for the same call id fails or masks
``mark_incomplete_durability``      a mark after freeze is seen by fresh clients, bumps the
                                    version, and makes the old snapshot undroppable
``freeze_idempotency``              two freezes of unchanged state agree
``post_freeze_write_safety``        a put after freeze fails or makes the snapshot undroppable
``conditional_retirement``          a stale drop is refused and keeps the data; the exact drop
                                    succeeds
``lineage_visibility``              a resolver made before a put resolves against it
``fresh_client_lineage_visibility`` the same with a resolver made after the put
``begin_call_custody``              an intent without its entry makes the snapshot incomplete
=================================== ==========================================================

The lineage checks run only with a ``lineage_factory``; ``begin_call_custody`` only when the
sink has ``begin_call``. The first failure raises :class:`ConformanceError`; an exception a check
did not ask for counts as its failure.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

from rollcap.staging._tokens import (
    LineageDecision,
    TokenCaptureSnapshot,
    TokenEntry,
    TokenSink,
    TokenSource,
    entry_digest,
)

__all__ = [
    "CONFORMANCE_CHECKS",
    "CONFORMANCE_CREATED_AT",
    "CONFORMANCE_MODEL",
    "CONFORMANCE_QUESTION",
    "ConformanceError",
    "LineageFactory",
    "LineageResolving",
    "SinkFactory",
    "SourceFactory",
    "conformance_entry",
    "run_conformance",
]

CONFORMANCE_CHECKS: tuple[str, ...] = (
    "put_then_freeze_visibility",
    "idempotent_reput",
    "conflicting_reput",
    "mark_incomplete_durability",
    "freeze_idempotency",
    "post_freeze_write_safety",
    "conditional_retirement",
    "lineage_visibility",
    "fresh_client_lineage_visibility",
    "begin_call_custody",
)

CONFORMANCE_MODEL = "conformance-model"
CONFORMANCE_CREATED_AT = 1700000000.0
CONFORMANCE_QUESTION: tuple[Mapping[str, Any], ...] = (
    {"role": "user", "content": "What is the weather in Paris?"},
)

_LOGPROB = -0.1
_FOLLOW_UP = {"role": "user", "content": "And tomorrow?"}
_REWRITTEN = {"role": "user", "content": "What is the weather in Rome?"}
_FRESH = {"role": "user", "content": "What is the weather in Berlin?"}

_T = TypeVar("_T")


@runtime_checkable
class LineageResolving(Protocol):
    """What the lineage checks need of a resolver (``LineageResolver`` is one)."""

    async def resolve(
        self,
        rollout_id: str,
        request_items: Sequence[Mapping[str, Any]],
    ) -> LineageDecision: ...


SinkFactory: TypeAlias = Callable[[], TokenSink | Awaitable[TokenSink]]
SourceFactory: TypeAlias = Callable[[], TokenSource | Awaitable[TokenSource]]
LineageFactory: TypeAlias = Callable[[], LineageResolving | Awaitable[LineageResolving]]


class ConformanceError(Exception):
    """A conformance check failed: ``check_name`` says which, ``detail`` how."""

    def __init__(self, check_name: str, detail: str) -> None:
        super().__init__(f"{check_name}: {detail}")
        self.check_name = check_name
        self.detail = detail


def _output_items(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        },
    ]


def conformance_entry(
    rollout_id: str,
    *,
    model_call_id: str = "call-1",
    prompt_token_ids: Sequence[int] = (11, 12),
    generation_token_ids: Sequence[int] = (13, 14),
    text: str = "a",
    request_items: Sequence[Mapping[str, Any]] = CONFORMANCE_QUESTION,
    parent_call_id: str | None = None,
) -> TokenEntry:
    """The suite's test entry (STAGING §5.4), by default the one every check starts from.

    Model ``conformance-model``, logprob -0.1 per generated id, one assistant message whose
    ``output_text`` is ``text``, ``created_at`` 1700000000.0, stamped against ``request_items``
    (by default the Paris question, as a root).
    """
    return TokenEntry.stamp(
        rollout_id=rollout_id,
        model_call_id=model_call_id,
        model=CONFORMANCE_MODEL,
        prompt_token_ids=prompt_token_ids,
        generation_token_ids=generation_token_ids,
        generation_log_probs=[_LOGPROB] * len(generation_token_ids),
        output_items=_output_items(text),
        request_items=request_items,
        parent_call_id=parent_call_id,
        created_at=CONFORMANCE_CREATED_AT,
    )


class _Failed(Exception):
    """A check's own verdict (becomes a ConformanceError with the check's name)."""


class _Skipped(Exception):
    """The backend lacks what the check is about (an optional method)."""


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise _Failed(detail)


class _Check:
    """One check's rollout and the clients it made (all closed when it ends)."""

    def __init__(
        self,
        name: str,
        rollout_id: str,
        sink_factory: SinkFactory,
        source_factory: SourceFactory,
        lineage_factory: LineageFactory | None,
    ) -> None:
        self.name = name
        self.rollout_id = rollout_id
        self._sink_factory = sink_factory
        self._source_factory = source_factory
        self._lineage_factory = lineage_factory
        self.made: list[object] = []

    async def _make(self, factory: Callable[[], _T | Awaitable[_T]]) -> _T:
        made = factory()
        client = cast("_T", await made if inspect.isawaitable(made) else made)
        self.made.append(client)
        return client

    async def sink(self) -> TokenSink:
        return await self._make(self._sink_factory)

    async def source(self) -> TokenSource:
        return await self._make(self._source_factory)

    async def resolver(self) -> LineageResolving:
        assert self._lineage_factory is not None  # the lineage checks run only with one
        return await self._make(self._lineage_factory)

    def entry(self, **changes: Any) -> TokenEntry:
        return conformance_entry(self.rollout_id, **changes)

    async def close_all(self) -> None:
        """Close every client, the last made first; the first error is raised after all ran."""
        error: BaseException | None = None
        for client in reversed(self.made):
            try:
                await _close(client)
            except Exception as exc:
                error = error or exc
        self.made.clear()
        if error is not None:
            raise error


async def _close(client: object) -> None:
    close = getattr(client, "close", None)
    if close is None:
        return
    result = close()
    if inspect.isawaitable(result):
        await result


def _dump(entry: TokenEntry) -> dict[str, Any]:
    return entry.model_dump(mode="json")


def _digests(snapshot: TokenCaptureSnapshot) -> dict[str, str]:
    return {entry.model_call_id: entry_digest(entry) for entry in snapshot.entries}


# --- the checks, in STAGING §5.4's order ----------------------------------------------------


async def _put_then_freeze_visibility(check: _Check) -> None:
    entry = check.entry()
    sink, source = await check.sink(), await check.source()
    await sink.put(entry)
    snapshot = await source.freeze(check.rollout_id)
    _require(len(snapshot.entries) == 1, f"froze {len(snapshot.entries)} entries, expected 1")
    _require(not snapshot.incomplete, "the snapshot of one clean put is incomplete")
    _require(
        isinstance(snapshot.snapshot_id, str) and bool(snapshot.snapshot_id),
        f"snapshot_id {snapshot.snapshot_id!r} is not a non-empty string",
    )
    _require(
        _dump(snapshot.entries[0]) == _dump(entry),
        "the frozen entry's JSON differs from the entry put",
    )


async def _idempotent_reput(check: _Check) -> None:
    entry = check.entry()
    # A separate object with the same content: identity must not be what makes it identical.
    copy = TokenEntry.model_validate_json(entry.model_dump_json())
    sink, source = await check.sink(), await check.source()
    await sink.put(entry)
    try:
        await sink.put(copy)
    except Exception as exc:
        raise _Failed(
            f"re-putting an identical entry raised {type(exc).__name__}: {exc}",
        ) from exc
    snapshot = await source.freeze(check.rollout_id)
    _require(len(snapshot.entries) == 1, f"froze {len(snapshot.entries)} entries, expected 1")
    _require(not snapshot.incomplete, "an identical re-put made the snapshot incomplete")


async def _conflicting_reput(check: _Check) -> None:
    sink, source = await check.sink(), await check.source()
    await sink.put(check.entry())
    try:
        await sink.put(check.entry(generation_token_ids=(15,), text="b"))
    except Exception:
        return  # refused: the conflict cannot reach a trainer
    snapshot = await source.freeze(check.rollout_id)
    _require(
        snapshot.incomplete,
        "a different payload for call-1 was accepted and the snapshot is not incomplete",
    )


async def _mark_incomplete_durability(check: _Check) -> None:
    sink = await check.sink()
    await sink.put(check.entry())
    first = await (await check.source()).freeze(check.rollout_id)
    await sink.mark_incomplete(check.rollout_id, "call-2")
    second = await (await check.source()).freeze(check.rollout_id)
    _require(second.incomplete, "a fresh source does not see the rollout marked incomplete")
    _require(
        second.version != first.version,
        f"mark_incomplete after freeze left the version at {first.version!r}",
    )
    dropped = await (await check.source()).drop(
        check.rollout_id,
        snapshot_id=first.snapshot_id,
        version=first.version,
    )
    _require(dropped is False, f"dropping the pre-mark snapshot returned {dropped!r}, not False")


async def _freeze_idempotency(check: _Check) -> None:
    sink = await check.sink()
    await sink.put(check.entry())
    first = await (await check.source()).freeze(check.rollout_id)
    second = await (await check.source()).freeze(check.rollout_id)
    _require(
        first.snapshot_id == second.snapshot_id,
        f"snapshot_id changed between freezes: {first.snapshot_id!r} then {second.snapshot_id!r}",
    )
    _require(
        first.version == second.version,
        f"version changed between freezes: {first.version!r} then {second.version!r}",
    )
    _require(_digests(first) == _digests(second), "the frozen entries changed between freezes")


async def _post_freeze_write_safety(check: _Check) -> None:
    sink, source = await check.sink(), await check.source()
    parent = check.entry()
    await sink.put(parent)
    snapshot = await source.freeze(check.rollout_id)
    late = check.entry(
        model_call_id="call-2",
        prompt_token_ids=(11, 12, 13, 14),
        generation_token_ids=(15,),
        text="b",
        request_items=[*parent.request_items, *parent.output_items],
        parent_call_id=parent.model_call_id,
    )
    try:
        await sink.put(late)
    except Exception:
        return  # refused after freeze
    dropped = await source.drop(
        check.rollout_id,
        snapshot_id=snapshot.snapshot_id,
        version=snapshot.version,
    )
    _require(
        dropped is False,
        f"a put after freeze was accepted and dropping the snapshot returned {dropped!r}, "
        "so the late entry could be lost",
    )


async def _conditional_retirement(check: _Check) -> None:
    sink, source = await check.sink(), await check.source()
    entry = check.entry()
    await sink.put(entry)
    snapshot = await source.freeze(check.rollout_id)
    stale = await source.drop(
        check.rollout_id,
        snapshot_id=snapshot.snapshot_id,
        version=snapshot.version + 1,
    )
    _require(stale is False, f"a drop at version + 1 returned {stale!r}, not False")
    again = await source.freeze(check.rollout_id)
    _require(
        _digests(again).get(entry.model_call_id) == entry_digest(entry),
        "the entry is gone (or changed) after a refused drop",
    )
    exact = await source.drop(
        check.rollout_id,
        snapshot_id=again.snapshot_id,
        version=again.version,
    )
    _require(exact is True, f"dropping the current snapshot returned {exact!r}, not True")


def _lineage_entry(check: _Check) -> TokenEntry:
    return check.entry(
        prompt_token_ids=(101, 102, 103),
        generation_token_ids=(201, 202),
        text="It is sunny.",
    )


async def _expect_lineage(check: _Check, resolver: LineageResolving, entry: TokenEntry) -> None:
    continuation = [*entry.request_items, *entry.output_items, _FOLLOW_UP]
    decision = await resolver.resolve(check.rollout_id, continuation)
    _require(
        decision.kind == "resolved" and decision.model_call_id == entry.model_call_id,
        f"the continuation resolved as {decision.kind!r} to {decision.model_call_id!r}, "
        f"expected 'resolved' to {entry.model_call_id!r}",
    )
    expected = [*entry.prompt_token_ids, *entry.generation_token_ids]
    _require(
        list(decision.cumulative_token_ids) == expected,
        f"cumulative ids {list(decision.cumulative_token_ids)!r}, expected {expected!r}",
    )
    rewritten = [_REWRITTEN, *entry.output_items, _FOLLOW_UP]
    decision = await resolver.resolve(check.rollout_id, rewritten)
    _require(
        decision.kind == "unresolved",
        f"a continuation with a rewritten first turn resolved as {decision.kind!r}",
    )
    decision = await resolver.resolve(check.rollout_id, [_FRESH])
    _require(decision.kind == "root", f"a fresh question resolved as {decision.kind!r}")


async def _lineage_visibility(check: _Check) -> None:
    resolver = await check.resolver()
    entry = _lineage_entry(check)
    await (await check.sink()).put(entry)
    await _expect_lineage(check, resolver, entry)


async def _fresh_client_lineage_visibility(check: _Check) -> None:
    entry = _lineage_entry(check)
    await (await check.sink()).put(entry)
    resolver = await check.resolver()
    await _expect_lineage(check, resolver, entry)


async def _begin_call_custody(check: _Check) -> None:
    sink = await check.sink()
    begin_call = getattr(sink, "begin_call", None)
    if not callable(begin_call):
        raise _Skipped  # begin_call is optional (STAGING §5.3)
    await begin_call(check.rollout_id, "call-lost")
    snapshot = await (await check.source()).freeze(check.rollout_id)
    _require(snapshot.incomplete, "an intent without its entry left the snapshot complete")


_CHECKS: dict[str, Callable[[_Check], Awaitable[None]]] = {
    "put_then_freeze_visibility": _put_then_freeze_visibility,
    "idempotent_reput": _idempotent_reput,
    "conflicting_reput": _conflicting_reput,
    "mark_incomplete_durability": _mark_incomplete_durability,
    "freeze_idempotency": _freeze_idempotency,
    "post_freeze_write_safety": _post_freeze_write_safety,
    "conditional_retirement": _conditional_retirement,
    "lineage_visibility": _lineage_visibility,
    "fresh_client_lineage_visibility": _fresh_client_lineage_visibility,
    "begin_call_custody": _begin_call_custody,
}
assert tuple(_CHECKS) == CONFORMANCE_CHECKS

_LINEAGE_CHECKS = frozenset({"lineage_visibility", "fresh_client_lineage_visibility"})


async def run_conformance(
    sink_factory: SinkFactory,
    source_factory: SourceFactory,
    lineage_factory: LineageFactory | None = None,
    *,
    rollout_id: str = "conformance-rollout",
) -> list[str]:
    """Run the checks of STAGING §5.4 in order; return the names of those that passed.

    Each factory returns a fresh client (or an awaitable of one) over one shared backend; the
    suite makes several per check and closes every one it made, pass or fail. Check ``c`` runs
    on rollout ``f"{rollout_id}-{c.replace('_', '-')}"``, so the backend should start without
    those rollouts. The lineage checks run only with ``lineage_factory``;
    ``begin_call_custody`` only when a sink has a ``begin_call`` method.

    Raises :class:`ConformanceError` for the first check that fails; an exception the check did
    not ask for (from a client, a factory, or a close) fails it with detail
    ``"unexpected <Type>: <message>"``.
    """
    passed: list[str] = []
    for name, run in _CHECKS.items():
        if name in _LINEAGE_CHECKS and lineage_factory is None:
            continue
        check_rollout = f"{rollout_id}-{name.replace('_', '-')}"
        check = _Check(name, check_rollout, sink_factory, source_factory, lineage_factory)
        error: ConformanceError | None = None
        skipped = False
        try:
            await run(check)
        except _Skipped:
            skipped = True
        except _Failed as failed:
            error = ConformanceError(name, str(failed))
            error.__cause__ = failed.__cause__
        except Exception as exc:
            error = ConformanceError(name, _unexpected(exc))
            error.__cause__ = exc
        try:
            await check.close_all()
        except Exception as exc:
            # A failing check's own verdict is what matters; a close error only fails a pass.
            if error is None:
                error = ConformanceError(name, _unexpected(exc))
                error.__cause__ = exc
        if error is not None:
            raise error
        if not skipped:
            passed.append(name)
    return passed


def _unexpected(exc: BaseException) -> str:
    return f"unexpected {type(exc).__name__}: {exc}"
