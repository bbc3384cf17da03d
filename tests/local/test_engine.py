"""The engine's determinism: the same request gives one answer, whatever came before."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rollcap.local import Completion, LocalEngine, Prompt, Sampling, parse_chat_request

QUESTION = [{"role": "user", "content": "Name three colours."}]
# An answer that, with llama.cpp reusing the evaluated prompt, parts from the fresh one after
# about twenty tokens on an AVX-512 CPU: evaluating in other batches rounds differently.
ARITHMETIC = [{"role": "user", "content": "What is 17 times 23?"}]
OTHER = [{"role": "user", "content": "Write one sentence about the sea."}]
TOKENS = 48


def _call(engine: LocalEngine, messages: Sequence[Mapping[str, str]]) -> tuple[Prompt, Sampling]:
    call = parse_chat_request({"messages": list(messages), "max_tokens": TOKENS})
    return engine.prompt(call.messages), call.sampling


def _answer(engine: LocalEngine, messages: Sequence[Mapping[str, str]]) -> Completion:
    return engine.generate(*_call(engine, messages))


async def _streamed(engine: LocalEngine, messages: Sequence[Mapping[str, str]]) -> Completion:
    prompt, sampling = _call(engine, messages)
    pieces: list[str] = []
    done: Completion | None = None
    async for item in engine.stream(prompt, sampling):
        if isinstance(item, Completion):
            done = item
        else:
            pieces.append(item)
    assert done is not None
    assert "".join(pieces) == done.text
    return done


@pytest.mark.parametrize("messages", [QUESTION, ARITHMETIC], ids=["colours", "arithmetic"])
def test_one_request_gives_one_answer_whatever_came_before(
    engine: LocalEngine, messages: list[dict[str, str]]
) -> None:
    """Three times in a row, after another request, streamed, and on a fresh engine."""
    in_a_row = [_answer(engine, messages) for _ in range(3)]
    _answer(engine, OTHER)
    after_other = _answer(engine, messages)
    streamed = asyncio.run(_streamed(engine, messages))
    fresh_engine = LocalEngine.load()
    try:
        fresh = _answer(fresh_engine, messages)
        fresh_after_other = (_answer(fresh_engine, OTHER), _answer(fresh_engine, messages))[1]
    finally:
        fresh_engine.close()
    answers = [*in_a_row, after_other, streamed, fresh, fresh_after_other]
    assert answers[0].text
    assert [a.text for a in answers] == [answers[0].text] * len(answers)
    assert {(a.finish_reason, a.prompt_tokens, a.completion_tokens) for a in answers} == {
        (answers[0].finish_reason, answers[0].prompt_tokens, answers[0].completion_tokens)
    }


def test_every_generation_evaluates_its_whole_prompt_from_an_empty_context(
    engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state each answer starts from: nothing of the previous call is reused."""
    evaluated: list[tuple[int, int]] = []  # (tokens already in the context, tokens fed)
    real_eval = engine.llama.eval

    def spy(tokens: Any) -> None:
        evaluated.append((engine.llama.n_tokens, len(tokens)))
        real_eval(tokens)

    monkeypatch.setattr(engine.llama, "eval", spy)
    for messages in (QUESTION, QUESTION, OTHER, QUESTION):
        prompt, sampling = _call(engine, messages)
        evaluated.clear()
        engine.generate(prompt, sampling)
        assert evaluated[0] == (0, len(prompt.tokens))


@pytest.mark.parametrize("messages", [QUESTION, ARITHMETIC, OTHER])
def test_the_answer_is_llama_cpps_on_a_fresh_context(
    engine: LocalEngine, messages: list[dict[str, str]]
) -> None:
    """llama-cpp-python's own chat completion, from a reset context, answers the same."""
    _answer(engine, OTHER if messages is not OTHER else QUESTION)  # leave other tokens behind
    ours = _answer(engine, messages)
    call = parse_chat_request({"messages": messages})
    with engine.lock:
        engine.llama.reset()
        reference = engine.llama.create_chat_completion(
            messages=[dict(m) for m in call.messages], temperature=0.0, max_tokens=TOKENS, seed=0
        )
    assert ours.text == reference["choices"][0]["message"]["content"]
    assert ours.completion_tokens == reference["usage"]["completion_tokens"]
