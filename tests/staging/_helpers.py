"""Shared builders for the staging tests: a tiny byte tokenizer and vLLM-shaped responses."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

# The byte tokenizer the fake upstream also uses: 1 opens a message, 2 closes one, every other
# byte b is id b + 3. Its point here is the prefix property: a turn's prompt is the previous
# prompt plus the previous generated ids plus the new messages.
START, END = 1, 2


def text_ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode("utf-8")]


def render_message(role: str, body: str) -> list[int]:
    return [START, *text_ids(f"{role}\n"), *text_ids(body), END, *text_ids("\n")]


def generation_prompt() -> list[int]:
    return [START, *text_ids("assistant\n")]


def generated(body: str) -> list[int]:
    return [*text_ids(body), END]


def logprobs_for(ids: Sequence[int]) -> list[float]:
    """Exact in binary32, different per position, never 0.0 (so a mask slip is visible)."""
    return [-(((token + i) % 63) + 1) / 16 for i, token in enumerate(ids)]


def call_id() -> str:
    return uuid.uuid4().hex


def vllm_response(
    prompt_ids: Sequence[int],
    generated_ids: Sequence[int],
    logprobs: Sequence[float],
    *,
    with_token_ids: bool = True,
    **top_level: Any,
) -> dict[str, Any]:
    """A non-streamed vLLM chat completion as returned with return_token_ids: true."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "ok", "tool_calls": []},
        "finish_reason": "stop",
        "logprobs": {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp, "bytes": [], "top_logprobs": []}
                for t, lp in zip(generated_ids, logprobs, strict=True)
            ],
        },
    }
    if with_token_ids:
        choice["token_ids"] = list(generated_ids)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(generated_ids)},
        "prompt_token_ids": list(prompt_ids),
        **top_level,
    }
