"""The gate's file ledger: row shapes, idempotency, the lineage match and the manifest."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rollcap.staging import _ledger
from rollcap.staging._digest import EMPTY_EXTRAS_DIGEST
from rollcap.staging._fingerprint import (
    UnfingerprintableError,
    assistant_fingerprint,
    conversation_digest,
)
from rollcap.staging._ledger import (
    LINEAGE_SUFFIX,
    CaptureLedgerCommit,
    FileLineageStore,
    ParentRow,
    output_fingerprints,
)
from rollcap.staging._records import (
    REASON_LEDGER_ROW_MISSING_CHAIN_HASH,
    REASON_LEDGER_ROW_MISSING_RESPONSE_ID,
    REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    REASON_UNRESOLVED_PARENT,
    REASON_WORKER_CAPTURE_FAILED,
    CallRecord,
    CaptureAdmission,
    check_rollout_id,
)

# STAGING §4.3's observed two-call Responses rollout r1, its first record verbatim.
ROOT_ID = "1f320141da30434288cc5420be1db187"
CHILD_ID = "2a4ba8c560c94b50b2508d29b2888b7d"
SPEC_FIRST_RECORD: dict[str, Any] = {
    "schema_version": 2,
    "digest_version": 2,
    "extras_digest_version": 1,
    "model_call_id": ROOT_ID,
    "parent_call_id": None,
    "prev_len": 0,
    "delta_len": 5,
    "cum_len": 5,
    "weight_version": 4,
    "digest": "ec2b6fbac9e43f1a899edf26134df36ef93b788be42e86a66537997353a76100",
    "extras_digest": "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6",
    "staging_key": f"r1/{ROOT_ID}",
    "mode": "text",
    "chain_hash": "0489a3eeb520deb2e49ffd40fdfc94cc0a71b6aaa0c83fff340e99015a9f9608",
    "cumulative_hash": "49328c7d45c84ab0da30f5bded881d985ee7b696616ea23bed15df86b7b99c90",
    "response_id": "chatcmpl-1",
    "admitted_at": 1796150114.0349722,
    "output_fingerprint": "9291144f4986ae935b19d80da641e2962c49ca5fc07a930541635e65fc0ba242",
    "continuation_fingerprint": "9291144f4986ae935b19d80da641e2962c49ca5fc07a930541635e65fc0ba242",
    "fingerprint_version": 2,
}
# STAGING §1.4: the admission the gate sent for the second call of that rollout.
SPEC_CHILD_ADMISSION = {
    "schema_version": 2,
    "rollout_id": "r1",
    "model_call_id": CHILD_ID,
    "parent_call_id": ROOT_ID,
    "prev_len": 5,
    "mode": "token_in",
    "required_prefix_token_ids": [],
    "staging_chain": [f"r1/{ROOT_ID}"],
    "parent_chain_hash": "0489a3eeb520deb2e49ffd40fdfc94cc0a71b6aaa0c83fff340e99015a9f9608",
}

COMMITTED_COLUMNS = {
    "model_call_id",
    "fingerprint",
    "context_len",
    "context_digest",
    "digest",
    "parent_call_id",
    "staging_key",
    "weight_version",
    "prev_len",
    "delta_len",
    "cum_len",
    "staging_digest",
    "extras_digest",
    "mode",
    "admitted_at",
    "staging_chain",
    "chain_hash",
    "cumulative_hash",
    "response_id",
    "output_fingerprint",
    "continuation_fingerprint",
    "fingerprint_version",
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    """One assistant output message, as the Responses dialect serves it."""
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def hex64(n: int) -> str:
    return f"{n:064x}"


def commit(
    rollout_id: str,
    call_id: str,
    request: list[dict[str, Any]],
    response: list[dict[str, Any]],
    *,
    parent: ParentRow | None = None,
    delta_len: int = 3,
    response_id: str | None = None,
    **record_fields: Any,
) -> CaptureLedgerCommit:
    """A commit as the gate builds it, for a call under ``parent`` (a root when ``None``)."""
    key = f"{rollout_id}/{call_id}"
    prev_len = parent.cum_len if parent is not None else 0
    output_fp, continuation_fp = output_fingerprints(request, response)
    fields: dict[str, Any] = {
        "model_call_id": call_id,
        "parent_call_id": parent.model_call_id if parent is not None else None,
        "prev_len": prev_len,
        "delta_len": delta_len,
        "cum_len": prev_len + delta_len,
        "weight_version": 1,
        "digest": hex64(len(call_id) + 1),
        "extras_digest": EMPTY_EXTRAS_DIGEST,
        "staging_key": key,
        "mode": "token_in" if parent is not None else "text",
        "chain_hash": hex64(prev_len + delta_len),
        "cumulative_hash": hex64(prev_len + delta_len + 1000),
        "response_id": response_id or f"chatcmpl-{call_id}",
        "admitted_at": 1700000000.5,
        "output_fingerprint": output_fp,
        "continuation_fingerprint": continuation_fp,
        "fingerprint_version": 2,
    }
    fields.update(record_fields)
    chain = [*(parent.staging_chain if parent is not None else ()), key]
    return CaptureLedgerCommit(
        rollout_id=rollout_id,
        record=CallRecord(**fields),
        staging_chain=chain,
        request_items=request,
        response_items=response,
    )


def lines(store: FileLineageStore, rollout_id: str) -> list[str]:
    return store.path(rollout_id).read_text().splitlines()


def rows(store: FileLineageStore, rollout_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines(store, rollout_id)]


def write_rows(root: Path, rollout_id: str, *objects: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{rollout_id}.lineage.jsonl").open("a") as handle:
        for obj in objects:
            handle.write(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")


@pytest.fixture
def store(tmp_path: Path) -> FileLineageStore:
    return FileLineageStore(tmp_path / "ledger")


# --- the manifest row and the committed row ---------------------------------------------------

R1_REQUEST = [user("question 1")]
R1_RESPONSE = [answer("answer 1")]


def spec_root_commit() -> CaptureLedgerCommit:
    output_fp, continuation_fp = output_fingerprints(R1_REQUEST, R1_RESPONSE)
    assert output_fp == continuation_fp == SPEC_FIRST_RECORD["output_fingerprint"]
    return CaptureLedgerCommit(
        rollout_id="r1",
        record=CallRecord.model_validate(SPEC_FIRST_RECORD),
        staging_chain=[f"r1/{ROOT_ID}"],
        request_items=R1_REQUEST,
        response_items=R1_RESPONSE,
    )


def test_the_manifest_serves_the_record_of_the_spec(store: FileLineageStore) -> None:
    store.record(spec_root_commit())
    store.record_failure("r1", "8cbd13e5182142ac960c299956563d1c", REASON_UNRESOLVED_PARENT)

    manifest = store.manifest("r1").model_dump(mode="json")

    assert list(manifest) == ["schema_version", "rollout_id", "records", "failures"]
    assert manifest["schema_version"] == 2
    assert manifest["rollout_id"] == "r1"
    first = manifest["records"][0]
    assert list(first) == list(SPEC_FIRST_RECORD)
    assert first == SPEC_FIRST_RECORD
    assert manifest["failures"] == [
        {
            "schema_version": 2,
            "model_call_id": "8cbd13e5182142ac960c299956563d1c",
            "reason": "unresolved_parent",
        }
    ]


def test_a_committed_row_holds_the_lineage_and_custody_columns(store: FileLineageStore) -> None:
    store.record(spec_root_commit())

    (line,) = lines(store, "r1")
    row = json.loads(line)
    assert set(row) == COMMITTED_COLUMNS
    # Keys sorted, compact separators.
    assert line == json.dumps(row, sort_keys=True, separators=(",", ":"))
    assert row["fingerprint"] == assistant_fingerprint([*R1_REQUEST, *R1_RESPONSE])
    assert row["context_len"] == 1
    assert row["context_digest"] == conversation_digest(R1_REQUEST)
    assert row["digest"] == SPEC_FIRST_RECORD["cumulative_hash"]
    assert row["staging_digest"] == SPEC_FIRST_RECORD["digest"]
    assert row["staging_chain"] == [f"r1/{ROOT_ID}"]
    for name in COMMITTED_COLUMNS - {
        "fingerprint",
        "context_len",
        "context_digest",
        "digest",
        "staging_digest",
        "staging_chain",
    }:
        assert row[name] == SPEC_FIRST_RECORD[name], name
    assert "rollout_id" not in row
    assert (store.root / "r1.tokens.lock").exists()


def test_a_failure_row_is_reason_and_call_id(store: FileLineageStore) -> None:
    store.record_failure("r1", "c1", REASON_WORKER_CAPTURE_FAILED)

    assert lines(store, "r1") == ['{"failure_reason":"worker_capture_failed","model_call_id":"c1"}']


def test_the_child_of_the_spec_rollout_resolves_to_its_admission(store: FileLineageStore) -> None:
    store.record(spec_root_commit())
    items = [*R1_REQUEST, *R1_RESPONSE, user("question 2")]

    parent = store.resolve("r1", items)
    # The items' fingerprint, when the caller has it, is taken as given: the same parent.
    assert store.resolve("r1", items, fingerprint=assistant_fingerprint(items)) == parent
    assert store.resolve("r1", items, fingerprint="0" * 64) is None

    assert parent == ParentRow(
        model_call_id=ROOT_ID,
        cum_len=5,
        staging_chain=(f"r1/{ROOT_ID}",),
        chain_hash=SPEC_FIRST_RECORD["chain_hash"],
    )
    admission = CaptureAdmission(
        rollout_id="r1",
        model_call_id=CHILD_ID,
        parent_call_id=parent.model_call_id,
        prev_len=parent.cum_len,
        mode="token_in",
        staging_chain=list(parent.staging_chain),
        parent_chain_hash=parent.chain_hash,
    )
    assert admission.model_dump(mode="json") == SPEC_CHILD_ADMISSION


def test_a_chain_of_three_carries_the_staging_chain(store: FileLineageStore) -> None:
    first = [user("q1")]
    store.record(commit("r", "a", first, [answer("a1")]))
    second = [*first, answer("a1"), user("q2")]
    parent = store.resolve("r", second)
    assert parent is not None
    store.record(commit("r", "b", second, [answer("a2")], parent=parent))
    third = [*second, answer("a2"), user("q3")]

    grandparent = store.resolve("r", third)

    assert grandparent is not None
    assert grandparent.model_call_id == "b"
    assert grandparent.staging_chain == ("r/a", "r/b")
    assert grandparent.cum_len == 6
    assert [record.model_call_id for record in store.manifest("r").records] == ["a", "b"]


# --- commits ----------------------------------------------------------------------------------


def test_the_commit_model_is_strict() -> None:
    good = spec_root_commit().model_dump()
    assert CaptureLedgerCommit.model_validate(good).rollout_id == "r1"
    with pytest.raises(ValidationError):
        CaptureLedgerCommit.model_validate({**good, "extra": 1})
    with pytest.raises(ValidationError):
        CaptureLedgerCommit.model_validate({**good, "schema_version": 1})
    with pytest.raises(ValidationError):
        CaptureLedgerCommit.model_validate({**good, "request_items": None})
    with pytest.raises(ValidationError, match="end with its record's staging_key"):
        CaptureLedgerCommit.model_validate({**good, "staging_chain": ["r1/other"]})
    with pytest.raises(ValidationError, match="a root's staging_chain"):
        CaptureLedgerCommit.model_validate({**good, "staging_chain": ["r1/x", f"r1/{ROOT_ID}"]})


def test_recording_the_same_row_again_is_a_no_op(store: FileLineageStore) -> None:
    store.record(spec_root_commit())
    store.record(spec_root_commit())
    FileLineageStore(store.root).record(spec_root_commit())

    assert len(lines(store, "r1")) == 1


def test_a_different_row_for_a_recorded_call_is_refused(store: FileLineageStore) -> None:
    store.record(spec_root_commit())
    before = store.path("r1").read_bytes()
    other = spec_root_commit().model_copy(
        update={"record": spec_root_commit().record.model_copy(update={"response_id": "other"})}
    )

    with pytest.raises(ValueError, match="already in the ledger with a different row"):
        store.record(other)
    with pytest.raises(ValueError, match="different row"):
        FileLineageStore(store.root).record(other)

    assert store.path("r1").read_bytes() == before


def test_failure_rows_are_idempotent_per_identical_row(store: FileLineageStore) -> None:
    store.record_failure("r", "c1", REASON_WORKER_CAPTURE_FAILED)
    store.record_failure("r", "c1", REASON_WORKER_CAPTURE_FAILED)
    store.record_failure("r", "c1", REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)
    FileLineageStore(store.root).record_failure("r", "c1", REASON_WORKER_CAPTURE_FAILED)
    store.record_failure("r", "c2", REASON_WORKER_CAPTURE_FAILED)

    assert rows(store, "r") == [
        {"failure_reason": "worker_capture_failed", "model_call_id": "c1"},
        {"failure_reason": "request_finished_without_staged_coordinates", "model_call_id": "c1"},
        {"failure_reason": "worker_capture_failed", "model_call_id": "c2"},
    ]
    failures = [(f.model_call_id, f.reason) for f in store.manifest("r").failures]
    assert failures == [
        ("c1", "worker_capture_failed"),
        ("c1", "request_finished_without_staged_coordinates"),
        ("c2", "worker_capture_failed"),
    ]


@pytest.mark.parametrize(("call_id", "reason"), [("", "x"), ("c", ""), (None, "x")])
def test_a_failure_row_needs_a_call_id_and_a_reason(
    store: FileLineageStore, call_id: Any, reason: str
) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        store.record_failure("r", call_id, reason)
    assert not store.has_rows("r")


def test_unfingerprintable_items_commit_a_row_that_never_resolves(
    store: FileLineageStore,
) -> None:
    request = [{"role": "user", "content": [{"no_type": 1}]}]
    response = [{"role": "assistant", "content": [{"no_type": 2}]}]
    assert output_fingerprints(request, response) == (None, None)

    store.record(commit("r", "c", request, response))

    (row,) = rows(store, "r")
    assert row["fingerprint"] is None
    assert row["context_digest"] is None
    assert [record.model_call_id for record in store.manifest("r").records] == ["c"]
    with pytest.raises(UnfingerprintableError):
        store.resolve("r", [*request, *response])


def test_output_fingerprints_are_null_without_assistant_items() -> None:
    assert output_fingerprints([user("q")], []) == (None, None)
    previous = answer("earlier")
    output_fp, continuation_fp = output_fingerprints([previous, user("q")], [])
    assert output_fp is None
    assert continuation_fp == assistant_fingerprint([previous])
    output_fp, continuation_fp = output_fingerprints([previous], [answer("now")])
    assert output_fp == assistant_fingerprint([answer("now")])
    assert continuation_fp == assistant_fingerprint([previous, answer("now")])


# --- the match --------------------------------------------------------------------------------


def test_items_without_an_assistant_turn_resolve_to_nothing(store: FileLineageStore) -> None:
    store.record(commit("r", "a", [user("q")], []))  # an empty answer: fingerprint ""
    assert rows(store, "r")[0]["fingerprint"] == ""

    assert store.resolve("r", [user("q")]) is None
    assert store.resolve("unknown", [user("q"), answer("a")]) is None


def test_two_matching_rows_are_a_tie_and_resolve_to_nothing(store: FileLineageStore) -> None:
    store.record(commit("r", "a", [user("q")], [answer("same")]))
    store.record(commit("r", "b", [user("q")], [answer("same")]))

    assert store.resolve("r", [user("q"), answer("same"), user("next")]) is None


def test_a_different_context_resolves_to_nothing(store: FileLineageStore) -> None:
    store.record(commit("r", "a", [user("q")], [answer("a1")]))

    assert store.resolve("r", [user("rewritten q"), answer("a1"), user("next")]) is None
    assert store.resolve("r", [user("q"), answer("a1"), user("next")]) is not None


def test_a_request_shorter_than_the_parents_context_resolves_to_nothing(
    store: FileLineageStore,
) -> None:
    store.record(commit("r", "a", [user("q1"), user("q2")], [answer("a1")]))

    # The assistant fingerprint matches, but two context items cannot be replayed in one.
    assert store.resolve("r", [answer("a1")]) is None
    assert store.resolve("r", [user("q1"), user("q2"), answer("a1")]) is not None


def test_failure_rows_never_match(store: FileLineageStore, tmp_path: Path) -> None:
    items = [user("q"), answer("a")]
    store.record_failure("r", "c1", REASON_WORKER_CAPTURE_FAILED)
    assert store.resolve("r", items) is None
    # Even one carrying lineage columns (hand-written; the store never writes such a row).
    write_rows(
        store.root,
        "r",
        {
            "failure_reason": REASON_WORKER_CAPTURE_FAILED,
            "model_call_id": "c2",
            "fingerprint": assistant_fingerprint(items),
            "fingerprint_version": 2,
            "context_len": 1,
            "context_digest": conversation_digest(items[:1]),
            "cum_len": 3,
            "staging_chain": ["r/c2"],
            "chain_hash": hex64(1),
        },
    )
    assert store.resolve("r", items) is None


def test_rows_of_another_fingerprint_version_never_match(store: FileLineageStore) -> None:
    store.record(commit("r", "a", [user("q")], [answer("a1")], fingerprint_version=0))

    assert store.resolve("r", [user("q"), answer("a1"), user("next")]) is None


def test_a_parent_row_without_a_chain_hash_resolves_with_none(store: FileLineageStore) -> None:
    items = [user("q"), answer("a")]
    row = {
        "model_call_id": "p",
        "fingerprint": assistant_fingerprint(items),
        "fingerprint_version": 2,
        "context_len": 1,
        "context_digest": conversation_digest(items[:1]),
        "cum_len": 4,
        "staging_chain": ["r/p"],
        "response_id": "x",
    }
    write_rows(store.root, "r", row)

    # The gate's admission then fails validation and it records unresolved_parent (§1.2).
    assert store.resolve("r", items) == ParentRow("p", 4, ("r/p",), None)


def test_a_row_with_broken_columns_resolves_to_nothing(store: FileLineageStore) -> None:
    items = [user("q"), answer("a")]
    good = {
        "model_call_id": "p",
        "fingerprint": assistant_fingerprint(items),
        "fingerprint_version": 2,
        "context_len": 1,
        "context_digest": conversation_digest(items[:1]),
        "cum_len": 4,
        "staging_chain": ["r/p"],
        "chain_hash": hex64(9),
    }
    brokens: list[dict[str, Any]] = [
        {"cum_len": "4"},
        {"staging_chain": "r/p"},
        {"context_len": True},
        {"chain_hash": 7},
    ]
    for index, broken in enumerate(brokens):
        rollout = f"r{index}"
        write_rows(store.root, rollout, {**good, **broken})
        assert store.resolve(rollout, items) is None, broken
    write_rows(store.root, "ok", good)
    assert store.resolve("ok", items) == ParentRow("p", 4, ("r/p",), hex64(9))


# --- has_rows and the manifest ----------------------------------------------------------------


def test_has_rows_counts_either_kind(store: FileLineageStore) -> None:
    assert not store.has_rows("a")
    assert not store.has_rows("b")
    store.record_failure("a", "c1", REASON_UNRESOLVED_PARENT)
    store.record(commit("b", "c2", [user("q")], [answer("x")]))

    assert store.has_rows("a")
    assert store.has_rows("b")
    assert not store.has_rows("c")
    assert not (store.root / "c.tokens.lock").exists()  # a read creates no file


def test_an_unknown_rollout_has_an_empty_manifest(store: FileLineageStore) -> None:
    manifest = store.manifest("nothing-here")

    assert manifest.model_dump(mode="json") == {
        "schema_version": 2,
        "rollout_id": "nothing-here",
        "records": [],
        "failures": [],
    }


def test_malformed_custody_rows_become_manifest_failures(store: FileLineageStore) -> None:
    store.record(commit("r", "good1", [user("q1")], [answer("a1")]))
    full = rows(store, "r")[0]
    no_response_id = {**full, "model_call_id": "m1"}
    del no_response_id["response_id"]
    null_response_id = {**full, "model_call_id": "m2", "response_id": None}
    no_chain_hash = {**full, "model_call_id": "m3"}
    del no_chain_hash["chain_hash"]
    no_cumulative_hash = {**full, "model_call_id": "m4", "cumulative_hash": None}
    neither = {**full, "model_call_id": "m5", "response_id": "", "chain_hash": None}
    write_rows(
        store.root,
        "r",
        no_response_id,
        null_response_id,
        no_chain_hash,
        no_cumulative_hash,
        neither,
    )
    store.record(commit("r", "good2", [user("q2")], [answer("a2")]))

    manifest = store.manifest("r")

    assert [record.model_call_id for record in manifest.records] == ["good1", "good2"]
    assert [(f.model_call_id, f.reason) for f in manifest.failures] == [
        ("m1", REASON_LEDGER_ROW_MISSING_RESPONSE_ID),
        ("m2", REASON_LEDGER_ROW_MISSING_RESPONSE_ID),
        ("m3", REASON_LEDGER_ROW_MISSING_CHAIN_HASH),
        ("m4", REASON_LEDGER_ROW_MISSING_CHAIN_HASH),
        ("m5", REASON_LEDGER_ROW_MISSING_RESPONSE_ID),
    ]


def test_a_row_that_is_no_valid_record_fails_the_manifest(store: FileLineageStore) -> None:
    store.record(commit("r", "good", [user("q")], [answer("a")]))
    broken = {**rows(store, "r")[0], "model_call_id": "bad", "delta_len": 0}
    write_rows(store.root, "r", broken)

    with pytest.raises(ValueError, match="ledger row of call 'bad' is not a valid call record"):
        store.manifest("r")


def test_records_keep_append_order_across_kinds(store: FileLineageStore) -> None:
    store.record(commit("r", "z", [user("q1")], [answer("a1")]))
    store.record_failure("r", "y", REASON_UNRESOLVED_PARENT)
    store.record(commit("r", "a", [user("q2")], [answer("a2")]))

    manifest = store.manifest("r")

    assert [record.model_call_id for record in manifest.records] == ["z", "a"]
    assert [f.model_call_id for f in manifest.failures] == ["y"]


# --- rollout ids ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["bad id", "a/b", "", "x\n", "../x", "é", "a:b"])
def test_an_invalid_rollout_id_is_refused_with_the_routes_text(
    store: FileLineageStore, bad: str
) -> None:
    expected = f"Invalid rollout id: {bad!r}"
    good = spec_root_commit()
    calls: list[Callable[[], object]] = [
        lambda: store.manifest(bad),
        lambda: store.has_rows(bad),
        lambda: store.resolve(bad, [user("q"), answer("a")]),
        lambda: store.record_failure(bad, "c", REASON_UNRESOLVED_PARENT),
        lambda: store.path(bad),
    ]
    if bad:  # the commit model refuses an empty id itself
        calls.append(lambda: store.record(good.model_copy(update={"rollout_id": bad})))
    for call in calls:
        with pytest.raises(ValueError, match=r"^Invalid rollout id: ") as caught:
            call()
        assert str(caught.value) == expected
    assert not store.root.exists()


def test_the_observed_400_text() -> None:
    with pytest.raises(ValueError, match=r"^Invalid rollout id: ") as caught:
        check_rollout_id("bad id")
    assert str(caught.value) == "Invalid rollout id: 'bad id'"


@pytest.mark.parametrize("good", ["0-0", "r1", "A.b_c-9", "...", "x" * 200])
def test_valid_rollout_ids(store: FileLineageStore, good: str) -> None:
    store.record_failure(good, "c", REASON_UNRESOLVED_PARENT)
    assert store.path(good).parent == store.root
    assert store.has_rows(good)


# --- durability, concurrency, the cache -------------------------------------------------------


def test_a_torn_last_line_is_ignored_and_the_next_append_starts_afresh(
    store: FileLineageStore,
) -> None:
    store.record(commit("r", "a", [user("q")], [answer("a1")]))
    path = store.path("r")
    with path.open("ab") as handle:  # a crash in the middle of an append
        handle.write(b'{"failure_reason":"worker_capt')
    assert [r.model_call_id for r in store.manifest("r").records] == ["a"]
    assert store.manifest("r").failures == []
    fresh = FileLineageStore(store.root)
    assert [r.model_call_id for r in fresh.manifest("r").records] == ["a"]
    assert fresh.resolve("r", [user("q"), answer("a1")]) is not None

    store.record_failure("r", "b", REASON_WORKER_CAPTURE_FAILED)

    raw = path.read_text().splitlines()
    assert raw[1] == '{"failure_reason":"worker_capt'
    assert raw[2] == '{"failure_reason":"worker_capture_failed","model_call_id":"b"}'
    assert path.read_bytes().endswith(b"\n")
    for reader in (store, FileLineageStore(store.root)):
        manifest = reader.manifest("r")
        assert [r.model_call_id for r in manifest.records] == ["a"]
        assert [(f.model_call_id, f.reason) for f in manifest.failures] == [
            ("b", REASON_WORKER_CAPTURE_FAILED)
        ]


def test_a_torn_line_is_completed_by_a_later_append(store: FileLineageStore) -> None:
    # The torn fragment seen by one reader, then the rest of the row written by a slow writer.
    store.record_failure("r", "a", REASON_UNRESOLVED_PARENT)
    path = store.path("r")
    with path.open("ab") as handle:
        handle.write(b'{"failure_reason":"worker_capture_failed",')
    assert len(store.manifest("r").failures) == 1
    with path.open("ab") as handle:
        handle.write(b'"model_call_id":"b"}\n')

    assert [f.model_call_id for f in store.manifest("r").failures] == ["a", "b"]


def test_two_stores_on_one_directory_see_each_others_rows(tmp_path: Path) -> None:
    writer = FileLineageStore(tmp_path)
    reader = FileLineageStore(tmp_path)
    first = [user("q1")]
    assert reader.resolve("r", [*first, answer("a1")]) is None
    assert not reader.has_rows("r")

    writer.record(commit("r", "a", first, [answer("a1")]))
    assert reader.has_rows("r")
    parent = reader.resolve("r", [*first, answer("a1"), user("q2")])
    assert parent is not None
    assert [r.model_call_id for r in reader.manifest("r").records] == ["a"]

    second = [*first, answer("a1"), user("q2")]
    reader.record(commit("r", "b", second, [answer("a2")], parent=parent))
    writer.record_failure("r", "c", REASON_UNRESOLVED_PARENT)

    for store in (writer, reader):
        manifest = store.manifest("r")
        assert [r.model_call_id for r in manifest.records] == ["a", "b"]
        assert [f.model_call_id for f in manifest.failures] == ["c"]
        found = store.resolve("r", [*second, answer("a2"), user("q3")])
        assert found is not None
        assert found.model_call_id == "b"
    # The other store's identical row is a no-op, its conflicting one refused.
    writer.record(commit("r", "b", second, [answer("a2")], parent=parent))
    with pytest.raises(ValueError, match="different row"):
        writer.record(commit("r", "b", second, [answer("other")], parent=parent))
    assert len(lines(writer, "r")) == 3


def test_an_unchanged_file_is_not_read_again(
    store: FileLineageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.record(commit("r", "a", [user("q")], [answer("a1")]))
    offsets: list[int] = []
    real = _ledger._read_from

    def counting(fd: int, offset: int) -> bytes:
        offsets.append(offset)
        return real(fd, offset)

    monkeypatch.setattr(_ledger, "_read_from", counting)
    store.manifest("r")
    size = store.path("r").stat().st_size
    store.manifest("r")
    store.has_rows("r")
    store.resolve("r", [user("q"), answer("a1")])
    assert offsets == [0]

    FileLineageStore(store.root).record_failure("r", "b", REASON_UNRESOLVED_PARENT)
    assert offsets == [0, 0]  # the other store read the file once itself
    assert len(store.manifest("r").failures) == 1

    # Only what was appended since is read.
    assert offsets == [0, 0, size]


def test_the_cache_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    store = FileLineageStore(tmp_path, max_cached_rollouts=2)
    for rollout in ("r1", "r2", "r3"):
        store.record_failure(rollout, "c", REASON_UNRESOLVED_PARENT)
        store.has_rows(rollout)
    assert store.cached_rollouts() == ["r2", "r3"]

    store.manifest("r2")
    store.has_rows("r4")  # no file: nothing to cache
    store.record_failure("r1", "d", REASON_UNRESOLVED_PARENT)
    assert store.cached_rollouts() == ["r2", "r1"]
    assert [f.model_call_id for f in store.manifest("r1").failures] == ["c", "d"]
    assert [f.model_call_id for f in store.manifest("r3").failures] == ["c"]
    assert store.cached_rollouts() == ["r1", "r3"]


def test_a_cache_of_zero_reads_every_time(tmp_path: Path) -> None:
    store = FileLineageStore(tmp_path, max_cached_rollouts=0)
    store.record_failure("r", "c", REASON_UNRESOLVED_PARENT)
    store.record_failure("r", "c", REASON_UNRESOLVED_PARENT)
    assert store.has_rows("r")
    assert store.cached_rollouts() == []
    assert len(lines(store, "r")) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_the_cache_bound_must_be_a_count(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_cached_rollouts"):
        FileLineageStore(tmp_path, max_cached_rollouts=bad)


def test_threads_appending_to_one_rollout_lose_nothing(store: FileLineageStore) -> None:
    barrier = threading.Barrier(8)

    def work(worker: int) -> None:
        barrier.wait()
        for n in range(10):
            call = f"w{worker}-{n}"
            store.record(commit("r", call, [user(call)], [answer(call)]))
            store.record_failure("r", call, REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)
            store.record(commit("r", call, [user(call)], [answer(call)]))  # a no-op

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    manifest = FileLineageStore(store.root).manifest("r")
    assert len(manifest.records) == 80
    assert len(manifest.failures) == 80
    assert len(lines(store, "r")) == 160


def _append_failures(root: str, worker: int) -> None:
    store = FileLineageStore(Path(root))
    for n in range(25):
        store.record_failure("shared", f"p{worker}-{n}", REASON_UNRESOLVED_PARENT)
        store.record_failure("shared", f"p{worker}-{n}", REASON_UNRESOLVED_PARENT)


def test_processes_appending_to_one_rollout_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_failures, args=(str(tmp_path), w)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    store = FileLineageStore(tmp_path)
    failures = store.manifest("shared").failures
    assert sorted(f.model_call_id for f in failures) == sorted(
        f"p{w}-{n}" for w in range(3) for n in range(25)
    )
    assert len(lines(store, "shared")) == 75


def test_rows_another_appender_writes_read_as_the_store_writes_them(
    store: FileLineageStore, tmp_path: Path
) -> None:
    # The model server appends ledger_row / failure_row through its capture store (an exclusive
    # flock on the file itself, whole lines, fsynced): the manifest reads the same as rows the
    # store wrote itself, line for line.
    from rollcap.store import CaptureStore

    elsewhere = CaptureStore(tmp_path / "other", suffix=".lineage.jsonl", marker_suffix=".x")
    root = spec_root_commit()
    elsewhere.append("r1", _ledger.ledger_row(root))
    elsewhere.append("r1", _ledger.failure_row("c2", "unresolved_parent"))
    elsewhere.close()
    store.record(root)
    store.record_failure("r1", "c2", "unresolved_parent")
    other = FileLineageStore(tmp_path / "other")
    assert other.path("r1").read_bytes() == store.path("r1").read_bytes()
    assert other.manifest("r1") == store.manifest("r1")
    with pytest.raises(ValueError, match="non-empty reason"):
        _ledger.failure_row("c2", "")


def test_a_ledger_compacted_by_capture_compress_reads_and_takes_rows_as_frames(
    store: FileLineageStore,
) -> None:
    from rollcap.cli import main

    store.record(spec_root_commit())
    store.record_failure("r1", "c1", REASON_WORKER_CAPTURE_FAILED)
    before = store.manifest("r1")
    assert main(["capture", "compress", str(store.root)]) == 0
    packed = store.root / f"r1{LINEAGE_SUFFIX}.zst"
    assert packed.exists()
    assert not store.path("r1").exists()
    fresh = FileLineageStore(store.root)
    assert fresh.manifest("r1") == before
    store.record(spec_root_commit())  # the same row again: still a no-op
    store.record_failure("r1", "c2", REASON_WORKER_CAPTURE_FAILED)  # a frame of its own
    assert not store.path("r1").exists()
    failures = [f.model_call_id for f in FileLineageStore(store.root).manifest("r1").failures]
    assert failures == ["c1", "c2"]
    assert main(["capture", "decompress", str(store.root)]) == 0
    assert not packed.exists()
    assert [f.model_call_id for f in store.manifest("r1").failures] == ["c1", "c2"]
