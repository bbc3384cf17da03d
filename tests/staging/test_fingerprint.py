"""Lineage fingerprints (STAGING §1.3): the §3.6 vectors, each normalization rule checked against
a hash built field by field from the spec, the request envelope, and the property the ledger
relies on: a continuation that replays its parent resolves to it, in every dialect."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcap.staging import _fingerprint as fp
from rollcap.staging._fingerprint import (
    ENVELOPE_ROLE,
    FINGERPRINT_VERSION,
    UnfingerprintableError,
    assistant_fingerprint,
    canonical_arguments,
    canonical_json,
    conversation_digest,
    request_items,
    response_items,
)

# STAGING §3.6, copied here so that a change to either side is seen.
TOOL_CALL_FINGERPRINT = "b1912018fc16afba8b91d2f9ea130916fff31ff2341bbb099753c29486a4f213"
USER_HELLO_DIGEST = "629222a0abb0ebbd9c7576c60c2c7bf1a74d29ffbd64fe3ca782ad738a0b4b83"
TOOL_SUNNY_DIGEST = "07f05705895b5673b1a0a35a5135d4066e59c8c1ebea52d8ba1e9e1ad382bab6"
ANSWER_1_FINGERPRINT = "9291144f4986ae935b19d80da641e2962c49ca5fc07a930541635e65fc0ba242"

ASSISTANT_DOMAIN = b"nemo-gym-lineage"
CONTEXT_DOMAIN = b"nemo-gym-lineage-context"


def spec_hash(domain: bytes, fields: Sequence[tuple[int, str]]) -> str:
    """The spec's hash written out: raw domain, then tag ‖ u64be(len) ‖ utf8 per field."""
    sha = hashlib.sha256(domain)
    for tag, text in fields:
        data = text.encode("utf-8")
        sha.update(bytes((tag,)) + struct.pack(">Q", len(data)) + data)
    return sha.hexdigest()


def assistant_hash(*fields: tuple[int, str]) -> str:
    return spec_hash(ASSISTANT_DOMAIN, fields)


def context_hash(*fields: tuple[int, str]) -> str:
    return spec_hash(CONTEXT_DOMAIN, fields)


# --- §3.6 vectors ---------------------------------------------------------------------------


def test_constants() -> None:
    assert FINGERPRINT_VERSION == 2
    assert ENVELOPE_ROLE == "_ng_request_envelope"
    assert issubclass(UnfingerprintableError, ValueError)


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(
            {
                "type": "function_call",
                "call_id": "call-1",
                "name": "weather",
                "namespace": "functions",
                "arguments": '{"city": "Paris"}',
            },
            id="responses-function-call-namespace",
        ),
        pytest.param(
            {
                "type": "function_call",
                "call_id": "call-1",
                "name": "weather",
                "namespace": "functions",
                "arguments": {"city": "Paris"},
            },
            id="responses-function-call-object-arguments",
        ),
        pytest.param(
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
            },
            id="chat-tool-calls",
        ),
        pytest.param(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call-1",
                        "name": "functions__weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            id="anthropic-tool-use",
        ),
    ],
)
def test_tool_call_vector(item: dict[str, Any]) -> None:
    assert assistant_fingerprint([item]) == TOOL_CALL_FINGERPRINT


def test_tool_call_vector_through_the_messages_mapping() -> None:
    request = {
        "messages": [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call-1",
                        "name": "functions__weather",
                        "input": {"city": "Paris"},
                    }
                ],
            }
        ]
    }
    items = request_items("messages", request)
    assert items == [
        {
            "type": "function_call",
            "call_id": "call-1",
            "name": "functions__weather",
            "arguments": {"city": "Paris"},
        }
    ]
    assert assistant_fingerprint(items) == TOOL_CALL_FINGERPRINT


def test_tool_call_vector_is_the_spec_hash() -> None:
    expected = assistant_hash((2, "call-1"), (3, "functions__weather"), (4, '{"city":"Paris"}'))
    assert expected == TOOL_CALL_FINGERPRINT


def test_conversation_digest_vectors() -> None:
    assert conversation_digest([{"role": "user", "content": "hello"}]) == USER_HELLO_DIGEST
    tool = {"role": "tool", "tool_call_id": "call-1", "content": "sunny"}
    assert conversation_digest([tool]) == TOOL_SUNNY_DIGEST


def test_role_tool_is_hashed_as_content_and_as_result() -> None:
    fields = ((0, "tool"), (1, "text"), (2, "sunny"), (6, "call-1"), (7, "sunny"))
    assert context_hash(*fields) == TOOL_SUNNY_DIGEST
    structured = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "ok"}]}
    assert conversation_digest([structured]) == context_hash(
        (0, "tool"), (1, "text"), (2, "ok"), (6, "c"), (7, '[{"text":"ok","type":"text"}]')
    )


def test_output_text_vector() -> None:
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "answer 1", "annotations": []}],
    }
    assert assistant_fingerprint([message]) == ANSWER_1_FINGERPRINT
    assert assistant_hash((0, "text"), (1, "answer 1")) == ANSWER_1_FINGERPRINT


# --- normalization --------------------------------------------------------------------------


def test_no_assistant_authored_item_has_no_fingerprint() -> None:
    assert assistant_fingerprint([]) == ""
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    assert assistant_fingerprint(items) == ""


def test_an_assistant_item_without_content_still_counts() -> None:
    # Authorship, not contribution, decides between "" and a fingerprint.
    assert assistant_fingerprint([{"role": "assistant", "content": ""}]) == assistant_hash()
    assert conversation_digest([]) == context_hash()


def test_empty_strings_are_skipped() -> None:
    item = {
        "role": "assistant",
        "content": ["", {"type": "text", "text": ""}, {"type": "output_text", "text": "a"}, "b"],
    }
    assert assistant_fingerprint([item]) == assistant_hash(
        (0, "text"), (1, "a"), (0, "text"), (1, "b")
    )
    assert assistant_fingerprint([{"role": "assistant", "content": ""}]) == assistant_hash()


@pytest.mark.parametrize("ctype", ["", "text", "input_text", "output_text"])
def test_text_part_types(ctype: str) -> None:
    item = {"role": "user", "content": [{"type": ctype, "text": "hi", "extra": 1}]}
    assert conversation_digest([item]) == context_hash((0, "user"), (1, "text"), (2, "hi"))


def test_other_typed_parts_are_canonical_json() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:x"}, "détail": "é"}
    item = {"role": "assistant", "content": [image]}
    payload = '{"détail":"é","image_url":{"url":"data:x"},"type":"image_url"}'
    assert assistant_fingerprint([item]) == assistant_hash((0, "image_url"), (1, payload))
    # A text type whose text is not a string is no text part.
    odd = {"role": "assistant", "content": [{"type": "text", "text": None}]}
    assert assistant_fingerprint([odd]) == assistant_hash(
        (0, "text"), (1, '{"text":null,"type":"text"}')
    )


def test_tool_blocks_are_not_content() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "r"}],
    }
    assistant = {"role": "assistant", "content": [{"type": "text", "text": "calling"}, use]}
    user = {"role": "user", "content": [result, "thanks"]}
    assert assistant_fingerprint([assistant, user]) == assistant_hash(
        (0, "text"), (1, "calling"), (2, "t1"), (3, "f"), (4, '{"x":1}')
    )
    assert conversation_digest([assistant, user]) == context_hash(
        (0, "assistant"),
        (1, "text"),
        (2, "calling"),
        (3, "t1"),
        (4, "f"),
        (5, '{"x":1}'),
        (0, "user"),
        (1, "text"),
        (2, "thanks"),
        (6, "t1"),
        (7, '[{"text":"r","type":"text"}]'),
    )


def test_function_call_ids_and_outputs() -> None:
    by_id = {"type": "function_call", "id": "fc_1", "name": "f", "arguments": None}
    assert assistant_fingerprint([by_id]) == assistant_hash((2, "fc_1"), (3, "f"), (4, ""))
    anonymous = {"type": "function_call", "name": "f"}
    assert assistant_fingerprint([anonymous]) == assistant_hash((2, ""), (3, "f"), (4, ""))
    output = {"type": "function_call_output", "call_id": "c", "output": {"t": 20, "s": "ok"}}
    assert conversation_digest([output]) == context_hash(
        (0, "function_call_output"), (6, "c"), (7, '{"s":"ok","t":20}')
    )
    blank = {"type": "function_call_output", "id": "o1", "output": "x"}
    assert conversation_digest([blank]) == context_hash(
        (0, "function_call_output"), (6, "o1"), (7, "x")
    )


def test_kind_falls_back_from_role_to_type_to_empty() -> None:
    assert conversation_digest([{"content": "x"}]) == context_hash((0, ""), (1, "text"), (2, "x"))
    assert conversation_digest([{"type": "reasoning"}]) == context_hash((0, "reasoning"))


@pytest.mark.parametrize(
    ("arguments", "canonical"),
    [
        (None, ""),
        ('{"b": 1, "a": [1, 2.5]}', '{"a":[1,2.5],"b":1}'),
        ('  {"city":\n "Paris"}  ', '{"city":"Paris"}'),
        ('{"c": "\\u00e9"}', '{"c":"é"}'),
        ('"quoted"', '"quoted"'),
        ("  not json ", "not json"),
        ("", ""),
        ({"b": True, "a": None}, '{"a":null,"b":true}'),
        ([3, "x"], '[3,"x"]'),
        (7, "7"),
    ],
)
def test_canonical_arguments(arguments: Any, canonical: str) -> None:
    assert canonical_arguments(arguments) == canonical


def test_non_json_argument_strings_are_stripped_in_the_fingerprint() -> None:
    def call(arguments: str) -> dict[str, Any]:
        return {"type": "function_call", "call_id": "c", "name": "f", "arguments": arguments}

    assert assistant_fingerprint([call(" f(x) \n")]) == assistant_fingerprint([call("f(x)")])
    assert assistant_fingerprint([call("f(x)")]) == assistant_hash((2, "c"), (3, "f"), (4, "f(x)"))


# Lone surrogates are not text orjson reads; a client could not send them either.
_text = st.text(st.characters(exclude_categories=["Cs"]))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_arguments_match_however_the_client_spells_them(value: Any) -> None:
    compact = json.dumps(value, separators=(",", ":"))
    spaced = json.dumps(value, indent=2, ensure_ascii=False)
    # As strings they are parsed; as a value (the Messages `input`) written directly.
    assert canonical_arguments(compact) == canonical_arguments(spaced) == canonical_json(value)


@pytest.mark.parametrize(
    ("items", "where"),
    [
        pytest.param([{"role": "assistant", "content": [{"text": "x"}]}], "item 0", id="untyped"),
        pytest.param(
            [{"role": "user", "content": "ok"}, {"role": "user", "content": [{"type": 3}]}],
            "item 1",
            id="non-string-type",
        ),
        pytest.param([{"role": "assistant", "content": {"type": "text"}}], "item 0", id="dict"),
        pytest.param([{"role": "assistant", "content": 5}], "item 0", id="number"),
        pytest.param([{"role": "assistant", "content": [None]}], "item 0", id="null-part"),
        pytest.param(["hello"], "item 0", id="non-object-item"),
        pytest.param(
            [{"role": "assistant", "tool_calls": ["call"]}], "tool_calls[0]", id="tool-call"
        ),
        pytest.param(
            [{"type": "function_call", "call_id": 5, "name": "f"}], "call_id", id="int-call-id"
        ),
        pytest.param(
            [{"type": "function_call", "name": "f", "arguments": {1: 2}}],
            "arguments",
            id="non-json-arguments",
        ),
    ],
)
def test_unfingerprintable(items: list[Any], where: str) -> None:
    with pytest.raises(UnfingerprintableError, match=re.escape(where)):
        conversation_digest(items)


def test_an_untyped_object_fails_the_fingerprint_of_an_assistant_item() -> None:
    with pytest.raises(UnfingerprintableError, match=r"item 1\.content\[0\]"):
        assistant_fingerprint(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"x": 1}]}]
        )


# --- request items and the envelope ---------------------------------------------------------


def test_envelope_item_is_stdlib_json() -> None:
    tools = [{"type": "function", "name": "météo", "parameters": {"type": "object"}}]
    items = request_items("responses", {"instructions": "Réponds.", "tools": tools, "input": "q"})
    expected = (
        '{"instructions": "R\\u00e9ponds.", "tools": [{"name": "m\\u00e9t\\u00e9o", '
        '"parameters": {"type": "object"}, "type": "function"}]}'
    )
    assert items == [
        {"role": ENVELOPE_ROLE, "content": expected},
        {"role": "user", "content": "q"},
    ]
    assert expected == json.dumps({"instructions": "Réponds.", "tools": tools}, sort_keys=True)


def test_envelope_presence_per_dialect() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert request_items("chat", {"messages": messages}) == messages
    assert request_items("chat", {"messages": messages, "tools": []}) == messages
    with_tools = request_items("chat", {"messages": messages, "tools": [{"type": "function"}]})
    assert with_tools[0] == {
        "role": ENVELOPE_ROLE,
        "content": '{"instructions": null, "tools": [{"type": "function"}]}',
    }
    assert with_tools[1:] == messages
    assert request_items("responses", {"input": "q", "instructions": ""}) == [messages[1]]
    system = request_items("messages", {"system": "Be brief.", "messages": [messages[1]]})
    assert system == [
        {"role": ENVELOPE_ROLE, "content": '{"instructions": "Be brief.", "tools": null}'},
        messages[1],
    ]
    blocks = [{"type": "text", "text": "Be brief."}]
    assert request_items("messages", {"system": blocks, "messages": []}) == [
        {
            "role": ENVELOPE_ROLE,
            "content": '{"instructions": [{"text": "Be brief.", "type": "text"}], "tools": null}',
        }
    ]


def test_envelope_writes_other_values_with_str() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    items = request_items("responses", {"input": [], "tools": [Opaque()]})
    assert items == [
        {"role": ENVELOPE_ROLE, "content": '{"instructions": null, "tools": ["opaque"]}'}
    ]


def test_envelope_changes_the_context_digest_only() -> None:
    base = {"input": [{"role": "user", "content": "q"}]}
    plain = request_items("responses", base)
    briefed = request_items("responses", {**base, "instructions": "Be brief."})
    assert conversation_digest(plain) != conversation_digest(briefed)
    assert assistant_fingerprint(plain) == assistant_fingerprint(briefed) == ""


def test_request_items_are_plain_dicts() -> None:
    part = MappingProxyType({"type": "input_text", "text": "q"})
    request = MappingProxyType({"input": (MappingProxyType({"role": "user", "content": (part,)}),)})
    items = request_items("responses", request)
    assert items == [{"role": "user", "content": [{"type": "input_text", "text": "q"}]}]
    assert type(items[0]) is dict
    assert type(items[0]["content"][0]) is dict


def test_request_items_refusals() -> None:
    with pytest.raises(ValueError, match="dialect"):
        request_items("completions", {"prompt": "q"})
    with pytest.raises(ValueError, match="dialect"):
        response_items("completions", {})
    with pytest.raises(UnfingerprintableError, match=r"messages\[1\]"):
        request_items("chat", {"messages": [{"role": "user", "content": "q"}, "oops"]})
    with pytest.raises(UnfingerprintableError, match="input"):
        request_items("responses", {"input": {"role": "user"}})
    with pytest.raises(UnfingerprintableError, match=r"messages\[0\]"):
        request_items("messages", {"messages": [None]})


def test_messages_mapping_keeps_block_order() -> None:
    thinking = {"type": "thinking", "thinking": "plan", "signature": "sig"}
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    text = {"type": "text", "text": "Checking.", "citations": None}
    image = {"type": "image", "source": {"type": "base64", "data": "AA=="}}
    use = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    request = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [thinking, redacted, text, image, use]},
            {"role": "user", "content": [result, {"type": "text", "text": "and Lyon?"}]},
        ]
    }
    assert request_items("messages", request) == [
        {"role": "user", "content": "q"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "plan"}],
            "encrypted_content": "sig",
        },
        {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
        {"role": "assistant", "content": [text, image]},
        {
            "type": "function_call",
            "call_id": "toolu_1",
            "name": "weather",
            "arguments": {"city": "Paris"},
        },
        {"type": "function_call_output", "call_id": "toolu_1", "output": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "and Lyon?"}]},
    ]
    assert request_items("messages", {"messages": [{"role": "user", "content": []}]}) == [
        {"role": "user", "content": []}
    ]


def test_reasoning_items_are_not_assistant_authored() -> None:
    answer = {"content": [{"type": "thinking", "thinking": "plan", "signature": "s"}]}
    items = response_items("messages", answer)
    assert items == [
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "plan"}],
            "encrypted_content": "s",
        }
    ]
    assert assistant_fingerprint(items) == ""


# --- response items -------------------------------------------------------------------------

TOKEN_FIELDS = {
    "prompt_token_ids": [1, 2],
    "generation_token_ids": [3],
    "generation_log_probs": [-0.5],
    "routed_experts": [[0, 1]],
}


def test_response_items_drop_token_fields() -> None:
    chat = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", **TOKEN_FIELDS},
                "finish_reason": "stop",
            },
            {"index": 1, "message": {"content": "there", "tool_calls": None}},
        ]
    }
    assert response_items("chat", chat) == [
        {"role": "assistant", "content": "hi"},
        {"role": "assistant", "content": "there", "tool_calls": None},
    ]
    output_item = {"type": "message", "role": "assistant", "content": [], **TOKEN_FIELDS}
    responses = {"output": [output_item], **TOKEN_FIELDS}
    assert response_items("responses", responses) == [
        {"type": "message", "role": "assistant", "content": []}
    ]
    messages = {"content": [{"type": "text", "text": "hi"}], **TOKEN_FIELDS}
    assert response_items("messages", messages) == [
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}
    ]


def test_response_items_refusals() -> None:
    with pytest.raises(UnfingerprintableError, match="output"):
        response_items("responses", {"output": "text"})
    with pytest.raises(UnfingerprintableError, match=r"choices\[0\]\.message"):
        response_items("chat", {"choices": [{"message": "hi"}]})
    assert response_items("responses", {"output": None}) == []


def test_a_messages_answer_maps_as_its_replay() -> None:
    content = [
        {"type": "thinking", "thinking": "plan", "signature": "s"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ]
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "content": content}
    replay = {"messages": [{"role": "assistant", "content": content}]}
    assert response_items("messages", answer) == request_items("messages", replay)


# --- the continuation property --------------------------------------------------------------


def assert_resolves(
    dialect: str,
    parent: Mapping[str, Any],
    answer: Mapping[str, Any],
    child: Mapping[str, Any],
) -> None:
    """The ledger's match (STAGING §1.3): the child's fingerprint equals the parent row's, and
    the child's first ``context_len`` items digest to the parent row's context digest."""
    parent_items = request_items(dialect, parent)
    row_fingerprint = assistant_fingerprint([*parent_items, *response_items(dialect, answer)])
    child_items = request_items(dialect, child)
    assert row_fingerprint != ""
    assert assistant_fingerprint(child_items) == row_fingerprint
    assert len(child_items) >= len(parent_items)
    context = child_items[: len(parent_items)]
    assert conversation_digest(context) == conversation_digest(parent_items)


def assert_does_not_resolve(
    dialect: str,
    parent: Mapping[str, Any],
    answer: Mapping[str, Any],
    child: Mapping[str, Any],
) -> None:
    parent_items = request_items(dialect, parent)
    row_fingerprint = assistant_fingerprint([*parent_items, *response_items(dialect, answer)])
    child_items = request_items(dialect, child)
    same_fingerprint = assistant_fingerprint(child_items) == row_fingerprint
    context = child_items[: len(parent_items)]
    same_context = conversation_digest(context) == conversation_digest(parent_items)
    assert not (same_fingerprint and same_context)


CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
CHAT_PARENT: dict[str, Any] = {
    "model": "m",
    "tools": CHAT_TOOLS,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ],
}
CHAT_ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Paris","days":1}'},
                    }
                ],
                **TOKEN_FIELDS,
            },
        }
    ],
}


def chat_child(arguments: str) -> dict[str, Any]:
    replayed = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call-1",
                "type": "function",
                "function": {"name": "weather", "arguments": arguments},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "call-1", "content": "sunny"}
    return {**CHAT_PARENT, "messages": [*CHAT_PARENT["messages"], replayed, result]}


def test_chat_continuation_resolves() -> None:
    # The client re-spaces and reorders the arguments and leaves out the null content.
    child = chat_child('{"days": 1,  "city": "Paris"}')
    assert_resolves("chat", CHAT_PARENT, CHAT_ANSWER, child)

    # And the turn after: the child's own answer, replayed.
    answer = {"choices": [{"message": {"role": "assistant", "content": "Sunny, 20 °C."}}]}
    grandchild = {
        **child,
        "messages": [
            *child["messages"],
            {"role": "assistant", "content": "Sunny, 20 °C."},
            {"role": "user", "content": "Thanks."},
        ],
    }
    assert_resolves("chat", child, answer, grandchild)


def test_chat_continuation_with_other_arguments_or_tools_does_not_resolve() -> None:
    assert_does_not_resolve("chat", CHAT_PARENT, CHAT_ANSWER, chat_child('{"city": "Lyon"}'))
    other_tools = {**chat_child('{"city":"Paris","days":1}'), "tools": []}
    assert_does_not_resolve("chat", CHAT_PARENT, CHAT_ANSWER, other_tools)


RESPONSES_PARENT: dict[str, Any] = {
    "model": "m",
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "weather", "parameters": {}}],
    "input": "Weather in Paris?",
}
RESPONSES_ANSWER: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [], **TOKEN_FIELDS},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call-1",
            "name": "weather",
            "arguments": '{"city":"Paris"}',
            "status": "completed",
            **TOKEN_FIELDS,
        },
    ],
}


@pytest.mark.parametrize("keep_reasoning", [True, False])
def test_responses_continuation_resolves(keep_reasoning: bool) -> None:
    # The client spells the string input as a message, may drop the reasoning item, and
    # re-spaces the arguments; none of that is a different conversation.
    replayed: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Paris?"}],
        },
    ]
    if keep_reasoning:
        replayed.append({"type": "reasoning", "id": "rs_1", "summary": []})
    replayed += [
        {
            "type": "function_call",
            "call_id": "call-1",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call-1", "output": "sunny"},
    ]
    child = {**RESPONSES_PARENT, "input": replayed}
    assert_resolves("responses", RESPONSES_PARENT, RESPONSES_ANSWER, child)


def test_responses_continuation_with_other_instructions_does_not_resolve() -> None:
    replayed = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call-1",
            "name": "weather",
            "arguments": '{"city":"Paris"}',
        },
    ]
    child = {**RESPONSES_PARENT, "instructions": "Be verbose.", "input": replayed}
    assert_does_not_resolve("responses", RESPONSES_PARENT, RESPONSES_ANSWER, child)
    same = {**RESPONSES_PARENT, "input": replayed}
    assert_resolves("responses", RESPONSES_PARENT, RESPONSES_ANSWER, same)


MESSAGES_PARENT: dict[str, Any] = {
    "model": "claude",
    "max_tokens": 256,
    "system": "Be brief.",
    "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
}
MESSAGES_ANSWER: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude",
    "stop_reason": "tool_use",
    "content": [
        {"type": "thinking", "thinking": "I should call the tool.", "signature": "c2ln"},
        {"type": "text", "text": "Checking.", "citations": None},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ],
    **TOKEN_FIELDS,
}


def messages_child(assistant_content: list[dict[str, Any]]) -> dict[str, Any]:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    return {
        **MESSAGES_PARENT,
        "messages": [
            *MESSAGES_PARENT["messages"],
            {"role": "assistant", "content": assistant_content},
            {"role": "user", "content": [result]},
        ],
    }


def test_messages_continuation_resolves() -> None:
    child = messages_child(MESSAGES_ANSWER["content"])
    assert_resolves("messages", MESSAGES_PARENT, MESSAGES_ANSWER, child)
    # A client that drops the thinking block and the null citations still continues the call.
    trimmed = messages_child(
        [{"type": "text", "text": "Checking."}, *MESSAGES_ANSWER["content"][2:]]
    )
    assert_resolves("messages", MESSAGES_PARENT, MESSAGES_ANSWER, trimmed)


def test_messages_continuation_with_another_tool_call_does_not_resolve() -> None:
    other = messages_child(
        [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Paris"}},
        ]
    )
    assert_does_not_resolve("messages", MESSAGES_PARENT, MESSAGES_ANSWER, other)


def test_the_module_names_what_it_exports() -> None:
    for name in fp.__all__:
        assert hasattr(fp, name), name
