"""The fake tokenizer: exact ids of a rendered conversation, decoding, bodies and logprobs."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from rollcap.testing import (
    PREFIX_IDS_FIELD,
    assistant_body,
    decode,
    encode,
    fake_logprob,
    render_prompt,
)
from rollcap.testing._tokens import (
    END_ID,
    START_ID,
    generated_ids,
    logprob_entries,
    message_body,
    token_text,
)

GENERATION_PROMPT = [1, 100, 118, 118, 108, 118, 119, 100, 113, 119, 13]  # [1] + "assistant\n"


def test_field_name() -> None:
    assert PREFIX_IDS_FIELD == "required_prefix_token_ids"


def test_prompt_ids_of_one_user_message() -> None:
    # "user\n" = 117 115 101 114 10, "hi" = 104 105: each byte plus 3.
    assert render_prompt([{"role": "user", "content": "hi"}]) == [
        1,
        *[120, 118, 104, 117, 13],
        *[107, 108],
        2,
        13,
        *GENERATION_PROMPT,
    ]


def test_no_messages_is_the_generation_prompt() -> None:
    assert render_prompt([]) == GENERATION_PROMPT


def test_every_message_renders_role_body_and_markers() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "x"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    expected: list[int] = []
    for role, body in [
        ("system", "Be brief."),
        ("user", "Hi x"),
        ("assistant", '<tool_call>f\n{"a":1}</tool_call>'),
        ("tool", "42"),
    ]:
        expected += [START_ID, *encode(f"{role}\n"), *encode(body), END_ID, *encode("\n")]
    assert render_prompt(messages) == expected + GENERATION_PROMPT
    assert decode(render_prompt(messages), special=True) == (
        "<|start|>system\nBe brief.<|end|>\n<|start|>user\nHi x<|end|>\n"
        '<|start|>assistant\n<tool_call>f\n{"a":1}</tool_call><|end|>\n'
        "<|start|>tool\n42<|end|>\n<|start|>assistant\n"
    )


def test_assistant_body_is_content_then_each_tool_call() -> None:
    calls = [
        {"function": {"name": "a", "arguments": "{}"}},
        {"function": {"name": "b", "arguments": '{"x": "y"}'}},
    ]
    message = {"role": "assistant", "content": "Let me look.", "tool_calls": calls}
    assert assistant_body(message) == (
        'Let me look.<tool_call>a\n{}</tool_call><tool_call>b\n{"x": "y"}</tool_call>'
    )
    assert assistant_body({"role": "assistant", "content": "plain"}) == "plain"
    assert assistant_body({"role": "assistant", "content": None, "tool_calls": None}) == ""
    assert message_body({"role": "user", "content": "q", "tool_calls": calls}) == "q"


def test_encode_and_decode_round_trip_any_text() -> None:
    text = "naïve café — 東京 🚀\n\t{}"
    assert decode(encode(text)) == text
    assert all(3 <= i <= 258 for i in encode(text))
    assert decode(generated_ids(text)) == text
    assert generated_ids(text)[-1] == END_ID


def test_decode_leaves_special_ids_out_unless_asked() -> None:
    ids = [START_ID, *encode("ok"), END_ID]
    assert decode(ids) == "ok"
    assert decode(ids, special=True) == "<|start|>ok<|end|>"


@pytest.mark.parametrize("bad", [0, -1, 259, 10_000])
def test_ids_outside_the_vocabulary_do_not_decode(bad: int) -> None:
    with pytest.raises(ValueError, match="not in the fake vocabulary"):
        decode([5, bad])


def test_a_lone_byte_of_a_character_decodes_as_replacement() -> None:
    first = encode("é")[0]
    assert token_text(first) == "\ufffd"


def test_fake_logprob_formula() -> None:
    assert fake_logprob(3, 0) == -3 / 16
    assert fake_logprob(60, 4) == 0.0
    assert fake_logprob(2, 61) == -63 / 16
    # Every value is a multiple of 1/16 in [-63/16, 0]: exact in float32.
    for token_id in range(1, 259):
        for position in range(0, 130, 7):
            value = fake_logprob(token_id, position)
            assert value == -((token_id + position) % 64) / 16
            assert struct.unpack("<f", struct.pack("<f", value))[0] == value


def test_logprob_entries() -> None:
    ids = [*encode("aé"), END_ID]
    plain = logprob_entries(ids, start=5)
    assert [e["token"] for e in plain] == ["a", "\ufffd", "\ufffd", "<|end|>"]
    assert [e["bytes"] for e in plain] == [[97], [0xC3], [0xA9], list(b"<|end|>")]
    assert [e["logprob"] for e in plain] == [fake_logprob(t, 5 + i) for i, t in enumerate(ids)]
    assert all(e["top_logprobs"] == [] for e in plain)
    as_ids = logprob_entries(ids, as_token_ids=True)
    assert [e["token"] for e in as_ids] == [f"token_id:{t}" for t in ids]
    assert as_ids[0]["logprob"] == fake_logprob(ids[0], 0)


def test_pinned_prefix_replaces_everything_up_to_the_last_assistant() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
        {"role": "tool", "content": "five"},
        {"role": "user", "content": "six"},
    ]
    pinned = [7, 8, 9]
    tail = render_prompt(messages[4:])
    assert render_prompt(messages, prefix_ids=pinned) == pinned + tail
    # Without an assistant message, every message follows the pinned ids.
    assert render_prompt(messages[:1], prefix_ids=pinned) == pinned + render_prompt(messages[:1])
    # Ending on an assistant message: the pinned ids and the generation prompt.
    assert render_prompt(messages[:4], prefix_ids=[]) == GENERATION_PROMPT


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("not a list", "messages must be a list"),
        (["not an object"], "must be an object"),
        ([{"content": "no role"}], "string role"),
        ([{"role": "user", "content": 5}], "content must be"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url"),
        ([{"role": "user", "content": ["bare string part"]}], "content part must be"),
        ([{"role": "assistant", "tool_calls": {"not": "a list"}}], "tool_calls must be a list"),
        ([{"role": "assistant", "tool_calls": [{"type": "function"}]}], "function object"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
            "string arguments",
        ),
    ],
)
def test_messages_the_fake_cannot_render(messages: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render_prompt(messages)
