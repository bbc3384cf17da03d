"""Live status: what is in flight, what is stuck, while a run runs.

- ``call_state`` and ``rollout_state``: the states and their rules (``_rules``'s docstring, and
  the README's), with ``DurationQuantiles`` for the slow rule and ``LiveStatusSettings`` for the
  thresholds (the ``live_status`` configuration block);
- ``RunBoard``: a collection's status as plain data (its document's keys are listed there);
- ``LiveStatus``: the loop that keeps it live: it asks the model servers
  (``POST /inflight/rollouts``), replaces the status file (``status_path``) and tells the head
  server (``PUT /status``), which serves the runs' documents (``HeadStatus``, ``GET /status``);
- ``StatusSource``: where ``rollcap status`` and ``capture view`` read the status from.

The pure parts load with the package; the I/O shells (and aiohttp, prometheus-client) on first
use (PEP 562), so that reading the configuration loads no HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rollcap.status._board import DOCUMENT_SCHEMA, RunBoard, ServerAnswer
from rollcap.status._rules import (
    ACTIVE,
    CALL_STATES,
    CANCELLED,
    RETRYING,
    ROLLOUT_STATES,
    SLOW,
    STALLED,
    DurationQuantiles,
    LiveStatusSettings,
    call_state,
    rollout_state,
)

if TYPE_CHECKING:
    from rollcap.status._head import HeadStatus, StatusRefused
    from rollcap.status._live import (
        LiveStatus,
        ModelServers,
        StatusOptions,
        StatusSink,
        status_path,
    )
    from rollcap.status._source import StatusSource, StatusUnavailable

_ON_FIRST_USE = {
    **dict.fromkeys(("HeadStatus", "StatusRefused"), "rollcap.status._head"),
    **dict.fromkeys(
        ("LiveStatus", "ModelServers", "StatusOptions", "StatusSink", "status_path"),
        "rollcap.status._live",
    ),
    **dict.fromkeys(("StatusSource", "StatusUnavailable"), "rollcap.status._source"),
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ACTIVE",
    "CALL_STATES",
    "CANCELLED",
    "DOCUMENT_SCHEMA",
    "RETRYING",
    "ROLLOUT_STATES",
    "SLOW",
    "STALLED",
    "DurationQuantiles",
    "HeadStatus",
    "LiveStatus",
    "LiveStatusSettings",
    "ModelServers",
    "RunBoard",
    "ServerAnswer",
    "StatusOptions",
    "StatusRefused",
    "StatusSink",
    "StatusSource",
    "StatusUnavailable",
    "call_state",
    "rollout_state",
    "status_path",
]
