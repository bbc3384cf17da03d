"""What a comparison reads of one rollout line: its task's key and its figures (pure).

A line is matched to its task by a *key*: the value of one field (a dotted path into the line),
as canonical JSON, so that key order does not count. The default is the task's input,
``responses_create_params.input`` (the messages the agent starts from), which stays the same
when the run's model, agent or sampling change; a line without it is keyed by
``_ng_task_index``. A failures-file line carries only its ids: it takes the key of the finished
lines of its task (``_ng_task_index``) in the same run; a task none of whose rollouts finished
keeps the index key, and the comparison pairs it by index (``_compare``).

A rollout's figures (``METRICS``), each ``None`` when the line does not tell it:

- ``reward``: the line's ``reward``; failed rollouts have none;
- ``tokens``: ``ng_model_call_capture.metrics.tokens_total`` (else ``tokens_in + tokens_out``);
- ``calls``: its ``num_calls``;
- ``latency_ms``: the rollout's wall-clock, ``ng_perf.total_latency_ms``;
- ``error``: 1 for a failed rollout or one with a call that failed (an HTTP status of 400 or
  more, or an error category), else 0;
- ``gap``: 1 when its evidence names a gap (the capture's, a call's, the trajectory's or the
  agent observations'), else 0; unknown for a failed rollout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap.evidence._codes import CAPTURE_KEY, OBSERVATIONS_KEY, PERF_KEY, TRAJECTORY_KEY
from rollcap.ids import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from rollcap.report._facts import message_text

__all__ = [
    "DEFAULT_KEY",
    "LABEL_MAX",
    "METRICS",
    "LineFigures",
    "canonical",
    "field_value",
    "index_key",
    "line_figures",
    "task_id",
    "task_key",
    "task_label",
]

DEFAULT_KEY = "responses_create_params.input"
METRICS = ("reward", "tokens", "calls", "latency_ms", "error", "gap")
LABEL_MAX = 120
_MISSING = object()


def field_value(line: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of ``line`` (``a.b`` is ``line["a"]["b"]``; a list is
    indexed by a number), or ``None`` when the line has none there."""
    value: Any = line
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
        if value is _MISSING:
            return None
    return value


def task_key(line: Mapping[str, Any], key: str | None) -> bytes | None:
    """The line's task key (module doc) as canonical JSON; ``None`` when it has none."""
    value = field_value(line, DEFAULT_KEY if key is None else key)
    if value is None and key is None:
        index = line.get(TASK_INDEX_KEY)
        return None if index is None else index_key(index)
    return None if value is None else canonical(value)


def canonical(value: object) -> bytes:
    """``value`` as canonical JSON: key order does not count."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def index_key(index: object) -> bytes:
    """The key of a task known only by its ``_ng_task_index`` (the default key's fallback)."""
    return orjson.dumps({TASK_INDEX_KEY: index})


def task_id(benchmark: str, key: bytes) -> str:
    """A short stable name of a task, the same in both runs (for links and JSON readers)."""
    return hashlib.sha256(benchmark.encode() + b"\0" + key).hexdigest()[:12]


def task_label(line: Mapping[str, Any], key: bytes) -> str:
    """What to call the task: the text of its last user message, else its key."""
    text = ""
    messages = field_value(line, DEFAULT_KEY)
    if isinstance(messages, str):
        text = messages
    elif isinstance(messages, list):
        users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
        text = message_text(users[-1]) if users else ""
    text = " ".join(text.split()) or key.decode()
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 1] + "…"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _has_gaps(value: Any) -> bool:
    return (
        isinstance(value, Mapping) and isinstance(value.get("gaps"), list) and bool(value["gaps"])
    )


@dataclass(frozen=True, slots=True)
class LineFigures:
    """One rollout: its ids and its figures (``METRICS``, module doc)."""

    rollout_id: str | None
    task_index: int | None
    rollout_index: int | None
    failed: bool
    figures: dict[str, float | None]


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def line_figures(line: Mapping[str, Any], *, failed: bool = False) -> LineFigures:
    """The figures of a rollouts-file line, or of a failures-file line when ``failed``."""
    rollout_id = line.get("rollout_id", line.get("_ng_rollout_id"))
    task_index = _index(line.get(TASK_INDEX_KEY))
    rollout_index = _index(line.get(ROLLOUT_INDEX_KEY))
    if rollout_id is None and task_index is not None and rollout_index is not None:
        rollout_id = f"{task_index}-{rollout_index}"
    capture = line.get(CAPTURE_KEY)
    capture = capture if isinstance(capture, Mapping) else {}
    metrics = capture.get("metrics")
    metrics = metrics if isinstance(metrics, Mapping) else {}
    tokens = _number(metrics.get("tokens_total"))
    if tokens is None:
        parts = [_number(metrics.get(k)) for k in ("tokens_in", "tokens_out")]
        tokens = None if None in parts else sum(p for p in parts if p is not None)
    perf = line.get(PERF_KEY)
    calls = capture.get("calls")
    calls = [c for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []
    call_failed = any(
        (_number(c.get("status_code")) or 0) >= 400 or c.get("error_category") is not None
        for c in calls
    )
    gap = any(
        _has_gaps(v) for v in (capture, line.get(TRAJECTORY_KEY), line.get(OBSERVATIONS_KEY))
    ) or any(_has_gaps(c) for c in calls)
    figures: dict[str, float | None] = {
        "reward": None if failed else _number(line.get("reward")),
        "tokens": tokens,
        "calls": _number(metrics.get("num_calls")),
        "latency_ms": _number(perf.get("total_latency_ms")) if isinstance(perf, Mapping) else None,
        "error": 1.0 if failed or call_failed else 0.0,
        "gap": None if failed else (1.0 if gap else 0.0),
    }
    return LineFigures(
        rollout_id if isinstance(rollout_id, str) else None,
        task_index,
        rollout_index,
        failed,
        figures,
    )
