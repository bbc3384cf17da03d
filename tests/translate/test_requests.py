"""Request translation: Responses and Messages bodies as Chat Completions bodies."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcap.translate import (
    messages_request_to_chat,
    namespaced_tool_names,
    responses_request_to_chat,
)
from tests.translate._support import CRM_NAMESPACE, NAMESPACED_REQUEST

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


# --- Responses -----------------------------------------------------------------------------------


def test_responses_string_input_and_sampling_fields() -> None:
    chat = responses_request_to_chat(
        {
            "model": "qwen",
            "instructions": "Be brief.",
            "input": "Hi",
            "max_output_tokens": 128,
            "temperature": 0.2,
            "top_p": 0.9,
            "parallel_tool_calls": False,
            "metadata": {"k": "v"},
            "store": True,
            "truncation": "auto",
            "include": ["reasoning.encrypted_content"],
            "some_future_field": {"x": 1},
        }
    )
    assert chat == {
        "model": "qwen",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 128,
        "temperature": 0.2,
        "top_p": 0.9,
        "parallel_tool_calls": False,
    }


def test_responses_stream_asks_for_usage() -> None:
    chat = responses_request_to_chat({"input": "Hi", "stream": True})
    assert chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    assert "stream" not in responses_request_to_chat({"input": "Hi", "stream": False})


def test_responses_items_become_a_chat_conversation() -> None:
    request = {
        "input": [
            {"role": "developer", "content": "Use tools."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather in"},
                    {"type": "input_text", "text": "Paris?"},
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Need the tool."}],
                "encrypted_content": "opaque",
            },
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "Checking", "annotations": []},
                    {"type": "output_text", "text": " now.", "annotations": []},
                ],
            },
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"c":1}'},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"c":2}'},
            {"type": "function_call_output", "call_id": "c1", "output": "12C"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "14C"}],
            },
            {"role": "user", "content": "Thanks"},
        ]
    }
    assert responses_request_to_chat(request)["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in\nParis?"},
        {
            "role": "assistant",
            "content": "Checking now.",
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"c":1}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"c":2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12C"},
        {"role": "tool", "tool_call_id": "c2", "content": "14C"},
        {"role": "user", "content": "Thanks"},
    ]


def test_responses_reasoning_before_a_function_call_and_dropped_reasoning() -> None:
    request = {
        "input": [
            {"role": "user", "content": "x"},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "summary"}],
                "content": [{"type": "reasoning_text", "text": "raw thoughts"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "lost"}]},
            {"role": "user", "content": "y"},
        ]
    }
    messages = responses_request_to_chat(request)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "raw thoughts",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert messages[3] == {"role": "user", "content": "y"}
    assert all("lost" not in str(message) for message in messages)


def test_responses_images() -> None:
    request = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AAAA",
                        "detail": "low",
                    },
                ],
            }
        ]
    }
    assert responses_request_to_chat(request)["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


def test_responses_tools_choice_and_format() -> None:
    chat = responses_request_to_chat(
        {
            "input": "x",
            "tools": [
                {
                    "type": "function",
                    "name": "weather",
                    "description": "Weather now.",
                    "parameters": WEATHER_SCHEMA,
                    "strict": True,
                }
            ],
            "tool_choice": {"type": "function", "name": "weather"},
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "out",
                    "schema": WEATHER_SCHEMA,
                    "strict": True,
                },
                "verbosity": "low",
            },
            "reasoning": {"effort": "high", "summary": "auto"},
        }
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather now.",
                "parameters": WEATHER_SCHEMA,
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": WEATHER_SCHEMA, "strict": True},
    }
    assert chat["reasoning_effort"] == "high"
    for mode in ("auto", "none", "required"):
        assert responses_request_to_chat({"input": "x", "tool_choice": mode})["tool_choice"] == mode
    fmt = {"text": {"format": {"type": "json_object"}}}
    assert responses_request_to_chat({"input": "x", **fmt})["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in responses_request_to_chat(
        {"input": "x", "text": {"format": {"type": "text"}}}
    )
    assert "reasoning_effort" not in responses_request_to_chat(
        {"input": "x", "reasoning": {"effort": "minimal"}}
    )


def test_vllm_extras_pass_through() -> None:
    chat = responses_request_to_chat(
        {"input": "x", "top_k": 20, "chat_template_kwargs": {"enable_thinking": False}, "seed": 7}
    )
    assert (chat["top_k"], chat["chat_template_kwargs"], chat["seed"]) == (
        20,
        {"enable_thinking": False},
        7,
    )


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": "x", "background": True}, "background"),
        ({}, "input"),
        ({"input": 5}, "input"),
        ([], "request"),
        ({"input": "x", "model": 3}, "model"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": True}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": "x", "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
            "text.format.schema",
        ),
    ],
)
def test_responses_bad_requests_name_the_field(request_body: Any, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{_escape(field)}: "):
        responses_request_to_chat(request_body)


def test_responses_non_function_tools_are_all_named() -> None:
    with pytest.raises(ValueError, match="only function tools") as info:
        responses_request_to_chat(
            {
                "input": "x",
                "tools": [
                    {"type": "function", "name": "ok", "parameters": {}},
                    {"type": "web_search"},
                    {"type": "file_search", "vector_store_ids": []},
                ],
            }
        )
    assert "tools[1] ('web_search')" in str(info.value)
    assert "tools[2] ('file_search')" in str(info.value)


def test_responses_namespace_tools_are_flattened_with_joined_names() -> None:
    chat = responses_request_to_chat(
        {**NAMESPACED_REQUEST, "tool_choice": {"type": "function", "name": "crm__lookup"}}
    )
    lookup = CRM_NAMESPACE["tools"][0]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "parameters": {}}},
        {
            "type": "function",
            "function": {
                "name": "crm__lookup",
                "description": "Find a customer.",
                "parameters": lookup["parameters"],
            },
        },
        {
            "type": "function",
            "function": {"name": "crm__update", "parameters": {"type": "object"}, "strict": True},
        },
    ]
    # The API's function tool_choice has no namespace field: the chat name is what forces it.
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "crm__lookup"}}
    assert namespaced_tool_names(NAMESPACED_REQUEST) == {
        "crm__lookup": ("crm", "lookup"),
        "crm__update": ("crm", "update"),
    }
    # Every joined name the table holds is a tool the upstream was offered, and no other.
    offered = {tool["function"]["name"] for tool in chat["tools"]}
    assert set(namespaced_tool_names(NAMESPACED_REQUEST)) == offered - {"weather"}


def test_responses_namespaced_function_calls_in_history() -> None:
    request = {
        **NAMESPACED_REQUEST,
        "input": [
            {"role": "user", "content": "Who is a@b.c? And the weather?"},
            {
                "type": "function_call",
                "call_id": "c1",
                "namespace": "crm",
                "name": "lookup",
                "arguments": '{"email": "a@b.c"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "namespace": None,
                "name": "weather",
                "arguments": "{}",
            },
            {
                "type": "function_call_output",
                "call_id": "c1",
                "namespace": "crm",
                "name": "lookup",
                "output": "Ada",
            },
            {"type": "function_call_output", "call_id": "c2", "output": "sunny"},
        ],
    }
    assert responses_request_to_chat(request)["messages"] == [
        {"role": "user", "content": "Who is a@b.c? And the weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "crm__lookup", "arguments": '{"email": "a@b.c"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Ada"},
        {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
    ]


def _namespace(name: object, *tools: object) -> dict[str, Any]:
    return {"type": "namespace", "name": name, "description": "d", "tools": list(tools)}


_LOOKUP = {"type": "function", "name": "lookup"}


@pytest.mark.parametrize(
    ("tools", "field", "names"),
    [
        ([_namespace("", _LOOKUP)], "tools[0].name", None),
        ([_namespace(None, _LOOKUP)], "tools[0].name", None),
        ([{"type": "namespace", "name": "crm"}], "tools[0].tools", None),
        ([_namespace("crm", "lookup")], "tools[0].tools[0]", None),
        ([_namespace("crm", {"type": "function"})], "tools[0].tools[0].name", None),
        (
            [_namespace("crm", {"type": "function", "name": "f", "parameters": []})],
            "tools[0].tools[0].parameters",
            {"crm__f": ("crm", "f")},
        ),
        # A joined name that another tool already has, whichever comes first.
        (
            [{"type": "function", "name": "crm__lookup"}, _namespace("crm", _LOOKUP)],
            "tools[1].tools[0].name",
            {},
        ),
        (
            [_namespace("crm", _LOOKUP), {"type": "function", "name": "crm__lookup"}],
            "tools[0].tools[0].name",
            {},
        ),
        (
            [
                _namespace("crm", _LOOKUP),
                {"type": "function", "function": {"name": "crm__lookup"}},
            ],
            "tools[0].tools[0].name",
            {},
        ),
        (
            [
                _namespace("a", {"type": "function", "name": "b__c"}),
                _namespace(
                    "a__b",
                    {
                        "type": "function",
                        "name": "c",
                    },
                ),
            ],
            "tools[1].tools[0].name",
            {},
        ),
        (
            [_namespace("crm", _LOOKUP, _LOOKUP)],
            "tools[0].tools[1].name",
            {},
        ),
    ],
)
def test_responses_bad_namespace_tools_name_the_field(
    tools: list[Any], field: str, names: dict[str, tuple[str, str]] | None
) -> None:
    with pytest.raises(ValueError, match=rf"^{_escape(field)}: "):
        responses_request_to_chat({"input": "x", "tools": tools})
    # The table leaves out what the translation refuses, and never raises on it.
    assert namespaced_tool_names({"tools": tools}) == (names or {})


def test_responses_collision_error_says_what_collides() -> None:
    tools = [{"type": "function", "name": "crm__lookup"}, _namespace("crm", _LOOKUP)]
    with pytest.raises(ValueError, match=r"'crm__lookup', which is also the name of tools\[0\]"):
        responses_request_to_chat({"input": "x", "tools": tools})


def test_responses_non_function_tools_in_a_namespace_are_named() -> None:
    custom = {"type": "custom", "name": "sql", "description": "Raw SQL."}
    with pytest.raises(ValueError, match=r"^tools: only function tools") as info:
        responses_request_to_chat(
            {"input": "x", "tools": [_namespace("crm", _LOOKUP, custom, _namespace("in", _LOOKUP))]}
        )
    assert "tools[0].tools[1] ('custom')" in str(info.value)
    assert "tools[0].tools[2] ('namespace')" in str(info.value)


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"namespace": ""}, "input[0].namespace"),
        ({"namespace": 3}, "input[0].namespace"),
        ({"namespace": "crm", "name": None}, "input[0].name"),
    ],
)
def test_responses_bad_namespaced_calls_name_the_field(item: dict[str, Any], field: str) -> None:
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", **item}
    with pytest.raises(ValueError, match=rf"^{_escape(field)}: "):
        responses_request_to_chat({"input": [call]})


_odd = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children)
    ),
    max_leaves=10,
)


def _mostly(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy``, now and then something odd instead."""
    return st.one_of(*[strategy] * 9, _odd)


# Names that join into each other's: "a" + "b__c" and "a__b" + "c" are both "a__b__c".
_names = _mostly(st.sampled_from(["crm", "lookup", "a", "a__b", "b__c", "c", "a__b__c", ""]))
_function_tools = st.fixed_dictionaries(
    {"type": _mostly(st.just("function")), "name": _names},
    optional={"parameters": _mostly(st.just({}))},
) | st.builds(lambda name: {"type": "function", "function": {"name": name}}, _names)
_namespace_tools = st.fixed_dictionaries(
    {
        "type": st.just("namespace"),
        "name": _names,
        "tools": _mostly(st.lists(_mostly(_function_tools), min_size=1, max_size=3)),
    }
)
_tool_lists = st.lists(_mostly(_function_tools | _namespace_tools), max_size=4)


@settings(max_examples=300, deadline=None)
@given(_odd, _tool_lists)
def test_namespaced_tool_names_never_raises(request_body: Any, tools: list[Any]) -> None:
    namespaced_tool_names(request_body)
    table = namespaced_tool_names({"tools": tools})
    assert all(name == f"{pair[0]}__{pair[1]}" for name, pair in table.items())
    try:
        chat = responses_request_to_chat({"input": "x", "tools": tools})
    except ValueError:
        return
    # Whenever the request translates, the table holds exactly the names it joined. (A tool sent
    # in chat form goes upstream as it is, whatever its name holds.)
    offered = [tool["function"]["name"] for tool in chat.get("tools", [])]
    plain = [
        tool.get("name", tool.get("function", {}).get("name"))
        for tool in tools
        if tool["type"] == "function"
    ]
    assert set(table) == {name for name in offered if isinstance(name, str) and name not in plain}


def test_namespaced_tool_names_of_requests_without_namespaces() -> None:
    requests: list[Any] = [{}, {"tools": None}, {"tools": [_LOOKUP]}, [], "x", {"tools": {"a": 1}}]
    for request in requests:
        assert namespaced_tool_names(request) == {}


def _escape(field: str) -> str:
    return field.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")


# --- Messages ------------------------------------------------------------------------------------


def test_messages_conversation() -> None:
    request = {
        "model": "qwen",
        "max_tokens": 256,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "12C",
                        "is_error": False,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
            {"role": "assistant", "content": "Sunny."},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "a"}],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_3"},
                ],
            },
        ],
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 0.8,
        "top_k": 40,
        "metadata": {"user_id": "u1"},
        "stream": True,
    }
    chat = messages_request_to_chat(request)
    assert chat == {
        "model": "qwen",
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "Use the tool.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "12C"},
            {"role": "user", "content": "And tomorrow?"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "a"},
            {"role": "tool", "tool_call_id": "toolu_3", "content": ""},
        ],
        "stop": ["END"],
        "temperature": 0.5,
        "top_p": 0.8,
        "top_k": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_messages_tools_and_choices() -> None:
    base: dict[str, Any] = {
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [
            {"name": "weather", "description": "Weather.", "input_schema": WEATHER_SCHEMA},
            {"type": "custom", "name": "other", "input_schema": {"type": "object"}},
        ],
    }
    chat = messages_request_to_chat(base)
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather.",
                "parameters": WEATHER_SCHEMA,
            },
        },
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]
    cases = [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
        ),
    ]
    for choice, expected in cases:
        assert messages_request_to_chat({**base, "tool_choice": choice})["tool_choice"] == expected
    chat = messages_request_to_chat(
        {**base, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    )
    assert chat["parallel_tool_calls"] is False


def test_messages_thinking_switch() -> None:
    base: dict[str, Any] = {"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    assert "chat_template_kwargs" not in messages_request_to_chat(base)
    enabled = {**base, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert messages_request_to_chat(enabled)["chat_template_kwargs"] == {"enable_thinking": True}
    disabled = {**base, "thinking": {"type": "disabled"}}
    assert messages_request_to_chat(disabled)["chat_template_kwargs"] == {"enable_thinking": False}
    explicit = {**enabled, "chat_template_kwargs": {"enable_thinking": False, "x": 1}}
    assert messages_request_to_chat(explicit)["chat_template_kwargs"] == {
        "enable_thinking": False,
        "x": 1,
    }


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5}, "messages"),
        ({"max_tokens": 5, "messages": []}, "messages"),
        ({"max_tokens": 5, "messages": "hi"}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 5, "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ],
            },
            "messages[0].content[0].source.type",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}],
            },
            "messages[0].content[0].id",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}],
            },
            "messages[0].content[0].type",
        ),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "system": 3}, "system"),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "system": [{"type": "image"}],
            },
            "system[0].type",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "f"}],
            },
            "tools[0].input_schema",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "x"},
            },
            "tool_choice.type",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "stop_sequences": [1],
            },
            "stop_sequences[0]",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "x"},
            },
            "thinking.type",
        ),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": -1}, "top_k"),
    ],
)
def test_messages_bad_requests_name_the_field(request_body: Any, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{_escape(field)}: "):
        messages_request_to_chat(request_body)


def test_messages_builtin_tools_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="only custom") as info:
        messages_request_to_chat(
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [
                    {"type": "bash_20250124", "name": "bash"},
                    {"type": "web_search_20250305", "name": "w"},
                ],
            }
        )
    assert "tools[0] ('bash_20250124')" in str(info.value)
    assert "tools[1] ('web_search_20250305')" in str(info.value)


def test_tool_input_round_trips_through_a_request() -> None:
    # A tool_use whose input is the raw text of unparseable arguments goes back as that text.
    chat = messages_request_to_chat(
        {
            "max_tokens": 5,
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "not json"}],
                }
            ],
        }
    )
    assert chat["messages"][0]["tool_calls"][0]["function"]["arguments"] == "not json"
    assert chat["messages"][0]["content"] is None
