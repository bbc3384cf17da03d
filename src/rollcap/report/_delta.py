"""What each call of a rollout added to the conversation, and where two rollouts part (pure).

Every call of a multi-turn rollout sends the whole conversation again. To show (and store) only
what is new, each call's request is read as chat messages, in the canonical form the model
server's conversation fingerprints use (``rollcap.conversation``: ids, empty content and
JSON key order do not count), whatever dialect the client spoke:

- a call's *parent* is the earlier call of the rollout whose request messages, followed by its
  answer's messages, are the longest prefix of this call's messages; a retry of the same request
  has the failed call as its parent, with nothing new;
- its *delta* is the messages after that prefix, ``keep`` being the prefix's length.

Where two rollouts of one task part is ``_diverge``'s: it compares the calls' ``signature``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

# The one import of the conversation fingerprints: they move with the pure core.
from rollcap.conversation import answer_fingerprint, fingerprints
from rollcap.translate import (
    messages_request_to_chat,
    namespaced_tool_names,
    responses_request_to_chat,
)

__all__ = [
    "CONVERSATION_KEYS",
    "CallThread",
    "CanonicalCall",
    "answer_messages",
    "canonical_call",
    "request_messages",
    "thread_calls",
]

# The request fields that hold the conversation, per dialect; the rest are the call's parameters.
CONVERSATION_KEYS: Mapping[str, tuple[str, ...]] = {
    "chat": ("messages",),
    "responses": ("input", "instructions"),
    "messages": ("messages", "system"),
}
# A Messages request needs max_tokens to translate; the answer's wrapper request has no other use.
_ANSWER_MAX_TOKENS = 1


def request_messages(
    dialect: str, request: Mapping[str, Any]
) -> tuple[list[Any], dict[str, tuple[str, str]]]:
    """The request's conversation as chat messages, and the Responses tool names to map back.

    Raises ``ValueError`` (naming the field) for a request that does not translate.
    """
    if dialect == "chat":
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise ValueError("messages: expected a list")
        return list(messages), {}
    if dialect == "responses":
        chat = responses_request_to_chat(request)
        return list(chat["messages"]), namespaced_tool_names(request)
    if dialect == "messages":
        return list(messages_request_to_chat(request)["messages"]), {}
    raise ValueError(f"unknown dialect {dialect!r}")


def answer_messages(dialect: str, response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The answer as the chat message(s) a client sends back on its next turn.

    Raises ``ValueError`` for an answer that is not one (an error body, an unknown item type).
    """
    if dialect == "chat":
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise ValueError("choices: no answer")
        message = choices[0].get("message")
        if not isinstance(message, Mapping):
            raise ValueError("choices[0].message: no answer")
        return [{"role": "assistant", **message}]
    if dialect == "responses":
        output = response.get("output")
        if not isinstance(output, list) or not output:
            raise ValueError("output: no answer")
        return list(responses_request_to_chat({"input": output})["messages"])
    if dialect == "messages":
        content = response.get("content")
        if not isinstance(content, list):
            raise ValueError("content: no answer")
        wrapped = {
            "max_tokens": _ANSWER_MAX_TOKENS,
            "messages": [{"role": "assistant", "content": content}],
        }
        return list(messages_request_to_chat(wrapped)["messages"])
    raise ValueError(f"unknown dialect {dialect!r}")


@dataclass(frozen=True, slots=True)
class CanonicalCall:
    """One call's conversation in canonical form.

    ``messages`` is ``None`` when the request did not translate (``request_error`` says why);
    ``answer`` is empty when there was no answer to send back. ``params`` is the request less its
    conversation fields. ``signature`` identifies the whole request (messages and params), for
    comparing calls across rollouts.
    """

    messages: list[Any] | None
    answer: list[dict[str, Any]]
    params: dict[str, Any]
    request_fingerprints: list[bytes]
    answer_fingerprints: list[bytes]
    signature: bytes
    request_error: str | None = None
    answer_error: str | None = None
    identities: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def _prints(
    messages: Sequence[Any],
    identities: Mapping[str, tuple[str, str]],
    previous: CanonicalCall | None,
) -> list[bytes]:
    """``fingerprints(messages)``, reusing the previous call's for the messages it shares.

    A rollout resends its history on every call: comparing the messages as values is much
    cheaper than fingerprinting them again, and equal values fingerprint alike.
    """
    same = 0
    if previous is not None and previous.messages and previous.identities == identities:
        for old, new in zip(previous.messages, messages, strict=False):
            if old != new:
                break
            same += 1
    prints = previous.request_fingerprints[:same] if previous is not None and same else []
    if not prints:
        return fingerprints(messages, identities)
    for message in messages[same:]:
        prints.append(answer_fingerprint(prints, message, identities))
    return prints


def canonical_call(
    dialect: str,
    request: Mapping[str, Any] | None,
    response: Mapping[str, Any] | None,
    *,
    previous: CanonicalCall | None = None,
) -> CanonicalCall:
    """Read one captured call's request and answer; never raises.

    ``previous``, the rollout's call before this one, only saves work: the result is the same.
    """
    request = request if isinstance(request, Mapping) else None
    params: dict[str, Any] = {}
    messages: list[Any] | None = None
    identities: dict[str, tuple[str, str]] = {}
    request_error: str | None = None
    if request is None:
        request_error = "no request object was captured"
    else:
        conversation = CONVERSATION_KEYS.get(dialect, ())
        params = {k: v for k, v in request.items() if k not in conversation}
        try:
            messages, identities = request_messages(dialect, request)
        except Exception as exc:  # any request a client sent: shown as it came, never a crash
            request_error = str(exc) or type(exc).__name__
    answer: list[dict[str, Any]] = []
    answer_error: str | None = None
    if isinstance(response, Mapping):
        try:
            answer = answer_messages(dialect, response)
        except Exception as exc:  # any answer an upstream sent, as above
            answer_error = str(exc) or type(exc).__name__
    prints = _prints(messages, identities, previous) if messages is not None else []
    answered: list[bytes] = []
    state = list(prints)
    for message in answer:
        state = [answer_fingerprint(state, message, identities)]
        answered.append(state[0])
    return CanonicalCall(
        messages=messages,
        answer=answer,
        params=params,
        request_fingerprints=prints,
        answer_fingerprints=answered,
        signature=_signature(prints, params, request, request_error),
        request_error=request_error,
        answer_error=answer_error,
        identities=identities,
    )


def _signature(
    prints: Sequence[bytes],
    params: Mapping[str, Any],
    request: Mapping[str, Any] | None,
    request_error: str | None,
) -> bytes:
    digest = hashlib.sha256()
    if request_error is not None:
        # Not canonical: the request as it came is all there is to compare.
        digest.update(b"raw\0" + orjson.dumps(request, option=orjson.OPT_SORT_KEYS))
    else:
        digest.update(b"messages\0" + (prints[-1] if prints else b""))
        digest.update(b"\0params\0" + orjson.dumps(params, option=orjson.OPT_SORT_KEYS))
    return digest.digest()[:8]


@dataclass(frozen=True, slots=True)
class CallThread:
    """Where one call sits in its rollout's conversation.

    ``parent`` is the position (in the rollout's call list) of the call it continues, or
    ``None``; the call's messages are the parent's request and answer messages up to ``keep``,
    then ``new``. Without a parent ``keep`` is 0 and ``new`` is every message.
    """

    parent: int | None
    keep: int
    new: list[Any]


def thread_calls(calls: Sequence[CanonicalCall]) -> list[CallThread]:
    """The parent, kept prefix and delta of each call, in order; later calls win ties."""
    # fingerprint -> (position, length of the conversation it covers)
    ends: dict[bytes, tuple[int, int]] = {}
    out: list[CallThread] = []
    for position, call in enumerate(calls):
        prints = call.request_fingerprints
        parent: int | None = None
        keep = 0
        for length in range(len(prints), 0, -1):
            found = ends.get(prints[length - 1])
            if found is not None:
                parent, keep = found[0], length
                break
        messages = call.messages or []
        out.append(CallThread(parent, keep, messages[keep:]))
        if prints:
            ends[prints[-1]] = (position, len(prints))
            for extra, fingerprint in enumerate(call.answer_fingerprints, start=1):
                ends[fingerprint] = (position, len(prints) + extra)
    return out
