"""Lineage fingerprints of request and response items (STAGING §1.3, FINGERPRINT_VERSION 2).

A continuation call is matched to its parent by two SHA-256 hashes over *items*, the objects a
conversation is made of (Chat messages, Responses input and output items, and Anthropic Messages
content mapped to Responses-style items):

- :func:`assistant_fingerprint` covers only what the model authored: assistant messages and
  ``function_call`` items. A parent's row stores the fingerprint of its request items followed by
  its served answer; a child that replays both, in any dialect's spelling of the same content and
  tool identity, hashes to the same value.
- :func:`conversation_digest` covers every item, so the parent's request items, replayed as the
  child's first items, pin down which conversation the child continues.

Every field is hashed as ``tag (1 byte) ‖ u64be(len(utf8)) ‖ utf8`` after a raw domain string,
so neither a field boundary nor a tag can be forged by content. The normalizations below are the
wire contract: an implementation that hashes a different value for the same conversation never
resolves a parent written by the other.

Everything here is pure: no I/O, no clock, no global state.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "ASSISTANT_FINGERPRINT_DOMAIN",
    "CONVERSATION_DIGEST_DOMAIN",
    "ENVELOPE_ROLE",
    "FINGERPRINT_VERSION",
    "TOKEN_TRANSPORT_KEYS",
    "UnfingerprintableError",
    "assistant_fingerprint",
    "canonical_arguments",
    "canonical_json",
    "content_parts",
    "conversation_digest",
    "request_items",
    "response_items",
    "tool_calls",
    "tool_results",
]

FINGERPRINT_VERSION = 2

ASSISTANT_FINGERPRINT_DOMAIN = b"nemo-gym-lineage"
CONVERSATION_DIGEST_DOMAIN = b"nemo-gym-lineage-context"

ENVELOPE_ROLE = "_ng_request_envelope"

# What the engine or the gate adds to an answer for training; the client never sees it, so a
# replayed answer cannot carry it and the parent's row must not hash it.
TOKEN_TRANSPORT_KEYS: tuple[str, ...] = (
    "prompt_token_ids",
    "generation_token_ids",
    "generation_log_probs",
    "routed_experts",
)

_DIALECTS = ("chat", "responses", "messages")
_TEXT_PART_TYPES = frozenset({"", "text", "input_text", "output_text"})
_TOOL_BLOCK_TYPES = frozenset({"tool_use", "tool_result"})
_THINKING_BLOCK_TYPES = frozenset({"thinking", "redacted_thinking"})
# Anthropic blocks that become items of their own rather than parts of a message's content.
_ITEM_BLOCK_TYPES = _THINKING_BLOCK_TYPES | _TOOL_BLOCK_TYPES
_U64 = struct.Struct(">Q")

# Tags of assistant_fingerprint fields.
_AF_PART_TYPE = 0x00
_AF_PART_PAYLOAD = 0x01
_AF_CALL_ID = 0x02
_AF_CALL_NAME = 0x03
_AF_CALL_ARGS = 0x04

# Tags of conversation_digest fields.
_CD_KIND = 0x00
_CD_PART_TYPE = 0x01
_CD_PART_PAYLOAD = 0x02
_CD_CALL_ID = 0x03
_CD_CALL_NAME = 0x04
_CD_CALL_ARGS = 0x05
_CD_RESULT_ID = 0x06
_CD_RESULT_OUTPUT = 0x07


class UnfingerprintableError(ValueError):
    """An item or a piece of content has no fingerprint (its message says what and where).

    The gate fails the request on it rather than guess a parent (STAGING §1.2).
    """


# --- canonical forms ------------------------------------------------------------------------


def canonical_json(value: Any, *, where: str = "value") -> str:
    """``value`` as orjson writes it with sorted keys: compact, UTF-8, no ASCII escapes.

    Raises :class:`UnfingerprintableError` for what orjson cannot write (a non-string key, an
    integer beyond 64 bits, an arbitrary object, …).
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise UnfingerprintableError(f"{where} is not JSON-serializable: {exc}") from exc


def canonical_arguments(arguments: Any, *, where: str = "arguments") -> str:
    """The canonical form of tool-call arguments.

    ``None`` → ``""``; a string that parses as JSON → its canonical JSON (so a client that
    re-spaces or reorders the model's arguments still matches), any other string → itself
    stripped of surrounding whitespace; any other value → its canonical JSON.
    """
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments.strip()
        return canonical_json(parsed, where=where)
    return canonical_json(arguments, where=where)


def _result_output(value: Any, *, where: str) -> str:
    # A tool result is hashed verbatim when it is text; structure is hashed canonically.
    if isinstance(value, str):
        return value
    return canonical_json(value, where=where)


def _string_field(item: Mapping[str, Any], key: str, *, where: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UnfingerprintableError(f"{where}.{key} must be a string, not {type(value).__name__}")
    return value


def _first_string(item: Mapping[str, Any], keys: Sequence[str], *, where: str) -> str:
    # "a or b or ''": the first key holding a non-empty string wins.
    for key in keys:
        value = _string_field(item, key, where=where)
        if value:
            return value
    return ""


# --- normalization --------------------------------------------------------------------------


def content_parts(content: Any, *, where: str = "content") -> list[tuple[str, str]]:
    """The ``(ctype, payload)`` parts of an item's ``content``.

    ``None`` → none; a string → ``("text", s)`` when non-empty. A list: string entries →
    ``("text", s)`` when non-empty; ``tool_use``/``tool_result`` blocks are skipped (they are
    hashed as tool calls and results); objects typed ``""``, ``text``, ``input_text`` or
    ``output_text`` with a string ``text`` → ``("text", text)`` when non-empty; any other typed
    object → ``(type, canonical JSON of the object)``. An untyped object, or content of any other
    shape, raises :class:`UnfingerprintableError`.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list | tuple):
        raise UnfingerprintableError(
            f"{where} must be null, a string or a list, not {type(content).__name__}"
        )
    parts: list[tuple[str, str]] = []
    for index, entry in enumerate(content):
        entry_where = f"{where}[{index}]"
        if isinstance(entry, str):
            if entry:
                parts.append(("text", entry))
            continue
        if not isinstance(entry, Mapping):
            raise UnfingerprintableError(
                f"{entry_where} must be a string or an object, not {type(entry).__name__}"
            )
        ctype = entry.get("type")
        if not isinstance(ctype, str):
            raise UnfingerprintableError(f"{entry_where} is an object without a string type")
        if ctype in _TOOL_BLOCK_TYPES:
            continue
        text = entry.get("text")
        if ctype in _TEXT_PART_TYPES and isinstance(text, str):
            if text:
                parts.append(("text", text))
            continue
        parts.append((ctype, canonical_json(entry, where=entry_where)))
    return parts


def _content_blocks(item: Mapping[str, Any], block_type: str) -> Iterator[tuple[int, Any]]:
    content = item.get("content")
    if not isinstance(content, list | tuple):
        return
    for index, entry in enumerate(content):
        if isinstance(entry, Mapping) and entry.get("type") == block_type:
            yield index, entry


def tool_calls(item: Mapping[str, Any], *, where: str = "item") -> list[tuple[str, str, str]]:
    """The ``(id, name, canonical arguments)`` tool calls an item makes, in this order.

    A ``function_call`` item itself: ``call_id`` or ``id`` or ``""``, ``name`` prefixed with
    ``"<namespace>__"`` when ``namespace`` is set, ``arguments``. Then every ``tool_use``
    content block: ``id``, ``name``, ``input``. Then every ``tool_calls[]`` entry: ``id``,
    ``function.name``, ``function.arguments``.
    """
    calls: list[tuple[str, str, str]] = []
    if item.get("type") == "function_call":
        name = _string_field(item, "name", where=where)
        namespace = _string_field(item, "namespace", where=where)
        if namespace:
            name = f"{namespace}__{name}"
        calls.append(
            (
                _first_string(item, ("call_id", "id"), where=where),
                name,
                canonical_arguments(item.get("arguments"), where=f"{where}.arguments"),
            )
        )
    for index, block in _content_blocks(item, "tool_use"):
        block_where = f"{where}.content[{index}]"
        calls.append(
            (
                _string_field(block, "id", where=block_where),
                _string_field(block, "name", where=block_where),
                canonical_arguments(block.get("input"), where=f"{block_where}.input"),
            )
        )
    entries = item.get("tool_calls")
    if entries is not None:
        if not isinstance(entries, list | tuple):
            raise UnfingerprintableError(f"{where}.tool_calls must be a list")
        for index, entry in enumerate(entries):
            entry_where = f"{where}.tool_calls[{index}]"
            if not isinstance(entry, Mapping):
                raise UnfingerprintableError(f"{entry_where} must be an object")
            function = entry.get("function")
            if function is None:
                function = {}
            if not isinstance(function, Mapping):
                raise UnfingerprintableError(f"{entry_where}.function must be an object")
            calls.append(
                (
                    _string_field(entry, "id", where=entry_where),
                    _string_field(function, "name", where=f"{entry_where}.function"),
                    canonical_arguments(
                        function.get("arguments"), where=f"{entry_where}.function.arguments"
                    ),
                )
            )
    return calls


def tool_results(item: Mapping[str, Any], *, where: str = "item") -> list[tuple[str, str]]:
    """The ``(id, output)`` tool results an item carries, in this order.

    A ``function_call_output`` item: ``call_id`` or ``id``, ``output``; else a ``role: "tool"``
    message: ``tool_call_id``, ``content``. Then every ``tool_result`` content block:
    ``tool_use_id`` or ``id``, ``content``. An output is hashed as is when it is a string, else
    as canonical JSON.
    """
    results: list[tuple[str, str]] = []
    if item.get("type") == "function_call_output":
        results.append(
            (
                _first_string(item, ("call_id", "id"), where=where),
                _result_output(item.get("output"), where=f"{where}.output"),
            )
        )
    elif item.get("role") == "tool":
        results.append(
            (
                _string_field(item, "tool_call_id", where=where),
                _result_output(item.get("content"), where=f"{where}.content"),
            )
        )
    for index, block in _content_blocks(item, "tool_result"):
        block_where = f"{where}.content[{index}]"
        results.append(
            (
                _first_string(block, ("tool_use_id", "id"), where=block_where),
                _result_output(block.get("content"), where=f"{block_where}.content"),
            )
        )
    return results


def _is_assistant_authored(item: Mapping[str, Any]) -> bool:
    # Reasoning items are the model's too, but clients drop or rewrite them freely, so they
    # would make a faithful replay miss its parent.
    return item.get("role") == "assistant" or item.get("type") == "function_call"


# --- hashes ---------------------------------------------------------------------------------


class _Hasher:
    """SHA-256 over a raw domain, then tagged, length-prefixed UTF-8 fields."""

    def __init__(self, domain: bytes) -> None:
        self._sha = hashlib.sha256(domain)

    def field(self, tag: int, value: str, *, where: str) -> None:
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UnfingerprintableError(f"{where} is not valid UTF-8 text: {exc}") from exc
        self._sha.update(bytes((tag,)))
        self._sha.update(_U64.pack(len(data)))
        self._sha.update(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _checked_item(item: Any, index: int) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise UnfingerprintableError(f"item {index} must be an object, not {type(item).__name__}")
    return item


def assistant_fingerprint(items: Sequence[Mapping[str, Any]]) -> str:
    """The hex SHA-256 of the assistant-authored items, or ``""`` when there are none.

    Domain ``nemo-gym-lineage``; for each item with ``role == "assistant"`` or
    ``type == "function_call"``, in order: its content parts as tags ``00`` ctype and ``01``
    payload, then its tool calls as ``02`` id, ``03`` name, ``04`` arguments. An empty result
    means "no assistant turn": the call is a root (STAGING §1.2).

    Raises :class:`UnfingerprintableError` for a non-object item, or for an assistant-authored
    item whose content or tool calls have no normal form (other items' content is not read).
    """
    hasher = _Hasher(ASSISTANT_FINGERPRINT_DOMAIN)
    authored = False
    for index, raw in enumerate(items):
        item = _checked_item(raw, index)
        if not _is_assistant_authored(item):
            continue
        authored = True
        where = f"item {index}"
        for ctype, payload in content_parts(item.get("content"), where=f"{where}.content"):
            hasher.field(_AF_PART_TYPE, ctype, where=where)
            hasher.field(_AF_PART_PAYLOAD, payload, where=where)
        for call_id, name, arguments in tool_calls(item, where=where):
            hasher.field(_AF_CALL_ID, call_id, where=where)
            hasher.field(_AF_CALL_NAME, name, where=where)
            hasher.field(_AF_CALL_ARGS, arguments, where=where)
    return hasher.hexdigest() if authored else ""


def conversation_digest(items: Sequence[Mapping[str, Any]]) -> str:
    """The hex SHA-256 of every item, whoever authored it.

    Domain ``nemo-gym-lineage-context``; for each item, in order: ``00`` its role, else its type,
    else ``""``; content parts as ``01`` ctype, ``02`` payload; tool calls as ``03`` id,
    ``04`` name, ``05`` arguments; tool results as ``06`` id, ``07`` output. The digest of no
    items is the digest of the domain alone.

    Raises :class:`UnfingerprintableError` for a non-object item or content without a normal
    form.
    """
    hasher = _Hasher(CONVERSATION_DIGEST_DOMAIN)
    for index, raw in enumerate(items):
        item = _checked_item(raw, index)
        where = f"item {index}"
        kind = _first_string(item, ("role", "type"), where=where)
        hasher.field(_CD_KIND, kind, where=where)
        for ctype, payload in content_parts(item.get("content"), where=f"{where}.content"):
            hasher.field(_CD_PART_TYPE, ctype, where=where)
            hasher.field(_CD_PART_PAYLOAD, payload, where=where)
        for call_id, name, arguments in tool_calls(item, where=where):
            hasher.field(_CD_CALL_ID, call_id, where=where)
            hasher.field(_CD_CALL_NAME, name, where=where)
            hasher.field(_CD_CALL_ARGS, arguments, where=where)
        for result_id, output in tool_results(item, where=where):
            hasher.field(_CD_RESULT_ID, result_id, where=where)
            hasher.field(_CD_RESULT_OUTPUT, output, where=where)
    return hasher.hexdigest()


# --- items of a request and of an answer ----------------------------------------------------


def _plain(value: Any) -> Any:
    # Items leave here as plain JSON-shaped values so that callers may store or serialize them
    # and so that a mapping proxy or tuple hashes as the dict or list it stands for.
    if isinstance(value, Mapping):
        return {key: _plain(entry) for key, entry in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(entry) for entry in value]
    return value


def _item_list(value: Any, *, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise UnfingerprintableError(f"{where} must be a list, not {type(value).__name__}")
    items: list[dict[str, Any]] = []
    for index, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise UnfingerprintableError(
                f"{where}[{index}] must be an object, not {type(entry).__name__}"
            )
        items.append(_plain(entry))
    return items


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str | bytes | Mapping | list | tuple):
        return len(value) == 0
    return False


def _envelope(instructions: Any, tools: Any) -> list[dict[str, Any]]:
    if _is_empty(instructions) and _is_empty(tools):
        return []
    # The stdlib's json with its default separators and ASCII escapes, not canonical_json: the
    # string is the contract, byte for byte.
    envelope = json.dumps(
        {"instructions": instructions, "tools": tools}, sort_keys=True, default=str
    )
    return [{"role": ENVELOPE_ROLE, "content": envelope}]


def _thinking_item(block: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning"}
    if block.get("type") == "thinking":
        item["summary"] = [{"type": "summary_text", "text": _plain(block.get("thinking"))}]
        signature = block.get("signature")
        if signature is not None:
            item["encrypted_content"] = _plain(signature)
    else:
        item["summary"] = []
        item["encrypted_content"] = _plain(block.get("data"))
    return item


def _message_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as Responses-style items, in the order its blocks come.

    Runs of other blocks (text, images, …) stay together as the content of a message item with
    the message's role; thinking blocks become reasoning items, ``tool_use`` blocks
    ``function_call`` items and ``tool_result`` blocks ``function_call_output`` items, where
    they stand.
    """
    role = message.get("role")
    content = message.get("content")
    if not isinstance(content, list | tuple):
        # A string (or a malformed value, left for the fingerprint to refuse) is the message.
        return [{"role": role, "content": _plain(content)}]
    items: list[dict[str, Any]] = []
    pending: list[Any] = []

    def flush() -> None:
        if pending:
            items.append({"role": role, "content": list(pending)})
            pending.clear()

    for block in content:
        btype = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping) or btype not in _ITEM_BLOCK_TYPES:
            pending.append(_plain(block))
            continue
        flush()
        if btype in _THINKING_BLOCK_TYPES:
            items.append(_thinking_item(block))
        elif btype == "tool_use":
            items.append(
                {
                    "type": "function_call",
                    "call_id": _plain(block.get("id")),
                    "name": _plain(block.get("name")),
                    "arguments": _plain(block.get("input")),
                }
            )
        else:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": _plain(block.get("tool_use_id")),
                    "output": _plain(block.get("content")),
                }
            )
    flush()
    if not items:
        # An empty content list is still a turn of the conversation.
        items.append({"role": role, "content": []})
    return items


def _messages_items(messages: Any, *, where: str) -> list[dict[str, Any]]:
    if messages is None:
        return []
    if not isinstance(messages, list | tuple):
        raise UnfingerprintableError(f"{where} must be a list, not {type(messages).__name__}")
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UnfingerprintableError(
                f"{where}[{index}] must be an object, not {type(message).__name__}"
            )
        items.extend(_message_items(message))
    return items


def _check_dialect(dialect: str) -> None:
    if dialect not in _DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}: expected one of {', '.join(_DIALECTS)}")


def request_items(dialect: str, request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request items of a validated request in ``dialect`` (STAGING §1.3), as plain dicts.

    ``"chat"``: ``messages``. ``"responses"``: ``input`` (a string is one user message item).
    ``"messages"`` (Anthropic): each message mapped to Responses-style items (see
    :func:`response_items`, which maps an answer the same way). Preceded, when the instructions
    (Responses ``instructions``, Messages ``system``; Chat has none) or ``tools`` are non-empty,
    by the pseudo item ``{"role": ENVELOPE_ROLE, "content": S}``, S being the stdlib's
    ``json.dumps({"instructions": …, "tools": …}, sort_keys=True, default=str)``; a change of
    system prompt or tools thus changes the conversation digest.

    Raises ``ValueError`` for an unknown dialect and :class:`UnfingerprintableError` for items
    that are not a list of objects.
    """
    _check_dialect(dialect)
    tools = request.get("tools")
    if dialect == "chat":
        instructions = None
        items = _item_list(request.get("messages"), where="messages")
    elif dialect == "responses":
        instructions = request.get("instructions")
        raw_input = request.get("input")
        if isinstance(raw_input, str):
            items = [{"role": "user", "content": raw_input}]
        else:
            items = _item_list(raw_input, where="input")
    else:
        instructions = request.get("system")
        items = _messages_items(request.get("messages"), where="messages")
    return [*_envelope(instructions, tools), *items]


def _without_transport(item: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key not in TOKEN_TRANSPORT_KEYS}


def response_items(dialect: str, answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The served, client-visible answer in ``dialect`` as output items, as plain dicts.

    ``"responses"``: ``output``. ``"chat"``: each ``choices[*].message`` as an assistant message
    item. ``"messages"``: the ``content`` blocks mapped as :func:`request_items` maps an
    assistant message, so a client that replays the turn reproduces the same items. The token
    transport keys (``TOKEN_TRANSPORT_KEYS``) are dropped from each item; a replay never has
    them.

    Raises ``ValueError`` for an unknown dialect and :class:`UnfingerprintableError` for an
    answer whose items are not objects.
    """
    _check_dialect(dialect)
    if dialect == "responses":
        items = _item_list(answer.get("output"), where="output")
    elif dialect == "chat":
        choices = _item_list(answer.get("choices"), where="choices")
        items = []
        for index, choice in enumerate(choices):
            message = choice.get("message")
            if not isinstance(message, dict):
                raise UnfingerprintableError(f"choices[{index}].message must be an object")
            items.append({**message, "role": "assistant"})
    else:
        items = _message_items({"role": "assistant", "content": answer.get("content")})
    return [_without_transport(item) for item in items]
