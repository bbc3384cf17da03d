"""What a rollout's line says of its task and its grading, for the transcript's header (pure).

A rollout line (``rollcap.collect.rollout_line``) is, in key order: the task's fields, the ids
(``_ng_task_index`` ...), the agent's ``response`` and ``reward``, the agent's other fields (what
the verifier returned), then the evidence (``ng_*``). From it:

- ``input``: the task's prompt as messages, from ``responses_create_params`` (``instructions``,
  then ``input``), else from the first of ``INPUT_KEYS`` the task has;
- ``expected``: the first of ``EXPECTED_KEYS`` the line has, named (``{"field", "value"}``);
- ``answer``: the text of the agent's final answer (``response``: a Responses, Chat Completions
  or Messages object, or ``{"text": ...}``, or a string);
- ``verifier``: every field after ``reward`` that is not evidence, the task's prompt or the
  expected answer again (``extracted_answer``, ``resolved``, and whatever else it returned);
- ``tool_runs``: the timed tool calls of ``ng_trajectory.tool_calls``.

Texts are cut at ``TEXT_MAX`` characters (saying so) and lists at ``LIST_MAX`` items, so one
line's facts stay small whatever the task carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.report._delta import answer_messages

__all__ = [
    "EXPECTED_KEYS",
    "INPUT_KEYS",
    "LIST_MAX",
    "TEXT_MAX",
    "facts_text",
    "line_facts",
    "message_text",
]

# Where tasks carry their expected answer, most specific first (NeMo Gym's resources servers
# use ``expected_answer``; other datasets ``ground_truth``, ``target``, ``answer``, ``label``).
EXPECTED_KEYS = (
    "expected_answer",
    "expected_output",
    "ground_truth",
    "reference_answer",
    "target",
    "gold",
    "answer",
    "label",
    "solution",
)
INPUT_KEYS = ("question", "prompt", "problem", "input", "query")
TEXT_MAX = 4000
LIST_MAX = 500
_TASK_PROMPT_KEY = "responses_create_params"
_FIRST_ID_KEY = "_ng_task_index"
_EVIDENCE_PREFIXES = ("ng_", "_ng_")


def _cut(text: str) -> str:
    if len(text) <= TEXT_MAX:
        return text
    return text[:TEXT_MAX] + f" … ({len(text) - TEXT_MAX} more characters)"


def _small(value: Any) -> Any:
    """``value`` with long strings cut and long lists shortened, for the page."""
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, list):
        return [_small(v) for v in value[:LIST_MAX]]
    if isinstance(value, Mapping):
        return {str(k): _small(v) for k, v in list(value.items())[:LIST_MAX]}
    return value


def message_text(message: Any) -> str:
    """The text of a chat message's content (string or parts); ``""`` when it has none."""
    if not isinstance(message, Mapping):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def _messages(value: Any) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": _cut(value)}]
    out: list[dict[str, str]] = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, Mapping) and "content" in item:
            text = item["content"] if isinstance(item["content"], str) else message_text(item)
            out.append({"role": str(item.get("role", "user")), "content": _cut(text)})
    return out[-LIST_MAX:]


def _input(task: Mapping[str, Any]) -> list[dict[str, str]] | None:
    params = task.get(_TASK_PROMPT_KEY)
    if isinstance(params, Mapping):
        out: list[dict[str, str]] = []
        if isinstance(params.get("instructions"), str) and params["instructions"]:
            out.append({"role": "system", "content": _cut(params["instructions"])})
        out.extend(_messages(params.get("input")))
        if out:
            return out
        messages = _messages(params.get("messages"))
        if messages:
            return messages
    for key in INPUT_KEYS:
        if key in task:
            found = _messages(task[key])
            if found:
                return found
    return None


def _answer_text(response: Any) -> str | None:
    if isinstance(response, str):
        return _cut(response)
    if not isinstance(response, Mapping):
        return None
    if isinstance(response.get("text"), str):
        return _cut(response["text"])
    dialect = (
        "responses"
        if "output" in response
        else "chat"
        if "choices" in response
        else "messages"
        if "content" in response
        else None
    )
    if dialect is None:
        return None
    try:
        messages = answer_messages(dialect, response)
    except Exception:  # an agent's response of any shape: no text, never a crash
        return None
    texts = [message_text(m) for m in messages if m.get("role") == "assistant"]
    texts = [t for t in texts if t]
    return _cut(texts[-1]) if texts else None


def _tool_runs(trajectory: Any) -> list[dict[str, Any]]:
    calls = trajectory.get("tool_calls") if isinstance(trajectory, Mapping) else None
    out: list[dict[str, Any]] = []
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, Mapping) or not isinstance(call.get("tool_call_id"), str):
            continue
        run: dict[str, Any] = {"id": call["tool_call_id"]}
        for key in ("tool_name", "started_at", "completed_at", "duration_ms", "status"):
            value = call.get(key)
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                run[key] = value
        if isinstance(call.get("error_type"), str):
            run["error_type"] = call["error_type"]
        out.append(run)
    return out[:LIST_MAX]


def line_facts(line: Mapping[str, Any]) -> dict[str, Any]:
    """The header facts of one rollout line (the module doc); absent facts are ``None``."""
    keys = list(line)
    first_id = keys.index(_FIRST_ID_KEY) if _FIRST_ID_KEY in line else 0
    task = {k: line[k] for k in keys[:first_id]} or dict(line)
    expected = next(
        ({"field": k, "value": _small(line[k])} for k in EXPECTED_KEYS if k in line), None
    )
    after_reward = keys[keys.index("reward") + 1 :] if "reward" in line else []
    skip = {_TASK_PROMPT_KEY, "response", None if expected is None else expected["field"]}
    verifier = {
        k: _small(line[k])
        for k in after_reward
        if k not in skip and not k.startswith(_EVIDENCE_PREFIXES)
    }
    return {
        "input": _input(task),
        "expected": expected,
        "answer": _answer_text(line.get("response")),
        "verifier": verifier,
        "tool_runs": _tool_runs(line.get("ng_trajectory")),
    }


def facts_text(facts: Mapping[str, Any]) -> Sequence[str]:
    """The searchable texts of a line's facts: answer, expected answer, verifier, prompt."""
    out: list[str] = []
    if facts.get("answer"):
        out.append(str(facts["answer"]))
    expected = facts.get("expected")
    if isinstance(expected, Mapping):
        out.append(str(expected.get("value")))
    for value in (facts.get("verifier") or {}).values():
        out.append(str(value))
    for message in facts.get("input") or ():
        out.append(message_text(message))
    return out
