"""The lines collection writes: rollout lines and failure lines.

``rollout_line`` is the one function that turns a finished rollout into its output line, for
the collector and for anyone else who runs rollouts (a worker of a distributed run calls it as
it is). A rollout line is, in this key order: the task's fields; ``_ng_task_index``,
``_ng_rollout_index``, ``_ng_attempt_index``, ``rollout_id``; the agent's ``response`` and
``reward``; the agent's other fields, its own ``ng_agent_observations`` and ``ng_trajectory``
among them; then the evidence ``rollcap.evidence.attach`` adds (EVIDENCE.md): with capture on,
``ng_model_call_capture`` (and the agent's observations joined with the captured calls, in
place), ``ng_trajectory`` whenever the line has an evidence key, and ``ng_perf`` with capture
on. The evidence never replaces ``response`` or ``reward``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.collect._plan import Rollout
from rollcap.evidence import (
    CAPTURE_KEY,
    OBSERVATIONS_KEY,
    PERF_KEY,
    TRAJECTORY_KEY,
    CaptureDir,
    attach,
)
from rollcap.ids import ATTEMPT_INDEX_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

__all__ = [
    "AgentAnswerError",
    "check_agent_answer",
    "failure_line",
    "has_evidence",
    "rollout_line",
]

_ID_KEYS = (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY, "rollout_id")
_EVIDENCE_KEYS = (CAPTURE_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY, PERF_KEY)
# The collector's own keys: an agent cannot set them, and a task cannot bring evidence.
_NOT_FROM_AGENT = frozenset(_ID_KEYS)
_NOT_FROM_TASK = frozenset((*_ID_KEYS, *_EVIDENCE_KEYS))


class AgentAnswerError(ValueError):
    """A 2xx agent answer that is not a rollout result."""


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


def has_evidence(answer: Mapping[str, Any]) -> bool:
    """Whether the agent's answer brings evidence of its own to build a trajectory from."""
    return any(key in answer for key in _EVIDENCE_KEYS)


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
    *,
    capture_dirs: Sequence[CaptureDir] = (),
    observability_enabled: bool = False,
    rollout_latency_ms: float | None = None,
) -> dict[str, Any]:
    """The output line of a finished rollout, its evidence attached.

    ``answer`` is the agent's checked ``/run`` answer (``check_agent_answer``);
    ``capture_dirs`` are the model servers' capture directories (or their ``CaptureStore``s),
    read when ``observability_enabled``; ``rollout_latency_ms`` is the collector's own
    wall-clock of the agent's ``/run``, for ``ng_perf``. Reads the rollout's capture file, so a
    caller on an event loop runs it in a thread. Damaged evidence never raises: it is a gap on
    the line.
    """
    line = {k: v for k, v in rollout.task.items() if k not in _NOT_FROM_TASK and k not in answer}
    line.update(_ids(rollout))
    line["response"] = answer["response"]
    line["reward"] = answer["reward"]
    for key, value in answer.items():
        if key not in _NOT_FROM_AGENT and key not in ("response", "reward"):
            line[key] = value
    return attach(
        rollout.run_body(),
        line,
        capture_dirs=capture_dirs,
        observability_enabled=observability_enabled,
        rollout_latency_ms=rollout_latency_ms,
    )


def failure_line(rollout: Rollout, kind: str, message: str, **detail: Any) -> dict[str, Any]:
    """A line of the failures file: the ids and ``error`` (``kind``, ``message``, details)."""
    line = _ids(rollout)
    line["error"] = {"kind": kind, "message": message, **detail}
    return line
