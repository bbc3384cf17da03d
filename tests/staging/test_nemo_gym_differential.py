"""rollcap's staging against NeMo Gym 0.7.0's own released code, differentially, over a corpus.

"Compatible" means proven against the other side: every input below goes through NeMo Gym
0.7.0's staging modules (``make nemo-gym`` downloads the pinned wheel; ``_nemo_gym`` loads them
in a process of their own) and through ``rollcap.staging``, driven by the same code
(``_nemo_gym.OPS``), and the two answers are compared as JSON:

1. digests: their ``assert_golden_vectors()`` passes, our ``compute_*`` give their golden file's
   values, and both give the same digests over a generated corpus;
2. records: the same rollouts through their ``RolloutTokenCapture`` (an in-memory sink
   returning their ``StageResult``) and ours (``InMemoryStagingSink``) stage byte-identical
   records and answer byte-identical coords, staged or failed;
3. cross-reading: each side's models parse the other's JSON (and mutations of it) alike;
4. rebuild: ``verify_and_linearize`` over either side's receipts and snapshots gives the same
   row or the same refusal code, tampered cases included;
5. adapters: the vLLM and Megatron adapters read the same ids, logprobs and extras, or both
   refuse, and stage the same outcome;
6. fingerprints: ``assistant_fingerprint`` and ``conversation_digest`` agree, or both refuse;
7. terminal selection: ``select_terminal_call`` and ``resolve_terminal`` choose alike.

Why a process of its own for NeMo Gym's side: their modules live under ``nemo_gym.*`` beside
stand-ins for its two top packages, and define pydantic models and loggers of their own; kept out
of this process, no other test can see a half-imported ``nemo_gym``, their code runs with only
the standard library, pydantic and orjson loaded (checked: no rollcap module in it), and every
comparison goes through the wire form, which is what compatibility is about.

Where the two differ, the case is listed in ``DIFFERENCES`` with what each side answers (in
short): the test asserts that every other case agrees and that each listed case still differs
exactly so. A listed difference is a finding, not an accepted behaviour: fixing one side makes
the test fail until the entry is removed.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import random
import struct
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from rollcap import staging
from tests.staging import _nemo_gym
from tests.staging._nemo_gym import OPS, Api, NemoGymProcess, dump_model

if not _nemo_gym.available():
    pytest.skip(_nemo_gym.SKIP_REASON, allow_module_level=True)

HEX = "0123456789abcdef"
EMPTY_EXTRAS = staging.EMPTY_EXTRAS_DIGEST


# --- the two sides -------------------------------------------------------------------------


def _our_api() -> Api:
    def attribution(found: Any) -> dict[str, Any]:
        return {
            "terminal": found.terminal_model_call_id,
            "method": found.method or "",
            "reason": found.reason,
        }

    return Api(
        models={
            "CaptureAdmission": staging.CaptureAdmission,
            "StagedCallBaseSnapshot": staging.StagedCallBaseSnapshot,
            "StagedCallRecord": staging.StagedCallRecord,
            "StagedCallSnapshot": staging.StagedCallSnapshot,
            "StageResult": staging.StageResult,
            "CommitCoords": staging.CommitCoords,
            "CallRecord": staging.CallRecord,
            "ManifestFailure": staging.ManifestFailure,
            "RolloutManifest": staging.RolloutManifest,
            "RolloutReceipt": staging.RolloutReceipt,
        },
        capture_cls=staging.RolloutTokenCapture,
        new_store=staging.InMemoryStagingSink,
        store_attachments=lambda store, key: store.attachments(key),
        adapters={"vllm": staging.VLLMCaptureAdapter, "megatron": staging.MegatronCaptureAdapter},
        verify_and_linearize=staging.verify_and_linearize,
        linearize=staging.linearize,
        verification_error=staging.ReceiptVerificationError,
        row_json=dump_model,
        assistant_fingerprint=staging.assistant_fingerprint,
        conversation_digest=staging.conversation_digest,
        select_terminal_call=staging.select_terminal_call,
        resolve_terminal=staging.resolve_terminal,
        attribution=attribution,
        digests={
            "extras": staging.compute_extras_digest,
            "staging": staging.compute_staging_digest,
            "chain": staging.compute_chain_hash,
            "hash_ids": staging.hash_token_ids,
            "encode_ids": staging.encode_token_ids,
        },
    )


OURS = _our_api()


@pytest.fixture(scope="module")
def gym() -> Iterator[NemoGymProcess]:
    process = NemoGymProcess()
    try:
        yield process
    finally:
        process.close()


def _wire(value: Any) -> Any:
    """``value`` through the transport's JSON: what both sides are handed, and how answers
    compare (NaN, -0.0 and 1 vs 1.0 all kept apart)."""
    return json.loads(json.dumps(value))


def _refusals(value: Any) -> Any:
    # A refusal is a refusal: the two sides' exception classes differ by design (pydantic's,
    # ValueError, TypeError, rollcap's UnfingerprintableError, ...).
    if isinstance(value, dict):
        if set(value) == {"refused"}:
            return {"refused": True}
        return {key: _refusals(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_refusals(item) for item in value]
    return value


def _key(value: Any) -> str:
    return json.dumps(_refusals(value), sort_keys=True)


def run_both(gym: NemoGymProcess, op: str, corpus: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(theirs, ours)``: one op over one corpus on each side, one answer per case."""
    theirs = gym.call(op, _wire(list(corpus)))
    ours = _wire(OPS[op](OURS, _wire(list(corpus))))
    assert len(theirs) == len(ours) == len(corpus)
    return theirs, ours


# --- known differences, and the comparison ---------------------------------------------------

# area -> case id -> (what NeMo Gym answers, what rollcap answers), each in short (the area's
# ``short``); or None: the case may differ, and only because it holds a listed one.
DIFFERENCES: dict[str, dict[str, tuple[Any, Any] | None]] = {}


def _short(value: Any) -> Any:
    """An answer in short: a refusal as ``refused``, a hash as ``hash``, the rest as it is."""
    if isinstance(value, dict):
        if set(value) == {"refused"}:
            return "refused"
        if (
            set(value) == {"value"}
            and isinstance(value["value"], str)
            and len(value["value"]) == 64
        ):
            return "hash"
        return {key: _short(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_short(item) for item in value]
    return value


def compare(
    area: str,
    ids: Sequence[str],
    theirs: Sequence[Any],
    ours: Sequence[Any],
    *,
    short: Callable[[Any], Any] = _short,
) -> dict[str, tuple[Any, Any]]:
    """Assert that every case agrees but the ones ``DIFFERENCES[area]`` lists, and that those
    still differ as listed; the differing cases (full answers) are returned for reports."""
    assert len(set(ids)) == len(ids), "case ids must be unique"
    differing = {
        case: (mine_theirs, mine_ours)
        for case, mine_theirs, mine_ours in zip(ids, theirs, ours, strict=True)
        if _key(mine_theirs) != _key(mine_ours)
    }
    known = DIFFERENCES.get(area, {})
    unexpected = {case: answers for case, answers in differing.items() if case not in known}
    assert not unexpected, f"{area}: {len(unexpected)} cases differ: {unexpected}"
    fixed = sorted(case for case, listed in known.items() if listed and case not in differing)
    assert not fixed, f"{area}: listed as different but now agree (remove them): {fixed}"
    for case, listed in known.items():
        if listed is not None:
            got = [_wire(short(differing[case][0])), _wire(short(differing[case][1]))]
            assert got == _wire(list(listed)), f"{area}/{case}: {got}"
    return differing


# --- 1. golden vectors and digests ----------------------------------------------------------


def test_their_own_check_runs_on_their_code_only(gym: NemoGymProcess) -> None:
    info = gym.info
    assert info["assert_golden_vectors"] is None  # assert_golden_vectors() passed
    assert not info["rollcap_loaded"]
    # The stand-ins, not nemo_gym's __init__.py: no file behind the two packages.
    assert info["stand_in_files"] == {"nemo_gym": None, "nemo_gym.token_id_capture": None}
    assert set(_nemo_gym.LOADED_MODULES) <= set(info["loaded"])
    extra = {name for name in info["new_top_level"] if not name.startswith("_sysconfigdata")}
    assert extra - {"nemo_gym"} <= _nemo_gym.ALLOWED_THIRD_PARTY | _nemo_gym.PYDANTIC_DEPENDENCIES
    # Each module, read: only the standard library, pydantic, orjson, and one another.
    for module in _nemo_gym.LOADED_MODULES:
        for name in _nemo_gym.module_imports(module):
            top = name.split(".")[0]
            assert (
                top in sys.stdlib_module_names
                or top in _nemo_gym.ALLOWED_THIRD_PARTY
                or name in _nemo_gym.LOADED_MODULES
            ), f"{module} imports {name}"


def test_our_digests_give_their_golden_file(gym: NemoGymProcess) -> None:
    vectors = gym.info["golden_vectors"]
    on_disk = json.loads(
        _nemo_gym.module_path(f"{_nemo_gym.PACKAGE}.staging.conformance")
        .with_name("golden_vectors.json")
        .read_text(encoding="utf-8")
    )
    assert vectors == on_disk
    assert staging.compute_extras_digest(vectors["extras"]) == vectors["extras_digest"]
    assert staging.compute_staging_digest(**vectors["staged_call"]) == vectors["staged_call_digest"]


def _rand_hex(rng: random.Random) -> str:
    return "".join(rng.choice(HEX) for _ in range(64))


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 7, 2**63 - 1, -(2**63), rng.randint(-(10**6), 10**6)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.0, -0.1, 1e-300, 2.5e38, rng.uniform(-1e6, 1e6)])
    if kind in (4, 5):
        return rng.choice(["", "é", "nrlre1:int8:1x1x1:AQ==", "\U0001f600", "a b", "ÿz"])
    if kind in (6, 7):
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["a", "b", "é", "Z", "routed_experts", "\U0001f600", ""]): _json_value(
            rng, depth + 1
        )
        for _ in range(rng.randint(0, 3))
    }


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _digest_corpus() -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(101)
    cases: list[tuple[str, dict[str, Any]]] = []
    for n in range(60):
        value = _json_value(rng)
        extras = value if isinstance(value, dict) and rng.random() < 0.8 else {"x": value}
        cases.append((f"extras-{n}", {"fn": "extras", "args": [extras]}))
    named: tuple[tuple[str, Any], ...] = (
        ("null", None),
        ("empty", {}),
        ("routed-list", {"routed_experts": [[[3, 1]], [[2, 5]]]}),
        ("big-int", {"n": 2**63}),
        ("nan", {"n": float("nan")}),
        ("inf", {"n": float("inf")}),
        ("deep-60", {"d": _deep(60)}),
        ("deep-70", {"d": _deep(70)}),
        ("top-list", [1, 2]),
        ("top-string", "x"),
    )
    for name, extras in named:
        cases.append((f"extras-{name}", {"fn": "extras", "args": [extras]}))
    for n in range(30):
        ids = [rng.choice([0, 1, 300, 2**64 - 1, rng.randint(0, 2**20)]) for _ in range(n % 7)]
        cases.append((f"hash-ids-{n}", {"fn": "hash_ids", "args": [ids]}))
        cases.append((f"encode-ids-{n}", {"fn": "encode_ids", "args": [ids]}))
        parent = None if n % 3 == 0 else _rand_hex(rng)
        cases.append((f"chain-{n}", {"fn": "chain", "args": [parent, ids or [5]]}))
    for name, args in (
        ("negative", [None, [-1]]),
        ("u64-overflow", [None, [2**64]]),
        ("bool", [None, [True]]),
        ("float", [None, [1.0]]),
        ("parent-upper", ["A" * 64, [1]]),
        ("parent-short", ["a" * 63, [1]]),
        ("empty-delta", [None, []]),
    ):
        cases.append((f"chain-{name}", {"fn": "chain", "args": args}))
    base: dict[str, Any] = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "r",
        "model_call_id": "c",
        "parent_call_id": "p",
        "mode": "token_in",
        "prev_len": 3,
        "delta_len": 2,
        "cum_len": 5,
        "weight_version": 7,
        "token_ids_delta": [10, 11],
        "token_mask_delta": [0.0, 1.0],
        "generation_log_probs_delta": [0.0, -0.25],
        "extras_digest": EMPTY_EXTRAS,
        "chain_hash": "1" * 64,
        "cumulative_hash": "2" * 64,
    }
    for n in range(30):
        carry = rng.randint(0, 3)
        generated = rng.randint(0 if carry else 1, 3)
        fields = dict(
            base,
            model_call_id=f"c{n}",
            weight_version=rng.randint(0, 2**40),
            token_ids_delta=[rng.randint(0, 2**32) for _ in range(carry + generated)],
            token_mask_delta=[0.0] * carry + [1.0] * generated,
            generation_log_probs_delta=[0.0] * carry
            + [rng.choice([-0.1, -rng.random() * 30, 0.0, -1e-40]) for _ in range(generated)],
            delta_len=carry + generated,
            cum_len=3 + carry + generated,
            chain_hash=_rand_hex(rng),
            cumulative_hash=_rand_hex(rng),
        )
        if n % 4 == 0:
            fields.update(parent_call_id=None, mode="text", prev_len=0, cum_len=carry + generated)
        cases.append((f"staging-{n}", {"fn": "staging", "kwargs": fields}))
    for name, change in (
        ("root-token-in", {"parent_call_id": None, "prev_len": 0, "cum_len": 2}),
        ("child-text", {"mode": "text"}),
        ("empty-parent", {"parent_call_id": ""}),
        ("delta-zero", {"delta_len": 0}),
        ("mask-half", {"token_mask_delta": [0.5, 1.0]}),
        ("carry-logprob", {"generation_log_probs_delta": [-0.5, -0.25]}),
        ("carry-minus-zero", {"generation_log_probs_delta": [-0.0, -0.25]}),
        ("cum-wrong", {"cum_len": 6}),
        ("int-logprob", {"generation_log_probs_delta": [0.0, -1]}),
        ("nan-logprob", {"generation_log_probs_delta": [0.0, float("nan")]}),
        ("f32-overflow", {"generation_log_probs_delta": [0.0, -3.5e38]}),
        ("f32-underflow", {"generation_log_probs_delta": [0.0, -1e-50]}),
        ("int-mask", {"token_mask_delta": [0, 1]}),
        ("bool-version", {"weight_version": True}),
        ("u64-version", {"weight_version": 2**64}),
        ("extras-digest-upper", {"extras_digest": "A" * 64}),
        ("chain-short", {"chain_hash": "1" * 63}),
        ("schema-1", {"schema_version": 1}),
        ("lengths-differ", {"generation_log_probs_delta": [0.0]}),
    ):
        cases.append((f"staging-{name}", {"fn": "staging", "kwargs": dict(base, **change)}))
    return cases


DIFFERENCES["digests"] = {}


def test_digests_agree(gym: NemoGymProcess) -> None:
    cases = _digest_corpus()
    theirs, ours = run_both(gym, "digest", [case for _, case in cases])
    compare("digests", [name for name, _ in cases], theirs, ours)


# --- 2. records and coords through the capture ----------------------------------------------


def _routes_envelope(rows: list[list[list[int]]]) -> str:
    """The ``nrlre1`` envelope of a [token][layer][k] route list (int16, little-endian)."""
    t, layers, k = len(rows), len(rows[0]), len(rows[0][0])
    flat = [value for token in rows for layer in token for value in layer]
    data = base64.b64encode(struct.pack(f"<{len(flat)}h", *flat)).decode()
    return f"nrlre1:int16:{t}x{layers}x{k}:{data}"


def _logprob(rng: random.Random) -> float:
    return rng.choice(
        [
            -0.1,
            -0.5,
            -0.0625,
            0.0,
            -1e-8,
            -20.5,
            -0.10000000149011612,
            round(-rng.random() * 10, rng.randint(1, 6)),
            -rng.expovariate(1.0),
        ]
    )


def _extras(rng: random.Random, tokens: int) -> Any:
    routes = [[[rng.randint(0, 7), rng.randint(0, 7)]] for _ in range(max(tokens, 1))]
    spans = [{"modality": "image", "offset": rng.randint(0, 9), "length": 3, "placeholder_id": 9}]
    return rng.choice(
        [
            None,
            None,
            None,
            {},
            {"routed_experts": _routes_envelope(routes)},
            {"routed_experts": routes},
            {"media_spans": spans},
            {"routed_experts": _routes_envelope(routes), "media_spans": spans},
            {"note": {"é": [1, 2.5, True, None, "x"], "a": -2, "nested": [[[1]], []]}},
        ]
    )


def _vllm_answer(
    rng: random.Random, prompt: list[int], generated: list[int], logprobs: list[float], extras: Any
) -> dict[str, Any]:
    """A vLLM worker's chat completion carrying these ids, in one of the shapes it answers."""
    message: dict[str, Any] = {"role": "assistant", "content": "ok"}
    answer: dict[str, Any] = {"id": "chatcmpl-x", "object": "chat.completion", "model": "m"}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "message": message}
    if rng.random() < 0.35:
        message.update(
            prompt_token_ids=prompt,
            generation_token_ids=generated,
            generation_log_probs=logprobs,
        )
    else:
        answer["prompt_token_ids"] = prompt
        spellings: list[Callable[[int], Any]] = [lambda t: f"token_id:{t}", lambda t: t, str]
        spell = rng.choice(spellings)
        choice["logprobs"] = {
            "content": [
                {"token": spell(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(generated, logprobs, strict=True)
            ]
        }
    if isinstance(extras, dict):
        if "routed_experts" in extras:
            message["routed_experts"] = extras["routed_experts"]
        if "media_spans" in extras:
            answer["media_spans"] = extras["media_spans"]
    answer["choices"] = [choice]
    return answer


def _random_rollout(rng: random.Random, rollout_id: str) -> dict[str, Any]:
    calls: list[dict[str, Any]] = []
    cumulative: dict[str, list[int]] = {}
    version = rng.randint(0, 3)
    for index in range(rng.randint(1, 6)):
        call = f"c{index}"
        if rng.random() < 0.3:
            version += 1
        parent = None if not cumulative or rng.random() < 0.15 else rng.choice(list(cumulative))
        carry = [rng.randint(0, 60000) for _ in range(rng.randint(0 if parent else 1, 4))]
        generated = [rng.randint(0, 60000) for _ in range(rng.choice([0, 1, 1, 2, 3, 4, 5]))]
        if not carry and not generated:
            generated = [rng.randint(0, 60000)]
        logprobs = [_logprob(rng) for _ in generated]
        prompt = (cumulative[parent] if parent else []) + carry
        extras = _extras(rng, len(carry) + len(generated))
        step: dict[str, Any] = {"call": call, "parent": parent, "version": version}
        style = rng.random()
        if style < 0.25:
            step.update(
                do="response",
                adapter="vllm",
                payload=_vllm_answer(rng, prompt, generated, logprobs, extras),
            )
        elif style < 0.35:
            step.update(
                do="response",
                adapter="megatron",
                form=rng.choice(["mapping", "object"]),
                payload={
                    "prompt_token_ids": prompt,
                    "generated_token_ids": generated,
                    "generated_log_probs": logprobs,
                },
            )
        else:
            step.update(prompt=prompt, generated=generated, logprobs=logprobs, extras=extras)
        if rng.random() < 0.2:
            step["attachments"] = rng.choice([{}, {"pixels-0.bin": "0001"}, {"a": "ff", "b": ""}])
        if parent and rng.random() < 0.3:
            step["inline"] = True
        if rng.random() < 0.15:
            step["weight_version"] = version + 100  # the engine owns this call's version
        calls.append(step)
        cumulative[call] = prompt + generated
    return {"rollout_id": rollout_id, "version": version, "calls": calls}


SPEC_ANSWER_0E3F: dict[str, Any] = {
    "id": "chatcmpl-3",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "prompt_token_ids": [1, 104, 105, 42, 2, 1, 117, 2, 1, 97, 43, 1, 9, 9, 9, 2],
    "media_spans": [{"modality": "image", "offset": 12, "length": 3, "placeholder_id": 9}],
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {
                "role": "assistant",
                "content": "ok",
                "routed_experts": "nrlre1:int16:2x1x2:AwABAAIABQA=",
            },
            "logprobs": {
                "content": [
                    {"token": "token_id:44", "logprob": -0.5},
                    {"token": "token_id:2", "logprob": -0.125},
                ]
            },
        }
    ],
}

# STAGING §3.5's rollout, as the spec lists its inputs.
SPEC_ROLLOUT: dict[str, Any] = {
    "rollout_id": "0-0",
    "version": 7,
    "calls": [
        {
            "call": "0a1b",
            "parent": None,
            "prompt": [1, 104, 105],
            "generated": [42, 2],
            "logprobs": [-0.5, -1.25],
        },
        {
            "call": "0c2d",
            "parent": "0a1b",
            "version": 8,
            "prompt": [1, 104, 105, 42, 2, 1, 117, 2, 1, 97],
            "generated": [43],
            "logprobs": [-0.0625],
        },
        {
            "call": "0e3f",
            "parent": "0c2d",
            "do": "response",
            "adapter": "vllm",
            "payload": SPEC_ANSWER_0E3F,
            "attachments": {"pixels-0.bin": "0001"},
        },
        {"call": "0f40", "parent": "0e3f", "version": 9, "do": "fail"},
    ],
}


def _root(call: str, **step: Any) -> dict[str, Any]:
    return {
        "call": call,
        "parent": None,
        "prompt": [1, 2],
        "generated": [3],
        "logprobs": [-0.5],
    } | step


def _child(call: str, parent: str, **step: Any) -> dict[str, Any]:
    # Children of _root: the parent's cumulative ids are [1, 2, 3].
    return {
        "call": call,
        "parent": parent,
        "prompt": [1, 2, 3, 4],
        "generated": [5],
        "logprobs": [-0.25],
    } | step


def _failure_rollouts() -> list[dict[str, Any]]:
    """One rollout per way a call can fail (or be refused) before or while staging."""
    bad = {
        "bad-prefix": [_root("a"), _child("b", "a", prompt=[1, 2, 9, 4])],
        "bad-prefix-inline": [_root("a"), _child("b", "a", prompt=[9, 2, 3], inline=True)],
        "empty-delta": [_root("a"), _child("b", "a", prompt=[1, 2, 3], generated=[], logprobs=[])],
        "empty-root": [_root("a", prompt=[], generated=[], logprobs=[])],
        "prompt-shorter-than-prev": [_root("a"), _child("b", "a", prompt=[1, 2])],
        "int-logprob": [_root("a", logprobs=[-1])],
        "int-zero-logprob": [_root("a", logprobs=[0])],
        "bool-logprob": [_root("a", logprobs=[True])],
        "nan-logprob": [_root("a", logprobs=[float("nan")])],
        "inf-logprob": [_root("a", logprobs=[float("-inf")])],
        "f32-overflow-logprob": [_root("a", logprobs=[-3.5e38])],
        "string-logprob": [_root("a", logprobs=["-0.5"])],
        "length-mismatch": [_root("a", generated=[3, 4])],
        "negative-id": [_root("a", generated=[-3])],
        "u64-overflow-id": [_root("a", generated=[2**64])],
        "u64-max-id": [_root("a", generated=[2**64 - 1])],
        "float-id": [_root("a", generated=[3.0])],
        "bool-id-in-prefix": [_root("a"), _child("b", "a", prompt=[True, 2, 3, 4])],
        "sink-raises": [_root("a", sink="raise")],
        "sink-refuses": [_root("a", sink="refuse")],
        "sink-not-a-result": [_root("a", sink="not_a_result")],
        "sink-none": [_root("a", sink="none")],
        "legacy-sink-text": [_root("a", sink="legacy")],
        "legacy-sink-attachments": [_root("a", sink="legacy", attachments={"p.bin": "00"})],
        "legacy-sink-empty-attachments": [_root("a", sink="legacy", attachments={})],
        "fail-call": [_root("a"), _child("b", "a", do="fail")],
        "fail-root": [_root("a", do="fail")],
        "extras-list": [_root("a", extras=[1, 2])],
        "extras-string": [_root("a", extras="x")],
        "extras-deep-70": [_root("a", extras={"d": _deep(70)})],
        "extras-big-int": [_root("a", extras={"n": 2**63})],
        "extras-nan": [_root("a", extras={"n": float("nan")})],
        "weight-version-u64-overflow": [_root("a", weight_version=2**64)],
        "weight-version-u64-max": [_root("a", weight_version=2**64 - 1)],
        "weight-version-negative": [_root("a", weight_version=-1)],
        "weight-version-bool": [_root("a", weight_version=True)],
        "weight-version-float": [_root("a", weight_version=7.0)],
        "trainer-version-negative": [_root("a", version=-1)],
        "stream": [_root("a", stream=True)],
        "inline-prefix-conflict": [_root("a"), _child("b", "a", inline=True, prefix=[1, 2, 4])],
        "prefix-wrong-length": [_root("a"), _child("b", "a", prefix=[1, 2])],
        "prefix-negative": [_root("a"), _child("b", "a", prefix=[1, 2, -3])],
        "chain-without-prefix": [_root("a"), _child("b", "a", prefix=None)],
        "text-with-prefix": [_root("a", prefix=[1])],
        "text-with-empty-prefix": [_root("a", prefix=[])],
        "admission-no-chain-hash": [
            _root("a"),
            _child("b", "a", admission={"parent_chain_hash": None}),
        ],
        "admission-text-with-parent": [_root("a", admission={"parent_call_id": "z"})],
        "admission-negative-prefix": [
            _root("a"),
            _child("b", "a", inline=True, admission={"required_prefix_token_ids": [1, 2, -3]}),
        ],
        "vllm-no-prompt-ids": [
            _root("a", do="response", adapter="vllm", payload={"choices": [{"message": {}}]})
        ],
        "vllm-not-an-object": [_root("a", do="response", adapter="vllm", payload=[1])],
        "megatron-missing": [_root("a", do="response", adapter="megatron", payload={})],
        "call-id-with-slash": [_root("a/b"), _child("c", "a/b")],
        "unicode-ids": [_root("ç-☃"), _child("Ω", "ç-☃")],
        "compaction-child": [
            _root("a", prompt=[1, 2, 3, 4], generated=[5, 6, 7, 8], logprobs=[-0.1] * 4),
            # Cuts into its parent: prev_len 6 of the parent's 8 ids, as a compaction would.
            _child(
                "b", "a", inline=True, prev_len=6, prompt=[1, 2, 3, 4, 5, 6, 40], generated=[41]
            ),
        ],
        "branches": [
            _root("a"),
            _child("b", "a"),
            _child("c", "a", generated=[6]),
            _child("d", "c", prompt=[1, 2, 3, 4, 6, 7]),
        ],
        "two-roots": [_root("a"), _root("b", prompt=[7], generated=[8, 9], logprobs=[-0.1, -0.2])],
        "carry-only-middle": [
            _root("a"),
            _child("b", "a", generated=[], logprobs=[]),
            {
                "call": "c",
                "parent": "b",
                "prompt": [1, 2, 3, 4, 5],
                "generated": [6],
                "logprobs": [-0.3],
            },
        ],
    }
    rollouts = [
        {"rollout_id": f"f-{name}", "version": 3, "calls": calls} for name, calls in bad.items()
    ]
    # A rollout id with a "/": the sinks' keys are theirs to choose (opaque to Gym).
    rollouts.append({"rollout_id": "f/slash", "version": 1, "calls": [_root("a")]})
    return rollouts


def rollout_corpus() -> list[dict[str, Any]]:
    rng = random.Random(20260701)
    return [
        SPEC_ROLLOUT,
        *(_random_rollout(rng, f"r{n:02d}") for n in range(40)),
        *_failure_rollouts(),
    ]


def _capture_cases(results: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, Any]]:
    for rollout in results:
        for step in rollout["steps"]:
            yield f"{rollout['rollout_id']}:{step['call']}", step
        yield f"{rollout['rollout_id']}:snapshots", rollout["snapshots"]
        yield f"{rollout['rollout_id']}:attachments", rollout["attachments"]


def _capture_short(step: Any) -> Any:
    if not isinstance(step, dict) or "call" not in step:
        return step
    if "coords" not in step:
        return {key: value for key, value in step.items() if key != "call"}
    coords = json.loads(step["coords"]) if step["coords"] else None
    return {
        "disposition": coords["disposition"] if coords else step.get("coords_unwritable"),
        "staging_key": coords["staging_key"] if coords else None,
        "records": len(step["records"]),
    }


DIFFERENCES["capture"] = {
    # An engine-owned weight_version of 2**64: NeMo Gym's begin_call takes it and the call fails
    # (capture_failed coords that carry 2**64, which orjson cannot write); rollcap's begin_call
    # raises CaptureError.
    "f-weight-version-u64-overflow:a": (
        {"disposition": "TypeError", "staging_key": None, "records": 0},
        {"begin_refused": "CaptureError"},
    ),
    # A rollout id with a "/": the sinks choose different (opaque) keys.
    "f/slash:a": (
        {"disposition": "staged", "staging_key": "f/slash/a", "records": 1},
        {"disposition": "staged", "staging_key": "/%f%2Fslash/a", "records": 1},
    ),
    "f/slash:attachments": ({"f/slash/a": {}}, {"/%f%2Fslash/a": {}}),
}


def _snapshots_short(value: Any) -> Any:
    if isinstance(value, list) and value and isinstance(value[0], str):
        return f"<{len(value)} snapshot{'s' if len(value) > 1 else ''}>"
    return value


@pytest.fixture(scope="module")
def captured(gym: NemoGymProcess) -> tuple[list[Any], list[Any]]:
    """The rollout corpus through both captures: ``(theirs, ours)``."""
    return run_both(gym, "capture", rollout_corpus())


def test_records_and_coords_are_byte_identical(captured: tuple[list[Any], list[Any]]) -> None:
    theirs, ours = captured
    their_cases = list(_capture_cases(theirs))
    our_cases = list(_capture_cases(ours))
    assert [case for case, _ in their_cases] == [case for case, _ in our_cases]
    compare(
        "capture",
        [case for case, _ in their_cases],
        [answer for _, answer in their_cases],
        [answer for _, answer in our_cases],
        short=lambda value: _snapshots_short(_capture_short(value)),
    )
    # The corpus does what it says: staged and failed calls, several weight versions, extras.
    steps = [step for rollout in ours for step in rollout["steps"] if step.get("coords")]
    coords = [json.loads(step["coords"]) for step in steps]
    records = [json.loads(record) for step in steps for record in step["records"]]
    assert sum(c["disposition"] == "staged" for c in coords) > 100
    assert sum(c["disposition"] == "capture_failed" for c in coords) > 20
    assert len({c["weight_version"] for c in coords}) > 5
    assert sum(c["parent_call_id"] is not None for c in coords) > 50
    assert {type(r["extras"]).__name__ for r in records} >= {"NoneType", "dict"}
    assert any(-0.1 in r["generation_log_probs_delta"] for r in records)


def test_spec_rollout_is_staged_as_the_spec_lists_it(captured: tuple[list[Any], list[Any]]) -> None:
    theirs, _ = captured
    digests = [json.loads(step["records"][0])["digest"] for step in theirs[0]["steps"][:3]]
    assert [d[:8] for d in digests] == ["45abfc67", "428efd9e", "d2c57897"]
    assert json.loads(theirs[0]["steps"][3]["coords"])["disposition"] == "capture_failed"


# --- 3. cross-reading ---------------------------------------------------------------------------


def _row(coords: Mapping[str, Any], index: int, **extra: Any) -> dict[str, Any]:
    """The gate's manifest row for one staged call's coords (STAGING §4.3)."""
    return {
        "model_call_id": coords["model_call_id"],
        "parent_call_id": coords["parent_call_id"],
        "prev_len": coords["prev_len"],
        "delta_len": coords["delta_len"],
        "cum_len": coords["cum_len"],
        "weight_version": coords["weight_version"],
        "digest": coords["digest"],
        "extras_digest": coords["extras_digest"],
        "staging_key": coords["staging_key"],
        "mode": "text" if coords["parent_call_id"] is None else "token_in",
        "chain_hash": coords["chain_hash"],
        "cumulative_hash": coords["cumulative_hash"],
        "response_id": f"chatcmpl-{coords['model_call_id']}",
        "admitted_at": float(index) if index % 3 else None,
        "fingerprint_version": 0,
    } | extra


def _staged(rollout: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        json.loads(step["coords"])
        for step in rollout["steps"]
        if step.get("coords") and json.loads(step["coords"])["disposition"] == "staged"
    ]


def _failed(rollout: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        json.loads(step["coords"])
        for step in rollout["steps"]
        if step.get("coords") and json.loads(step["coords"])["disposition"] == "capture_failed"
    ]


def _manifest(rollout: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "rollout_id": rollout["rollout_id"],
        "records": [_row(c, i) for i, c in enumerate(_staged(rollout))],
        "failures": [
            {"model_call_id": c["model_call_id"], "reason": "worker_capture_failed"}
            for c in _failed(rollout)
        ],
    }


def _receipt(
    rollout_id: str, rows: list[dict[str, Any]], terminal: str, **extra: Any
) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "reward": 1.0,
        "terminal_model_call_id": terminal,
        "manifest": rows,
        "terminal_selection": "declared",
    } | extra


def _digest_of_any_extras(value: object) -> str:
    from rollcap.staging._digest import EXTRAS_DIGEST_DOMAIN, EXTRAS_DIGEST_VERSION, encode_extras

    body = bytes([EXTRAS_DIGEST_VERSION]) + encode_extras(value)
    return hashlib.sha256(EXTRAS_DIGEST_DOMAIN + body).hexdigest()


def _mutated(model: str, data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Mutations of one model's JSON that a reader must take, or refuse, alike."""
    yield "extra-key", data | {"unknown": 1}
    yield "schema-1", data | {"schema_version": 1}
    yield "schema-string", data | {"schema_version": "2"}
    if model in ("StagedCallRecord", "StagedCallBaseSnapshot"):
        yield "int-masks", data | {"token_mask_delta": [int(m) for m in data["token_mask_delta"]]}
        yield "string-id", data | {"token_ids_delta": [str(t) for t in data["token_ids_delta"]]}
        yield "float-id", data | {"token_ids_delta": [float(t) for t in data["token_ids_delta"]]}
        yield "float-version", data | {"weight_version": float(data["weight_version"])}
        yield "bool-version", data | {"weight_version": True}
        yield "digest-upper", data | {"digest": data["digest"].upper()}
        yield (
            "digest-flipped",
            data | {"digest": ("0" if data["digest"][0] != "0" else "1") + data["digest"][1:]},
        )
        carry_zero = [
            -0.0 if m == 0.0 else lp
            for m, lp in zip(
                data["token_mask_delta"], data["generation_log_probs_delta"], strict=True
            )
        ]
        yield "carry-minus-zero", data | {"generation_log_probs_delta": carry_zero}
        yield (
            "without-defaulted",
            {k: v for k, v in data.items() if k not in ("extras_digest", "schema_version")},
        )
    if model == "StagedCallRecord":
        yield "without-extras", {k: v for k, v in data.items() if k != "extras"}
        yield (
            "extras-list",
            # Signed as a list would hash, had it been allowed: both sides must refuse it.
            data | {"extras": [1], "extras_digest": _digest_of_any_extras([1])},
        )
    if model == "StagedCallBaseSnapshot":
        yield "with-extras", data | {"extras": None}
    if model == "CommitCoords":
        yield (
            "failed-with-key",
            data | {"disposition": "capture_failed", "delta_len": 0, "cum_len": data["prev_len"]},
        )
        yield "staged-empty", data | {"delta_len": 0, "cum_len": data["prev_len"]}
        yield "bad-disposition", data | {"disposition": "dropped"}
    if model == "CallRecord":
        yield "admitted-int", data | {"admitted_at": 5}
        yield "admitted-string", data | {"admitted_at": "5"}
        yield "admitted-bool", data | {"admitted_at": True}
        yield "no-mode", {k: v for k, v in data.items() if k != "mode"}
        yield "empty-response-id", data | {"response_id": ""}
        yield "no-response-id", {k: v for k, v in data.items() if k != "response_id"}
        yield "fingerprint-upper", data | {"output_fingerprint": "A" * 64}
        yield "fingerprint-version-float", data | {"fingerprint_version": 2.0}
        yield "delta-zero", data | {"delta_len": 0, "cum_len": data["prev_len"]}
    if model == "RolloutManifest":
        yield "failure-empty-reason", data | {"failures": [{"model_call_id": "x", "reason": ""}]}
        yield (
            "failure-extra-key",
            data | {"failures": [{"model_call_id": "x", "reason": "r", "at": 1}]},
        )
        yield "failure-no-id", data | {"failures": [{"reason": "r"}]}
    if model == "RolloutReceipt":
        yield "reward-string", data | {"reward": "1.5"}
        yield "reward-bool", data | {"reward": True}
        yield "reward-int", data | {"reward": 1}
        yield "poisoned-int", data | {"capture_poisoned": 1, "failure_reason": "x"}
        yield "poisoned-string", data | {"capture_poisoned": "true", "failure_reason": "x"}
        yield "reason-int", data | {"terminal_attribution_reason": 5}
        yield "selection-explicit", data | {"terminal_selection": "explicit"}
        yield "terminal-absent", data | {"terminal_model_call_id": "nope"}
        yield "untrainable", data | {"terminal_model_call_id": None, "terminal_selection": None}
        yield (
            "poisoned-no-reason",
            data
            | {
                "capture_poisoned": True,
                "terminal_model_call_id": None,
                "terminal_selection": None,
            },
        )
        yield "poisoned-after-attribution", data | {"capture_poisoned": True}
        yield "reason-unpoisoned", data | {"failure_reason": "x"}
        yield "terminal-no-selection", data | {"terminal_selection": None}
        yield "duplicate-rows", data | {"manifest": data["manifest"] + data["manifest"][:1]}
    if model == "StageResult":
        yield "ok-int", data | {"ok": 1}
        yield "ok-string", data | {"ok": "true"}
        yield "failed-empty-error", {"ok": False, "error": ""}
        yield "ok-no-key", {"ok": True}
    if model == "CaptureAdmission":
        yield "prev-string", data | {"prev_len": "5"}
        yield "chain-empty-key", data | {"staging_chain": [""]}
        yield "chain-int-key", data | {"staging_chain": [5]}
        yield "prefix-negative", data | {"required_prefix_token_ids": [-1]}
        yield "prefix-bool", data | {"required_prefix_token_ids": [True]}


def _wire_docs(
    side: str, results: Sequence[Mapping[str, Any]]
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(case, model, JSON object)``: everything one side's capture wrote, and the manifest
    documents built from it."""
    for rollout in results:
        rid = rollout["rollout_id"]
        for step in rollout["steps"]:
            for n, record in enumerate(step.get("records", [])):
                yield (
                    f"{side}:{rid}:{step['call']}:record{n}",
                    "StagedCallRecord",
                    json.loads(record),
                )
                yield (
                    f"{side}:{rid}:{step['call']}:snapshot{n}",
                    "StagedCallSnapshot",
                    json.loads(record),
                )
            if step.get("coords"):
                yield (
                    f"{side}:{rid}:{step['call']}:coords",
                    "CommitCoords",
                    json.loads(step["coords"]),
                )
        for n, shot in enumerate(rollout["snapshots"]):
            yield f"{side}:{rid}:base{n}", "StagedCallBaseSnapshot", json.loads(shot)
        manifest = _manifest(rollout)
        yield f"{side}:{rid}:manifest", "RolloutManifest", manifest
        for n, row in enumerate(manifest["records"]):
            yield f"{side}:{rid}:row{n}", "CallRecord", row
        if manifest["records"]:
            terminal = manifest["records"][-1]["model_call_id"]
            yield (
                f"{side}:{rid}:receipt",
                "RolloutReceipt",
                _receipt(rid, manifest["records"], terminal),
            )
        for failure in manifest["failures"]:
            yield f"{side}:{rid}:failure:{failure['model_call_id']}", "ManifestFailure", failure


def _admission_docs() -> Iterator[tuple[str, str, dict[str, Any]]]:
    yield (
        "admission:text",
        "CaptureAdmission",
        {"rollout_id": "r", "model_call_id": "a", "mode": "text"},
    )
    yield (
        "admission:chain",
        "CaptureAdmission",
        {
            "rollout_id": "r",
            "model_call_id": "b",
            "parent_call_id": "a",
            "prev_len": 3,
            "mode": "token_in",
            "staging_chain": ["r/a"],
            "parent_chain_hash": "1" * 64,
        },
    )
    yield (
        "admission:inline",
        "CaptureAdmission",
        {
            "rollout_id": "r",
            "model_call_id": "b",
            "parent_call_id": "a",
            "prev_len": 3,
            "mode": "token_in",
            "required_prefix_token_ids": [1, 2, 3],
            "parent_chain_hash": "1" * 64,
        },
    )
    yield "stage-result:ok", "StageResult", {"ok": True, "staging_key": "r/a"}
    yield "stage-result:failed", "StageResult", {"ok": False, "error": "disk full"}


def _cross_corpus(
    captured: tuple[list[Any], list[Any]],
) -> list[tuple[str, dict[str, Any], bool]]:
    """``(case, parse request, whether it is a document a side wrote)``: both sides' documents,
    then each mutation once per model and kind of document (on NeMo Gym's documents)."""
    theirs, ours = captured
    cases: list[tuple[str, dict[str, Any], bool]] = []
    mutated: set[tuple[Any, ...]] = set()
    docs = [*_wire_docs("theirs", theirs), *_wire_docs("ours", ours), *_admission_docs()]
    for case, model, data in docs:
        cases.append(
            (
                case,
                {"model": model, "json": json.dumps(data)},
                case.startswith(("theirs:", "ours:")),
            )
        )
        kind = (
            model,
            case.split(":")[0],
            data.get("disposition"),
            data.get("parent_call_id") is None,
        )
        if kind in mutated or case.startswith("ours:"):
            continue
        mutated.add(kind)
        for name, changed in _mutated(model, data):
            cases.append((f"{case}:{name}", {"model": model, "json": json.dumps(changed)}, False))
    return cases


PARSED, REFUSED = "<parsed>", "refused"
DIFFERENCES["cross-reading"] = {
    # NeMo Gym's models validate their plain bool/float fields in pydantic's lax mode (a
    # "1.5" or true reward, a 1 or "true" capture_poisoned or ok); rollcap's are strict.
    "theirs:0-0:receipt:reward-string": (PARSED, REFUSED),
    "theirs:0-0:receipt:reward-bool": (PARSED, REFUSED),
    "theirs:0-0:receipt:poisoned-int": (PARSED, REFUSED),
    "theirs:0-0:receipt:poisoned-string": (PARSED, REFUSED),
    "stage-result:ok:ok-int": (PARSED, REFUSED),
    "stage-result:ok:ok-string": (PARSED, REFUSED),
}


def _parsed_short(value: Any) -> Any:
    return PARSED if isinstance(value, dict) and "json" in value else _short(value)


def test_each_side_reads_the_others_json(
    gym: NemoGymProcess, captured: tuple[list[Any], list[Any]]
) -> None:
    cases = _cross_corpus(captured)
    theirs, ours = run_both(gym, "parse", [request for _, request, _ in cases])
    compare("cross-reading", [case for case, _, _ in cases], theirs, ours, short=_parsed_short)
    # Both sides write back what they read as the same bytes.
    for (case, _, _), their_answer, our_answer in zip(cases, theirs, ours, strict=True):
        if "json" in their_answer and "json" in our_answer:
            assert their_answer["json"] == our_answer["json"], case
    # Nearly every document either side wrote is read by both; a mutation is as often refused.
    documents = [(case, ours[n]) for n, (case, _, original) in enumerate(cases) if original]
    assert len(documents) > 1000
    assert sum("json" in answer for _, answer in documents) > len(documents) - 10
    assert sum("refused" in answer for answer in ours) > 100


# --- 4. rebuild ---------------------------------------------------------------------------------


def _resign(shot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot forged consistently: its digest recomputed over its (changed) fields.

    Computed with rollcap's digest, which test_digests_agree shows equal to NeMo Gym's."""
    fields = {k: v for k, v in shot.items() if k not in ("digest", "extras")}
    return shot | {"digest": staging.compute_staging_digest(**fields)}


def _leaves(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    parents = {row["parent_call_id"] for row in rows}
    return [row["model_call_id"] for row in rows if row["model_call_id"] not in parents]


def _chain_of(rows: Sequence[Mapping[str, Any]], terminal: str) -> list[int]:
    by_id = {row["model_call_id"]: i for i, row in enumerate(rows)}
    chain = [by_id[terminal]]
    while rows[chain[-1]]["parent_call_id"] is not None:
        chain.append(by_id[rows[chain[-1]]["parent_call_id"]])
    return chain[::-1]


def _tampers(
    receipt: dict[str, Any], shots: list[dict[str, Any]]
) -> Iterator[tuple[str, str, bool, dict[str, Any], list[dict[str, Any]]]]:
    """``(name, the code NeMo Gym gives, construct?, receipt, snapshots)``: one receipt's
    tampered variants; ``construct`` ones bypass validation (``model_construct``), as bytes
    tampered in storage reach a verifier that does not re-validate."""
    rows = receipt["manifest"]
    chain = _chain_of(rows, receipt["terminal_model_call_id"])
    t = chain[-1]  # the terminal's index
    r0 = chain[0]

    def with_rows(index: int, **change: Any) -> dict[str, Any]:
        new = copy.deepcopy(receipt)
        new["manifest"][index].update(change)
        return new

    def with_shot(index: int, shot: dict[str, Any]) -> list[dict[str, Any]]:
        new = copy.deepcopy(shots)
        new[index] = shot
        return new

    flipped = ("0" if shots[t]["digest"][0] != "0" else "1") + shots[t]["digest"][1:]
    yield (
        "digest-snapshot",
        "wrong_digest",
        True,
        receipt,
        with_shot(t, shots[t] | {"digest": flipped}),
    )
    yield (
        "digest-both",
        "corrupt_digest",
        True,
        with_rows(t, digest=flipped),
        with_shot(t, shots[t] | {"digest": flipped}),
    )
    ids = list(shots[t]["token_ids_delta"])
    ids[-1] += 1
    yield (
        "token-id",
        "corrupt_digest",
        True,
        receipt,
        with_shot(t, shots[t] | {"token_ids_delta": ids}),
    )
    yield (
        "weight-version-row",
        "wrong_weight_version",
        False,
        with_rows(t, weight_version=rows[t]["weight_version"] + 1),
        shots,
    )
    forged = _resign(shots[t] | {"weight_version": shots[t]["weight_version"] + 1})
    yield "weight-version-snapshot", "wrong_weight_version", False, receipt, with_shot(t, forged)
    yield (
        "rollout-snapshot",
        "wrong_rollout",
        False,
        receipt,
        with_shot(t, _resign(shots[t] | {"rollout_id": "other"})),
    )
    chain_hash = "ab" * 32
    forged = _resign(shots[t] | {"chain_hash": chain_hash})
    yield (
        "chain-hash",
        "chain_hash_mismatch",
        False,
        with_rows(t, chain_hash=chain_hash, digest=forged["digest"]),
        with_shot(t, forged),
    )
    forged = _resign(shots[t] | {"cumulative_hash": chain_hash})
    yield (
        "cumulative-hash",
        "cumulative_hash_mismatch",
        False,
        with_rows(t, cumulative_hash=chain_hash, digest=forged["digest"]),
        with_shot(t, forged),
    )
    mask = shots[t]["token_mask_delta"][::-1]
    if mask != shots[t]["token_mask_delta"]:
        logprobs = [
            lp if m else 0.0
            for m, lp in zip(mask, shots[t]["generation_log_probs_delta"][::-1], strict=True)
        ]
        forged = _resign(
            shots[t] | {"token_mask_delta": mask, "generation_log_probs_delta": logprobs}
        )
        yield (
            "mask-order",
            "invalid_mask_order",
            False,
            with_rows(t, digest=forged["digest"]),
            with_shot(t, forged),
        )
    yield (
        "failure-reason",
        "rollout_failed",
        False,
        receipt | {"capture_poisoned": True, "failure_reason": "worker_capture_failed"},
        shots,
    )
    yield "poisoned", "capture_poisoned", False, receipt | {"capture_poisoned": True}, shots
    yield "row-count", "row_count_mismatch", False, receipt, shots[:-1]
    yield (
        "extras-digest-row",
        "wrong_extras_digest",
        False,
        with_rows(t, extras_digest="0" * 64),
        shots,
    )
    yield "chain-hash-row", "wrong_chain_hash", False, with_rows(t, chain_hash="0" * 64), shots
    yield (
        "cumulative-hash-row",
        "wrong_cumulative_hash",
        False,
        with_rows(t, cumulative_hash="0" * 64),
        shots,
    )
    yield (
        "parent-row",
        "wrong_parent_call_id",
        True,
        with_rows(t, parent_call_id="elsewhere"),
        shots,
    )
    yield (
        "delta-len-row",
        "wrong_delta_len",
        True,
        with_rows(t, delta_len=rows[t]["delta_len"] + 1),
        shots,
    )
    yield "digest-version-row", "wrong_digest_version", True, with_rows(t, digest_version=1), shots
    yield (
        "extras-version-snapshot",
        "wrong_extras_digest_version",
        True,
        receipt,
        with_shot(t, shots[t] | {"extras_digest_version": 2}),
    )
    yield "mode-row", "wrong_mode", True, with_rows(r0, mode="token_in"), shots
    yield "schema-row", "wrong_schema_version", True, with_rows(t, schema_version=3), shots
    yield (
        "missing-terminal",
        "missing_terminal",
        True,
        receipt | {"terminal_model_call_id": "nope"},
        shots,
    )
    yield "no-terminal", "missing_terminal", True, receipt | {"terminal_model_call_id": None}, shots
    yield (
        "empty-manifest",
        "empty_manifest",
        True,
        receipt | {"manifest": [], "terminal_model_call_id": None},
        [],
    )
    yield "schema-receipt", "unsupported_schema", True, receipt | {"schema_version": 3}, shots
    yield (
        "digest-version-receipt",
        "unsupported_digest",
        True,
        receipt | {"digest_version": 1},
        shots,
    )
    yield (
        "extras-version-receipt",
        "unsupported_extras_digest",
        True,
        receipt | {"extras_digest_version": 2},
        shots,
    )
    yield (
        "invalid-snapshot",
        "invalid_snapshot",
        True,
        receipt,
        with_shot(t, shots[t] | {"token_mask_delta": [0.5] * len(shots[t]["token_mask_delta"])}),
    )
    yield (
        "unknown-snapshot",
        "snapshot_identity_mismatch",
        True,
        receipt,
        with_shot(t, shots[t] | {"model_call_id": "nope"}),
    )
    if len(rows) > 1:
        yield "order", "snapshot_order_mismatch", False, receipt, shots[::-1]
        yield (
            "duplicate-snapshot",
            "duplicate_snapshot",
            False,
            receipt,
            with_shot(len(shots) - 1, shots[0]),
        )
        other = 1 if t != 1 else 0
        yield (
            "duplicate-key",
            "duplicate_staging_key",
            False,
            with_rows(other, staging_key=rows[t]["staging_key"]),
            shots,
        )
        yield (
            "duplicate-row",
            "duplicate_manifest_row",
            True,
            receipt | {"manifest": rows + rows[:1]},
            shots + shots[:1],
        )
    if len(chain) > 1:
        keep = [i for i in range(len(rows)) if i != r0]
        yield (
            "missing-parent",
            "missing_parent",
            False,
            receipt | {"manifest": [rows[i] for i in keep]},
            [shots[i] for i in keep],
        )
        yield (
            "prev-len-row",
            "wrong_prev_len",
            True,
            with_rows(t, prev_len=rows[t]["prev_len"] + 1),
            shots,
        )
        # A child forged to start one id past where its parent ends, consistently signed.
        lengths = {"prev_len": shots[t]["prev_len"] + 1, "cum_len": shots[t]["cum_len"] + 1}
        forged = _resign(shots[t] | lengths)
        yield (
            "parent-length",
            "parent_length_mismatch",
            False,
            with_rows(t, digest=forged["digest"], **lengths),
            with_shot(t, forged),
        )
    # Linearize: the same checks under a declared receipt, with a hint or without one.
    yield "linearize-hint", "", False, receipt | {"hint": receipt["terminal_model_call_id"]}, shots
    yield "linearize-no-hint", "missing_terminal", False, receipt | {"hint": None}, shots
    yield (
        "linearize-no-hint-tampered",
        "missing_terminal",
        False,
        with_rows(t, weight_version=rows[t]["weight_version"] + 1) | {"hint": None},
        shots,
    )


def _lineage_cycle_case() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Two valid rows naming each other: a's parent b ends where a starts (5), b's parent a does
    not (7 vs 3), so the parent-length and the cycle checks both apply."""

    def shot(call: str, parent: str, prev: int) -> dict[str, Any]:
        return _resign(
            {
                "schema_version": 2,
                "digest_version": 2,
                "extras_digest_version": 1,
                "rollout_id": "cycle",
                "model_call_id": call,
                "parent_call_id": parent,
                "mode": "token_in",
                "prev_len": prev,
                "delta_len": 2,
                "cum_len": prev + 2,
                "weight_version": 1,
                "digest": "",
                "token_ids_delta": [7, 8],
                "token_mask_delta": [0.0, 1.0],
                "generation_log_probs_delta": [0.0, -0.5],
                "extras_digest": EMPTY_EXTRAS,
                "chain_hash": "3" * 64,
                "cumulative_hash": "4" * 64,
            }
        )

    shots = [shot("a", "b", 5), shot("b", "a", 3)]
    rows = [
        {
            k: s[k]
            for k in s
            if k
            not in (
                "rollout_id",
                "token_ids_delta",
                "token_mask_delta",
                "generation_log_probs_delta",
            )
        }
        | {
            "staging_key": f"cycle/{s['model_call_id']}",
            "response_id": f"resp-{s['model_call_id']}",
        }
        for s in shots
    ]
    return _receipt("cycle", rows, "a"), shots


def _rebuild_corpus(
    gym: NemoGymProcess, side: str, results: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, dict[str, Any]]]:
    """``(case, the code NeMo Gym should give or "", request)`` for one side's capture output;
    validated receipts are that side's own JSON (parsed and written back by its models)."""
    drafts: list[tuple[str, str, bool, dict[str, Any], list[dict[str, Any]]]] = []
    tampered = 0
    for rollout in results:
        rid = rollout["rollout_id"]
        rows = [_row(c, i) for i, c in enumerate(_staged(rollout))]
        shots = [json.loads(s) for s in rollout["snapshots"]]
        if not rows:
            continue
        for leaf in _leaves(rows):
            receipt = _receipt(rid, rows, leaf)
            drafts.append((f"{rid}:{leaf}", "", False, receipt, shots))
            chain = _chain_of(rows, leaf)
            clean = all(1.0 in shots[i]["token_mask_delta"] for i in chain)
            if clean and ((len(chain) > 1 and tampered < 12) or rid == "0-0"):
                tampered += 1
                for name, code, construct, bad_receipt, bad_shots in _tampers(receipt, shots):
                    if name.startswith("linearize") and rid != "0-0":
                        continue
                    drafts.append((f"{rid}:{leaf}:{name}", code, construct, bad_receipt, bad_shots))
        if rid == "r02":
            receipt = _receipt(rid, rows, rows[0]["model_call_id"])
            for name, code, construct, bad_receipt, bad_shots in _tampers(receipt, shots):
                drafts.append((f"{rid}:root-only:{name}", code, construct, bad_receipt, bad_shots))
    cycle_receipt, cycle_shots = _lineage_cycle_case()
    drafts.append(("cycle", "lineage_cycle", False, cycle_receipt, cycle_shots))
    # A row whose weight_version is 8.0 rather than 8, built without validation.
    receipt, shots = drafts[0][3], drafts[0][4]
    rows = copy.deepcopy(receipt["manifest"])
    rows[0]["weight_version"] = float(rows[0]["weight_version"])
    drafts.append(("float-weight-version-row", "", True, receipt | {"manifest": rows}, shots))
    # Each side's own JSON for every receipt that validates.
    api = OURS if side == "ours" else None
    parse_requests = [
        {"model": "RolloutReceipt", "json": json.dumps({k: v for k, v in r.items() if k != "hint"})}
        for _, _, _, r, _ in drafts
    ]
    parsed = OPS["parse"](api, parse_requests) if api else gym.call("parse", parse_requests)
    corpus: list[tuple[str, str, dict[str, Any]]] = []
    for (case, code, construct, receipt, shots), answer in zip(drafts, parsed, strict=True):
        request: dict[str, Any] = {
            "receipt": answer["json"]
            if "json" in answer and not construct
            else json.dumps({k: v for k, v in receipt.items() if k != "hint"}),
            "snapshots": [json.dumps(s) for s in shots],
            "construct": construct or "json" not in answer,
        }
        if "hint" in receipt:
            request["hint"] = receipt["hint"]
        corpus.append((f"{side}:{case}", code, request))
    return corpus


def _refusal(code: str, cls: str = "ReceiptVerificationError") -> dict[str, str]:
    return {"code": code, "cls": cls}


DIFFERENCES["rebuild"] = {}
for _side in ("theirs", "ours"):
    # A row whose weight_version is the float 8.0 (reachable only without validation): NeMo
    # Gym compares by value and linearizes; rollcap compares types too and refuses.
    DIFFERENCES["rebuild"][f"{_side}:float-weight-version-row"] = (
        "<row>",
        _refusal("wrong_weight_version"),
    )


def _rebuild_short(value: Any) -> Any:
    return "<row>" if isinstance(value, dict) and "row" in value else value


def test_rebuild_agrees_both_ways(
    gym: NemoGymProcess, captured: tuple[list[Any], list[Any]]
) -> None:
    their_capture, our_capture = captured
    cases = [
        *_rebuild_corpus(gym, "theirs", their_capture),
        *_rebuild_corpus(gym, "ours", our_capture),
    ]
    theirs, ours = run_both(gym, "rebuild", [request for _, _, request in cases])
    ids = [case for case, _, _ in cases]
    compare("rebuild", ids, theirs, ours, short=_rebuild_short)
    # Either side's receipts and snapshots give the same answers as the other side's: the
    # cases built from both captures are the same but for the rollouts the captures differ on.
    answers = dict(zip(ids, zip(theirs, ours, strict=True), strict=True))
    pairs = [
        (case, "ours:" + case.removeprefix("theirs:")) for case in ids if case.startswith("theirs:")
    ]
    assert sum(mine in answers for _, mine in pairs) > 500
    for case, mine in pairs:
        if mine in answers:
            assert _key(answers[case]) == _key(answers[mine]), case
    their_cases = {case.removeprefix("theirs:") for case in ids if case.startswith("theirs:")}
    our_cases = {case.removeprefix("ours:") for case in ids if case.startswith("ours:")}
    only = {case.split(":")[0] for case in their_cases ^ our_cases}
    assert only == set(), only
    # Each tampered case gets the refusal it was made for, from NeMo Gym.
    for (case, code, _), answer in zip(cases, theirs, strict=True):
        if code:
            assert answer.get("code") == code, (case, answer)
    assert sum("row" in answer for answer in theirs) > 150
    assert len({answer["code"] for answer in theirs if "code" in answer}) >= 35


# --- 5. adapters ------------------------------------------------------------------------------


def _adapter_corpus() -> list[tuple[str, dict[str, Any]]]:
    """Engine answers, vLLM's and Megatron's, in the shapes they come in and some they do not."""
    spec = SPEC_ANSWER_0E3F

    def answer(message: Mapping[str, Any] | None = None, **top: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "x"} | dict(message or {}),
        }
        if "logprobs" in top:
            choice["logprobs"] = top.pop("logprobs")
        return {"id": "chatcmpl-1", "prompt_token_ids": [1, 2]} | {"choices": [choice]} | top

    def content(*tokens: Any, logprob: Any = -0.5) -> dict[str, Any]:
        return {"content": [{"token": token, "logprob": logprob} for token in tokens]}

    bundle = {
        "prompt_token_ids": [7, 8],
        "generation_token_ids": [9],
        "generation_log_probs": [-0.1],
    }
    cases: dict[str, Any] = {
        "spec-3.5": spec,
        "token-id-strings": answer(logprobs=content("token_id:5", "token_id:0")),
        "token-ints": answer(logprobs=content(5, 0)),
        "token-digit-strings": answer(logprobs=content("5", "12")),
        "token-mixed": answer(logprobs=content("token_id:5", 6, "7")),
        "token-space": answer(logprobs=content(" 5")),
        "token-plus": answer(logprobs=content("+5")),
        "token-underscore": answer(logprobs=content("1_0")),
        "token-arabic-digit": answer(logprobs=content("٣")),
        "token-negative": answer(logprobs=content("token_id:-1")),
        "token-float": answer(logprobs=content(5.0)),
        "token-bool": answer(logprobs=content(True)),
        "token-text": answer(logprobs=content("hello")),
        "token-null": answer(logprobs=content(None)),
        "logprob-string": answer(logprobs=content(5, logprob="-0.5")),
        "logprob-int": answer(logprobs=content(5, logprob=-1)),
        "logprob-bool": answer(logprobs=content(5, logprob=True)),
        "logprob-null": answer(logprobs=content(5, logprob=None)),
        "logprob-nan-string": answer(logprobs=content(5, logprob="nan")),
        "logprob-inf": answer(logprobs=content(5, logprob=float("-inf"))),
        "logprob-float64": answer(logprobs=content(5, logprob=-0.1)),
        "content-empty": answer(logprobs={"content": []}),
        "content-null": answer(logprobs={"content": None}),
        "logprobs-null": answer(logprobs=None),
        "logprobs-absent": answer(),
        "entry-no-logprob": answer(logprobs={"content": [{"token": "token_id:5"}]}),
        "entry-no-token": answer(logprobs={"content": [{"logprob": -0.5}]}),
        "entry-string": answer(logprobs={"content": ["token_id:5"]}),
        "bundle": answer(bundle) | {"prompt_token_ids": None},
        "bundle-no-top": {"choices": [{"message": bundle}]},
        "bundle-and-same-top": answer(bundle, logprobs=content(1)) | {"prompt_token_ids": [7, 8]},
        "bundle-and-other-top": answer(bundle) | {"prompt_token_ids": [1, 2, 3]},
        "bundle-token-id-strings": answer(bundle | {"generation_token_ids": ["token_id:9"]})
        | {"prompt_token_ids": None},
        "bundle-float-ids": answer(bundle | {"generation_token_ids": [9.0]})
        | {"prompt_token_ids": None},
        "bundle-string-ids": answer(bundle | {"generation_token_ids": ["9"]})
        | {"prompt_token_ids": None},
        "bundle-lengths-differ": answer(bundle | {"generation_log_probs": []})
        | {"prompt_token_ids": None},
        "bundle-generation-only": answer(
            {"generation_token_ids": [9], "generation_log_probs": [-0.2]}
        ),
        "bundle-ids-only": answer({"generation_token_ids": [9]}, logprobs=content(5)),
        "bundle-logprobs-null": answer(bundle | {"generation_log_probs": None})
        | {"prompt_token_ids": None},
        "prompt-string-ids": answer(logprobs=content(5)) | {"prompt_token_ids": ["1", "2"]},
        "prompt-float-ids": answer(logprobs=content(5)) | {"prompt_token_ids": [1.0, 2.0]},
        "prompt-fraction-ids": answer(logprobs=content(5)) | {"prompt_token_ids": [1.5]},
        "prompt-bool-ids": answer(logprobs=content(5)) | {"prompt_token_ids": [True]},
        "prompt-negative-ids": answer(logprobs=content(5)) | {"prompt_token_ids": [-1]},
        "prompt-a-string": answer(logprobs=content(5)) | {"prompt_token_ids": "123"},
        "prompt-an-object": answer(logprobs=content(5)) | {"prompt_token_ids": {"4": 1}},
        "prompt-empty": answer(logprobs=content(5)) | {"prompt_token_ids": []},
        "prompt-in-message": answer({"prompt_token_ids": [3, 4]}, logprobs=content(5))
        | {"prompt_token_ids": None},
        "prompt-in-message-top-absent": {
            "choices": [{"message": {"prompt_token_ids": [3]}, "logprobs": content(5)}]
        },
        "prompt-nowhere": {"choices": [{"message": {}, "logprobs": content(5)}]},
        "routed-envelope": answer(
            {"routed_experts": "nrlre1:int16:2x1x2:AwABAAIABQA="}, logprobs=content(5)
        ),
        "routed-nested": answer({"routed_experts": [[[3, 1]], [[2, 5]]]}, logprobs=content(5)),
        "routed-object": answer({"routed_experts": {"dtype": "int8"}}, logprobs=content(5)),
        "routed-int": answer({"routed_experts": 5}, logprobs=content(5)),
        "routed-null": answer({"routed_experts": None}, logprobs=content(5)),
        "routed-empty-string": answer({"routed_experts": ""}, logprobs=content(5)),
        "routed-top-level": answer(logprobs=content(5)) | {"routed_experts": [[[1]]]},
        "routed-in-choice": {
            "prompt_token_ids": [1],
            "choices": [{"message": {}, "logprobs": content(5), "routed_experts": [[[1]]]}],
        },
        "media-spans": answer(logprobs=content(5)) | {"media_spans": [{"offset": 1, "length": 2}]},
        "media-spans-empty": answer(logprobs=content(5)) | {"media_spans": []},
        "media-spans-null": answer(logprobs=content(5)) | {"media_spans": None},
        "media-spans-not-objects": answer(logprobs=content(5)) | {"media_spans": [1]},
        "media-spans-object": answer(logprobs=content(5)) | {"media_spans": {"offset": 1}},
        "media-spans-in-choice": {
            "prompt_token_ids": [1],
            "choices": [{"message": {}, "logprobs": content(5), "media_spans": [{}]}],
        },
        "media-and-routed": answer({"routed_experts": [[[1]]]}, logprobs=content(5))
        | {"media_spans": [{}]},
        "two-choices": answer(logprobs=content(5))
        | {
            "choices": [
                {"message": {}, "logprobs": content(5)},
                {"message": {}, "logprobs": content(6)},
            ]
        },
        "no-choices": {"prompt_token_ids": [1], "choices": []},
        "choices-null": {"prompt_token_ids": [1], "choices": None},
        "choice-string": {"prompt_token_ids": [1], "choices": ["x"]},
        "message-null": {
            "prompt_token_ids": [1],
            "choices": [{"message": None, "logprobs": content(5)}],
        },
        "message-string": {
            "prompt_token_ids": [1],
            "choices": [{"message": "hi", "logprobs": content(5)}],
        },
        "message-absent": {"prompt_token_ids": [1], "choices": [{"logprobs": content(5)}]},
        "token-ids-at-choice": {
            "prompt_token_ids": [1],
            "choices": [{"message": {}, "token_ids": [4, 5]}],
        },
        "answer-a-list": [1],
        "answer-null": None,
    }
    corpus: list[tuple[str, dict[str, Any]]] = [
        (f"vllm:{name}", {"adapter": "vllm", "payload": payload}) for name, payload in cases.items()
    ]
    mega = {
        "prompt_token_ids": [1, 2],
        "generated_token_ids": [3, 4],
        "generated_log_probs": [-0.5, -1.0],
    }
    megatron: dict[str, Any] = {
        "plain": mega,
        "int-logprobs": mega | {"generated_log_probs": [-1, 0]},
        "float64-logprobs": mega | {"generated_log_probs": [-0.1, -0.2]},
        "bool-logprob": mega | {"generated_log_probs": [True, -1.0]},
        "string-logprob": mega | {"generated_log_probs": ["-0.5", -1.0]},
        "nan-logprob": mega | {"generated_log_probs": [float("nan"), -1.0]},
        "inf-logprob": mega | {"generated_log_probs": [float("-inf"), -1.0]},
        "huge-int-logprob": mega | {"generated_log_probs": [-(10**400), -1.0]},
        "float-id": mega | {"generated_token_ids": [3.0, 4]},
        "string-id": mega | {"prompt_token_ids": ["1", 2]},
        "bool-id": mega | {"prompt_token_ids": [True, 2]},
        "negative-id": mega | {"generated_token_ids": [-3, 4]},
        "huge-id": mega | {"generated_token_ids": [2**64, 4]},
        "lengths-differ": mega | {"generated_log_probs": [-0.5]},
        "empty-generation": mega | {"generated_token_ids": [], "generated_log_probs": []},
        "missing-prompt": {k: v for k, v in mega.items() if k != "prompt_token_ids"},
        "missing-logprobs": {k: v for k, v in mega.items() if k != "generated_log_probs"},
        "null-prompt": mega | {"prompt_token_ids": None},
        "string-prompt": mega | {"prompt_token_ids": "12"},
        "object-prompt": mega | {"prompt_token_ids": {"1": 1}},
        "with-routed-experts": mega | {"routed_experts": [[[1]]]},
    }
    for name, payload in megatron.items():
        for form in ("mapping", "object"):
            corpus.append(
                (
                    f"megatron:{form}:{name}",
                    {"adapter": "megatron", "payload": payload, "form": form},
                )
            )
    corpus.append(("megatron:mapping:not-a-payload", {"adapter": "megatron", "payload": [1, 2]}))
    return corpus


def _read(prompt: Any = None, generation: Any = None, extras: Any = None) -> dict[str, Any]:
    """An adapter's answer in short: what each ``extract_*`` gave (``refused`` or the value)."""
    return {
        "extract_prompt_ids": prompt if prompt is not None else {"value": [1, 2]},
        "extract_generation": generation if generation is not None else {"value": [[5], [-0.5]]},
        "extract_extras": extras if extras is not None else {"value": None},
    }


def _adapter_short(value: Any) -> Any:
    return _short({k: v for k, v in value.items() if k != "enter_prefix"})


def _v(value: Any) -> dict[str, Any]:
    return {"value": value}


_NAN, _NEG_INF = float("nan"), float("-inf")
DIFFERENCES["adapters"] = {
    # logprobs.content[*].token through int(str(token)): NeMo Gym reads whitespace, "+", "_",
    # other scripts' digits and a negative id; rollcap takes only token_id:<digits>, <digits>
    # or an int.
    "vllm:token-space": (_read(generation=_v([[5], [-0.5]])), _read(generation=REFUSED)),
    "vllm:token-plus": (_read(generation=_v([[5], [-0.5]])), _read(generation=REFUSED)),
    "vllm:token-underscore": (_read(generation=_v([[10], [-0.5]])), _read(generation=REFUSED)),
    "vllm:token-arabic-digit": (_read(generation=_v([[3], [-0.5]])), _read(generation=REFUSED)),
    "vllm:token-negative": (_read(generation=_v([[-1], [-0.5]])), _read(generation=REFUSED)),
    # logprobs through float(): NeMo Gym takes a JSON true (as 1.0), "nan" and an infinity;
    # rollcap refuses a bool and anything not finite.
    "vllm:logprob-bool": (_read(generation=_v([[5], [1.0]])), _read(generation=REFUSED)),
    "vllm:logprob-nan-string": (_read(generation=_v([[5], [_NAN]])), _read(generation=REFUSED)),
    "vllm:logprob-inf": (_read(generation=_v([[5], [_NEG_INF]])), _read(generation=REFUSED)),
    # The bundle's generation ids: NeMo Gym through int(str(id)) (so "token_id:9" is 9 and 9.0
    # is refused), rollcap by its JSON id rule (an integral float is taken, token_id:N is not).
    "vllm:bundle-token-id-strings": (
        _read(prompt=_v([7, 8]), generation=_v([[9], [-0.1]])),
        _read(prompt=_v([7, 8]), generation=REFUSED),
    ),
    "vllm:bundle-float-ids": (
        _read(prompt=_v([7, 8]), generation=REFUSED),
        _read(prompt=_v([7, 8]), generation=_v([[9], [-0.1]])),
    ),
    # Prompt ids through int(): NeMo Gym truncates 1.5 to 1, takes true as 1, keeps -1, and
    # iterates a string's characters or an object's keys; rollcap refuses each.
    "vllm:prompt-fraction-ids": (_read(prompt=_v([1])), _read(prompt=REFUSED)),
    "vllm:prompt-bool-ids": (_read(prompt=_v([1])), _read(prompt=REFUSED)),
    "vllm:prompt-negative-ids": (_read(prompt=_v([-1])), _read(prompt=REFUSED)),
    "vllm:prompt-a-string": (_read(prompt=_v([1, 2, 3])), _read(prompt=REFUSED)),
    "vllm:prompt-an-object": (_read(prompt=_v([4])), _read(prompt=REFUSED)),
    # More than one choice: NeMo Gym refuses generation and extras; rollcap reads choices[0].
    "vllm:two-choices": (_read(generation=REFUSED, extras=REFUSED), _read()),
    # A message that is not an object: NeMo Gym refuses; rollcap reads logprobs.content and
    # no extras.
    "vllm:message-string": (
        _read(prompt=_v([1]), generation=REFUSED, extras=REFUSED),
        _read(prompt=_v([1])),
    ),
    # No usable choice: both refuse the generation; NeMo Gym's extract_extras refuses too,
    # rollcap's finds no extras.
    "vllm:no-choices": (
        _read(prompt=_v([1]), generation=REFUSED, extras=REFUSED),
        _read(prompt=_v([1]), generation=REFUSED),
    ),
    "vllm:choices-null": (
        _read(prompt=_v([1]), generation=REFUSED, extras=REFUSED),
        _read(prompt=_v([1]), generation=REFUSED),
    ),
    "vllm:choice-string": (
        _read(prompt=_v([1]), generation=REFUSED, extras=REFUSED),
        _read(prompt=_v([1]), generation=REFUSED),
    ),
}
for _form in ("mapping", "object"):
    # Megatron: NeMo Gym keeps a negative id and a non-finite logprob (its capture then fails
    # the call); rollcap refuses them at extraction.
    for _name, _generation in (
        ("negative-id", [[-3, 4], [-0.5, -1.0]]),
        ("nan-logprob", [[3, 4], [_NAN, -1.0]]),
        ("inf-logprob", [[3, 4], [_NEG_INF, -1.0]]),
    ):
        DIFFERENCES["adapters"][f"megatron:{_form}:{_name}"] = (
            _read(generation=_v(_generation)),
            _read(generation=REFUSED),
        )


def test_adapters_read_alike(gym: NemoGymProcess) -> None:
    corpus = _adapter_corpus()
    theirs, ours = run_both(gym, "adapt", [request for _, request in corpus])
    compare("adapters", [case for case, _ in corpus], theirs, ours, short=_adapter_short)
    read = [answer for answer in ours if "value" in answer["extract_generation"]]
    assert len(read) > 40
    assert any(answer["extract_extras"].get("value") for answer in read)


def _staged_short(rollout: Any) -> Any:
    """A one-call rollout in short: the disposition and, when staged, the staged ids."""
    step = rollout["steps"][0]
    coords = json.loads(step["coords"])
    record = json.loads(step["records"][0]) if step["records"] else None
    return [coords["disposition"], record["token_ids_delta"] if record else None]


_FAILED: list[Any] = ["capture_failed", None]
DIFFERENCES["adapter-staging"] = {
    # Where a reading difference reaches the staged record: NeMo Gym stages what its
    # coercions read (a JSON true logprob as 1.0, prompt id 1.5 as 1, the string "123" as
    # [1, 2, 3], ...); rollcap fails the call.
    "vllm:token-space": (["staged", [1, 2, 5]], _FAILED),
    "vllm:token-plus": (["staged", [1, 2, 5]], _FAILED),
    "vllm:token-underscore": (["staged", [1, 2, 10]], _FAILED),
    "vllm:token-arabic-digit": (["staged", [1, 2, 3]], _FAILED),
    "vllm:logprob-bool": (["staged", [1, 2, 5]], _FAILED),
    "vllm:bundle-token-id-strings": (["staged", [7, 8, 9]], _FAILED),
    "vllm:prompt-fraction-ids": (["staged", [1, 5]], _FAILED),
    "vllm:prompt-bool-ids": (["staged", [1, 5]], _FAILED),
    "vllm:prompt-a-string": (["staged", [1, 2, 3, 5]], _FAILED),
    "vllm:prompt-an-object": (["staged", [4, 5]], _FAILED),
    # The other way round: rollcap stages, NeMo Gym fails the call.
    "vllm:bundle-float-ids": (_FAILED, ["staged", [7, 8, 9]]),
    "vllm:two-choices": (_FAILED, ["staged", [1, 2, 5]]),
    "vllm:message-string": (_FAILED, ["staged", [1, 5]]),
}


def test_adapters_stage_alike(gym: NemoGymProcess) -> None:
    """Each engine answer as a root call through both captures: the same record and coords,
    or both fail the call (a negative id or a NaN that one adapter lets through is refused by
    its capture)."""
    corpus = _adapter_corpus()
    rollouts = [
        {
            "rollout_id": f"a{n}",
            "calls": [{"call": "c", "parent": None, "do": "response", **request}],
        }
        for n, (_, request) in enumerate(corpus)
    ]
    theirs, ours = run_both(gym, "capture", rollouts)
    compare("adapter-staging", [case for case, _ in corpus], theirs, ours, short=_staged_short)
    assert sum(_staged_short(rollout)[0] == "staged" for rollout in ours) > 40


# --- 6. fingerprints --------------------------------------------------------------------------


def _fingerprint_corpus() -> list[tuple[str, list[Any]]]:
    weather = {"city": "Paris"}
    items: dict[str, list[Any]] = {
        "user": [{"role": "user", "content": "hello"}],
        "tool": [{"role": "tool", "tool_call_id": "call-1", "content": "sunny"}],
        "tool-list-content": [
            {
                "role": "tool",
                "tool_call_id": "call-1",
                "content": [{"type": "text", "text": "sunny"}],
            }
        ],
        "tool-null-content": [{"role": "tool", "tool_call_id": "call-1", "content": None}],
        "tool-no-id": [{"role": "tool", "content": "sunny"}],
        "assistant-text": [{"role": "assistant", "content": "answer 1"}],
        "assistant-output-text": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "answer 1"}],
            }
        ],
        "assistant-empty": [{"role": "assistant", "content": ""}],
        "assistant-null": [{"role": "assistant", "content": None}],
        "assistant-parts": [
            {
                "role": "assistant",
                "content": [
                    "a",
                    "",
                    {"type": "text", "text": "b"},
                    {"type": "input_text", "text": ""},
                    {"type": "", "text": "c"},
                ],
            }
        ],
        "assistant-refusal-part": [
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
        ],
        "assistant-image-part": [
            {
                "role": "assistant",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:,x", "detail": "low"}}
                ],
            }
        ],
        "assistant-text-part-no-text": [{"role": "assistant", "content": [{"type": "text"}]}],
        "assistant-text-part-int-text": [
            {"role": "assistant", "content": [{"type": "text", "text": 5}]}
        ],
        "untyped-part-with-text": [{"role": "assistant", "content": [{"text": "hi"}]}],
        "null-typed-part-with-text": [
            {"role": "assistant", "content": [{"type": None, "text": "hi"}]}
        ],
        "untyped-part-without-text": [{"role": "assistant", "content": [{"foo": 1}]}],
        "int-typed-part": [{"role": "assistant", "content": [{"type": 5, "text": "hi"}]}],
        "untyped-part-in-user": [{"role": "user", "content": [{"text": "hi"}]}],
        "content-object": [{"role": "assistant", "content": {"text": "hi"}}],
        "content-number": [{"role": "user", "content": 5}],
        "part-number": [{"role": "user", "content": [5]}],
        "chat-tool-call": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {
                            "name": "functions__weather",
                            "arguments": '{"city": "Paris"}',
                        },
                    }
                ],
            }
        ],
        "chat-tool-call-object-args": [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "function": {"name": "functions__weather", "arguments": weather},
                    }
                ],
            }
        ],
        "chat-tool-call-spaced-args": [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "function": {
                            "name": "functions__weather",
                            "arguments": '  { "city" :"Paris" }  ',
                        },
                    }
                ],
            }
        ],
        "chat-tool-call-text-args": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "call-1", "function": {"name": "w", "arguments": "  not json  "}}
                ],
            }
        ],
        "chat-tool-call-null-args": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "call-1", "function": {"name": "w", "arguments": None}}],
            }
        ],
        "chat-tool-call-nan-args": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "w", "arguments": '{"x": NaN}'}}],
            }
        ],
        "chat-tool-call-inf-args": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "w", "arguments": '{"x": 1e999}'}}],
            }
        ],
        "chat-tool-call-big-int-args": [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "function": {
                            "name": "w",
                            "arguments": '{"x": 123456789012345678901234567890}',
                        },
                    }
                ],
            }
        ],
        "chat-tool-call-u64-args": [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "function": {"name": "w", "arguments": '{"x": 18446744073709551615}'},
                    }
                ],
            }
        ],
        "chat-tool-call-surrogate-args": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "w", "arguments": '"\\ud800"'}}],
            }
        ],
        "chat-tool-call-unicode-args": [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "function": {
                            "name": "w",
                            "arguments": '{"é": "\\u00e9☃", "a": [1, 2.50, -0]}',
                        },
                    }
                ],
            }
        ],
        "chat-tool-call-no-function": [{"role": "assistant", "tool_calls": [{"id": "c"}]}],
        "chat-tool-call-null-function": [
            {"role": "assistant", "tool_calls": [{"id": "c", "function": None}]}
        ],
        "chat-tool-call-null-name": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": None, "arguments": "{}"}}],
            }
        ],
        "chat-tool-call-int-name": [
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 5}}]}
        ],
        "chat-tool-call-int-id": [
            {"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "w"}}]}
        ],
        "chat-tool-call-not-object": [{"role": "assistant", "tool_calls": ["x"]}],
        "chat-tool-calls-null": [{"role": "assistant", "content": "x", "tool_calls": None}],
        "chat-tool-calls-object": [
            {"role": "assistant", "content": "x", "tool_calls": {"id": "c"}}
        ],
        "responses-function-call": [
            {
                "type": "function_call",
                "call_id": "call-1",
                "name": "weather",
                "namespace": "functions",
                "arguments": '{"city": "Paris"}',
            }
        ],
        "responses-function-call-id-only": [
            {"type": "function_call", "id": "fc_1", "name": "weather", "arguments": "{}"}
        ],
        "responses-function-call-both-ids": [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call-1",
                "name": "weather",
                "arguments": "{}",
            }
        ],
        "responses-function-call-empty-namespace": [
            {
                "type": "function_call",
                "call_id": "c",
                "name": "weather",
                "namespace": "",
                "arguments": "{}",
            }
        ],
        "responses-function-call-null-name": [
            {"type": "function_call", "call_id": "c", "name": None, "arguments": "{}"}
        ],
        "responses-function-call-no-name": [
            {"type": "function_call", "call_id": "c", "arguments": "{}"}
        ],
        "responses-function-call-int-namespace": [
            {"type": "function_call", "call_id": "c", "name": "w", "namespace": 7}
        ],
        "responses-function-call-object-args": [
            {
                "type": "function_call",
                "call_id": "c",
                "name": "w",
                "arguments": {"b": 1, "a": [True, None]},
            }
        ],
        "responses-function-call-output": [
            {"type": "function_call_output", "call_id": "call-1", "output": "sunny"}
        ],
        "responses-function-call-output-object": [
            {"type": "function_call_output", "call_id": "call-1", "output": {"t": 20, "c": "°C"}}
        ],
        "responses-function-call-output-list": [
            {
                "type": "function_call_output",
                "call_id": "call-1",
                "output": [{"type": "input_text", "text": "sunny"}],
            }
        ],
        "responses-function-call-output-null": [
            {"type": "function_call_output", "id": "x", "output": None}
        ],
        "responses-reasoning": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}
        ],
        "anthropic-tool-use": [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "let me check"},
                    {
                        "type": "tool_use",
                        "id": "call-1",
                        "name": "functions__weather",
                        "input": weather,
                    },
                ],
            }
        ],
        "anthropic-tool-use-null-name": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "call-1", "name": None, "input": {}}],
            }
        ],
        "anthropic-tool-use-string-input": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "call-1", "name": "w", "input": '{"a":1}'}],
            }
        ],
        "anthropic-tool-result": [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call-1", "content": "sunny"}],
            }
        ],
        "anthropic-tool-result-blocks": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call-1",
                        "content": [{"type": "text", "text": "sunny"}],
                    },
                    {"type": "text", "text": "thanks"},
                ],
            }
        ],
        "anthropic-tool-result-id": [
            {"role": "user", "content": [{"type": "tool_result", "id": "call-1", "content": None}]}
        ],
        "anthropic-thinking": [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "ok"},
                ],
            }
        ],
        "role-tool-with-blocks": [
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "tool_result", "tool_use_id": "d", "content": "x"}],
            }
        ],
        "envelope": [
            {
                "role": "_ng_request_envelope",
                "content": '{"instructions": "be brief", "tools": null}',
            },
            {"role": "user", "content": "hi"},
        ],
        "no-role-no-type": [{"content": "hi"}],
        "role-int": [{"role": 5, "content": "hi"}],
        "role-empty-type-set": [{"role": "", "type": "message", "content": "hi"}],
        "item-not-object": ["hello"],
        "item-null": [None],
        "empty": [],
    }
    corpus = list(items.items())
    # Conversations: the same turns in each dialect, and random mixes of all of the above.
    rng = random.Random(606)
    pool = [name for name in items if name not in ("empty",)]
    for n in range(120):
        names = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
        corpus.append((f"mix-{n}:" + "+".join(names), [i for name in names for i in items[name]]))
    return corpus


def _fp(af: Any, cd: Any) -> dict[str, Any]:
    return {"assistant_fingerprint": af, "conversation_digest": cd}


_HASHES = _fp("hash", "hash")
_NO_AUTHOR = {"value": ""}
# Each item list fingerprinted differently, alone; a mix may differ only when it holds one (it
# agrees all the same when another of its items makes both refuse).
FINGERPRINT_DIFFERENCES: dict[str, tuple[Any, Any]] = {
    # A content object without a string type but with a string text: NeMo Gym reads it as
    # text (its type is str(type or "") == ""); rollcap refuses it (STAGING §1.3: "an untyped
    # object ... → error").
    "untyped-part-with-text": (_HASHES, _fp(REFUSED, REFUSED)),
    "null-typed-part-with-text": (_HASHES, _fp(REFUSED, REFUSED)),
    "untyped-part-in-user": (_fp(_NO_AUTHOR, "hash"), _fp(_NO_AUTHOR, REFUSED)),
    # A type, role, name, id or namespace that is not a string: NeMo Gym hashes str(value);
    # rollcap refuses a non-string.
    "int-typed-part": (_HASHES, _fp(REFUSED, REFUSED)),
    "role-int": (_fp(_NO_AUTHOR, "hash"), _fp(_NO_AUTHOR, REFUSED)),
    "chat-tool-call-int-name": (_HASHES, _fp(REFUSED, REFUSED)),
    "chat-tool-call-int-id": (_HASHES, _fp(REFUSED, REFUSED)),
    "responses-function-call-int-namespace": (_HASHES, _fp(REFUSED, REFUSED)),
    # A null tool name: NeMo Gym hashes "None" (str(None)), rollcap "" (two other hashes).
    "chat-tool-call-null-name": (_HASHES, _HASHES),
    "responses-function-call-null-name": (_HASHES, _HASHES),
    "anthropic-tool-use-null-name": (_HASHES, _HASHES),
    # Arguments parsed by Python's json (NeMo Gym) or orjson (rollcap): NaN and 1e999 parse
    # to null in NeMo Gym and stay text in rollcap (other hashes); an integer beyond 64 bits
    # or a lone surrogate parse in NeMo Gym and then cannot be written (refused), while
    # orjson reads the integer as a float and leaves the surrogate escape as text.
    "chat-tool-call-nan-args": (_HASHES, _HASHES),
    "chat-tool-call-inf-args": (_HASHES, _HASHES),
    "chat-tool-call-big-int-args": (_fp(REFUSED, REFUSED), _HASHES),
    "chat-tool-call-surrogate-args": (_fp(REFUSED, REFUSED), _HASHES),
}


def _fingerprint_listed(corpus: Sequence[tuple[str, list[Any]]]) -> None:
    listed: dict[str, tuple[Any, Any] | None] = dict(FINGERPRINT_DIFFERENCES)
    for case, _ in corpus:
        if case.startswith("mix-") and set(case.split(":", 1)[1].split("+")) & set(listed):
            listed[case] = None
    DIFFERENCES["fingerprints"] = listed


def test_fingerprints_agree(gym: NemoGymProcess) -> None:
    corpus = _fingerprint_corpus()
    _fingerprint_listed(corpus)
    theirs, ours = run_both(gym, "fingerprint", [items for _, items in corpus])
    compare("fingerprints", [case for case, _ in corpus], theirs, ours)
    agreeing = [
        t
        for (case, _), t in zip(corpus, theirs, strict=True)
        if case not in DIFFERENCES["fingerprints"]
    ]
    assert sum(len(t["assistant_fingerprint"].get("value", "")) == 64 for t in agreeing) > 60
    assert sum("refused" in t["conversation_digest"] for t in agreeing) > 5
    assert len(agreeing) > 100


# --- 7. terminal selection -------------------------------------------------------------------


def _n_hex(n: int) -> str:
    return f"{n:064x}"


def _synthetic_row(call: str, parent: str | None, **extra: Any) -> dict[str, Any]:
    prev = 0 if parent is None else 1
    return {
        "model_call_id": call,
        "parent_call_id": parent,
        "prev_len": prev,
        "delta_len": 1,
        "cum_len": prev + 1,
        "weight_version": 0,
        "digest": _n_hex(1),
        "extras_digest": EMPTY_EXTRAS,
        "staging_key": f"r/{call}",
        "mode": "text" if parent is None else "token_in",
        "chain_hash": hashlib.sha256(b"chain:" + call.encode()).hexdigest(),
        "cumulative_hash": hashlib.sha256(b"cumulative:" + call.encode()).hexdigest(),
        "response_id": f"resp-{call}",
    } | extra


def _select_corpus() -> list[tuple[str, list[dict[str, Any]]]]:
    row = _synthetic_row
    cases: dict[str, list[dict[str, Any]]] = {
        "empty": [],
        "one-root": [row("a", None)],
        "spec-branch": [row("a", None), row("b", "a"), row("c", "a"), row("d", "c")],
        "spec-two-leaves": [row("a", None), row("b", "a"), row("c", "a")],
        "spec-two-roots-admitted": [
            row("a", None, admitted_at=2.0),
            row("b", None, admitted_at=1.0),
        ],
        "spec-unstamped-loses": [row("a", None), row("b", None, admitted_at=5.0)],
        "spec-root-with-child-wins": [
            row("a", None, admitted_at=1.0),
            row("b", None, admitted_at=2.0),
            row("c", "b"),
        ],
        "ties-by-position": [row("b", None, admitted_at=1.0), row("a", None, admitted_at=1.0)],
        "all-unstamped": [row("b", None), row("a", None)],
        "duplicate": [row("a", None), row("a", None)],
        "orphan": [row("a", None), row("b", "x")],
        "cycle": [row("a", "b"), row("b", "a")],
        "cycle-and-root": [row("r", None), row("a", "b"), row("b", "a")],
        "deep-chain": [row("a", None), row("b", "a"), row("c", "b"), row("d", "c")],
        "abandoned-leaf": [
            row("a", None),
            row("b", "a"),
            row("c", "a"),
            row("d", "b"),
            row("e", "d"),
        ],
        "two-extended": [
            row("a", None),
            row("b", "a"),
            row("c", "a"),
            row("d", "b"),
            row("e", "c"),
        ],
        "negative-admitted": [row("a", None, admitted_at=-1.0), row("b", None, admitted_at=0.0)],
        "child-before-parent": [row("b", "a"), row("a", None)],
    }
    corpus = list(cases.items())
    rng = random.Random(707)
    for n in range(80):
        rows: list[dict[str, Any]] = []
        for index in range(rng.randint(1, 7)):
            parent = None if not rows or rng.random() < 0.25 else rng.choice(rows)["model_call_id"]
            stamp = rng.choice([None, None, 0.5, 1.0, 2.0, 2.0, float(index)])
            rows.append(row(f"c{index}", parent, admitted_at=stamp))
        rng.shuffle(rows)
        corpus.append((f"random-{n}", rows))
    return corpus


def test_select_terminal_call_agrees(gym: NemoGymProcess) -> None:
    corpus = _select_corpus()
    theirs, ours = run_both(gym, "select", [rows for _, rows in corpus])
    compare("select", [case for case, _ in corpus], theirs, ours, short=lambda v: v)
    reasons = {answer["reason"] for answer in theirs}
    assert reasons == {
        "selected",
        "no_records",
        "duplicate_call_id",
        "orphaned_row",
        "no_root",
        "ambiguous_terminal",
    }


def _resolve_corpus() -> list[tuple[str, dict[str, Any]]]:
    af = staging.assistant_fingerprint
    out1: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "answer 1"}],
        }
    ]
    out2: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "answer 2"}],
        }
    ]
    call: list[dict[str, Any]] = [
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"}
    ]
    result: list[dict[str, Any]] = [
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    ]
    row = _synthetic_row
    a = row(
        "a",
        None,
        output_fingerprint=af(call),
        continuation_fingerprint=af(call),
        fingerprint_version=2,
    )
    b = row(
        "b",
        "a",
        output_fingerprint=af(out1),
        continuation_fingerprint=af(call + out1),
        fingerprint_version=2,
    )
    c = row(
        "c",
        "a",
        output_fingerprint=af(out2),
        continuation_fingerprint=af(call + out2),
        fingerprint_version=2,
    )
    base = [a, b, c]
    twin = row(
        "t",
        "a",
        output_fingerprint=af(out1),
        fingerprint_version=2,
        response_id="resp-b",
        chain_hash=b["chain_hash"],
        cumulative_hash=b["cumulative_hash"],
        cum_len=b["cum_len"],
        prev_len=b["prev_len"],
    )
    other = row("o", "a", response_id="resp-b")
    v1 = row("v1", None, output_fingerprint=af(out1), fingerprint_version=1)
    numeric = row("n", None, response_id="5")

    def response(output: Any = None, **top: Any) -> dict[str, Any]:
        return ({"output": output} if output is not None else {}) | top

    cases: dict[str, dict[str, Any]] = {
        "id-and-content": {"rows": base, "response": response(out1, id="resp-b")},
        "content-only": {"rows": base, "response": response(out2)},
        "full-transcript": {"rows": base, "response": response(call + result + out1)},
        "trailing-block": {
            "rows": base,
            "response": response(call + result + [{"role": "user", "content": "more"}] + out2),
        },
        "transcript-ends-with-tool": {"rows": base, "response": response(call + result)},
        "declared": {"rows": base, "response": response(out1, id="resp-b"), "declared": "resp-b"},
        "declared-missing": {"rows": base, "response": response(out1), "declared": "resp-x"},
        "declared-ambiguous": {
            "rows": [*base, other],
            "response": response(out1),
            "declared": "resp-b",
        },
        "declared-twin": {"rows": [*base, twin], "response": response(out1), "declared": "resp-b"},
        "declared-empty": {"rows": base, "response": response(out1), "declared": ""},
        "explicit": {"rows": base, "response": response(out1), "explicit": "b"},
        "explicit-missing": {"rows": base, "response": response(out1), "explicit": "z"},
        "explicit-empty": {"rows": base, "response": response(out1), "explicit": ""},
        "explicit-disagrees": {"rows": base, "response": response(out1), "explicit": "c"},
        "disagreement": {"rows": base, "response": response(out2, id="resp-b")},
        "id-ambiguous": {"rows": [*base, other], "response": response(id="resp-b")},
        "id-twin": {"rows": [*base, twin], "response": response(out1, id="resp-b")},
        "id-no-match": {"rows": base, "response": response(out1, id="resp-x")},
        "id-empty": {"rows": base, "response": response(out1, id="")},
        "id-null": {"rows": base, "response": response(out1, id=None)},
        "id-int": {"rows": [*base, numeric], "response": response(id=5)},
        "id-int-no-row": {"rows": base, "response": response(out1, id=5)},
        "no-response": {"rows": base, "response": None},
        "response-list": {"rows": base, "response": [out1]},
        "response-string": {"rows": base, "response": "resp-b"},
        "output-empty": {"rows": base, "response": response([], id="resp-b")},
        "output-object": {"rows": base, "response": {"output": {"x": 1}}},
        "output-no-assistant": {"rows": base, "response": response(result)},
        "output-unfingerprintable": {
            "rows": base,
            "response": response([{"role": "assistant", "content": {"x": 1}}]),
        },
        "output-with-non-object": {"rows": base, "response": response(["junk", *out1])},
        "output-untyped-part": {
            "rows": base,
            "response": response([{"role": "assistant", "content": [{"text": "answer 1"}]}]),
        },
        "content-ambiguous": {
            "rows": [*base, row("d", "a", output_fingerprint=af(out1), fingerprint_version=2)],
            "response": response(out1),
        },
        "content-twin": {"rows": [*base, twin], "response": response(out1)},
        "fingerprint-version-1": {"rows": [v1], "response": response(out1)},
        "no-rows": {"rows": [], "response": response(out1, id="resp-b")},
        "everything": {
            "rows": [*base, twin],
            "response": response(out1, id="resp-b"),
            "explicit": "b",
            "declared": "resp-b",
        },
    }
    corpus = list(cases.items())
    rng = random.Random(808)
    outputs = [out1, out2, call, call + result + out1, call + out2, result]
    for n in range(60):
        rows = [a, *rng.sample([b, c, twin, other, v1], rng.randint(0, 5))]
        case = {
            "rows": rows,
            "response": response(
                rng.choice(outputs),
                **(
                    {"id": rng.choice(["resp-a", "resp-b", "resp-c", "resp-x"])}
                    if rng.random() < 0.6
                    else {}
                ),
            ),
        }
        if rng.random() < 0.2:
            case["explicit"] = rng.choice(["a", "b", "c", "z"])
        if rng.random() < 0.2:
            case["declared"] = rng.choice(["resp-a", "resp-b", "resp-x"])
        corpus.append((f"random-{n}", case))
    return corpus


DIFFERENCES["resolve"] = {
    # A response id that is not a string: NeMo Gym matches str(id); rollcap has no id.
    "id-int": (
        {"terminal": "n", "method": "response_id", "reason": "response_has_no_output"},
        {"terminal": None, "method": "", "reason": "response_has_no_id,response_has_no_output"},
    ),
    "id-int-no-row": (
        {"terminal": "b", "method": "content", "reason": "response_id_no_match"},
        {"terminal": "b", "method": "content", "reason": "response_has_no_id"},
    ),
    # Output items that are not objects: NeMo Gym drops them; rollcap's fingerprint refuses.
    "output-with-non-object": (
        {"terminal": "b", "method": "content", "reason": "response_has_no_id"},
        {
            "terminal": None,
            "method": "",
            "reason": "response_has_no_id,response_output_unfingerprintable",
        },
    ),
    # An untyped text part (see the fingerprints): NeMo Gym matches it as text.
    "output-untyped-part": (
        {"terminal": "b", "method": "content", "reason": "response_has_no_id"},
        {
            "terminal": None,
            "method": "",
            "reason": "response_has_no_id,response_output_unfingerprintable",
        },
    ),
}


def test_resolve_terminal_agrees(gym: NemoGymProcess) -> None:
    corpus = _resolve_corpus()
    theirs, ours = run_both(gym, "resolve", [case for _, case in corpus])
    compare("resolve", [case for case, _ in corpus], theirs, ours, short=lambda v: v)
    methods = {answer.get("method") for answer in theirs}
    assert methods >= {"declared", "response_id", "content", "explicit", ""}
