"""The answer to a request before any dialect shapes it: text, reasoning, a tool call, usage.

Determinism: ids and timestamps come from a hash of the request body with ``stream`` and
``stream_options`` left out, so the same request gets the same ids streamed or not.

Token counts: ``input`` is ceil(chars / 4) of the request's text (the string values of ``input`` and
``instructions``, of ``messages``, and of ``system``; ``role`` and ``type`` values left out), at
least 1. Half of it (or ``x-fake-cached-tokens``) is reported as cached. ``output`` is ceil(chars /
4) of the answer's text and tool arguments (at least 1) plus the reasoning tokens, ceil(chars / 4)
of the reasoning text. Every dialect reports the same totals: Anthropic's ``input_tokens`` is the
input less the cached part, which it reports as ``cache_read_input_tokens``.

Token ids: a chat request with ``"return_token_ids": true`` also gets vLLM's token fields, from
the fake tokenizer in ``_tokens`` (``Plan.tokens``), and its usage counts those ids (no reasoning
tokens: the reasoning is not among them).
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap._json import as_dict, as_str
from rollcap.testing import _tokens as tokenizer
from rollcap.testing._knobs import DEFAULT_MODEL, KnobError, Knobs

__all__ = [
    "Finish",
    "Plan",
    "PlannedUsage",
    "TokenPlan",
    "ToolPlan",
    "choice_letter",
    "last_user_text",
    "plan_answer",
    "tool_results",
]

_DEFAULT_TEXT = "Hello! This is the rollcap fake upstream answering your request."
_REASONING_TEXT = (
    "The request came to the fake upstream. A short, friendly sentence answers it best."
)
_FILLER = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
_TOOL_PIECE_CHARS = 12
_DEFAULT_TOOL = "lookup"
_SKIPPED_TEXT_KEYS = frozenset({"role", "type"})
_OPTION_LINE = re.compile(r"^\s*([A-Z])\)", re.MULTILINE)


class Finish(enum.Enum):
    STOP = "stop"
    TOOL = "tool"
    LENGTH = "length"


@dataclass(frozen=True, slots=True)
class PlannedUsage:
    """Token counts for every dialect: input includes the cached part, output the reasoning."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class ToolPlan:
    name: str
    arguments: str  # JSON text
    pieces: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """Token ids for a chat request that asked for ``return_token_ids`` (see ``_tokens``)."""

    prompt: tuple[int, ...]
    generated: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """One answer, dialect-neutral: what the model says and how a stream splits it."""

    seed: str
    model: str
    created: int
    text: str | None
    text_pieces: tuple[str, ...]
    reasoning: str | None
    reasoning_pieces: tuple[str, ...]
    tool: ToolPlan | None
    finish: Finish
    usage: PlannedUsage
    tokens: TokenPlan | None = None

    def ident(self, label: str, length: int) -> str:
        """A stable id fragment of ``length`` hex digits for this answer."""
        digest = hashlib.sha256(f"{self.seed}:{label}".encode()).hexdigest()
        return (digest * (1 + length // len(digest)))[:length]


def _seed(dialect: str, body: Mapping[str, Any]) -> str:
    same = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:
        canonical = orjson.dumps(same, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        canonical = repr(sorted(same.items(), key=lambda kv: kv[0])).encode()
    return hashlib.sha256(dialect.encode() + b"\n" + canonical).hexdigest()


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _text_chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_text_chars(v) for k, v in value.items() if k not in _SKIPPED_TEXT_KEYS)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return 0


def _word_pieces(text: str) -> tuple[str, ...]:
    """Split before each word; the pieces join back to ``text``."""
    return tuple(re.findall(r"\s*\S+|\s+$", text))


def _even_pieces(text: str, count: int) -> tuple[str, ...]:
    size = len(text)
    return tuple(text[size * i // count : size * (i + 1) // count] for i in range(count))


def _chunk_pieces(text: str, width: int) -> tuple[str, ...]:
    return tuple(text[i : i + width] for i in range(0, len(text), width)) or ("",)


def _filler(words: int) -> str:
    return " ".join(_FILLER[i % len(_FILLER)] for i in range(words))


def _sized(size: int) -> str:
    words = _filler(size // 5 + 2)
    while len(words) < size:
        words = f"{words} {words}"
    return words[:size]


def _answer_text(knobs: Knobs) -> tuple[str, tuple[str, ...]]:
    if knobs.events == 0:
        return "", ()
    if knobs.content_bytes is not None:
        text = _sized(knobs.content_bytes)
        if knobs.events is not None:
            return text, _even_pieces(text, knobs.events)
        return text, _word_pieces(text)
    if knobs.events is not None:
        text = _filler(knobs.events)
        return text, _word_pieces(text)
    return _DEFAULT_TEXT, _word_pieces(_DEFAULT_TEXT)


def _tools(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The request's named tools, in any dialect's shape, each with its parameter schema."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    tools = body.get("tools")
    for raw in tools if isinstance(tools, list) else ():
        tool = as_dict(raw)
        function = as_dict(tool.get("function"))
        name = as_str(tool.get("name")) or as_str(function.get("name"))
        if name:
            schema = (
                tool.get("parameters") or tool.get("input_schema") or function.get("parameters")
            )
            found.append((name, as_dict(schema)))
    return found


def _nth_tool(body: Mapping[str, Any], index: int) -> tuple[str, Mapping[str, Any]]:
    """The request's tool at ``index``, counting round its tools (else ``lookup``)."""
    tools = _tools(body)
    return tools[index % len(tools)] if tools else (_DEFAULT_TOOL, {})


def tool_results(dialect: str, body: Mapping[str, Any]) -> int:
    """How many tool results the request sends back: Responses ``function_call_output`` items,
    chat ``tool`` messages, Messages ``tool_result`` blocks."""

    def listed(value: object) -> list[Mapping[str, Any]]:
        return [as_dict(item) for item in value] if isinstance(value, list) else []

    if dialect == "responses":
        items = listed(body.get("input"))
        return sum(1 for item in items if item.get("type") == "function_call_output")
    messages = listed(body.get("messages"))
    if dialect == "chat":
        return sum(1 for message in messages if message.get("role") == "tool")
    return sum(
        1
        for message in messages
        for block in listed(message.get("content"))
        if block.get("type") == "tool_result"
    )


def _content_text(content: object) -> str:
    """A message's text: its string content, or its parts' ``text`` strings, one a line."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [as_str(as_dict(part).get("text")) for part in content]
    return "\n".join(text for text in texts if text)


def last_user_text(dialect: str, body: Mapping[str, Any]) -> str:
    """The text of the request's last user message that has any text, else ``""``.

    Responses: a string ``input`` is that message. A user message that carries only Anthropic
    ``tool_result`` blocks has no text and is passed over, as the other dialects' tool results
    are no user messages at all.
    """
    key = "input" if dialect == "responses" else "messages"
    messages = body.get(key)
    if isinstance(messages, str):
        return messages if dialect == "responses" else ""
    for raw in reversed(messages if isinstance(messages, list) else []):
        message = as_dict(raw)
        if message.get("role") == "user" and (text := _content_text(message.get("content"))):
            return text
    return ""


def choice_letter(seed: int, text: str) -> str | None:
    """The option ``choice`` answers ``text`` with, for ``seed``; ``None`` when it lists none.

    The options are the letters of the lines that start with ``A)``, ``B)``, ... (after blanks),
    in order, each once; the pick is sha256 of the seed and the text, so one seed answers one
    prompt alike on every run, and another seed may answer it otherwise.
    """
    letters: list[str] = list(dict.fromkeys(_OPTION_LINE.findall(text)))
    if not letters:
        return None
    digest = hashlib.sha256(f"{seed}\n{text}".encode()).digest()
    return letters[int.from_bytes(digest[:8], "big") % len(letters)]


def _sample_value(schema: Mapping[str, Any], name: str) -> Any:
    enum_values = schema.get("enum")
    if isinstance(enum_values, list) and enum_values:
        return enum_values[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    samples: dict[object, Any] = {
        "integer": 1,
        "number": 1.5,
        "boolean": True,
        "array": [],
        "object": {},
        "null": None,
    }
    return samples.get(kind, f"example {name}")


def _sample_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = as_dict(schema.get("properties"))
    if not properties:
        return {"query": "example query"}
    required = schema.get("required")
    names = [n for n in required if n in properties] if isinstance(required, list) else []
    return {n: _sample_value(as_dict(properties[n]), n) for n in names or list(properties)}


def plan_answer(dialect: str, body: Mapping[str, Any], knobs: Knobs) -> Plan:
    """Decide the answer to ``body``: text, reasoning, tool call, finish and token counts.

    A chat request with ``"return_token_ids": true`` also gets its token ids (``Plan.tokens``),
    and its usage counts them; ``KnobError`` when its messages cannot be tokenized.
    """
    seed = _seed(dialect, body)
    text: str | None
    text, text_pieces = _answer_text(knobs)
    reasoning: str | None = None
    reasoning_pieces: tuple[str, ...] = ()
    tool: ToolPlan | None = None
    finish = Finish.STOP
    turn = tool_results(dialect, body) if knobs.scenario == "tool_turns" else 0
    if knobs.scenario == "tool" or (knobs.scenario == "tool_turns" and turn < knobs.tool_turns):
        name, schema = _nth_tool(body, turn)
        arguments = orjson.dumps(_sample_arguments(schema)).decode()
        pieces = (
            _even_pieces(arguments, knobs.events)
            if knobs.events is not None
            else _chunk_pieces(arguments, _TOOL_PIECE_CHARS)
        )
        tool = ToolPlan(name, arguments, pieces)
        text, text_pieces, finish = None, (), Finish.TOOL
    elif knobs.scenario == "reasoning":
        reasoning, reasoning_pieces = _REASONING_TEXT, _word_pieces(_REASONING_TEXT)
    elif knobs.scenario == "choice":
        letter = choice_letter(knobs.seed, last_user_text(dialect, body))
        if letter is not None:  # else the text answer, knobs and all
            text, text_pieces = letter, (letter,)
    elif knobs.scenario == "incomplete":
        text_pieces = text_pieces[: (len(text_pieces) + 1) // 2]
        text, finish = "".join(text_pieces), Finish.LENGTH

    tokens = _token_plan(body, text, tool) if dialect == "chat" else None
    if tokens is not None:
        # Counted in ids; the reasoning is not among the generated ids.
        input_tokens, reasoning_tokens = len(tokens.prompt), 0
        output_tokens = len(tokens.generated)
    else:
        input_chars = sum(
            _text_chars(body.get(key)) for key in ("input", "instructions", "messages", "system")
        )
        input_tokens = max(1, _tokens(input_chars))
        answer_chars = len(text or "") + (len(tool.arguments) if tool is not None else 0)
        reasoning_tokens = _tokens(len(reasoning)) if reasoning else 0
        output_tokens = max(1, _tokens(answer_chars)) + reasoning_tokens
    cached = input_tokens // 2 if knobs.cached_tokens is None else knobs.cached_tokens
    usage = PlannedUsage(
        input_tokens=input_tokens,
        cached_tokens=min(cached, input_tokens),
        output_tokens=output_tokens,
        reasoning_tokens=reasoning_tokens,
    )
    model = as_str(body.get("model")) or DEFAULT_MODEL
    return Plan(
        seed=seed,
        model=model,
        created=1_700_000_000 + int(seed[:8], 16) % 100_000_000,
        text=text,
        text_pieces=text_pieces,
        reasoning=reasoning,
        reasoning_pieces=reasoning_pieces,
        tool=tool,
        finish=finish,
        usage=usage,
        tokens=tokens,
    )


def _token_plan(
    body: Mapping[str, Any], text: str | None, tool: ToolPlan | None
) -> TokenPlan | None:
    """The token ids of a chat request with ``"return_token_ids": true``, else ``None``.

    Raises ``KnobError`` when the messages or the pinned prefix cannot be tokenized.
    """
    if body.get("return_token_ids") is not True:
        return None
    pinned = body.get(tokenizer.PREFIX_IDS_FIELD)
    if pinned is not None and not (
        isinstance(pinned, list)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in pinned)
    ):
        raise KnobError(f"{tokenizer.PREFIX_IDS_FIELD} must be null or a list of token ids")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise KnobError("messages must be a list to return token ids")
    try:
        prompt = tokenizer.render_prompt(messages, prefix_ids=pinned)
    except ValueError as exc:
        raise KnobError(f"messages cannot be tokenized: {exc}") from None
    answer_body = text or ""
    if tool is not None:
        answer_body += tokenizer.tool_call_text(tool.name, tool.arguments)
    return TokenPlan(tuple(prompt), tuple(tokenizer.generated_ids(answer_body)))
