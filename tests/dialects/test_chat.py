"""The Chat Completions dialect: normalize, terminal events and stream edge cases."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcap.dialects import chat
from rollcap.dialects._base import PIECE_OVERHEAD, Normalized, StreamOutcome, ToolCall, Usage
from rollcap.sse import SSEEvent

CID = "chatcmpl-AZ4bT9kLm2qRv6sXy1WcFj8NdHe3P"
MODEL = "gpt-4o-2024-08-06"


def completion(**message: Any) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` whose first choice carries ``message``."""
    return {
        "id": CID,
        "object": "chat.completion",
        "created": 1732893000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": None, **message},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 12, "audio_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_7f6be3efb0",
    }


def with_usage(usage: Any) -> dict[str, Any]:
    response = completion(content="hi")
    response["usage"] = usage
    return response


def chunk(*choices: dict[str, Any], **top: Any) -> SSEEvent:
    body = {
        "id": CID,
        "object": "chat.completion.chunk",
        "created": 1732893000,
        "model": MODEL,
        "choices": list(choices),
        **top,
    }
    return SSEEvent(data=orjson.dumps(body).decode())


def choice(delta: dict[str, Any], index: int = 0, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


DONE = SSEEvent(data="[DONE]")


def run(*events: SSEEvent) -> Any:
    reassembler = chat.StreamReassembler()
    for event in events:
        reassembler.feed(event)
    return reassembler.finish()


# normalize ----------------------------------------------------------------------------------


def test_normalize_reads_a_text_completion() -> None:
    got = chat.normalize(completion(content="Paris."))
    assert got == Normalized(
        response_id=CID,
        model=MODEL,
        response_status=None,
        finish_reason="stop",
        usage=Usage(
            tokens_in=120,  # cached tokens are inside prompt_tokens: not added again
            tokens_out=30,
            tokens_reasoning=12,
            tokens_total=150,
            cached_tokens=64,
            cache_creation_tokens=None,
        ),
        tool_calls=(),
        reasoning_content=None,
    )


@pytest.mark.parametrize("bad", [True, False, 3.0, 2.5, -1, "7", None, [1], {"n": 1}])
def test_a_count_that_is_not_a_non_negative_int_is_unknown(bad: Any) -> None:
    usage = chat.normalize(
        with_usage(
            {
                "prompt_tokens": bad,
                "completion_tokens": bad,
                "total_tokens": bad,
                "prompt_tokens_details": {"cached_tokens": bad},
                "completion_tokens_details": {"reasoning_tokens": bad},
            }
        )
    ).usage
    assert usage == Usage()


def test_zero_is_a_count() -> None:
    usage = chat.normalize(
        with_usage(
            {
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            }
        )
    ).usage
    assert usage == Usage(0, 0, 0, 0, 0, None)


def test_total_falls_back_to_in_plus_out() -> None:
    usage = chat.normalize(with_usage({"prompt_tokens": 10, "completion_tokens": 5})).usage
    assert usage.tokens_total == 15
    assert chat.normalize(with_usage({"prompt_tokens": 10})).usage.tokens_total is None
    assert chat.normalize(with_usage({"completion_tokens": 5})).usage.tokens_total is None
    bad_total = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 1.5}
    assert chat.normalize(with_usage(bad_total)).usage.tokens_total == 15


def test_a_reported_total_is_kept_even_when_it_disagrees() -> None:
    reported = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 99}
    assert chat.normalize(with_usage(reported)).usage.tokens_total == 99


@pytest.mark.parametrize("usage", [None, "n/a", [], {}, 17])
def test_missing_usage_leaves_every_count_unknown(usage: Any) -> None:
    assert chat.normalize(with_usage(usage)).usage == Usage()
    response = completion(content="hi")
    del response["usage"]
    assert chat.normalize(response).usage == Usage()


def test_tool_calls_are_read_and_arguments_parsed() -> None:
    response = completion(
        tool_calls=[
            {
                "id": "call_a1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            {
                "id": "call_b2",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q": "unterminated'},
            },
            {"id": "call_c3", "type": "function", "function": {"name": "noop", "arguments": ""}},
            {"id": "call_d4", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}},
            "not a call",
            {"type": "function", "function": "not an object"},
        ]
    )
    assert chat.normalize(response).tool_calls == (
        ToolCall("call_a1", "get_weather", {"city": "Oslo"}),
        ToolCall("call_b2", "search", {"_raw": '{"q": "unterminated'}),
        ToolCall("call_c3", "noop", {"_raw": ""}),
        ToolCall("call_d4", "sql", {"_raw": "SELECT 1"}),
        ToolCall(None, None, None),
    )


def test_legacy_function_call_has_no_call_id() -> None:
    response = completion(function_call={"name": "lookup", "arguments": '{"id": 7}'})
    assert chat.normalize(response).tool_calls == (ToolCall(None, "lookup", {"id": 7}),)


def test_reasoning_is_read_under_either_name() -> None:
    assert chat.normalize(completion(reasoning_content="think")).reasoning_content == "think"
    assert chat.normalize(completion(reasoning="ponder")).reasoning_content == "ponder"
    both = completion(reasoning_content="first", reasoning="second")
    assert chat.normalize(both).reasoning_content == "first"
    not_text = completion(reasoning_content={"text": "x"}, reasoning="fallback")
    assert chat.normalize(not_text).reasoning_content == "fallback"
    assert chat.normalize(completion(reasoning=12)).reasoning_content is None


def test_finish_reason_only_when_a_string() -> None:
    response = completion(content="x")
    response["choices"][0]["finish_reason"] = None
    assert chat.normalize(response).finish_reason is None
    response["choices"][0]["finish_reason"] = 3
    assert chat.normalize(response).finish_reason is None


@pytest.mark.parametrize("choices", [[], None, "x", [None], [[]], {"0": {}}])
def test_no_usable_choice(choices: Any) -> None:
    response = completion(content="x")
    response["choices"] = choices
    got = chat.normalize(response)
    assert (got.response_id, got.model, got.usage.tokens_total) == (CID, MODEL, 150)
    assert (got.finish_reason, got.tool_calls, got.reasoning_content) == (None, (), None)


@pytest.mark.parametrize(
    "response",
    [
        None,
        [],
        "chat.completion",
        42,
        {},
        {"id": 5, "model": ["m"], "choices": [{"message": "text"}]},
        {"choices": [{"message": {"tool_calls": "call", "function_call": [1]}}]},
        {"choices": [{"message": {"tool_calls": [None, 1, {"function": None}]}}]},
        {"usage": {"prompt_tokens_details": [], "completion_tokens_details": "x"}},
    ],
)
def test_normalize_never_raises(response: Any) -> None:
    got = chat.normalize(response)
    assert got.response_status is None
    assert isinstance(got.usage, Usage)


# is_terminal_event -----------------------------------------------------------------------------


def test_terminal_events() -> None:
    assert chat.is_terminal_event(DONE)
    assert chat.is_terminal_event(SSEEvent(data=" [DONE] "))
    assert chat.is_terminal_event(SSEEvent(data='{"error": {"message": "boom", "code": 500}}'))
    assert chat.is_terminal_event(SSEEvent(data='{"error": "overloaded"}'))
    assert chat.is_terminal_event(SSEEvent(data='{"message": "boom"}', event="error"))
    # JSON may spell the key with escapes; the text shortcut must not miss it.
    assert chat.is_terminal_event(SSEEvent(data='{"\\u0065rror": {"message": "boom"}}'))


def test_ordinary_chunks_are_not_terminal() -> None:
    assert not chat.is_terminal_event(chunk(choice({"content": "Hi"})))
    assert not chat.is_terminal_event(chunk(choice({}, finish="stop")))
    assert not chat.is_terminal_event(chunk(usage={"prompt_tokens": 1}))
    # The word "error" inside generated text is not an error chunk.
    assert not chat.is_terminal_event(chunk(choice({"content": '{"error": 1}'})))
    assert not chat.is_terminal_event(SSEEvent(data='{"error": null, "choices": []}'))
    assert not chat.is_terminal_event(SSEEvent(data='not json "error"'))
    assert not chat.is_terminal_event(SSEEvent(data='["error"]'))
    assert not chat.is_terminal_event(SSEEvent(data="DONE"))
    assert not chat.is_terminal_event(SSEEvent(data=""))


# reassembly -------------------------------------------------------------------------------------


def test_no_events_is_a_truncated_stream_without_response() -> None:
    got = run()
    assert (got.response, got.outcome, got.error) == (None, StreamOutcome.TRUNCATED, None)
    assert got.truncated


def test_done_alone_completes_without_response() -> None:
    got = run(DONE)
    assert (got.response, got.outcome) == (None, StreamOutcome.COMPLETED)


def test_error_before_any_chunk() -> None:
    error = {"message": "model overloaded", "type": "server_error", "param": None, "code": None}
    got = run(SSEEvent(data=orjson.dumps({"error": error}).decode()), DONE)
    assert (got.response, got.outcome, got.error) == (None, StreamOutcome.ERROR, error)


def test_garbage_data_is_ignored() -> None:
    garbage = ["", "{", "not json", "[1, 2]", "17", "null", '"text"', "{}", '{"foo": 1}']
    events = [SSEEvent(data=g) for g in garbage]
    got = run(
        *events[:4],
        chunk(choice({"role": "assistant", "content": "Hel"})),
        *events[4:],
        chunk(choice({"content": "lo"}, finish="stop")),
        DONE,
    )
    assert got.outcome is StreamOutcome.COMPLETED
    assert got.response["choices"][0]["message"]["content"] == "Hello"


def test_malformed_fields_in_chunks_are_skipped() -> None:
    got = run(
        SSEEvent(data='{"id": "chatcmpl-x", "choices": "oops"}'),
        SSEEvent(data='{"id": "chatcmpl-x", "choices": [null, 3, {"index": true, "delta": 5}]}'),
        SSEEvent(data='{"id": "chatcmpl-x", "choices": [{"delta": {"content": 7}}]}'),
        SSEEvent(data='{"id": "chatcmpl-x", "choices": [{"delta": {"tool_calls": [1, null]}}]}'),
        SSEEvent(data='{"id": "chatcmpl-x", "choices": [{"delta": {"content": "ok"}}]}'),
        DONE,
    )
    assert got.response == {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": None,
        "model": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok", "refusal": None},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }


def test_tool_call_id_only_in_the_first_fragment() -> None:
    got = run(
        chunk(
            choice(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_k1",
                            "type": "function",
                            "function": {"name": "add", "arguments": ""},
                        }
                    ],
                }
            )
        ),
        chunk(choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]})),
        chunk(choice({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})),
        chunk(choice({}, finish="tool_calls")),
        DONE,
    )
    message = got.response["choices"][0]["message"]
    assert message["tool_calls"] == [
        {
            "index": 0,
            "id": "call_k1",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1}'},
        }
    ]
    assert chat.normalize(got.response).tool_calls == (ToolCall("call_k1", "add", {"a": 1}),)


def test_tool_call_fragments_without_index() -> None:
    def fragment(**kw: Any) -> SSEEvent:
        return chunk(choice({"tool_calls": [kw]}))

    got = run(
        fragment(id="call_1", type="function", function={"name": "f", "arguments": '{"x"'}),
        fragment(function={"arguments": ": 1}"}),
        fragment(id="call_2", type="function", function={"name": "g", "arguments": "{}"}),
        # A server that repeats id and name on every fragment.
        fragment(id="call_1", function={"name": "f", "arguments": ""}),
        DONE,
    )
    assert [c["function"] for c in got.response["choices"][0]["message"]["tool_calls"]] == [
        {"name": "f", "arguments": '{"x": 1}'},
        {"name": "g", "arguments": "{}"},
    ]


def test_legacy_function_call_stream() -> None:
    got = run(
        chunk(choice({"role": "assistant", "content": None, "function_call": {"name": "lookup"}})),
        chunk(choice({"function_call": {"arguments": '{"id"'}})),
        chunk(choice({"function_call": {"arguments": ": 7}"}})),
        chunk(choice({}, finish="function_call")),
        DONE,
    )
    message = got.response["choices"][0]["message"]
    assert message["function_call"] == {"name": "lookup", "arguments": '{"id": 7}'}
    assert "tool_calls" not in message
    assert chat.normalize(got.response).tool_calls == (ToolCall(None, "lookup", {"id": 7}),)


def test_reasoning_is_kept_under_the_key_the_stream_used() -> None:
    got = run(
        chunk(choice({"role": "assistant", "reasoning": "a"})),
        chunk(choice({"reasoning": "b", "reasoning_content": "x"})),
        chunk(choice({"content": "done"}, finish="stop")),
        DONE,
    )
    message = got.response["choices"][0]["message"]
    assert (message["reasoning"], message["reasoning_content"]) == ("ab", "x")
    only = run(chunk(choice({"reasoning": "r"})), DONE).response["choices"][0]["message"]
    assert "reasoning_content" not in only
    assert (
        chat.normalize(run(chunk(choice({"reasoning": "r"})), DONE).response).reasoning_content
        == "r"
    )


def test_finish_reason_is_the_last_non_null_one() -> None:
    got = run(
        chunk(choice({"content": "a"}, finish="length")),
        chunk(choice({"content": "b"})),
        chunk(choice({}, finish="stop")),
        chunk(choice({})),
        DONE,
    )
    assert got.response["choices"][0]["finish_reason"] == "stop"


def test_usage_is_the_last_usage_object_and_omitted_when_none_came() -> None:
    # vLLM's continuous usage stats: a running usage on every chunk.
    got = run(
        chunk(choice({"content": "a"}), usage={"prompt_tokens": 5, "completion_tokens": 1}),
        chunk(choice({"content": "b"}), usage=None),
        chunk(choice({}, finish="stop"), usage={"prompt_tokens": 5, "completion_tokens": 2}),
        DONE,
    )
    assert got.response["usage"] == {"prompt_tokens": 5, "completion_tokens": 2}
    assert chat.normalize(got.response).usage.tokens_total == 7
    none = run(chunk(choice({"content": "a"}), usage=None), DONE)
    assert "usage" not in none.response


def test_top_level_fields_take_their_first_non_null_value() -> None:
    got = run(
        chunk(choice({"content": "a"}), system_fingerprint=None, service_tier=None),
        chunk(choice({"content": "b"}), system_fingerprint="fp_1", model="other"),
        chunk(choice({}), system_fingerprint="fp_2", service_tier="flex", x_late="kept"),
        chunk(choice({}), system_fingerprint=None),
        DONE,
    )
    # As the SDK: the first chunk's keys, the last fingerprint sent (not lost to a later null).
    assert (got.response["system_fingerprint"], got.response["model"]) == ("fp_2", MODEL)
    # A key the first chunk held null, or did not send, takes the first value that comes.
    assert (got.response["service_tier"], got.response["x_late"]) == ("flex", "kept")


def test_unknown_keys_of_deltas_fragments_and_choices_are_merged_as_the_sdk_merges_them() -> None:
    got = run(
        chunk(
            {"index": 0, "delta": {"role": "assistant", "x_text": "a", "x_n": 1}, "x_choice": [1]}
        ),
        chunk(choice({"x_text": "b", "x_n": 2, "x_obj": {"k": "v"}, "audio": {"data": "QU"}})),
        chunk(
            {
                "index": 0,
                "delta": {
                    "audio": {"data": "JD", "transcript": "hi"},
                    "tool_calls": [
                        {"index": 0, "id": "c1", "x_frag": "f", "function": {"name": "t", "x_f": 1}}
                    ],
                },
                "x_choice": [2],
            }
        ),
        chunk(choice({"tool_calls": [{"index": 0, "function": {"arguments": "{}", "x_f": 2}}]})),
        DONE,
    )
    choice_ = got.response["choices"][0]
    message = choice_["message"]
    assert (message["x_text"], message["x_n"], message["x_obj"]) == ("ab", 3, {"k": "v"})
    assert message["audio"] == {"data": "QUJD", "transcript": "hi"}
    assert message["tool_calls"] == [
        {
            "index": 0,
            "id": "c1",
            "type": "function",
            "x_frag": "f",
            "function": {"name": "t", "arguments": "{}", "x_f": 3},
        }
    ]
    assert choice_["x_choice"] == [1, 2]


def test_the_padding_key_is_left_out_as_the_sdk_leaves_it() -> None:
    got = run(chunk(choice({"content": "a"}), obfuscation="Qz9"), DONE)
    assert "obfuscation" not in got.response


def test_events_after_the_terminal_event_are_ignored() -> None:
    got = run(
        chunk(choice({"content": "a"})),
        DONE,
        chunk(choice({"content": "b"})),
        SSEEvent(data='{"error": {"message": "late"}}'),
        DONE,
    )
    assert got.outcome is StreamOutcome.COMPLETED
    assert got.error is None
    assert got.response["choices"][0]["message"]["content"] == "a"


def test_error_then_done_stays_an_error() -> None:
    got = run(
        chunk(choice({"content": "a"})),
        SSEEvent(data='{"error": "overloaded"}'),
        DONE,
    )
    assert (got.outcome, got.error) == (StreamOutcome.ERROR, {"message": "overloaded"})
    assert got.response["choices"][0]["message"]["content"] == "a"


def test_logprobs_of_content_and_refusal_are_concatenated() -> None:
    def lp(token: str) -> dict[str, Any]:
        return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}

    first = {"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [lp("a")]}}
    second = {"index": 0, "delta": {"refusal": "no"}, "logprobs": {"refusal": [lp("no")]}}
    third = {"index": 0, "delta": {"content": "b"}, "logprobs": {"content": [lp("b")]}}
    got = run(chunk(first), chunk(second), chunk(third), DONE)
    assert got.response["choices"][0]["logprobs"] == {
        "content": [lp("a"), lp("b")],
        "refusal": [lp("no")],
    }


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
chunk_like = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "model": json_values,
        "usage": json_values,
        "error": json_values,
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "index": json_values,
                    "finish_reason": json_values,
                    "logprobs": json_values,
                    "delta": st.dictionaries(
                        st.sampled_from(
                            [
                                "role",
                                "content",
                                "refusal",
                                "reasoning",
                                "tool_calls",
                                "function_call",
                                "annotations",
                            ]
                        ),
                        json_values,
                    ),
                },
            ),
            max_size=3,
        ),
    },
)
event_data = (
    chunk_like.map(lambda c: orjson.dumps(c).decode())
    | json_values.map(lambda v: orjson.dumps(v).decode())
    | st.sampled_from(["[DONE]", "", "{"])
    | st.text(max_size=20)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(event_data, st.sampled_from([None, "error", "message"])), max_size=8))
def test_reassembly_never_raises(events: list[tuple[str, str | None]]) -> None:
    reassembler = chat.StreamReassembler()
    for data, name in events:
        event = SSEEvent(data=data, event=name)
        chat.is_terminal_event(event)
        reassembler.feed(event)
    got = reassembler.finish()
    if got.response is not None:
        chat.normalize(got.response)
        orjson.dumps(got.response)


def test_an_event_named_error_is_an_error() -> None:
    got = run(chunk(choice({"content": "a"})), SSEEvent(data="upstream gone", event="error"))
    assert (got.outcome, got.error) == (StreamOutcome.ERROR, {"message": "upstream gone"})
    named = run(SSEEvent(data='{"message": "boom", "code": 503}', event="error"))
    assert named.error == {"message": "boom", "code": 503}


def test_size_counts_text_kept_and_whole_chunks_otherwise() -> None:
    reassembler = chat.StreamReassembler()
    assert reassembler.size == 0
    reassembler.feed(chunk(choice({"role": "assistant", "content": ""})))
    after_role = reassembler.size
    for _ in range(100):
        reassembler.feed(chunk(choice({"content": "x" * 1000})))
    # Each text delta counts its text and a piece's overhead, not its chunk's JSON.
    assert reassembler.size - after_role == 100 * (1000 + PIECE_OVERHEAD)
    tool = chunk(choice({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))
    before = reassembler.size
    reassembler.feed(tool)
    assert reassembler.size - before == len(tool.data) + PIECE_OVERHEAD  # the whole chunk


def test_size_counts_a_chunk_whose_top_level_keys_are_kept() -> None:
    reassembler = chat.StreamReassembler()
    reassembler.feed(chunk(choice({"content": "a"})))
    # Chunks without choices, each with a top-level key not seen before: kept, so counted.
    for n in range(3):
        late = chunk(**{f"x_{n}": "v" * 500})
        before = reassembler.size
        reassembler.feed(late)
        assert reassembler.size - before == len(late.data) + PIECE_OVERHEAD
    # The same shape again adds nothing to keep.
    before = reassembler.size
    reassembler.feed(chunk(x_2="w"))
    assert reassembler.size == before
    response = reassembler.finish().response
    assert response is not None
    assert response["x_2"] == "v" * 500
