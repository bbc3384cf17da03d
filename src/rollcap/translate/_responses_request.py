"""OpenAI Responses requests as Chat Completions requests (pure).

Request rules (``responses_request_to_chat``):

- ``instructions`` becomes a leading system message; ``input`` a string is one user message.
- Message items: roles user / assistant / system, ``developer`` sent as ``system`` (chat templates
  rarely know it). Text parts (``input_text``, ``output_text``, ``refusal``) of a message that has
  only text are joined into one string (``"\\n"`` between parts, ``""`` for assistant text, which is
  one answer cut in pieces); ``input_image`` parts with an ``image_url`` become ``image_url`` parts.
- ``function_call`` items become ``tool_calls`` of an assistant message (joined to the assistant
  message right before them, so parallel calls stay one turn); ``function_call_output`` items
  become ``tool`` messages.
- Namespace tools (``{"type": "namespace", "name": "crm", "tools": [...]}``): chat has one flat
  list of tool names, so each function tool ``lookup`` in namespace ``crm`` is sent as the chat
  function tool ``crm__lookup`` (namespace, two underscores, name), and a ``function_call`` item
  with ``"namespace": "crm"`` as a call of ``crm__lookup``. ``namespaced_tool_names`` gives the
  table of these joined names. The namespace's ``description`` has no place in chat and is not
  sent. Refused: an empty namespace name, anything but a function tool inside a namespace (custom
  tools included), and a joined name that is also the name of another tool. The API's function
  ``tool_choice`` has no namespace; its name is sent as given, so a namespaced function is forced
  by its joined name.
- ``reasoning`` items are carried, not dropped: their text (the ``reasoning_text`` content when
  present, else the summary texts joined by ``"\\n"``) becomes ``reasoning_content`` of the next
  assistant message, which is where vLLM chat templates read earlier reasoning. Reasoning followed
  by anything but assistant output is dropped. ``encrypted_content`` is ignored.
- Refused with ``ValueError``: what needs server-side state (``previous_response_id``,
  ``conversation``, ``prompt``, ``background: true``, ``item_reference`` items, file ids), tools
  other than function and namespace tools, other item and part types.
- Mapped: ``tools``, ``tool_choice``, ``max_output_tokens`` -> ``max_tokens``, ``temperature``,
  ``top_p``, ``parallel_tool_calls``, ``stream`` (+ ``stream_options.include_usage``),
  ``text.format`` -> ``response_format``, ``reasoning.effort`` (low / medium / high) ->
  ``reasoning_effort``, ``user``, and the vLLM extras of ``VLLM_PASSTHROUGH``. Every other field
  (``metadata``, ``store``, ``include``, ``truncation``, ``service_tier``, ``text.verbosity``,
  unknown ones...) is not sent upstream; those the response echoes are echoed from the request.

The answers and streams go the other way in ``_responses_answer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollcap._json import as_dict
from rollcap.translate._common import fail
from rollcap.translate._requests import (
    apply_stream,
    copy_passthrough,
    opt_bool,
    opt_count,
    opt_number,
    opt_str,
    req_list,
    req_mapping,
    req_str,
)

__all__ = ["namespaced_tool_names", "responses_request_to_chat", "split_name"]

_REASONING_EFFORTS = frozenset({"low", "medium", "high"})
_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# Between a namespace and a function name in the chat tool name. Chat templates and vLLM's tool
# parsers expect identifier-like names, which rules out "." and "/".
_NAMESPACE_SEPARATOR = "__"


# --- requests ------------------------------------------------------------------------------------


def responses_request_to_chat(request: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses ``create`` body as a Chat Completions body. Raises ``ValueError`` naming the
    field for a request that is malformed or needs what a stateless translation cannot give."""
    req = req_mapping(request, "request")
    _refuse_stateful(req)
    chat: dict[str, Any] = {}
    model = opt_str(req, "model")
    if model is not None:
        chat["model"] = model
    messages: list[dict[str, Any]] = []
    instructions = opt_str(req, "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if req.get("input") is None:
        fail("input", "is required")
    items = req["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    else:
        messages.extend(_InputItems().convert(req_list(items, "input")))
    chat["messages"] = messages
    if req.get("tools") is not None:
        tools = _tools(req_list(req["tools"], "tools"))
        if tools:
            chat["tools"] = tools
    if req.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(req["tool_choice"])
    max_tokens = opt_count(req, "max_output_tokens", minimum=1)
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        number = opt_number(req, key)
        if number is not None:
            chat[key] = number
    parallel = opt_bool(req, "parallel_tool_calls")
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    response_format = _response_format(req.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if req.get("reasoning") is not None:
        effort = opt_str(req_mapping(req["reasoning"], "reasoning"), "effort", "reasoning.effort")
        # vLLM only knows these three; "minimal" / "none" are left to the model's default.
        if effort in _REASONING_EFFORTS:
            chat["reasoning_effort"] = effort
    user = opt_str(req, "user")
    if user is not None:
        chat["user"] = user
    apply_stream(req, chat)
    copy_passthrough(req, chat)
    return chat


def _refuse_stateful(req: Mapping[str, Any]) -> None:
    if req.get("previous_response_id") is not None:
        fail(
            "previous_response_id",
            "not supported: this proxy is stateless and cannot resolve earlier responses; "
            "send the whole conversation in input",
        )
    if req.get("conversation") is not None:
        fail("conversation", "not supported: this proxy keeps no conversations")
    if req.get("prompt") is not None:
        fail("prompt", "not supported: prompt templates are stored server-side")
    if req.get("background") is True:
        fail("background", "not supported: this proxy cannot run responses in the background")


class _InputItems:
    """Builds chat messages from Responses input items, joining what chat keeps in one message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.reasoning: list[str] = []
        # True while the last message may still take the next function call as a parallel call.
        self.open_assistant = False

    def convert(self, items: list[Any]) -> list[dict[str, Any]]:
        for position, raw in enumerate(items):
            name = f"input[{position}]"
            item = req_mapping(raw, name)
            kind = item.get("type")
            if kind is None and "role" in item:
                kind = "message"
            if kind == "message":
                self._message(item, name)
            elif kind == "function_call":
                self._function_call(item, name)
            elif kind == "function_call_output":
                self._function_output(item, name)
            elif kind == "reasoning":
                text = _reasoning_text(item, name)
                if text:
                    self.reasoning.append(text)
            elif kind == "item_reference":
                fail(name, "item_reference is not supported: this proxy stores no items")
            else:
                fail(f"{name}.type", f"item type {kind!r} cannot be translated to Chat Completions")
        return self.messages

    def _append(self, message: dict[str, Any]) -> None:
        if message["role"] == "assistant" and self.reasoning:
            message["reasoning_content"] = "\n".join(self.reasoning)
        self.reasoning = []
        self.messages.append(message)
        self.open_assistant = message["role"] == "assistant"

    def _message(self, item: Mapping[str, Any], name: str) -> None:
        role = item.get("role")
        if role not in _ROLES:
            fail(f"{name}.role", f"expected one of {', '.join(_ROLES)}, got {role!r}")
        chat_role = _ROLES[role]
        content = item.get("content")
        if content is None:
            fail(f"{name}.content", "is required")
        if isinstance(content, str):
            self._append({"role": chat_role, "content": content})
            return
        parts = _content_parts(req_list(content, f"{name}.content"), f"{name}.content")
        self._append({"role": chat_role, "content": _join(parts, chat_role)})

    def _function_call(self, item: Mapping[str, Any], name: str) -> None:
        function_name = req_str(item.get("name"), f"{name}.name")
        namespace = opt_str(item, "namespace", f"{name}.namespace")
        if namespace is not None:
            namespace = _namespace_name(namespace, f"{name}.namespace")
            function_name = _joined_name(namespace, function_name)
        call = {
            "id": req_str(item.get("call_id"), f"{name}.call_id"),
            "type": "function",
            "function": {
                "name": function_name,
                "arguments": req_str(item.get("arguments"), f"{name}.arguments"),
            },
        }
        if self.open_assistant and not self.reasoning:
            self.messages[-1].setdefault("tool_calls", []).append(call)
            return
        self._append({"role": "assistant", "content": None, "tool_calls": [call]})

    def _function_output(self, item: Mapping[str, Any], name: str) -> None:
        call_id = req_str(item.get("call_id"), f"{name}.call_id")
        output = item.get("output")
        if isinstance(output, str):
            content: str | list[dict[str, Any]] = output
        else:
            parts = _content_parts(req_list(output, f"{name}.output"), f"{name}.output")
            content = _join(parts, "tool")
        self._append({"role": "tool", "tool_call_id": call_id, "content": content})


def _reasoning_text(item: Mapping[str, Any], name: str) -> str:
    texts: list[str] = []
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        for position, raw in enumerate(req_list(parts, f"{name}.{key}")):
            part = req_mapping(raw, f"{name}.{key}[{position}]")
            if part.get("type") == kind:
                texts.append(req_str(part.get("text"), f"{name}.{key}[{position}].text"))
        if texts:
            # The raw reasoning when the item has it; the summary only stands in for it.
            break
    return "\n".join(texts)


def _content_parts(parts: list[Any], name: str) -> list[dict[str, Any]]:
    chat_parts: list[dict[str, Any]] = []
    for position, raw in enumerate(parts):
        part_name = f"{name}[{position}]"
        part = req_mapping(raw, part_name)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            chat_parts.append({"type": "text", "text": req_str(part.get("text"), part_name)})
        elif kind == "refusal":
            text = req_str(part.get("refusal"), f"{part_name}.refusal")
            chat_parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if url is None:
                fail(f"{part_name}.image_url", "is required (file_id images need a file store)")
            image: dict[str, Any] = {"url": req_str(url, f"{part_name}.image_url")}
            detail = opt_str(part, "detail", f"{part_name}.detail")
            if detail is not None:
                image["detail"] = detail
            chat_parts.append({"type": "image_url", "image_url": image})
        else:
            fail(f"{part_name}.type", f"content type {kind!r} cannot be translated")
    return chat_parts


def _join(parts: list[dict[str, Any]], role: str) -> str | list[dict[str, Any]]:
    """Text-only content as one string (what every chat template accepts), else the parts."""
    if any(part["type"] != "text" for part in parts):
        return parts
    return ("" if role == "assistant" else "\n").join(part["text"] for part in parts)


@dataclass(frozen=True, slots=True)
class _ToolName:
    chat_name: str
    field: str  # where the name came from, for an error
    tool: str  # the tool it names, for an error
    namespaced: bool


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    chat_tools: list[dict[str, Any]] = []
    names: list[_ToolName] = []
    unsupported: list[str] = []
    for position, raw in enumerate(tools):
        name = f"tools[{position}]"
        tool = req_mapping(raw, name)
        kind = tool.get("type")
        if kind == "namespace":
            namespace = _namespace_name(req_str(tool.get("name"), f"{name}.name"), f"{name}.name")
            inner_tools = req_list(tool.get("tools"), f"{name}.tools")
            for inner_position, inner_raw in enumerate(inner_tools):
                inner_name = f"{name}.tools[{inner_position}]"
                inner = req_mapping(inner_raw, inner_name)
                if inner.get("type") != "function":
                    unsupported.append(f"{inner_name} ({inner.get('type')!r})")
                    continue
                function = _function(inner, inner_name)
                function["name"] = _joined_name(namespace, function["name"])
                names.append(_ToolName(function["name"], f"{inner_name}.name", inner_name, True))
                chat_tools.append({"type": "function", "function": function})
            continue
        if kind != "function":
            unsupported.append(f"{name} ({kind!r})")
            continue
        if "name" not in tool and isinstance(tool.get("function"), Mapping):
            # Already in chat form: accepted as it is.
            function = dict(tool["function"])
            if isinstance(function.get("name"), str):
                names.append(_ToolName(function["name"], f"{name}.function.name", name, False))
            chat_tools.append({"type": "function", "function": function})
            continue
        function = _function(tool, name)
        names.append(_ToolName(function["name"], f"{name}.name", name, False))
        chat_tools.append({"type": "function", "function": function})
    if unsupported:
        fail(
            "tools",
            "only function tools and namespaces of function tools can be translated to Chat "
            "Completions; unsupported: " + ", ".join(unsupported),
        )
    _refuse_joined_collisions(names)
    return chat_tools


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": req_str(tool.get("name"), f"{name}.name")}
    description = opt_str(tool, "description", f"{name}.description")
    if description is not None:
        function["description"] = description
    if tool.get("parameters") is not None:
        function["parameters"] = dict(req_mapping(tool["parameters"], f"{name}.parameters"))
    strict = opt_bool(tool, "strict", f"{name}.strict")
    if strict is not None:
        function["strict"] = strict
    return function


def _namespace_name(namespace: str, field_name: str) -> str:
    if not namespace:
        fail(field_name, "expected a non-empty namespace name")
    return namespace


def _joined_name(namespace: str, name: str) -> str:
    return f"{namespace}{_NAMESPACE_SEPARATOR}{name}"


def _refuse_joined_collisions(names: list[_ToolName]) -> None:
    """A joined name equal to another tool's name would make the model's call ambiguous: the
    answer could not tell which tool it meant. Two plain tools of one name are left to the
    upstream, as before namespaces."""
    first: dict[str, _ToolName] = {}
    for current in names:
        earlier = first.setdefault(current.chat_name, current)
        if earlier is current or not (current.namespaced or earlier.namespaced):
            continue
        joined, other = (current, earlier) if current.namespaced else (earlier, current)
        fail(
            joined.field,
            f"namespace and name join to {joined.chat_name!r}, which is also the name of "
            f"{other.tool}; chat tool names are one flat list",
        )


def namespaced_tool_names(request: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Each chat tool name that ``responses_request_to_chat`` makes for a function inside one of
    the request's namespace tools, mapped to that function's ``(namespace, name)``: one table for
    reading a chat tool call as the Responses call it stands for. Empty when the request has no
    namespace tools. Never raises: what the request translation refuses (a malformed tool, an
    empty namespace name, a joined name that is also another tool's name) is left out."""
    tools = request.get("tools") if isinstance(request, Mapping) else None
    if not isinstance(tools, list):
        return {}
    table: dict[str, tuple[str, str]] = {}
    ambiguous: set[str] = set()
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        if tool.get("type") != "namespace":
            name = tool.get("name")
            if not isinstance(name, str):
                name = as_dict(tool.get("function")).get("name")
            if isinstance(name, str):
                ambiguous.add(name)
            continue
        namespace = tool.get("name")
        inner_tools = tool.get("tools")
        if not isinstance(namespace, str) or not namespace or not isinstance(inner_tools, list):
            continue
        for raw in inner_tools:
            inner = as_dict(raw)
            name = inner.get("name")
            if inner.get("type") != "function" or not isinstance(name, str):
                continue
            joined = _joined_name(namespace, name)
            if joined in table:
                ambiguous.add(joined)
            table[joined] = (namespace, name)
    return {joined: pair for joined, pair in table.items() if joined not in ambiguous}


def split_name(chat_name: str, names: Mapping[str, tuple[str, str]]) -> tuple[str | None, str]:
    """A chat tool name as ``(namespace, name)``; ``None`` for a name outside the table."""
    found = names.get(chat_name)
    return (None, chat_name) if found is None else found


def _tool_choice(value: object) -> str | dict[str, Any]:
    if isinstance(value, str):
        if value not in _TOOL_CHOICE_MODES:
            fail("tool_choice", f"expected auto, none, required or a function, got {value!r}")
        return value
    choice = req_mapping(value, "tool_choice")
    if choice.get("type") != "function":
        fail(
            "tool_choice.type", f"only function tool choices translate, got {choice.get('type')!r}"
        )
    return {
        "type": "function",
        "function": {"name": req_str(choice.get("name"), "tool_choice.name")},
    }


def _response_format(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    text = req_mapping(value, "text")
    if text.get("format") is None:
        return None
    fmt = req_mapping(text["format"], "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        fail("text.format.type", f"expected text, json_object or json_schema, got {kind!r}")
    schema: dict[str, Any] = {
        "name": req_str(fmt.get("name"), "text.format.name"),
        "schema": dict(req_mapping(fmt.get("schema"), "text.format.schema")),
    }
    description = opt_str(fmt, "description", "text.format.description")
    if description is not None:
        schema["description"] = description
    strict = opt_bool(fmt, "strict", "text.format.strict")
    if strict is not None:
        schema["strict"] = strict
    return {"type": "json_schema", "json_schema": schema}
