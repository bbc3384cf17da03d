"""linearize: exact sequences from staged deltas, and every tampered byte named, never repaired."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcap.staging import (
    ROOT_CHAIN_HASH,
    Admission,
    CommitCoords,
    DirectoryStagingSink,
    InMemoryStagingSink,
    LinearizeError,
    RolloutTokenCapture,
    StagedCallRecord,
    VLLMCaptureAdapter,
    linearize,
    linearize_records,
)
from tests.staging._helpers import (
    call_id,
    generated,
    generation_prompt,
    logprobs_for,
    render_message,
    text_ids,
    vllm_response,
)

ROLLOUT = "12-3"

# An agent's five model calls: two tool calls, an answer, a user follow-up, a last tool round.
TURNS: list[tuple[list[tuple[str, str]], str]] = [
    (
        [("system", "You can call tools."), ("user", "Weather in Oslo?")],
        '<tool_call>weather\n{"city": "Oslo"}</tool_call>',
    ),
    ([("tool", "rain, 4C")], '<tool_call>forecast\n{"city": "Oslo"}</tool_call>'),
    ([("tool", "rain all week")], "Rain, 4C, and rain all week."),
    ([("user", "And Bergen?")], '<tool_call>weather\n{"city": "Bergen"}</tool_call>'),
    ([("tool", "sun, 9C")], "Bergen: sun, 9C."),
]


def run_agent(capture: RolloutTokenCapture) -> tuple[list[str], list[CommitCoords]]:
    """Drive the five turns through the capture as a worker would, vLLM responses included."""
    ids: list[str] = []
    all_coords: list[CommitCoords] = []
    history: list[int] = []
    parent: str | None = None
    for messages, answer in TURNS:
        new = [token for role, body in messages for token in render_message(role, body)]
        # After an assistant turn the history ends in its END token; the newline that closes
        # the rendered message comes first in the next prompt.
        prompt = [*history, *(text_ids("\n") if history else []), *new, *generation_prompt()]
        output = generated(answer)
        model_call_id = call_id()
        call = capture.begin_call(Admission(ROLLOUT, model_call_id, parent))
        response = vllm_response(prompt, output, logprobs_for(output))
        coords = capture.complete_call_from_response(call, response)
        assert coords.staged, coords.reason
        ids.append(model_call_id)
        all_coords.append(coords)
        history = [*prompt, *output]
        parent = model_call_id
    return ids, all_coords


def expected_sequence() -> tuple[list[int], list[int], list[float]]:
    """Built from the turns directly, not from any staged record."""
    token_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    for index, (messages, answer) in enumerate(TURNS):
        context = [*(text_ids("\n") if index else [])]
        for role, body in messages:
            context += render_message(role, body)
        context += generation_prompt()
        output = generated(answer)
        token_ids += context + output
        loss_mask += [0] * len(context) + [1] * len(output)
        logprobs += [0.0] * len(context) + logprobs_for(output)
    return token_ids, loss_mask, logprobs


@pytest.fixture
def staged_agent(tmp_path: Path) -> tuple[Path, list[str], list[CommitCoords]]:
    capture = RolloutTokenCapture(DirectoryStagingSink(tmp_path), VLLMCaptureAdapter(), 4)
    ids, coords = run_agent(capture)
    return tmp_path, ids, coords


def test_five_call_chain_with_tool_turns_linearizes_exactly(
    staged_agent: tuple[Path, list[str], list[CommitCoords]],
) -> None:
    root, ids, coords = staged_agent
    [chain] = linearize(root, ROLLOUT, coords=coords)
    token_ids, loss_mask, logprobs = expected_sequence()
    assert chain.model_call_ids == tuple(ids)
    assert chain.token_ids == token_ids
    assert chain.loss_mask == loss_mask
    assert chain.logprobs == logprobs
    assert chain.weight_versions == (4, 4, 4, 4, 4)
    assert chain.chain_hash == coords[-1].chain_hash
    assert chain.cum_lens == tuple(c.cum_len for c in coords)
    assert chain.prev_lens == (0, *chain.cum_lens[:-1])
    assert chain.leaf_model_call_id == ids[-1]
    assert chain.staging_keys[0] == f"{ROLLOUT}/{ids[0]}"
    assert sum(loss_mask) == sum(len(generated(answer)) for _, answer in TURNS)


def test_branches_give_one_chain_per_leaf() -> None:
    sink = InMemoryStagingSink()
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 0)

    def stage(model_call_id: str, parent: str | None, prompt: list[int], out: list[int]) -> None:
        call = capture.begin_call(Admission(ROLLOUT, model_call_id, parent))
        coords = capture.complete_call(
            call,
            prompt_token_ids=prompt,
            generated_token_ids=out,
            generated_logprobs=logprobs_for(out),
        )
        assert coords.staged, coords.reason

    stage("a0", None, [10, 11], [12])
    stage("b0", "a0", [10, 11, 12, 13], [14])
    stage("b1", "a0", [10, 11, 12, 15], [16, 17])
    stage("c0", "b1", [10, 11, 12, 15, 16, 17, 18], [19])
    chains = linearize(sink, ROLLOUT)
    assert [c.model_call_ids for c in chains] == [("a0", "b0"), ("a0", "b1", "c0")]
    assert chains[0].token_ids == [10, 11, 12, 13, 14]
    assert chains[0].loss_mask == [0, 0, 1, 0, 1]
    assert chains[1].token_ids == [10, 11, 12, 15, 16, 17, 18, 19]
    assert chains[1].loss_mask == [0, 0, 1, 0, 1, 1, 0, 1]
    assert linearize(sink, "99-9") == []


def test_a_pinned_prefix_that_cuts_the_parent_rebuilds_from_the_cut() -> None:
    sink = InMemoryStagingSink()
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 0)
    first = capture.begin_call(Admission(ROLLOUT, "a0"))
    capture.complete_call(
        first, prompt_token_ids=[1, 2], generated_token_ids=[3, 4], generated_logprobs=[-1, -2]
    )
    second = capture.begin_call(Admission(ROLLOUT, "b0", "a0", (1, 2, 3)))
    capture.complete_call(
        second, prompt_token_ids=[1, 2, 3, 7], generated_token_ids=[8], generated_logprobs=[-3]
    )
    [chain] = linearize(sink, ROLLOUT)
    assert chain.token_ids == [1, 2, 3, 7, 8]
    assert chain.loss_mask == [0, 0, 1, 0, 1]
    assert chain.logprobs == [0.0, 0.0, -1.0, 0.0, -3.0]


# -- tampering --------------------------------------------------------------------------------


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    body = orjson.loads(path.read_bytes())
    change(body)
    path.write_bytes(orjson.dumps(body))


def _flip_token(b: dict[str, Any]) -> None:
    b["token_ids"][-1] ^= 1


def _flip_logprob(b: dict[str, Any]) -> None:
    b["logprobs"][-1] = b["logprobs"][-1] / 2


def _flip_mask(b: dict[str, Any]) -> None:
    b["loss_mask"][0] = 1 - b["loss_mask"][0]


def _add_extra(b: dict[str, Any]) -> None:
    b["extras"]["routed_experts"] = [[1]]


def _shift_prev_len(b: dict[str, Any]) -> None:
    b["prev_len"] -= 1
    b["cum_len"] -= 1


def _bump_weight_version(b: dict[str, Any]) -> None:
    b["weight_version"] += 1


def _forge_chain_hash(b: dict[str, Any]) -> None:
    b["chain_hash"] = "f" * 64


def _bad_schema(b: dict[str, Any]) -> None:
    b["schema_version"] = 2


def _bad_logprob_type(b: dict[str, Any]) -> None:
    b["logprobs"][0] = "zero"


@pytest.mark.parametrize(
    ("index", "change", "message"),
    [
        (2, _flip_token, "digest mismatch"),
        (2, _flip_logprob, "digest mismatch"),
        (3, _flip_mask, "digest mismatch"),
        (1, _add_extra, "extras digest mismatch"),
        (4, _shift_prev_len, "digest mismatch"),
        (0, _bump_weight_version, "digest mismatch"),
        (3, _forge_chain_hash, "chain hash mismatch"),
        (1, _bad_schema, "schema_version"),
        (2, _bad_logprob_type, "logprobs"),
    ],
)
def test_a_tampered_staged_file_is_named(
    staged_agent: tuple[Path, list[str], list[CommitCoords]],
    index: int,
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    root, ids, _ = staged_agent
    _edit(root / ROLLOUT / ids[index] / "record.json", change)
    with pytest.raises(LinearizeError, match=message) as caught:
        linearize(root, ROLLOUT)
    assert ids[index] in str(caught.value)
    assert f"{ROLLOUT}/{ids[index]}" in str(caught.value)
    assert caught.value.model_call_id == ids[index]
    assert caught.value.staging_key == f"{ROLLOUT}/{ids[index]}"


def test_a_missing_parent_is_named(
    staged_agent: tuple[Path, list[str], list[CommitCoords]],
) -> None:
    root, ids, _ = staged_agent
    (root / ROLLOUT / ids[1] / "record.json").unlink()
    (root / ROLLOUT / ids[1]).rmdir()
    with pytest.raises(LinearizeError, match=f"parent {ids[1]} is missing") as caught:
        linearize(root, ROLLOUT)
    assert caught.value.model_call_id == ids[2]


def test_a_forged_leaf_passes_its_own_hashes_but_not_the_coords(
    staged_agent: tuple[Path, list[str], list[CommitCoords]],
) -> None:
    root, ids, coords = staged_agent
    leaf_path = root / ROLLOUT / ids[-1] / "record.json"
    leaf = StagedCallRecord.from_json(orjson.loads(leaf_path.read_bytes()))
    forged = StagedCallRecord.create(
        rollout_id=leaf.rollout_id,
        model_call_id=leaf.model_call_id,
        parent_model_call_id=leaf.parent_model_call_id,
        parent_chain_hash=leaf.parent_chain_hash,
        prev_len=leaf.prev_len,
        token_ids=[*leaf.token_ids[:-1], leaf.token_ids[-1] + 1],
        loss_mask=leaf.loss_mask,
        logprobs=leaf.logprobs,
        weight_version=leaf.weight_version,
        extras=leaf.extras,
    )
    leaf_path.write_bytes(orjson.dumps(forged.to_json()))
    linearize(root, ROLLOUT)  # self-consistent: only an outside anchor can tell
    with pytest.raises(LinearizeError, match="differs from the reported") as caught:
        linearize(root, ROLLOUT, coords=coords)
    assert caught.value.model_call_id == ids[-1]


def test_coords_for_a_call_without_a_record_are_named(
    staged_agent: tuple[Path, list[str], list[CommitCoords]],
) -> None:
    root, _, coords = staged_agent
    ghost = CommitCoords(
        **{**coords[0].to_json(), "model_call_id": "dead", "staging_key": f"{ROLLOUT}/dead"}
    )
    failed = CommitCoords.failed("sink_failed", "x", rollout_id=ROLLOUT, model_call_id="beef")
    linearize(root, ROLLOUT, coords=[*coords, failed])  # failed coords promise nothing
    with pytest.raises(LinearizeError, match="no record was found") as caught:
        linearize(root, ROLLOUT, coords=[ghost])
    assert caught.value.staging_key == f"{ROLLOUT}/dead"


def _record(
    model_call_id: str, parent: str | None, parent_chain: str, prev_len: int
) -> StagedCallRecord:
    return StagedCallRecord.create(
        rollout_id=ROLLOUT,
        model_call_id=model_call_id,
        parent_model_call_id=parent,
        parent_chain_hash=parent_chain,
        prev_len=prev_len,
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        weight_version=0,
    )


def test_structural_faults_are_named() -> None:
    root = _record("a0", None, ROOT_CHAIN_HASH, 0)
    cases: list[tuple[list[StagedCallRecord], str, str]] = [
        ([_record("a0", None, "1" * 64, 0)], "a0", "not the root hash"),
        ([_record("a0", None, ROOT_CHAIN_HASH, 3)], "a0", "prev_len 3"),
        ([root, _record("b0", "a0", root.chain_hash, 3)], "b0", "exceeds parent a0's 2 ids"),
        ([root, _record("b0", "a0", "2" * 64, 2)], "b0", "is not parent a0's chain hash"),
        ([root, root], "a0", "staged more than once"),
        (
            [_record("a0", "b0", "3" * 64, 0), _record("b0", "a0", "4" * 64, 0)],
            "a0",
            "chain hash|cycle",
        ),
    ]
    for records, named, message in cases:
        with pytest.raises(LinearizeError, match=message) as caught:
            linearize_records(ROLLOUT, records)
        assert caught.value.model_call_id == named, message
    other = StagedCallRecord.create(
        **{**_fields(root), "rollout_id": "77-7"},
    )
    with pytest.raises(LinearizeError, match="belongs to rollout 77-7"):
        linearize_records(ROLLOUT, [other])


def _fields(record: StagedCallRecord) -> dict[str, Any]:
    return {
        "rollout_id": record.rollout_id,
        "model_call_id": record.model_call_id,
        "parent_model_call_id": record.parent_model_call_id,
        "parent_chain_hash": record.parent_chain_hash,
        "prev_len": record.prev_len,
        "token_ids": record.token_ids,
        "loss_mask": record.loss_mask,
        "logprobs": record.logprobs,
        "weight_version": record.weight_version,
        "extras": record.extras,
    }


def test_an_unreadable_rollout_is_a_linearize_error(tmp_path: Path) -> None:
    with pytest.raises(LinearizeError, match="cannot read staged rollout"):
        linearize(tmp_path, "../escape")
    (tmp_path / ROLLOUT).mkdir()
    (tmp_path / ROLLOUT / "stray").write_text("x")
    with pytest.raises(LinearizeError, match="unexpected entry"):
        linearize(tmp_path, ROLLOUT)


# -- property: any tree of calls rebuilds exactly ---------------------------------------------


@st.composite
def call_trees(draw: st.DrawFn) -> list[tuple[int | None, list[int], list[int], bool]]:
    """Each call: parent index (or None), new prompt ids, generated ids, pin a shorter prefix."""
    calls: list[tuple[int | None, list[int], list[int], bool]] = []
    for index in range(draw(st.integers(min_value=1, max_value=7))):
        parent = draw(st.none() | st.integers(min_value=0, max_value=index - 1)) if index else None
        new = draw(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=4))
        out = draw(st.lists(st.integers(min_value=0, max_value=2**20), max_size=4))
        calls.append((parent, new, out, draw(st.booleans())))
    return calls


@settings(max_examples=60, deadline=None)
@given(tree=call_trees())
def test_any_tree_of_calls_rebuilds_exactly(
    tree: list[tuple[int | None, list[int], list[int], bool]],
) -> None:
    sink = InMemoryStagingSink()
    capture = RolloutTokenCapture(sink, VLLMCaptureAdapter(), 3)
    full: list[list[int]] = []
    masks: list[list[int]] = []
    probs: list[list[float]] = []
    for index, (parent, new, out, cut) in enumerate(tree):
        base, base_mask, base_probs = (
            ([], [], [])
            if parent is None
            else (
                full[parent],
                masks[parent],
                probs[parent],
            )
        )
        keep = len(base) // 2 if cut and parent is not None else len(base)
        pinned = tuple(base[:keep]) if cut and parent is not None else None
        prompt = [*base[:keep], *new]
        lps = logprobs_for(out)
        call = capture.begin_call(
            Admission(ROLLOUT, f"{index:02x}", None if parent is None else f"{parent:02x}", pinned)
        )
        coords = capture.complete_call(
            call, prompt_token_ids=prompt, generated_token_ids=out, generated_logprobs=lps
        )
        assert coords.staged, coords.reason
        full.append([*prompt, *out])
        masks.append([*base_mask[:keep], *[0] * len(new), *[1] * len(out)])
        probs.append([*base_probs[:keep], *[0.0] * len(new), *lps])
    parents = {p for p, *_ in tree}
    chains = linearize(sink, ROLLOUT)
    assert sorted(c.leaf_model_call_id for c in chains) == [
        f"{i:02x}" for i in range(len(tree)) if i not in parents
    ]
    for chain in chains:
        leaf = int(chain.leaf_model_call_id, 16)
        assert chain.token_ids == full[leaf]
        assert chain.loss_mask == masks[leaf]
        assert chain.logprobs == probs[leaf]
