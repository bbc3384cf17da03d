"""The embedded model: what starting every generation from an empty context costs.

    .venv/bin/python bench/local.py [--rounds N]

An agent's conversation grows by a turn per call, so each call's prompt is the previous call's
prompt, its answer and a new user turn. ``LocalEngine`` evaluates every prompt whole, so that the
same request always gets the same answer; llama.cpp by itself would keep the previous call's
tokens and evaluate only the new ones. For conversations of growing length this bench times one
call both ways, in alternating rounds on one loaded model, medians:

- fresh: ``LocalEngine.generate`` (what the ``local_model`` server does): the whole prompt;
- reused: the same prompt handed to llama.cpp while the previous turn is still in its context,
  so only the new turn is evaluated (the baseline, what determinism gives up).

Each call generates 16 tokens. Needs the ``local`` extra.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rollcap.local import LocalEngine, parse_chat_request

ANSWER_TOKENS = 16
TURN = "Tell me one more fact about the colour of the sea, and why it changes with the weather."


def _conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for n in range(turns - 1):
        messages += [
            {"role": "user", "content": f"{TURN} ({n})"},
            {
                "role": "assistant",
                "content": "The sea looks blue because water absorbs red "
                "light and the sky's colour is reflected; under clouds it turns grey. " * 3,
            },
        ]
    return [*messages, {"role": "user", "content": TURN}]


def _time_fresh(engine: LocalEngine, messages: list[dict[str, str]]) -> float:
    call = parse_chat_request({"messages": messages, "max_tokens": ANSWER_TOKENS})
    prompt = engine.prompt(call.messages)
    start = time.perf_counter()
    engine.generate(prompt, call.sampling)
    return time.perf_counter() - start


def _time_reused(engine: LocalEngine, messages: list[dict[str, str]]) -> float:
    """The earlier turns are evaluated first (not timed), then llama.cpp reuses them."""
    earlier = parse_chat_request({"messages": messages[:-1] or messages[:1]}).messages
    now = parse_chat_request({"messages": messages}).messages
    prefix = engine.prompt(earlier).tokens
    tokens = engine.prompt(now).tokens
    llama = engine.llama
    with engine.lock:
        llama.reset()
        llama.eval(list(prefix))
        start = time.perf_counter()
        generated = llama.generate(list(tokens), temp=0.0, top_k=0, top_p=1.0, min_p=0.0)
        try:
            for n, _ in enumerate(generated, 1):
                if n >= ANSWER_TOKENS:
                    break
        finally:
            generated.close()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    engine = LocalEngine.load()
    try:
        print(f"one call, {ANSWER_TOKENS} tokens generated; median of {args.rounds} rounds")
        print(f"{'turns':>5} {'prompt tok':>10} {'fresh ms':>9} {'reused ms':>9} {'ratio':>6}")
        for turns in (1, 4, 16, 32):
            messages = _conversation(turns)
            size = len(engine.prompt(parse_chat_request({"messages": messages}).messages).tokens)
            fresh: list[float] = []
            reused: list[float] = []
            for _ in range(args.rounds):
                fresh.append(_time_fresh(engine, messages))
                reused.append(_time_reused(engine, messages))
            f, r = statistics.median(fresh) * 1000, statistics.median(reused) * 1000
            print(f"{turns:>5} {size:>10} {f:>9.1f} {r:>9.1f} {f / r:>6.2f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
