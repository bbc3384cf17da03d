"""The embedded chat server's wire format (pure): requests in, OpenAI-shaped bodies out.

Request rules (``parse_chat_request``), for a 135M model on a CPU:

- Deterministic by default: ``temperature`` 0 (greedy) and ``seed`` 0 unless the request sets
  them. ``top_p`` 1, ``top_k`` and ``min_p`` off, as the OpenAI API behaves; ``top_k``,
  ``min_p``, ``repetition_penalty`` (vLLM's names) are honoured when sent.
- ``max_completion_tokens`` (else ``max_tokens``) defaults to 128 and is capped at 1024 (a longer
  request is cut there and ends with ``finish_reason: "length"``, not refused: Anthropic clients
  always send a ``max_tokens``, often a large one).
- Message content is a string, ``null`` or a list of text parts (joined with ``"\\n"``).
  ``developer`` is sent as ``system``. Tool calls of earlier assistant turns and the
  ``tool`` messages answering them are kept as text the chat template can render.
- Tools: the model cannot call them. ``tools`` with ``tool_choice`` absent, ``auto`` or ``none``
  are ignored (the model answers in text, which ``auto`` allows); ``tool_choice`` ``required`` or
  a named function is refused, since no answer could honour it.
- Refused with HTTP 400 (``ChatRequestError``): ``n`` other than 1, ``logprobs``,
  ``response_format`` other than text, non-text content parts, and malformed values.
- Ignored: ``model`` (one model is served; answers name it), ``user``, ``metadata``,
  ``parallel_tool_calls``, ``reasoning_effort``, ``chat_template_kwargs`` and unknown fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_SEED",
    "MAX_TOKENS_CAP",
    "ChatCall",
    "ChatRequestError",
    "Completion",
    "Sampling",
    "chunk_body",
    "completion_body",
    "models_body",
    "parse_chat_request",
    "usage_body",
]

DEFAULT_MAX_TOKENS = 128
MAX_TOKENS_CAP = 1024
DEFAULT_SEED = 0
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_TOOL_ROLES = frozenset({"tool", "function"})


class ChatRequestError(ValueError):
    """A request the embedded model refuses: HTTP 400 with an OpenAI error body."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class Sampling:
    """How tokens are picked and when generation ends."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = DEFAULT_SEED
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0


@dataclass(frozen=True, slots=True)
class ChatCall:
    """One validated chat request: plain ``{"role", "content"}`` messages and sampling."""

    messages: tuple[Mapping[str, str], ...]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished generation. Counts are llama.cpp's tokens: the templated prompt, and every
    generated token but the end-of-generation one (as llama-cpp-python counts them)."""

    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ChatRequestError(
            f"{key} must be a number from {low} to {high}, got {value!r}", param=key
        )
    return float(value)


def _integer(body: Mapping[str, Any], key: str, default: int, low: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ChatRequestError(f"{key} must be an integer >= {low}, got {value!r}", param=key)
    return value


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise ChatRequestError("stop must be a string or a list of strings", param="stop")


def _text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatRequestError(f"{where} must be a string or a list of parts", param=where)
    texts: list[str] = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal") and isinstance(part.get(kind), str):
            texts.append(part[kind])
        else:
            raise ChatRequestError(
                f"the embedded model reads text only; {where}[{n}] has type {kind!r}",
                param=f"{where}[{n}].type",
            )
    return "\n".join(texts)


def _tool_calls_text(calls: object) -> str:
    """Earlier tool calls, written out so the model sees what was asked of the tools."""
    if not isinstance(calls, list):
        return ""
    lines = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            lines.append(f"{function.get('name')}({function.get('arguments') or ''})")
    return "\n".join(lines)


def _messages(value: object) -> tuple[Mapping[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ChatRequestError("messages must be a non-empty list", param="messages")
    out: list[Mapping[str, str]] = []
    for n, message in enumerate(value):
        where = f"messages[{n}]"
        if not isinstance(message, dict):
            raise ChatRequestError(f"{where} must be an object", param=where)
        role = message.get("role")
        text = _text(message.get("content"), f"{where}.content")
        if role in _TOOL_ROLES:
            # Chat templates of small models know no tool role: the result is news to the user.
            out.append({"role": "user", "content": f"Tool result:\n{text}"})
        elif isinstance(role, str) and role in _ROLES:
            calls = _tool_calls_text(message.get("tool_calls")) if role == "assistant" else ""
            out.append({"role": _ROLES[role], "content": "\n".join(t for t in (text, calls) if t)})
        else:
            raise ChatRequestError(f"{where}.role {role!r} is not supported", param=f"{where}.role")
    return tuple(out)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    if body.get("n") not in (None, 1):
        raise ChatRequestError("the embedded model answers one choice: n must be 1", param="n")
    if body.get("logprobs") or body.get("top_logprobs") is not None:
        raise ChatRequestError("the embedded model reports no logprobs", param="logprobs")
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, dict) or response_format.get("type") != "text"
    ):
        raise ChatRequestError(
            "the embedded model supports only text output (response_format type text)",
            param="response_format",
        )
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "auto", "none"):
        raise ChatRequestError(
            "the embedded model cannot call tools: tool_choice must be auto or none "
            "(tools are then ignored and the answer is text)",
            param="tool_choice",
        )


def parse_chat_request(body: object) -> ChatCall:
    """Validate a Chat Completions request body; ``ChatRequestError`` for what cannot be served."""
    if not isinstance(body, dict):
        raise ChatRequestError("the request body must be a JSON object")
    _refuse_unsupported(body)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ChatRequestError("stream must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ChatRequestError("stream_options must be an object", param="stream_options")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    sampling = Sampling(
        max_tokens=min(_integer(body, key, DEFAULT_MAX_TOKENS, 1), MAX_TOKENS_CAP),
        temperature=_number(body, "temperature", 0.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=_integer(body, "top_k", 0, -1),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=_integer(body, "seed", DEFAULT_SEED, 0),
        stop=_stop(body.get("stop")),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=_number(body, "repetition_penalty", 1.0, 0.01, 10.0),
    )
    return ChatCall(
        messages=_messages(body.get("messages")),
        sampling=sampling,
        stream=bool(stream),
        include_usage=bool(options and options.get("include_usage") is True),
    )


def usage_body(completion: Completion) -> dict[str, Any]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def completion_body(
    completion: Completion, *, completion_id: str, created: int, model: str
) -> dict[str, Any]:
    """A non-streamed ``chat.completion``."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": completion.text, "refusal": None},
                "logprobs": None,
                "finish_reason": completion.finish_reason,
            }
        ],
        "usage": usage_body(completion),
    }


def chunk_body(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: Mapping[str, Any] | None = None,
    finish_reason: str | None = None,
    include_usage: bool = False,
    usage: Completion | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``: a delta, or (``usage`` given) the final usage chunk.

    With ``include_usage`` every delta chunk carries ``"usage": null``, as OpenAI sends them.
    """
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    if usage is not None:
        return {**body, "choices": [], "usage": usage_body(usage)}
    body["choices"] = [
        {"index": 0, "delta": dict(delta or {}), "logprobs": None, "finish_reason": finish_reason}
    ]
    if include_usage:
        body["usage"] = None
    return body


def models_body(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "rollcap"}],
    }
