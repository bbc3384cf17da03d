"""The dialect-neutral plan: usage every dialect reports alike, ids stable per request."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.dialects import get_dialect, reassemble
from rollcap.gym import example_data_path
from rollcap.testing._knobs import DIALECTS, Knobs
from rollcap.testing._plan import choice_letter, last_user_text, plan_answer
from tests.testing._support import (
    COMPLETING,
    json_of,
    reply,
    request,
    streamed,
)


@pytest.mark.parametrize("scenario", COMPLETING)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_normalized_usage_is_the_planned_usage(dialect: str, scenario: str) -> None:
    body = request(dialect)
    knobs = Knobs(scenario=scenario)
    plan = plan_answer(dialect, body, knobs)
    usage = (
        get_dialect(dialect)
        .normalize(json_of(reply(dialect, body, {"x-fake-scenario": scenario})))
        .usage
    )

    # The prompt is 68 characters: 17 tokens; half of them cached.
    assert usage.tokens_in == plan.usage.input_tokens == 17
    assert usage.cached_tokens == plan.usage.cached_tokens == 8
    assert usage.tokens_out == plan.usage.output_tokens > 0
    assert usage.tokens_total == plan.usage.input_tokens + plan.usage.output_tokens
    if dialect == "messages":
        assert usage.tokens_reasoning is None
        assert usage.cache_creation_tokens == 0
    else:
        assert usage.tokens_reasoning == plan.usage.reasoning_tokens
        assert usage.cache_creation_tokens is None
    assert (plan.usage.reasoning_tokens > 0) == (scenario == "reasoning")


def test_every_dialect_counts_the_same_tokens() -> None:
    usages = {
        dialect: get_dialect(dialect)
        .normalize(json_of(reply(dialect, request(dialect), {"x-fake-scenario": "reasoning"})))
        .usage
        for dialect in DIALECTS
    }
    counts = {(u.tokens_in, u.tokens_out, u.tokens_total, u.cached_tokens) for u in usages.values()}
    assert len(counts) == 1


def test_anthropic_reports_cached_input_apart() -> None:
    message = json_of(reply("messages", request("messages"), {"x-fake-cached-tokens": "10"}))
    assert message["usage"]["input_tokens"] == 7
    assert message["usage"]["cache_read_input_tokens"] == 10
    assert message["usage"]["cache_creation_input_tokens"] == 0


def test_cached_tokens_header_is_capped_at_the_input() -> None:
    body = json_of(reply("chat", request("chat"), {"x-fake-cached-tokens": "1000"}))
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 17
    assert body["usage"]["prompt_tokens"] == 17


def test_same_request_same_answer_and_ids() -> None:
    first = reply("responses", request("responses"))
    again = reply("responses", request("responses"))
    other = reply("responses", request("responses", input="Something else entirely"))
    assert first.body == again.body
    assert json_of(first)["id"] != json_of(other)["id"]
    assert json_of(first)["created_at"] == json_of(again)["created_at"]


# --- choice: a deterministic option letter per seed --------------------------------------------

# The MCQA example prompts, each with its option letters.
MCQA = [
    (task["responses_create_params"]["input"][0]["content"], "".join(map("".join, task["options"])))
    for task in map(orjson.loads, example_data_path("mcqa").read_bytes().splitlines())
]


def _asking(dialect: str, prompt: str, **extra: Any) -> dict[str, Any]:
    """The dialect's typical request with ``prompt`` as its one user message."""
    message = {"role": "user", "content": prompt}
    key = "input" if dialect == "responses" else "messages"
    return request(dialect, **{key: [message]}, **extra)


def _text(dialect: str, response: Any) -> str:
    if dialect == "responses":
        text = response["output"][0]["content"][0]["text"]
    elif dialect == "chat":
        text = response["choices"][0]["message"]["content"]
    else:
        text = response["content"][0]["text"]
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_choice_answers_a_letter_among_the_prompts_options(dialect: str) -> None:
    assert len(MCQA) == 27
    for prompt, letters in MCQA:
        by_header = json_of(
            reply(dialect, _asking(dialect, prompt), {"x-fake-scenario": "choice-1"})
        )
        by_model = json_of(reply(dialect, _asking(dialect, prompt, model="choice-1")))
        letter = _text(dialect, by_header)
        assert letter in letters
        assert letter == _text(dialect, by_model) == choice_letter(1, prompt)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_choice_stream_reassembles_to_the_answer(dialect: str) -> None:
    prompt = MCQA[0][0]
    headers = {"x-fake-scenario": "choice-3"}
    whole = json_of(reply(dialect, _asking(dialect, prompt), headers))
    result = reassemble(dialect, streamed(dialect, _asking(dialect, prompt), headers).events)
    assert result.response == whole
    assert _text(dialect, whole) == choice_letter(3, prompt)


def test_choice_same_seed_same_letter_other_seeds_differ_on_some_prompts() -> None:
    body = _asking("chat", MCQA[0][0], model="choice-5")
    assert reply("chat", body).body == reply("chat", body).body
    first = [choice_letter(1, prompt) for prompt, _ in MCQA]
    assert first == [choice_letter(1, prompt) for prompt, _ in MCQA]
    second = [choice_letter(2, prompt) for prompt, _ in MCQA]
    assert any(a != b for a, b in zip(first, second, strict=True))
    assert any(a == b for a, b in zip(first, second, strict=True))
    # ``choice`` is seed 0.
    plain = json_of(reply("chat", _asking("chat", MCQA[0][0], model="choice")))
    assert _text("chat", plain) == choice_letter(0, MCQA[0][0])


def test_choice_letters_are_the_option_lines() -> None:
    assert choice_letter(0, "Pick one.\nA) yes\n  B) no\n") in {"A", "B"}
    # Not options: lower case, a letter inside a line, no parenthesis.
    for text in ("a) yes\nb) no", "Is it A) or B)?", "A. yes\nB. no", ""):
        assert choice_letter(0, text) is None, text
    # A letter listed twice is one option; a single option is the only answer.
    assert {choice_letter(seed, "A) x\nA) y\nB) z") for seed in range(40)} == {"A", "B"}
    assert {choice_letter(seed, "Q\nC) only") for seed in range(10)} == {"C"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_choice_without_options_is_the_text_answer(dialect: str) -> None:
    text = json_of(reply(dialect, request(dialect)))
    choice = json_of(reply(dialect, request(dialect), {"x-fake-scenario": "choice"}))
    assert _text(dialect, choice) == _text(dialect, text)
    assert choice["usage"] == text["usage"]


def test_choice_reads_the_last_user_message_with_text() -> None:
    earlier = "Old question?\nA) one\nB) two"
    latest = "New question?\nC) three\nD) four"
    chat = {
        "messages": [
            {"role": "user", "content": earlier},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": [{"type": "text", "text": latest}]},
            {"role": "tool", "tool_call_id": "c1", "content": "E) not an option"},
        ]
    }
    assert last_user_text("chat", chat) == latest
    messages = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": latest}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ]
    }
    assert last_user_text("messages", messages) == latest
    parts = [
        {"type": "input_text", "text": "New question?"},
        {"type": "input_text", "text": "C) x"},
    ]
    responses = {"input": [{"type": "message", "role": "user", "content": parts}]}
    assert last_user_text("responses", responses) == "New question?\nC) x"
    assert last_user_text("responses", {"input": latest}) == latest
    assert last_user_text("chat", {"messages": "not a list"}) == ""
    assert last_user_text("chat", {"messages": [{"role": "user", "content": None}]}) == ""
    answered = json_of(reply("chat", {**request("chat"), **chat}, {"x-fake-scenario": "choice-4"}))
    assert _text("chat", answered) in {"C", "D"}


def test_choice_usage_counts_the_letter() -> None:
    plan = plan_answer("chat", _asking("chat", MCQA[0][0]), Knobs(scenario="choice", seed=1))
    assert plan.text == choice_letter(1, MCQA[0][0])
    assert plan.text_pieces == (plan.text,)
    assert plan.usage.output_tokens == 1  # ceil(1 / 4): one letter is one token, as for text
