"""Conversations compared by fingerprint: which earlier call of a rollout a new call continues.

Pure. A multi-turn rollout sends the whole conversation again on every call; the call whose
request messages plus answer are the longest prefix of the new call's messages is its parent,
so the staged token records of one rollout form a chain the trainer can linearize. The same
fingerprints tell where two conversations part: the first message whose fingerprints differ.

Messages are compared in the backend's (chat) form, after the client's dialect was translated,
in a canonical shape that drops what clients and translations are free to change:

- ids (tool call ids, item ids) and empty content (``None``, ``""``, ``[]`` are alike);
- content parts are reduced to their joined text;
- tool call arguments that are JSON compare by value (key order and spacing may change when an
  answer goes out as Anthropic ``input`` and comes back as chat ``arguments``);
- a tool's identity is its namespace plus its name: a Responses namespaced tool is flattened to
  one chat name, and ``identities`` maps that name back, so both forms of a call fingerprint alike.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = ["ConversationIndex", "answer_fingerprint", "fingerprints"]

_ROOT = hashlib.sha256(b"rollcap.conversation.v1").digest()


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                pieces.append(part["text"])
        return "".join(pieces)
    return ""


def _arguments(raw: object) -> Any:
    if isinstance(raw, str):
        try:
            return ["json", orjson.loads(raw)]
        except orjson.JSONDecodeError:
            return ["text", raw]
    return ["json", raw]


def _canonical(message: Mapping[str, Any], identities: Mapping[str, tuple[str, str]]) -> bytes:
    calls = []
    for call in message.get("tool_calls") or ():
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        name = function.get("name")
        name = name if isinstance(name, str) else ""
        namespace, inner = identities.get(name, ("", name))
        calls.append([namespace, inner, _arguments(function.get("arguments"))])
    shape = [str(message.get("role")), _text(message.get("content")), calls]
    return orjson.dumps(shape, option=orjson.OPT_SORT_KEYS)


def _extend(state: bytes, message: Mapping[str, Any], identities: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(state + _canonical(message, identities)).digest()


def fingerprints(
    messages: Sequence[Any], identities: Mapping[str, tuple[str, str]] | None = None
) -> list[bytes]:
    """The fingerprint after each message: ``result[i]`` covers ``messages[: i + 1]``."""
    names = identities or {}
    state = _ROOT
    out = []
    for message in messages:
        state = _extend(state, message if isinstance(message, Mapping) else {}, names)
        out.append(state)
    return out


def answer_fingerprint(
    request_fingerprints: Sequence[bytes],
    answer: Mapping[str, Any],
    identities: Mapping[str, tuple[str, str]] | None = None,
) -> bytes:
    """The fingerprint of a call's request messages followed by its answer message."""
    state = request_fingerprints[-1] if request_fingerprints else _ROOT
    return _extend(state, answer, identities or {})


class ConversationIndex:
    """Per rollout, the fingerprint each answered call leaves behind, most recent rollouts kept.

    Not thread-safe: it has one owner (the model server uses it from its event loop).
    """

    def __init__(self, max_rollouts: int = 4096) -> None:
        if max_rollouts < 1:
            raise ValueError("max_rollouts must be at least 1")
        self._max = max_rollouts
        self._rollouts: OrderedDict[str, dict[bytes, str]] = OrderedDict()

    def parent(self, rollout_id: str, request_fingerprints: Sequence[bytes]) -> str | None:
        """The call whose conversation is the longest prefix of this request's, if any."""
        known = self._rollouts.get(rollout_id)
        if not known:
            return None
        self._rollouts.move_to_end(rollout_id)
        # The last message is the new turn's own input; a parent ends before it.
        for fingerprint in reversed(request_fingerprints[:-1]):
            found = known.get(fingerprint)
            if found is not None:
                return found
        return None

    def remember(self, rollout_id: str, fingerprint: bytes, model_call_id: str) -> None:
        known = self._rollouts.get(rollout_id)
        if known is None:
            known = self._rollouts[rollout_id] = {}
            while len(self._rollouts) > self._max:
                self._rollouts.popitem(last=False)
        else:
            self._rollouts.move_to_end(rollout_id)
        known[fingerprint] = model_call_id

    def forget(self, rollout_id: str) -> None:
        self._rollouts.pop(rollout_id, None)
