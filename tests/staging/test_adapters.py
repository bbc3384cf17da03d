"""Engine adapters (vLLM, Megatron), the engine request fields and the answer's transport fields."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from rollcap.staging._adapters import (
    BACKENDS,
    PREFIX_IDS_FIELD,
    STREAMING_REFUSED,
    CaptureAdapter,
    MegatronCaptureAdapter,
    VLLMCaptureAdapter,
    prepare_engine_request,
    strip_capture_transport_fields,
)
from rollcap.staging._records import CAPTURE_FIELD, COORDS_FIELD

vllm = VLLMCaptureAdapter()
megatron = MegatronCaptureAdapter()

ROUTES = "nrlre1:int16:2x1x2:AwABAAIABQA="
SPANS = [{"modality": "image", "offset": 12, "length": 3, "placeholder_id": 9}]
PROMPT_0E3F = [1, 104, 105, 42, 2, 1, 117, 2, 1, 97, 43, 1, 9, 9, 9, 2]


def answer_0e3f() -> dict[str, Any]:
    """The engine answer of call 0e3f in the contract's generated vectors."""
    return {
        "id": "chatcmpl-3",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "prompt_token_ids": list(PROMPT_0E3F),
        "media_spans": copy.deepcopy(SPANS),
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok", "routed_experts": ROUTES},
                "logprobs": {
                    "content": [
                        {"token": "token_id:44", "logprob": -0.5},
                        {"token": "token_id:2", "logprob": -0.125},
                    ]
                },
            }
        ],
    }


def plain_answer(
    prompt: list[Any], tokens: list[Any], logprobs: list[Any], **top: Any
) -> dict[str, Any]:
    content = [{"token": t, "logprob": lp} for t, lp in zip(tokens, logprobs, strict=True)]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": {"content": content},
                "finish_reason": "stop",
            }
        ],
        **top,
    }


def bundle_answer() -> dict[str, Any]:
    return {
        "id": "chatcmpl-b",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "x",
                    "prompt_token_ids": [5, 6, 7],
                    "generation_token_ids": [8, 9],
                    "generation_log_probs": [-0.25, -1.0],
                },
                # Different ids here: the bundle must win over them.
                "logprobs": {"content": [{"token": "token_id:100", "logprob": -3.0}]},
                "token_ids": [100],
            }
        ],
        "prompt_token_ids": [100, 101],
    }


# --- the protocol -------------------------------------------------------------------------------


def test_both_adapters_satisfy_the_protocol() -> None:
    adapters: list[CaptureAdapter] = [vllm, megatron]
    assert len(adapters) == 2


@pytest.mark.parametrize("adapter", [vllm, megatron])
def test_enter_prefix_sets_the_key_in_place(adapter: CaptureAdapter) -> None:
    request: dict[str, Any] = {"model": "m", PREFIX_IDS_FIELD: [0]}
    result = adapter.enter_prefix(request, (4, 5, 6))
    assert result is request
    assert request == {"model": "m", PREFIX_IDS_FIELD: [4, 5, 6]}
    assert type(request[PREFIX_IDS_FIELD]) is list
    assert adapter.enter_prefix({}, iter([])) == {PREFIX_IDS_FIELD: []}


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        ([1, -2], ValueError, r"prefix_ids\[1\] is -2"),
        ([1, True], TypeError, r"prefix_ids\[1\] must be an int, not bool"),
        (["3"], TypeError, "must be an int, not str"),
        ([3.0], TypeError, "must be an int, not float"),
    ],
)
def test_enter_prefix_refuses_bad_ids_and_leaves_the_request(
    ids: list[Any], error: type[Exception], match: str
) -> None:
    request: dict[str, Any] = {"model": "m"}
    with pytest.raises(error, match=match):
        vllm.enter_prefix(request, ids)
    assert request == {"model": "m"}


def test_enter_prefix_needs_a_mutable_mapping() -> None:
    with pytest.raises(TypeError, match="mutable mapping"):
        vllm.enter_prefix((), [1])  # type: ignore[type-var]


# --- vLLM: the contract's 0e3f answer -----------------------------------------------------------


def test_vllm_reads_the_0e3f_answer() -> None:
    answer = answer_0e3f()
    before = copy.deepcopy(answer)
    assert vllm.extract_prompt_ids(answer) == PROMPT_0E3F
    assert vllm.extract_generation(answer) == ([44, 2], [-0.5, -0.125])
    extras = vllm.extract_extras(answer)
    assert extras == {"routed_experts": ROUTES, "media_spans": SPANS}
    assert extras is not None
    assert list(extras) == ["routed_experts", "media_spans"]
    assert answer == before


def test_vllm_extras_none_when_neither_is_there() -> None:
    answer = plain_answer([1, 2], ["token_id:3"], [-0.5])
    assert vllm.extract_extras(answer) is None
    # A null routed_experts counts as absent.
    answer["choices"][0]["message"]["routed_experts"] = None
    assert vllm.extract_extras(answer) is None
    # So does routed_experts anywhere but the message.
    answer["routed_experts"] = ROUTES
    answer["choices"][0]["routed_experts"] = ROUTES
    assert vllm.extract_extras(answer) is None
    assert vllm.extract_extras({}) is None


def test_vllm_extras_each_alone() -> None:
    answer = plain_answer([1], ["token_id:3"], [-0.5], media_spans=[])
    assert vllm.extract_extras(answer) == {"media_spans": []}
    answer = plain_answer([1], ["token_id:3"], [-0.5])
    answer["choices"][0]["message"]["routed_experts"] = [[[1, 2]]]
    assert vllm.extract_extras(answer) == {"routed_experts": [[[1, 2]]]}
    answer["choices"][0]["message"]["routed_experts"] = {"format": "other"}
    assert vllm.extract_extras(answer) == {"routed_experts": {"format": "other"}}


def test_vllm_extras_keep_routes_as_found() -> None:
    answer = plain_answer([1], ["token_id:3"], [-0.5])
    # Not an envelope at all: kept as found; the adapter never decodes it.
    answer["choices"][0]["message"]["routed_experts"] = "not-an-envelope"
    assert vllm.extract_extras(answer) == {"routed_experts": "not-an-envelope"}


@pytest.mark.parametrize(
    ("where", "value", "error", "match"),
    [
        ("routed", 7, TypeError, "routed_experts must be a string, object or list, not int"),
        ("routed", True, TypeError, "not bool"),
        ("routed", (1, 2), TypeError, "not tuple"),
        ("spans", None, TypeError, "media_spans must be a list of objects, not null"),
        ("spans", {"offset": 1}, TypeError, "not dict"),
        ("spans", [{"offset": 1}, 3], TypeError, r"media_spans\[1\] must be an object, not int"),
        ("spans", ["image"], TypeError, r"media_spans\[0\] must be an object, not str"),
    ],
)
def test_vllm_extras_refuse(where: str, value: Any, error: type[Exception], match: str) -> None:
    answer = plain_answer([1], ["token_id:3"], [-0.5])
    if where == "routed":
        answer["choices"][0]["message"]["routed_experts"] = value
    else:
        answer["media_spans"] = value
    with pytest.raises(error, match=match):
        vllm.extract_extras(answer)


# --- vLLM: prompt ids ---------------------------------------------------------------------------


def test_vllm_prompt_ids_top_level_then_message() -> None:
    answer = plain_answer([1, 2, 3], ["token_id:4"], [-1.0])
    assert vllm.extract_prompt_ids(answer) == [1, 2, 3]
    answer["choices"][0]["message"]["prompt_token_ids"] = [9]
    assert vllm.extract_prompt_ids(answer) == [1, 2, 3]  # top level first
    answer["prompt_token_ids"] = None
    assert vllm.extract_prompt_ids(answer) == [9]  # null counts as absent
    del answer["prompt_token_ids"]
    assert vllm.extract_prompt_ids(answer) == [9]


def test_vllm_prompt_ids_top_level_needs_no_choices() -> None:
    assert vllm.extract_prompt_ids({"prompt_token_ids": [1, 2]}) == [1, 2]
    assert vllm.extract_prompt_ids({"prompt_token_ids": [], "choices": "junk"}) == []


def test_vllm_prompt_ids_through_int() -> None:
    answer = plain_answer([1, "2", 3.0, "0"], [], [])
    assert vllm.extract_prompt_ids(answer) == [1, 2, 3, 0]
    assert all(type(x) is int for x in vllm.extract_prompt_ids(answer))


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        ([1, True], TypeError, r"prompt_token_ids\[1\] is a bool"),
        ([1, -1], ValueError, r"prompt_token_ids\[1\] is -1; token ids are >= 0"),
        (["-1"], ValueError, r"prompt_token_ids\[0\] is '-1', not a decimal token id"),
        ([2.5], ValueError, r"prompt_token_ids\[0\] is 2.5, not an integral token id"),
        ([float("nan")], ValueError, "not an integral token id"),
        ([float("inf")], ValueError, "not an integral token id"),
        ([-3.0], ValueError, "is -3; token ids are >= 0"),
        (["+5"], ValueError, "not a decimal token id"),
        ([" 5"], ValueError, "not a decimal token id"),
        (["5_0"], ValueError, "not a decimal token id"),
        (["token_id:5"], ValueError, "not a decimal token id"),
        (["\u0665"], ValueError, "not a decimal token id"),
        ([None], TypeError, r"prompt_token_ids\[0\] must be an int or a numeric string"),
        ([[1]], TypeError, "must be an int or a numeric string, not list"),
    ],
)
def test_vllm_prompt_ids_refuse_coercions(
    ids: list[Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        vllm.extract_prompt_ids(plain_answer(ids, [], []))


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ("not a list", TypeError, "prompt_token_ids must be a list, not str"),
        ("missing", ValueError, "has no prompt_token_ids"),
        ("missing, message null", TypeError, "choices[0].message must be an object, not null"),
        ("missing, message absent", ValueError, "has no prompt_token_ids"),
        ("missing, two choices", ValueError, "exactly one choice (choices: 2)"),
        ("missing, no choices", ValueError, "exactly one choice (choices: null)"),
        ("missing, choice not an object", TypeError, "choices[0] must be an object, not str"),
        ("message ids not a list", TypeError, "choices[0].message.prompt_token_ids must be a"),
    ],
)
def test_vllm_prompt_ids_errors(change: str, error: type[Exception], match: str) -> None:
    answer = plain_answer([1], ["token_id:2"], [-1.0])
    choices = answer["choices"]
    if change == "not a list":
        answer["prompt_token_ids"] = "1 2"
    else:
        del answer["prompt_token_ids"]
    if change == "missing, message null":
        choices[0]["message"] = None
    elif change == "missing, message absent":
        del choices[0]["message"]
    elif change == "missing, two choices":
        choices[0]["message"]["prompt_token_ids"] = [1]
        choices.append(copy.deepcopy(choices[0]))
    elif change == "missing, no choices":
        del answer["choices"]
    elif change == "missing, choice not an object":
        choices[0] = "choice"
    elif change == "message ids not a list":
        choices[0]["message"]["prompt_token_ids"] = {"ids": [1]}
    with pytest.raises(error, match=_literal(match)):
        vllm.extract_prompt_ids(answer)


def _literal(text: str) -> str:
    return text.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")


def test_vllm_answer_must_be_an_object() -> None:
    for method in (vllm.extract_prompt_ids, vllm.extract_generation, vllm.extract_extras):
        with pytest.raises(TypeError, match="must be a JSON object, not list"):
            method([])  # type: ignore[arg-type]


# --- vLLM: generation ---------------------------------------------------------------------------


def test_vllm_generation_from_logprobs_content() -> None:
    answer = plain_answer([1], ["token_id:70000", "3", 4, "token_id:0"], [-0.125, -2, "-0.5", 0])
    ids, logprobs = vllm.extract_generation(answer)
    assert ids == [70000, 3, 4, 0]
    assert logprobs == [-0.125, -2.0, -0.5, 0.0]
    assert all(type(x) is float for x in logprobs)


def test_vllm_generation_ignores_choice_token_ids() -> None:
    answer = plain_answer([1], ["token_id:7", "token_id:8"], [-0.5, -1.0])
    answer["choices"][0]["token_ids"] = [70, 80, 90]
    assert vllm.extract_generation(answer) == ([7, 8], [-0.5, -1.0])
    del answer["choices"][0]["logprobs"]
    with pytest.raises(ValueError, match=r"choices\[0\]\.logprobs is null"):
        vllm.extract_generation(answer)


def test_vllm_empty_generation() -> None:
    assert vllm.extract_generation(plain_answer([1], [], [])) == ([], [])


def test_vllm_reads_choice_zero() -> None:
    answer = plain_answer([1], ["token_id:7"], [-0.5])
    second = copy.deepcopy(answer["choices"][0])
    second["logprobs"]["content"][0]["token"] = "token_id:8"
    answer["choices"].append(second)
    assert vllm.extract_generation(answer) == ([7], [-0.5])


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ("logprobs null", ValueError, "choices[0].logprobs is null, not an object"),
        ("content null", ValueError, "choices[0].logprobs.content must be a list, not null"),
        ("content absent", ValueError, "choices[0].logprobs.content must be a list, not null"),
        ("entry not an object", TypeError, "choices[0].logprobs.content[1] must be an object"),
        ("no token", ValueError, "choices[0].logprobs.content[1] has no token"),
        ("no logprob", ValueError, "choices[0].logprobs.content[1] has no logprob"),
        ("text token", ValueError, "choices[0].logprobs.content[3].token is 'hello', not"),
        ("negative token", ValueError, "choices[0].logprobs.content[3].token is 'token_id:-4'"),
        ("negative int token", ValueError, "choices[0].logprobs.content[3].token is '-4'"),
        ("bool token", TypeError, "choices[0].logprobs.content[3].token is a bool"),
        ("float token", TypeError, "content[3].token must be a string or an int, not float"),
        ("empty id", ValueError, "content[3].token is 'token_id:', not"),
        ("null logprob", TypeError, "choices[0].logprobs.content[2].logprob must be a number"),
        ("bool logprob", TypeError, "choices[0].logprobs.content[2].logprob is a bool"),
        ("nan logprob", ValueError, "content[2].logprob is nan; logprobs must be finite"),
        ("inf string logprob", ValueError, "content[2].logprob is -inf; logprobs must be"),
        ("word logprob", ValueError, "content[2].logprob is 'low', not a float64 number"),
        ("huge logprob", ValueError, "not a float64 number"),
        ("no choices", ValueError, "choices must be a list, not null"),
        ("empty choices", ValueError, "choices is empty"),
        ("choice not an object", TypeError, "choices[0] must be an object, not int"),
    ],
)
def test_vllm_generation_errors(change: str, error: type[Exception], match: str) -> None:
    answer = plain_answer([1], ["token_id:1", "token_id:2", "token_id:3", "token_id:4"], [-1] * 4)
    choice = answer["choices"][0]
    content = choice["logprobs"]["content"]
    edits: dict[str, Any] = {
        "logprobs null": lambda: choice.update(logprobs=None),
        "content null": lambda: choice["logprobs"].update(content=None),
        "content absent": lambda: choice.update(logprobs={}),
        "entry not an object": lambda: content.__setitem__(1, "token_id:2"),
        "no token": lambda: content[1].pop("token"),
        "no logprob": lambda: content[1].pop("logprob"),
        "text token": lambda: content[3].update(token="hello"),
        "negative token": lambda: content[3].update(token="token_id:-4"),
        "negative int token": lambda: content[3].update(token=-4),
        "bool token": lambda: content[3].update(token=True),
        "float token": lambda: content[3].update(token=4.0),
        "empty id": lambda: content[3].update(token="token_id:"),
        "null logprob": lambda: content[2].update(logprob=None),
        "bool logprob": lambda: content[2].update(logprob=False),
        "nan logprob": lambda: content[2].update(logprob=float("nan")),
        "inf string logprob": lambda: content[2].update(logprob="-inf"),
        "word logprob": lambda: content[2].update(logprob="low"),
        "huge logprob": lambda: content[2].update(logprob=10**400),
        "no choices": lambda: answer.pop("choices"),
        "empty choices": lambda: answer.update(choices=[]),
        "choice not an object": lambda: answer.update(choices=[3]),
    }
    edits[change]()
    with pytest.raises(error, match=_literal(match)):
        vllm.extract_generation(answer)


# --- vLLM: the message-level bundle -------------------------------------------------------------


def test_vllm_bundle_generation_is_read_first_and_the_top_level_prompt_wins() -> None:
    # As 0.7.0's released adapter reads it (tests/staging/test_nemo_gym_differential.py).
    answer = bundle_answer()
    assert vllm.extract_prompt_ids(answer) == [100, 101]
    assert vllm.extract_generation(answer) == ([8, 9], [-0.25, -1.0])
    assert vllm.extract_extras(answer) is None


def test_vllm_generation_bundle_needs_both_keys() -> None:
    answer = bundle_answer()
    del answer["choices"][0]["message"]["generation_log_probs"]
    # Without both generation keys there is no bundle: logprobs.content and the top level.
    assert vllm.extract_generation(answer) == ([100], [-3.0])
    assert vllm.extract_prompt_ids(answer) == [100, 101]


def test_vllm_bundle_with_a_null_prompt_falls_back() -> None:
    answer = bundle_answer()
    answer["choices"][0]["message"]["prompt_token_ids"] = None
    assert vllm.extract_prompt_ids(answer) == [100, 101]
    assert vllm.extract_generation(answer) == ([8, 9], [-0.25, -1.0])


def test_vllm_bundle_without_top_level_ids() -> None:
    answer = bundle_answer()
    del answer["prompt_token_ids"]
    del answer["choices"][0]["logprobs"]
    assert vllm.extract_prompt_ids(answer) == [5, 6, 7]
    assert vllm.extract_generation(answer) == ([8, 9], [-0.25, -1.0])


def test_vllm_bundle_values_through_int_and_float() -> None:
    answer = bundle_answer()
    message = answer["choices"][0]["message"]
    message["generation_token_ids"] = ["8", 9.0]
    message["generation_log_probs"] = [-1, "-0.5"]
    assert vllm.extract_generation(answer) == ([8, 9], [-1.0, -0.5])


M = "choices[0].message"


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [
        (
            "generation_token_ids",
            None,
            TypeError,
            f"{M}.generation_token_ids must be a list, not null",
        ),
        (
            "generation_log_probs",
            None,
            TypeError,
            f"{M}.generation_log_probs must be a list, not null",
        ),
        (
            "generation_token_ids",
            [8],
            ValueError,
            f"{M} has 1 generation_token_ids but 2 generation",
        ),
        ("generation_token_ids", [8, False], TypeError, f"{M}.generation_token_ids[1] is a bool"),
        ("generation_token_ids", [8, -9], ValueError, f"{M}.generation_token_ids[1] is -9"),
        ("generation_log_probs", [-1.0, True], TypeError, f"{M}.generation_log_probs[1] is a bool"),
        ("generation_log_probs", [-1.0, "x"], ValueError, f"{M}.generation_log_probs[1] is 'x'"),
    ],
)
def test_vllm_bundle_errors(key: str, value: Any, error: type[Exception], match: str) -> None:
    answer = bundle_answer()
    answer["choices"][0]["message"][key] = value
    method = vllm.extract_prompt_ids if key == "prompt_token_ids" else vllm.extract_generation
    with pytest.raises(error, match=_literal(match)):
        method(answer)


# --- vLLM: an answer from rollcap's fake engine --------------------------------------------------


def test_vllm_reads_the_fake_engine_answer() -> None:
    testing = pytest.importorskip("rollcap.testing")
    messages = [{"role": "user", "content": "hello"}]
    body = {
        "model": "text",
        "messages": messages,
        # The fake engine returns ids only when asked for return_token_ids (a vLLM flag);
        # prepare_engine_request asks for the rest.
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    answer = testing.expected_response("chat", body)
    generated = answer["choices"][0]["token_ids"]
    assert vllm.extract_prompt_ids(answer) == testing.render_prompt(messages)
    ids, logprobs = vllm.extract_generation(answer)
    assert ids == generated
    assert logprobs == [testing.fake_logprob(t, i) for i, t in enumerate(generated)]
    assert vllm.extract_extras(answer) is None
    stripped = strip_capture_transport_fields(answer)
    assert "prompt_token_ids" not in stripped
    assert "token_ids" not in stripped["choices"][0]
    assert "logprobs" not in stripped["choices"][0]


# --- Megatron -----------------------------------------------------------------------------------


@dataclass
class OffloadedPayload:
    prompt_token_ids: Any = field(default_factory=lambda: [1, 2, 3])
    generated_token_ids: Any = field(default_factory=lambda: [4, 5])
    generated_log_probs: Any = field(default_factory=lambda: [-0.5, -1])


def test_megatron_reads_an_object_and_a_mapping() -> None:
    for payload in (OffloadedPayload(), vars(OffloadedPayload())):
        assert megatron.extract_prompt_ids(payload) == [1, 2, 3]
        ids, logprobs = megatron.extract_generation(payload)
        assert (ids, logprobs) == ([4, 5], [-0.5, -1.0])
        assert all(type(x) is float for x in logprobs)
        assert megatron.extract_extras(payload) is None


def test_megatron_takes_any_non_string_sequence() -> None:
    payload = OffloadedPayload(prompt_token_ids=(1, 2), generated_token_ids=range(3, 5))
    assert megatron.extract_prompt_ids(payload) == [1, 2]
    assert megatron.extract_generation(payload) == ([3, 4], [-0.5, -1.0])
    assert megatron.extract_generation(vars(OffloadedPayload([], [], []))) == ([], [])


def test_megatron_extras_always_none() -> None:
    payload = {"prompt_token_ids": [1], "routed_experts": [[[1]]], "media_spans": []}
    assert megatron.extract_extras(payload) is None


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("prompt_token_ids", [1, 2.0], TypeError, r"prompt_token_ids\[1\] must be an int, not"),
        ("prompt_token_ids", ["1"], TypeError, "must be an int, not str"),
        ("prompt_token_ids", [True], TypeError, "must be an int, not bool"),
        ("prompt_token_ids", [-1], ValueError, r"prompt_token_ids\[0\] is -1"),
        ("prompt_token_ids", "123", TypeError, "must be a non-string sequence, not str"),
        ("prompt_token_ids", None, TypeError, "must be a non-string sequence, not null"),
        ("prompt_token_ids", {1, 2}, TypeError, "non-string sequence, not set"),
        ("generated_token_ids", [4, 5.0], TypeError, r"generated_token_ids\[1\] must be an int"),
        ("generated_token_ids", b"\x04\x05", TypeError, "non-string sequence, not bytes"),
        ("generated_log_probs", [-0.5, True], TypeError, r"generated_log_probs\[1\] must be a"),
        ("generated_log_probs", [-0.5, "-1"], TypeError, "must be a number, not str"),
        ("generated_log_probs", [-0.5, None], TypeError, "must be a number, not null"),
        ("generated_log_probs", [-0.5, float("-inf")], ValueError, "logprobs must be finite"),
        ("generated_log_probs", [-0.5, 10**400], ValueError, "beyond float64"),
        ("generated_log_probs", [-0.5], ValueError, "2 generated_token_ids but 1 generated_log"),
    ],
)
def test_megatron_refuses(name: str, value: Any, error: type[Exception], match: str) -> None:
    for payload in (OffloadedPayload(**{name: value}), vars(OffloadedPayload(**{name: value}))):
        method = (
            megatron.extract_prompt_ids
            if name == "prompt_token_ids"
            else megatron.extract_generation
        )
        with pytest.raises(error, match=match):
            method(payload)


def test_megatron_missing_fields() -> None:
    with pytest.raises(ValueError, match="the Megatron payload has no 'prompt_token_ids' key"):
        megatron.extract_prompt_ids({})
    with pytest.raises(ValueError, match=r"\(object\) has no generated_token_ids attribute"):
        megatron.extract_generation(object())
    with pytest.raises(ValueError, match="no 'generated_log_probs' key"):
        megatron.extract_generation({"generated_token_ids": []})


# --- prepare_engine_request ---------------------------------------------------------------------

TOKEN_IN = {
    "schema_version": 2,
    "rollout_id": "r1",
    "model_call_id": "2a4ba8c560c94b50b2508d29b2888b7d",
    "parent_call_id": "1f320141da30434288cc5420be1db187",
    "prev_len": 5,
    "mode": "token_in",
    "required_prefix_token_ids": [],
    "staging_chain": ["r1/1f320141da30434288cc5420be1db187"],
    "parent_chain_hash": "0489a3eeb520deb2e49ffd40fdfc94cc0a71b6aaa0c83fff340e99015a9f9608",
}
TEXT = {
    "schema_version": 2,
    "rollout_id": "r1",
    "model_call_id": "1f320141da30434288cc5420be1db187",
    "parent_call_id": None,
    "prev_len": 0,
    "mode": "text",
    "required_prefix_token_ids": [],
    "staging_chain": [],
    "parent_chain_hash": None,
}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_backends() -> None:
    assert BACKENDS == ("vllm_worker", "megatron_worker")


def test_vllm_request_matches_the_observed_key_set() -> None:
    body = copy.deepcopy(BODY)
    request = prepare_engine_request(body, TOKEN_IN)
    assert sorted(request) == [
        "logprobs",
        "messages",
        "model",
        "ng_capture",
        "required_prefix_token_ids",
        "return_tokens_as_token_ids",
        "stream",
        "top_logprobs",
    ]
    assert request[PREFIX_IDS_FIELD] == []
    assert request[CAPTURE_FIELD] == TOKEN_IN
    assert request["stream"] is False
    assert request["logprobs"] is True
    assert request["top_logprobs"] == 0
    assert request["return_tokens_as_token_ids"] is True
    assert body == BODY


def test_vllm_request_copies_the_admission_and_its_prefix() -> None:
    admission = {**copy.deepcopy(TOKEN_IN), "required_prefix_token_ids": [1, 2, 3, 4, 5]}
    request = prepare_engine_request(BODY, admission, backend="vllm_worker")
    assert request[PREFIX_IDS_FIELD] == [1, 2, 3, 4, 5]
    request[CAPTURE_FIELD]["staging_chain"].append("x")
    request[PREFIX_IDS_FIELD].append(6)
    assert admission["staging_chain"] == ["r1/1f320141da30434288cc5420be1db187"]
    assert admission["required_prefix_token_ids"] == [1, 2, 3, 4, 5]


def test_vllm_text_request_has_no_prefix_field() -> None:
    request = prepare_engine_request({**BODY, "logprobs": False, "top_logprobs": 5}, TEXT)
    assert PREFIX_IDS_FIELD not in request
    assert request[CAPTURE_FIELD] == TEXT
    assert request["logprobs"] is True
    assert request["top_logprobs"] == 0


def test_megatron_request() -> None:
    body = {**copy.deepcopy(BODY), "n": 1, "offload_params": {"keep": True}}
    request = prepare_engine_request(body, TOKEN_IN, backend="megatron_worker")
    assert request == {
        **BODY,
        "n": 1,
        "stream": False,
        "offload_params": {"keep": True, "ng_capture": TOKEN_IN},
        "logprobs": True,
        "top_logprobs": 0,
    }
    assert body["offload_params"] == {"keep": True}
    # No prefix ids and no token echo on Megatron, text or token_in.
    request = prepare_engine_request(BODY, TEXT, backend="megatron_worker")
    assert request["offload_params"] == {"ng_capture": TEXT}
    assert PREFIX_IDS_FIELD not in request
    assert "return_tokens_as_token_ids" not in request
    assert prepare_engine_request({**BODY, "n": None}, TEXT, backend="megatron_worker")["n"] is None


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"n": 2}, r"one completion per call \(n is 2\)"),
        ({"n": 0}, "n is 0"),
        ({"n": True}, "n is True"),
        ({"n": 1.0}, "n is 1.0"),
        ({"offload_params": None}, "offload_params must be an object, not null"),
        ({"offload_params": []}, "offload_params must be an object, not list"),
    ],
)
def test_megatron_request_refuses(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        prepare_engine_request({**BODY, **extra}, TEXT, backend="megatron_worker")


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_is_forced_off(backend: str) -> None:
    body = {**BODY, "stream": False, "stream_options": {"include_usage": True}}
    for admission in (None, TEXT):
        request = prepare_engine_request(body, admission, backend=backend)
        assert request["stream"] is False
        assert "stream_options" not in request
    assert "stream_options" in body
    assert (
        prepare_engine_request({**BODY, "stream": None}, None, backend=backend)["stream"] is False
    )


@pytest.mark.parametrize("stream", [True, "true", 1])
@pytest.mark.parametrize("admission", [None, TEXT])
def test_a_streaming_body_is_refused(stream: Any, admission: dict[str, Any] | None) -> None:
    assert STREAMING_REFUSED == "external staging requires non-streaming backend requests"
    with pytest.raises(ValueError, match=STREAMING_REFUSED):
        prepare_engine_request({**BODY, "stream": stream}, admission)


def test_without_admission_only_the_stream_fields_change() -> None:
    body = {**BODY, "logprobs": False, "n": 3, "stream_options": {}}
    for backend in BACKENDS:
        request = prepare_engine_request(body, None, backend=backend)
        assert request == {**BODY, "logprobs": False, "n": 3, "stream": False}
        assert request is not body


@pytest.mark.parametrize(
    ("admission", "backend", "error", "match"),
    [
        (TEXT, "sglang_worker", ValueError, "unknown external staging backend 'sglang_worker'"),
        (None, "vllm", ValueError, "unknown external staging backend"),
        ({**TEXT, "mode": "tokens"}, "vllm_worker", ValueError, "mode must be 'text' or"),
        ({"rollout_id": "r1"}, "vllm_worker", ValueError, "mode must be"),
        (
            {**TOKEN_IN, "required_prefix_token_ids": None},
            "vllm_worker",
            ValueError,
            "required_prefix_token_ids must be a list, not null",
        ),
        ([("mode", "text")], "vllm_worker", TypeError, "admission must be a mapping"),
    ],
)
def test_prepare_engine_request_refuses(
    admission: Any, backend: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        prepare_engine_request(BODY, admission, backend=backend)


def test_prepare_engine_request_needs_a_mapping() -> None:
    with pytest.raises(TypeError, match="body must be a mapping"):
        prepare_engine_request([], None)  # type: ignore[arg-type]


# --- strip_capture_transport_fields -------------------------------------------------------------


def worker_answer() -> dict[str, Any]:
    answer = answer_0e3f()
    answer[COORDS_FIELD] = {"disposition": "staged"}
    answer["unknown_top"] = {"kept": 1}
    choice = answer["choices"][0]
    choice["token_ids"] = [44, 2]
    choice["unknown_choice"] = 1
    choice["message"].update(
        prompt_token_ids=[1],
        generation_token_ids=[44, 2],
        generation_log_probs=[-0.5, -0.125],
        compact_prompt_token_ids=[1],
        tool_calls=[],
    )
    answer["choices"].append({"index": 1, "message": {"role": "assistant", "content": "b"}})
    answer["choices"].append("not a choice")
    return answer


def test_strip_removes_exactly_the_transport_fields() -> None:
    answer = worker_answer()
    before = copy.deepcopy(answer)
    stripped = strip_capture_transport_fields(answer)
    assert stripped == {
        "id": "chatcmpl-3",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "media_spans": SPANS,
        "unknown_top": {"kept": 1},
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok", "tool_calls": []},
                "unknown_choice": 1,
            },
            {"index": 1, "message": {"role": "assistant", "content": "b"}},
            "not a choice",
        ],
    }
    assert answer == before


def test_strip_copies_only_what_it_changes() -> None:
    answer = worker_answer()
    stripped = strip_capture_transport_fields(answer)
    assert stripped is not answer
    assert stripped["media_spans"] is answer["media_spans"]
    assert stripped["unknown_top"] is answer["unknown_top"]
    assert stripped["choices"][1] is answer["choices"][1]
    assert stripped["choices"][0] is not answer["choices"][0]

    clean = {"id": "x", "choices": [{"index": 0, "message": {"content": "a"}}]}
    again = strip_capture_transport_fields(clean)
    assert again == clean
    assert again is not clean
    assert again["choices"] is clean["choices"]


def test_strip_message_only_change() -> None:
    answer: dict[str, Any] = {
        "choices": [{"index": 0, "message": {"content": "a", "routed_experts": ROUTES}}]
    }
    stripped = strip_capture_transport_fields(answer)
    assert stripped == {"choices": [{"index": 0, "message": {"content": "a"}}]}
    assert answer["choices"][0]["message"]["routed_experts"] == ROUTES


def test_strip_tolerates_odd_shapes() -> None:
    assert strip_capture_transport_fields({}) == {}
    assert strip_capture_transport_fields({"choices": None, COORDS_FIELD: 1}) == {"choices": None}
    odd = {"choices": [{"message": None, "logprobs": None}]}
    assert strip_capture_transport_fields(odd) == {"choices": [{"message": None}]}
    with pytest.raises(TypeError, match="the answer must be a mapping"):
        strip_capture_transport_fields([])  # type: ignore[arg-type]
