"""The lines collection writes: rollout lines, failure lines, and the trajectory (pure).

A rollout line is, in this key order: the task's fields; ``_ng_task_index``,
``_ng_rollout_index``, ``_ng_attempt_index``, ``rollout_id``; the agent's ``response`` and
``reward``; the agent's other fields; and, with capture on, ``ng_model_call_capture`` and
``ng_trajectory``. The attachment is evidence about the rollout and is added after the agent's
fields: it never replaces ``response`` or ``reward``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.collect._plan import Rollout
from rollcap.ids import ATTEMPT_INDEX_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from rollcap.records import GAP_TRAJECTORY_PROJECTION_FAILED, Gap

__all__ = [
    "CAPTURE_KEY",
    "TRAJECTORY_KEY",
    "TRAJECTORY_SCHEMA_VERSION",
    "AgentAnswerError",
    "ProjectionError",
    "check_agent_answer",
    "failure_line",
    "project_trajectory",
    "rollout_line",
    "with_trajectory",
]

CAPTURE_KEY = "ng_model_call_capture"
TRAJECTORY_KEY = "ng_trajectory"
TRAJECTORY_SCHEMA_VERSION = 1

_ID_KEYS = (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY, "rollout_id")
# The collector's own keys: neither a task nor an agent can set them.
_RESERVED = frozenset((*_ID_KEYS, CAPTURE_KEY, TRAJECTORY_KEY))
_PAYLOAD_KEYS = ("request", "response", "request_raw", "response_raw")
_TOKEN_KEYS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens")


class AgentAnswerError(ValueError):
    """A 2xx agent answer that is not a rollout result."""


class ProjectionError(ValueError):
    """The captured calls cannot be projected into a trajectory."""


def check_agent_answer(answer: object) -> dict[str, Any]:
    """``answer`` when it is a JSON object with ``response`` and a numeric ``reward``."""
    if not isinstance(answer, dict):
        raise AgentAnswerError(f"the answer is a {type(answer).__name__}, not a JSON object")
    if "response" not in answer:
        raise AgentAnswerError("the answer has no 'response'")
    reward = answer.get("reward")
    # bool is an int subclass, but True is an agent bug, not a reward of 1.
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise AgentAnswerError(f"the answer's 'reward' is not a number: {reward!r}")
    return answer


def _ids(rollout: Rollout) -> dict[str, Any]:
    return {
        TASK_INDEX_KEY: rollout.task_index,
        ROLLOUT_INDEX_KEY: rollout.rollout_index,
        ATTEMPT_INDEX_KEY: rollout.attempt_index,
        "rollout_id": rollout.rollout_id,
    }


def rollout_line(
    rollout: Rollout,
    answer: Mapping[str, Any],
    attachment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The output line of a finished rollout; ``attachment`` is ``with_trajectory``'s result."""
    line = {k: v for k, v in rollout.task.items() if k not in _RESERVED and k not in answer}
    line.update(_ids(rollout))
    line["response"] = answer["response"]
    line["reward"] = answer["reward"]
    for key, value in answer.items():
        if key not in _RESERVED and key not in ("response", "reward"):
            line[key] = value
    if attachment is not None:
        line.update(attachment)
    return line


def failure_line(rollout: Rollout, kind: str, message: str, **detail: Any) -> dict[str, Any]:
    """A line of the failures file: the ids and ``error`` (``kind``, ``message``, details)."""
    line = _ids(rollout)
    line["error"] = {"kind": kind, "message": message, **detail}
    return line


def project_trajectory(rollout: Rollout, calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``ng_trajectory`` from the attachment's calls (``ModelCallRecord.to_dict()`` objects).

    Calls come in ``call_index`` order. A payload that is not a JSON object is carried as its
    raw text instead. A call with no request at all, or two calls at one index, cannot be
    placed in a trajectory: ``ProjectionError``.
    """
    ordered = sorted(calls, key=lambda call: _call_index(call))
    steps: list[dict[str, Any]] = []
    previous = -1
    for call in ordered:
        index = _call_index(call)
        if index == previous:
            raise ProjectionError(f"two calls at call_index {index}")
        previous = index
        request = call.get("request")
        if request is None and call.get("request_raw") is None:
            raise ProjectionError(f"call {index} has no request payload")
        step: dict[str, Any] = {
            "call_index": index,
            "model_call_id": call.get("model_call_id"),
            "dialect": call.get("dialect"),
        }
        for obj_key, raw_key in (("request", "request_raw"), ("response", "response_raw")):
            value = call.get(obj_key)
            if value is None and call.get(raw_key) is not None:
                step[raw_key] = call[raw_key]
            else:
                step[obj_key] = value
        step["response_metadata"] = {
            "id": call.get("response_id"),
            "model": call.get("model"),
            "status": call.get("response_status"),
            "status_code": call.get("status_code"),
            "finish_reason": call.get("finish_reason"),
        }
        step["tokens"] = {key: call.get(key) for key in _TOKEN_KEYS}
        step["latency_total_ms"] = call.get("latency_total_ms")
        steps.append(step)
    return {
        "schema_version": TRAJECTORY_SCHEMA_VERSION,
        "task_index": rollout.task_index,
        "rollout_index": rollout.rollout_index,
        "attempt_index": rollout.attempt_index,
        "rollout_id": rollout.rollout_id,
        "calls": steps,
    }


def _call_index(call: Mapping[str, Any]) -> int:
    index = call.get("call_index")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ProjectionError(f"a call without an integer call_index: {index!r}")
    return index


def with_trajectory(rollout: Rollout, attachment: Mapping[str, Any]) -> dict[str, Any]:
    """The line's ``ng_model_call_capture`` and, when projection works, ``ng_trajectory``.

    ``attachment`` is ``capture_attachment(..., payloads=True)``'s result; it is left as it is.
    The payloads move into the trajectory, so after a projection the attached calls drop them;
    a failed projection keeps them and says so in ``gaps``.
    """
    calls = attachment.get("calls", [])
    try:
        trajectory = project_trajectory(rollout, calls)
    except ProjectionError as exc:
        gap = Gap(GAP_TRAJECTORY_PROJECTION_FAILED, str(exc)).to_dict()
        return {CAPTURE_KEY: {**attachment, "gaps": [*attachment.get("gaps", []), gap]}}
    lean = [{k: v for k, v in call.items() if k not in _PAYLOAD_KEYS} for call in calls]
    return {CAPTURE_KEY: {**attachment, "calls": lean}, TRAJECTORY_KEY: trajectory}
