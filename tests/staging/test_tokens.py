"""The complete-record path: TokenEntry, TokenCaptureStore's custody rules, LineageResolver."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from pydantic import ValidationError

from rollcap.staging._fingerprint import assistant_fingerprint, conversation_digest
from rollcap.staging._records import check_rollout_id
from rollcap.staging._tokens import (
    LineageDecision,
    LineageResolver,
    TokenCaptureSnapshot,
    TokenCaptureStore,
    TokenEntry,
    TokenEntryReader,
    TokenIntentSink,
    TokenSink,
    TokenSource,
    entry_digest,
)

ROLLOUT = "r-1"
QUESTION: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]


def answer(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        },
    ]


def make_entry(
    *,
    rollout_id: str = ROLLOUT,
    call: str = "call-1",
    prompt: Sequence[int] = (11, 12),
    generation: Sequence[int] = (13, 14),
    text: str = "a",
    request: Sequence[dict[str, Any]] = tuple(QUESTION),
    parent: str | None = None,
    created_at: float = 1700000000.0,
) -> TokenEntry:
    return TokenEntry.stamp(
        rollout_id=rollout_id,
        model_call_id=call,
        model="m",
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[-0.1] * len(generation),
        output_items=answer(text),
        request_items=request,
        parent_call_id=parent,
        created_at=created_at,
    )


def entry_json(**changes: Any) -> dict[str, Any]:
    return {**make_entry().model_dump(mode="json"), **changes}


def files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# --- TokenEntry ------------------------------------------------------------------------------


def test_stamped_root_computes_the_lineage_stamps() -> None:
    # STAGING §3.6 vectors: the answer's fingerprint and the one-user-turn context digest.
    entry = TokenEntry.stamped_root(
        rollout_id=ROLLOUT,
        model_call_id="call-1",
        model="m",
        prompt_token_ids=[1],
        generation_token_ids=[2],
        generation_log_probs=[-0.5],
        output_items=answer("answer 1"),
        request_items=[{"role": "user", "content": "hello"}],
        created_at=1.0,
    )
    assert entry.fingerprint == "9291144f4986ae935b19d80da641e2962c49ca5fc07a930541635e65fc0ba242"
    assert entry.context_digest == (
        "629222a0abb0ebbd9c7576c60c2c7bf1a74d29ffbd64fe3ca782ad738a0b4b83"
    )
    assert entry.context_len == 1
    assert entry.parent_call_id is None
    assert (entry.schema_version, entry.fingerprint_version) == (1, 2)
    assert entry.request_items == [{"role": "user", "content": "hello"}]


def test_stamp_covers_request_and_output_items() -> None:
    request = [*QUESTION, *answer("a"), {"role": "user", "content": "And tomorrow?"}]
    entry = make_entry(call="call-2", request=request, text="b", parent="call-1")
    assert entry.fingerprint == assistant_fingerprint([*request, *answer("b")])
    assert entry.context_digest == conversation_digest(request)
    assert entry.context_len == 3
    assert entry.parent_call_id == "call-1"


def test_no_assistant_item_anywhere_gives_an_empty_fingerprint() -> None:
    entry = TokenEntry.stamp(
        rollout_id=ROLLOUT,
        model_call_id="c",
        model="m",
        prompt_token_ids=[],
        generation_token_ids=[],
        generation_log_probs=[],
        output_items=[],
        request_items=QUESTION,
        created_at=0.0,
    )
    assert entry.fingerprint == ""


def test_stamp_defaults_created_at_to_now() -> None:
    entry = TokenEntry.stamp(
        rollout_id=ROLLOUT,
        model_call_id="c",
        model="m",
        prompt_token_ids=[1],
        generation_token_ids=[2],
        generation_log_probs=[-1.0],
        output_items=answer("x"),
        request_items=QUESTION,
    )
    assert entry.created_at > 1700000000.0


@pytest.mark.parametrize(
    "changes",
    [
        {"schema_version": 2},
        {"prompt_token_ids": [1, True]},
        {"prompt_token_ids": [-1]},
        {"generation_token_ids": [13, 14.0]},
        {"generation_token_ids": None},
        {"generation_log_probs": [-0.1]},
        {"generation_log_probs": [float("nan"), -0.1]},
        {"created_at": float("inf")},
        {"model_call_id": ""},
        {"model_call_id": 5},
        {"parent_call_id": ""},
        {"fingerprint": "abc"},
        {"context_digest": ""},
        {"context_len": -1},
        {"output_items": [{"bad": float("nan")}]},
        {"output_items": [{"bad": (1, 2)}]},
        {"output_items": [{"bad": {1: 2}}]},
        {"request_items": [{"bad": 2**64}]},
        {"output_items": ["not an object"]},
        {"surprise": 1},
    ],
)
def test_entry_is_strict(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TokenEntry.model_validate(entry_json(**changes))


def test_entry_owns_its_items() -> None:
    items = answer("a")
    entry = TokenEntry.model_validate(entry_json(output_items=items))
    items[0]["content"][0]["text"] = "changed"
    assert entry.output_items == answer("a")


def test_entry_digest_is_the_sorted_json_sha256() -> None:
    entry = make_entry()
    body = orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    assert entry_digest(entry) == hashlib.sha256(body).hexdigest()
    again = TokenEntry.model_validate_json(entry.model_dump_json())
    assert entry_digest(again) == entry_digest(entry)
    assert entry_digest(make_entry(created_at=1700000000.5)) != entry_digest(entry)


@pytest.mark.parametrize("bad", ["", "bad id", "a/b", "../x", "x\n", "é", 7, None])
def test_rollout_id_grammar(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^Invalid rollout id: "):
        check_rollout_id(bad)


def test_rollout_id_grammar_accepts_its_alphabet() -> None:
    assert check_rollout_id("Ab-0_9.x") == "Ab-0_9.x"


# --- TokenCaptureStore -----------------------------------------------------------------------


def test_store_satisfies_the_protocols(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    for protocol in (TokenSink, TokenIntentSink, TokenSource, TokenEntryReader):
        assert isinstance(store, protocol)


async def test_put_then_freeze(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path / "nested" / "root")
    entry = make_entry()
    await store.put(entry)
    snapshot = await store.freeze(ROLLOUT)
    assert isinstance(snapshot, TokenCaptureSnapshot)
    assert snapshot.rollout_id == ROLLOUT
    assert snapshot.entries == (entry,)
    assert not snapshot.incomplete
    assert snapshot.snapshot_id
    assert files(store.root) == [
        "r-1.tokens.jsonl",
        "r-1.tokens.lock",
        "r-1.tokens.state.json",
    ]
    line = (store.root / "r-1.tokens.jsonl").read_bytes()
    assert line == orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS) + b"\n"


async def test_identical_reput_is_a_no_op(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    before = await store.freeze(ROLLOUT)
    await store.put(make_entry())  # a separate, identical object
    after = await store.freeze(ROLLOUT)
    assert (after.snapshot_id, after.version) == (before.snapshot_id, before.version)
    assert len(after.entries) == 1
    assert not after.incomplete
    assert len((tmp_path / "r-1.tokens.jsonl").read_bytes().splitlines()) == 1


async def test_conflicting_reput_marks_incomplete_and_raises(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    original = make_entry()
    await store.put(original)
    before = await store.freeze(ROLLOUT)
    with pytest.raises(ValueError, match="different entry"):
        await store.put(make_entry(generation=[15], text="b"))
    after = await TokenCaptureStore(tmp_path).freeze(ROLLOUT)
    assert after.incomplete
    assert after.version == before.version + 1
    assert after.entries == (original,)  # the stored entry is kept, not replaced


async def test_a_timestamp_alone_is_a_conflict(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    with pytest.raises(ValueError, match="different entry"):
        await store.put(make_entry(created_at=1700000001.0))


async def test_mark_incomplete_is_durable_and_bumps_each_time(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    first = await store.freeze(ROLLOUT)
    await store.mark_incomplete(ROLLOUT, "call-2")
    second = await TokenCaptureStore(tmp_path).freeze(ROLLOUT)
    assert second.incomplete
    assert second.version > first.version
    await store.mark_incomplete(ROLLOUT)
    third = await TokenCaptureStore(tmp_path).freeze(ROLLOUT)
    assert third.version > second.version
    assert third.snapshot_id != second.snapshot_id
    assert not await store.drop(ROLLOUT, snapshot_id=first.snapshot_id, version=first.version)
    marks = (tmp_path / "r-1.tokens.incomplete").read_bytes().splitlines()
    assert [orjson.loads(mark)["model_call_id"] for mark in marks] == ["call-2", ""]


async def test_mark_incomplete_of_an_unknown_rollout(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.mark_incomplete("never-put")
    snapshot = await store.freeze("never-put")
    assert snapshot.incomplete
    assert snapshot.entries == ()


async def test_freeze_is_idempotent_across_instances(tmp_path: Path) -> None:
    await TokenCaptureStore(tmp_path).put(make_entry())
    first = await TokenCaptureStore(tmp_path).freeze(ROLLOUT)
    second = await TokenCaptureStore(tmp_path).freeze(ROLLOUT)
    assert first == second


async def test_freeze_of_an_unknown_rollout_is_empty_and_droppable(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    snapshot = await store.freeze("nothing")
    assert (snapshot.entries, snapshot.incomplete) == ((), False)
    assert await store.drop("nothing", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert files(tmp_path) == []


async def test_write_after_freeze_bumps_the_version(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    frozen = await store.freeze(ROLLOUT)
    await store.put(make_entry(call="call-2", prompt=[11, 12, 13, 14], generation=[15]))
    assert not await store.drop(ROLLOUT, snapshot_id=frozen.snapshot_id, version=frozen.version)
    later = await store.freeze(ROLLOUT)
    assert later.version > frozen.version
    assert {e.model_call_id for e in later.entries} == {"call-1", "call-2"}
    assert await store.drop(ROLLOUT, snapshot_id=later.snapshot_id, version=later.version)


async def test_drop_retires_exactly_that_snapshot(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.begin_call(ROLLOUT, "call-1")
    await store.put(make_entry())
    await store.mark_incomplete(ROLLOUT, "call-9")
    snap = await store.freeze(ROLLOUT)
    assert not await store.drop(ROLLOUT, snapshot_id=snap.snapshot_id, version=snap.version + 1)
    assert not await store.drop(ROLLOUT, snapshot_id="other", version=snap.version)
    assert (await store.freeze(ROLLOUT)) == snap
    assert await TokenCaptureStore(tmp_path).drop(
        ROLLOUT,
        snapshot_id=snap.snapshot_id,
        version=snap.version,
    )
    assert files(tmp_path) == []
    # Retired: the same snapshot cannot be dropped again, and the rollout starts afresh.
    assert not await store.drop(ROLLOUT, snapshot_id=snap.snapshot_id, version=snap.version)
    fresh = await store.freeze(ROLLOUT)
    assert (fresh.entries, fresh.incomplete) == ((), False)
    assert fresh.snapshot_id != snap.snapshot_id


async def test_drop_of_a_never_frozen_rollout_is_false(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    assert not await store.drop("unknown", snapshot_id="s", version=0)
    await store.put(make_entry())
    assert not await store.drop(ROLLOUT, snapshot_id="s", version=1)


async def test_drop_refuses_a_bad_version_type(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    with pytest.raises(TypeError):
        await store.drop(ROLLOUT, snapshot_id="s", version=True)


async def test_begin_call_intent_makes_the_snapshot_incomplete(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.begin_call(ROLLOUT, "call-1")
    await store.begin_call(ROLLOUT, "call-lost")
    assert (await TokenCaptureStore(tmp_path).freeze(ROLLOUT)).incomplete
    await store.put(make_entry())
    assert (await store.freeze(ROLLOUT)).incomplete  # call-lost is still missing
    await store.put(make_entry(call="call-lost"))
    assert not (await store.freeze(ROLLOUT)).incomplete


async def test_repeated_intent_is_a_no_op(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.begin_call(ROLLOUT, "call-1")
    before = await store.freeze(ROLLOUT)
    await store.begin_call(ROLLOUT, "call-1")
    assert await store.freeze(ROLLOUT) == before
    assert len((tmp_path / "r-1.tokens.intents").read_bytes().splitlines()) == 1


async def test_begin_call_needs_a_call_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model_call_id"):
        await TokenCaptureStore(tmp_path).begin_call(ROLLOUT, "")


@pytest.mark.parametrize("bad", ["bad id", "a/b", "../up", ""])
async def test_every_method_refuses_a_bad_rollout_id(tmp_path: Path, bad: str) -> None:
    store = TokenCaptureStore(tmp_path)
    with pytest.raises(ValueError, match="Invalid rollout id"):
        await store.freeze(bad)
    with pytest.raises(ValueError, match="Invalid rollout id"):
        await store.mark_incomplete(bad)
    with pytest.raises(ValueError, match="Invalid rollout id"):
        await store.begin_call(bad, "c")
    with pytest.raises(ValueError, match="Invalid rollout id"):
        await store.drop(bad, snapshot_id="s", version=0)
    with pytest.raises(ValueError, match="Invalid rollout id"):
        await store.entries(bad)
    if bad:  # an entry cannot even be built with an empty rollout id
        entry = make_entry().model_copy(update={"rollout_id": bad})
        with pytest.raises(ValueError, match="Invalid rollout id"):
            await store.put(entry)
    assert files(tmp_path) == []


async def test_put_refuses_what_is_not_an_entry(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        await TokenCaptureStore(tmp_path).put(entry_json())  # type: ignore[arg-type]


async def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.close()
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.put(make_entry())
    with pytest.raises(RuntimeError, match="closed"):
        await store.freeze(ROLLOUT)


async def test_instances_see_each_others_writes(tmp_path: Path) -> None:
    writer, reader = TokenCaptureStore(tmp_path), TokenCaptureStore(tmp_path)
    assert await reader.entries(ROLLOUT) == []
    first = await reader.freeze(ROLLOUT)
    await writer.put(make_entry())
    assert [e.model_call_id for e in await reader.entries(ROLLOUT)] == ["call-1"]
    second = await reader.freeze(ROLLOUT)
    assert second.version > first.version
    assert len(second.entries) == 1


async def test_concurrent_puts_keep_one_entry_per_call(tmp_path: Path) -> None:
    stores = [TokenCaptureStore(tmp_path) for _ in range(4)]

    async def put(index: int) -> None:
        store = stores[index % len(stores)]
        await store.put(make_entry(call=f"call-{index % 8}"))

    async with anyio.create_task_group() as group:
        for index in range(32):
            group.start_soon(put, index)
    snapshot = await stores[0].freeze(ROLLOUT)
    assert sorted(e.model_call_id for e in snapshot.entries) == sorted(
        f"call-{i}" for i in range(8)
    )
    assert not snapshot.incomplete
    assert len((tmp_path / "r-1.tokens.jsonl").read_bytes().splitlines()) == 8
    assert not [name for name in files(tmp_path) if ".tmp-" in name]


async def test_a_torn_tail_is_not_an_entry_and_is_cut_on_the_next_put(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    path = tmp_path / "r-1.tokens.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"model_call_id": "call-2", "trunc')
    snapshot = await store.freeze(ROLLOUT)
    assert [e.model_call_id for e in snapshot.entries] == ["call-1"]
    assert not snapshot.incomplete
    await store.put(make_entry(call="call-2"))
    lines = path.read_bytes().splitlines()
    assert [TokenEntry.model_validate_json(line).model_call_id for line in lines] == [
        "call-1",
        "call-2",
    ]


async def test_damaged_lines_make_the_snapshot_incomplete(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    path = tmp_path / "r-1.tokens.jsonl"
    with path.open("ab") as handle:
        handle.write(b"not json\n")
    snapshot = await store.freeze(ROLLOUT)
    assert snapshot.incomplete
    assert [e.model_call_id for e in snapshot.entries] == ["call-1"]


async def test_foreign_and_conflicting_lines_are_masked(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    path = tmp_path / "r-1.tokens.jsonl"
    # Written around the store, as a transport without compare-and-swap might.
    foreign = make_entry(rollout_id="r-2", call="call-3")
    conflict = make_entry(text="b")
    with path.open("ab") as handle:
        for entry in (foreign, conflict):
            handle.write(orjson.dumps(entry.model_dump(mode="json")) + b"\n")
    snapshot = await store.freeze(ROLLOUT)
    assert snapshot.incomplete
    assert snapshot.entries == ()  # conflicting payloads are zero candidates
    assert await store.entries(ROLLOUT) == []


async def test_a_change_made_without_a_bump_still_moves_the_snapshot(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    before = await store.freeze(ROLLOUT)
    with (tmp_path / "r-1.tokens.jsonl").open("ab") as handle:
        entry = make_entry(call="call-2")
        handle.write(orjson.dumps(entry.model_dump(mode="json")) + b"\n")
    assert not await store.drop(ROLLOUT, snapshot_id=before.snapshot_id, version=before.version)
    after = await store.freeze(ROLLOUT)
    assert after.version > before.version
    assert after.snapshot_id != before.snapshot_id


async def test_unreadable_state_is_refused(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    (tmp_path / "r-1.tokens.state.json").write_bytes(b"{")
    with pytest.raises(RuntimeError, match="unreadable token capture state"):
        await store.freeze(ROLLOUT)


async def test_entries_of_an_unknown_rollout_leave_no_files(tmp_path: Path) -> None:
    assert await TokenCaptureStore(tmp_path).entries("unknown") == []
    assert files(tmp_path) == []


async def test_files_are_private(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(make_entry())
    await store.mark_incomplete(ROLLOUT)
    await store.begin_call(ROLLOUT, "c")
    for name in files(tmp_path):
        assert os.stat(tmp_path / name).st_mode & 0o077 == 0, name


# --- LineageResolver -------------------------------------------------------------------------

FOLLOW_UP: dict[str, Any] = {"role": "user", "content": "And tomorrow?"}


def lineage_entry(call: str = "call-1", **changes: Any) -> TokenEntry:
    return make_entry(
        call=call,
        prompt=changes.pop("prompt", (101, 102, 103)),
        generation=changes.pop("generation", (201, 202)),
        text=changes.pop("text", "It is sunny."),
        **changes,
    )


async def test_resolver_decisions(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    resolver = LineageResolver(TokenCaptureStore(tmp_path))  # made before the put
    entry = lineage_entry()
    await store.put(entry)
    continuation = [*QUESTION, *entry.output_items, FOLLOW_UP]
    assert await resolver.resolve(ROLLOUT, continuation) == LineageDecision(
        "resolved",
        model_call_id="call-1",
        cumulative_token_ids=(101, 102, 103, 201, 202),
    )
    rewritten = [{"role": "user", "content": "Rome?"}, *entry.output_items, FOLLOW_UP]
    decision = await resolver.resolve(ROLLOUT, rewritten)
    assert (decision.kind, decision.reason) == ("unresolved", "context_mismatch")
    assert (await resolver.resolve(ROLLOUT, [FOLLOW_UP])).kind == "root"
    other_answer = [*QUESTION, *answer("It rains."), FOLLOW_UP]
    decision = await resolver.resolve(ROLLOUT, other_answer)
    assert (decision.kind, decision.reason) == ("unresolved", "no_match")
    # Another rollout's entries are not candidates.
    assert (await resolver.resolve("r-2", continuation)).reason == "no_match"


async def test_resolver_matches_across_dialect_spellings(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(lineage_entry())
    # The Responses answer replayed as a Chat assistant message.
    chat = [*QUESTION, {"role": "assistant", "content": "It is sunny."}, FOLLOW_UP]
    decision = await LineageResolver(store).resolve(ROLLOUT, chat)
    assert (decision.kind, decision.model_call_id) == ("resolved", "call-1")


async def test_a_request_shorter_than_the_context_is_unresolved(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    request = [{"role": "system", "content": "Be brief."}, *QUESTION]
    entry = lineage_entry(request=request)
    await store.put(entry)
    # Same assistant content, but the system turn is missing: fewer items than context_len.
    decision = await LineageResolver(store).resolve(ROLLOUT, [*entry.output_items])
    assert (decision.kind, decision.reason) == ("unresolved", "context_mismatch")


async def test_two_matching_entries_are_ambiguous(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(lineage_entry("call-1"))
    await store.put(lineage_entry("call-2", prompt=(9, 9)))
    continuation = [*QUESTION, *answer("It is sunny."), FOLLOW_UP]
    decision = await LineageResolver(store).resolve(ROLLOUT, continuation)
    assert (decision.kind, decision.reason) == ("unresolved", "ambiguous")


async def test_other_fingerprint_versions_are_not_candidates(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    await store.put(lineage_entry().model_copy(update={"fingerprint_version": 1}))
    continuation = [*QUESTION, *answer("It is sunny."), FOLLOW_UP]
    assert (await LineageResolver(store).resolve(ROLLOUT, continuation)).reason == "no_match"


async def test_unfingerprintable_requests_raise(tmp_path: Path) -> None:
    resolver = LineageResolver(TokenCaptureStore(tmp_path))
    with pytest.raises(ValueError, match="item 0"):
        await resolver.resolve(ROLLOUT, [{"role": "assistant", "content": [{"no": "type"}]}])


class FreezeOnly:
    """A TokenSource without ``entries``: the resolver falls back to freeze."""

    def __init__(self, store: TokenCaptureStore) -> None:
        self.store = store
        self.closed = 0

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        return await self.store.freeze(rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await self.store.drop(rollout_id, snapshot_id=snapshot_id, version=version)

    async def close(self) -> None:
        self.closed += 1


async def test_resolver_over_a_plain_source(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    source = FreezeOnly(store)
    assert not isinstance(source, TokenEntryReader)
    resolver = LineageResolver(source)
    await store.put(lineage_entry())
    continuation = [*QUESTION, *answer("It is sunny."), FOLLOW_UP]
    assert (await resolver.resolve(ROLLOUT, continuation)).kind == "resolved"
    await resolver.close()
    await resolver.close()
    assert source.closed == 1
    with pytest.raises(RuntimeError, match="closed"):
        await resolver.resolve(ROLLOUT, continuation)


async def test_resolver_can_leave_its_source_open(tmp_path: Path) -> None:
    source = FreezeOnly(TokenCaptureStore(tmp_path))
    await LineageResolver(source, close_source=False).close()
    assert source.closed == 0
