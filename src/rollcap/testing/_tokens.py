"""The fake upstream's tokenizer: byte level, deterministic, pure.

Used only when a chat request asks for ``return_token_ids``. Ids 1 and 2 are special (start and
end of a message); every byte ``b`` of UTF-8 text is the id ``b + 3``, so the vocabulary is the ids
1 to 258.

A message renders as ``[1] + bytes(role + "\\n") + body + [2] + bytes("\\n")`` and a prompt is its
messages followed by the generation prompt ``[1] + bytes("assistant\\n")``. The body of an
assistant message is its content text, then ``"<tool_call>" + name + "\\n" + arguments +
"</tool_call>"`` for each tool call; the body of any other message is its content text. Content
is a string, ``null`` (empty), or a list of ``{"type": "text", "text": ...}`` parts, which render
as their concatenated text.

The generated ids of an answer are the bytes of its body followed by ``2``. So when a client sends
the answer back as the next turn's assistant message (same content, same tool call names and
argument strings), the next prompt starts with this prompt followed by the generated ids.

A pinned prefix (the request field named by ``PREFIX_IDS_FIELD``) replaces the rendering of the
messages up to and including the last assistant message: the prompt is the pinned ids, the
messages after the last assistant message (all of them when there is none), then the generation
prompt.

The log-probability of the generated id ``t`` at position ``i`` is ``-((t + i) % 64) / 16``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "BYTE_OFFSET",
    "END_ID",
    "PREFIX_IDS_FIELD",
    "START_ID",
    "VOCAB_SIZE",
    "assistant_body",
    "decode",
    "encode",
    "fake_logprob",
    "generated_ids",
    "logprob_entries",
    "message_body",
    "render_prompt",
    "token_bytes",
    "token_text",
    "tool_call_parts",
    "tool_call_text",
]

START_ID: Final = 1
END_ID: Final = 2
BYTE_OFFSET: Final = 3
VOCAB_SIZE: Final = BYTE_OFFSET + 256
PREFIX_IDS_FIELD: Final = "required_prefix_token_ids"
"""The chat request field that pins the prompt's leading token ids."""

_SPECIAL_TEXT: Final = {START_ID: "<|start|>", END_ID: "<|end|>"}
_TOOL_OPEN: Final = "<tool_call>"
_TOOL_CLOSE: Final = "</tool_call>"


def tool_call_parts(name: str) -> tuple[str, str]:
    """The text before and after the arguments of a call to ``name`` in an assistant body."""
    return f"{_TOOL_OPEN}{name}\n", _TOOL_CLOSE


def tool_call_text(name: str, arguments: str) -> str:
    """How one tool call is written in an assistant body."""
    head, tail = tool_call_parts(name)
    return head + arguments + tail


def encode(text: str) -> list[int]:
    """The ids of ``text``'s UTF-8 bytes (no special ids)."""
    return [b + BYTE_OFFSET for b in text.encode()]


def token_bytes(token_id: int) -> bytes:
    """The bytes one id stands for; a special id stands for its marker text."""
    if token_id in _SPECIAL_TEXT:
        return _SPECIAL_TEXT[token_id].encode()
    if BYTE_OFFSET <= token_id < VOCAB_SIZE:
        return bytes((token_id - BYTE_OFFSET,))
    raise ValueError(f"token id {token_id!r} is not in the fake vocabulary (1 to {VOCAB_SIZE - 1})")


def token_text(token_id: int) -> str:
    """One id as text, the way a tokenizer decodes a single token (a lone byte of a multi-byte
    character becomes U+FFFD)."""
    return token_bytes(token_id).decode(errors="replace")


def decode(ids: Iterable[int], *, special: bool = False) -> str:
    """The text of ``ids``. Special ids are left out, unless ``special`` writes them as
    ``<|start|>`` and ``<|end|>``. Raises ``ValueError`` for an id outside the vocabulary."""
    out = bytearray()
    for token_id in ids:
        if token_id in _SPECIAL_TEXT and not special:
            continue
        out += token_bytes(token_id)
    return out.decode(errors="replace")


def fake_logprob(token_id: int, position: int) -> float:
    """The log-probability the fake reports for generated ``token_id`` at ``position`` (from 0)."""
    return -((token_id + position) % 64) / 16


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping):
                raise ValueError("a content part must be an object")
            text = part.get("text")
            if part.get("type") != "text" or not isinstance(text, str):
                raise ValueError(
                    f"content part type {part.get('type')!r} is not supported with token ids"
                )
            texts.append(text)
        return "".join(texts)
    raise ValueError("message content must be a string, null or a list of text parts")


def _tool_call_text(call: object) -> str:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        raise ValueError("a tool call must have a function object")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise ValueError("a tool call's function needs a string name and string arguments")
    return tool_call_text(name, arguments)


def assistant_body(message: Mapping[str, Any]) -> str:
    """The body text of an assistant message: content, then each tool call."""
    calls = message.get("tool_calls")
    if calls is None:
        calls = []
    if not isinstance(calls, list):
        raise ValueError("tool_calls must be a list")
    return _content_text(message.get("content")) + "".join(_tool_call_text(c) for c in calls)


def message_body(message: Mapping[str, Any]) -> str:
    """The body text of any message (an assistant's includes its tool calls)."""
    if message.get("role") == "assistant":
        return assistant_body(message)
    return _content_text(message.get("content"))


def _render_message(message: object) -> list[int]:
    if not isinstance(message, Mapping):
        raise ValueError("each message must be an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise ValueError("each message needs a string role")
    return [START_ID, *encode(role + "\n"), *encode(message_body(message)), END_ID, *encode("\n")]


def render_prompt(
    messages: Sequence[Mapping[str, Any]], *, prefix_ids: Sequence[int] | None = None
) -> list[int]:
    """The prompt ids for ``messages``, ending with the generation prompt.

    With ``prefix_ids`` (a pinned prefix): those ids, then only the messages after the last
    assistant message. Raises ``ValueError`` for a message the fake cannot render.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise ValueError("messages must be a list")
    ids: list[int] = []
    rendered: Sequence[Any] = messages
    if prefix_ids is not None:
        ids.extend(prefix_ids)
        last = max(
            (
                i
                for i, m in enumerate(messages)
                if isinstance(m, Mapping) and m.get("role") == "assistant"
            ),
            default=-1,
        )
        rendered = messages[last + 1 :]
    for message in rendered:
        ids.extend(_render_message(message))
    ids.append(START_ID)
    ids.extend(encode("assistant\n"))
    return ids


def generated_ids(body: str) -> list[int]:
    """The ids the fake generates for an answer whose body is ``body``: its bytes, then the end."""
    return [*encode(body), END_ID]


def logprob_entries(
    ids: Sequence[int], *, start: int = 0, as_token_ids: bool = False
) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` entries for generated ``ids`` that begin at position ``start``."""
    return [
        {
            "token": f"token_id:{token_id}" if as_token_ids else token_text(token_id),
            "logprob": fake_logprob(token_id, start + offset),
            "bytes": list(token_bytes(token_id)),
            "top_logprobs": [],
        }
        for offset, token_id in enumerate(ids)
    ]
