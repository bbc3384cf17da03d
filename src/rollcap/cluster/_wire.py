"""How the driver hands a rollout attempt to a worker, and the outcome comes back, over HTTP.

``POST /rollout`` on the worker: the body is one JSON object (``task_index``,
``rollout_index``, ``attempt_index``, ``task``, and ``kind`` + ``target``: run the worker's
own agent against that model-server replica, or call that agent). The answer is always 200
with the outcome in headers (``x-rollcap-outcome``: ``ok`` or ``failed``;
``x-rollcap-model-unreachable: 1`` when the agent could not reach its model) and the line
itself, as collection writes it, as the body: the line is never decoded or re-encoded on the
way. Anything else (no answer, a broken connection, another status) is for the driver to
judge.

Values in, values out: the I/O is the worker's server and the driver's client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rollcap.collect import Rollout, RolloutOutcome

__all__ = [
    "OUTCOME_HEADER",
    "ROLLOUT_PATH",
    "UNREACHABLE_HEADER",
    "decode_outcome",
    "decode_request",
    "encode_request",
    "outcome_headers",
]

ROLLOUT_PATH = "/rollout"
OUTCOME_HEADER = "x-rollcap-outcome"
UNREACHABLE_HEADER = "x-rollcap-model-unreachable"
_KINDS = (RolloutOutcome.OK, RolloutOutcome.FAILED)


def encode_request(rollout: Rollout, kind: str, target: str) -> bytes:
    return orjson.dumps(
        {
            "task_index": rollout.task_index,
            "rollout_index": rollout.rollout_index,
            "attempt_index": rollout.attempt_index,
            "task": rollout.task,
            "kind": kind,
            "target": target,
        }
    )


def _index(body: Mapping[str, Any], key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0, got {value!r}")
    return value


def decode_request(raw: bytes) -> tuple[Rollout, str, str]:
    """The rollout, the target's kind and the target; ``ValueError`` for a malformed body."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    task, kind, target = body.get("task"), body.get("kind"), body.get("target")
    if not isinstance(task, dict):
        raise ValueError("task must be a JSON object")
    if not isinstance(kind, str) or not isinstance(target, str):
        raise ValueError("kind and target must be strings")
    rollout = Rollout(
        _index(body, "task_index"),
        _index(body, "rollout_index"),
        _index(body, "attempt_index"),
        task,
    )
    return rollout, kind, target


def outcome_headers(outcome: RolloutOutcome) -> dict[str, str]:
    headers = {OUTCOME_HEADER: outcome.kind, "content-type": "application/x-ndjson"}
    if outcome.model_unreachable:
        headers[UNREACHABLE_HEADER] = "1"
    return headers


def decode_outcome(headers: Mapping[str, str], body: bytes) -> RolloutOutcome:
    """The outcome a worker answered; ``ValueError`` when the answer is not one."""
    kind = headers.get(OUTCOME_HEADER)
    if kind not in _KINDS or not body.endswith(b"\n"):
        raise ValueError(f"not a rollout outcome ({OUTCOME_HEADER}: {kind!r})")
    return RolloutOutcome(kind, body, model_unreachable=headers.get(UNREACHABLE_HEADER) == "1")
