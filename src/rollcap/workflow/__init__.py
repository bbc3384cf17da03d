"""The evaluation workflow: an environment of servers, eval run, eval submit, discovery.

- ``environment(config, ...)`` (``rollcap env start``): the model, resources and agent servers
  plus the head server that tells clients where they are (``GET /servers``, ``GET /config``).
- ``run_eval(request, config)`` (``rollcap eval run``): collect rollouts against an agent, found
  through a running head server or in an environment started around the run.
- ``submit(config)`` (``rollcap eval submit``): one ``eval run`` per benchmark of a driver config.
- ``resolve_model_base_url`` and ``list_servers``: the head server's client, for agents.

Discovery is what ``import rollcap`` needs, so it is imported here at once; the rest starts
servers and is imported on first use (PEP 562), so that the head server's client never loads
the server stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rollcap.workflow._discovery import (
    DEFAULT_HEAD_URL,
    HEAD_URL_ENV,
    head_url,
    list_servers,
    resolve_model_base_url,
)

if TYPE_CHECKING:
    from rollcap.workflow._env import (
        DEFAULT_HEAD_PORT,
        Environment,
        Instance,
        ServerInfo,
        agent_for,
        environment,
        instances,
        load_entrypoint,
    )
    from rollcap.workflow._run import EvalRequest, Progress, format_summary, run_eval
    from rollcap.workflow._submit import BenchmarkResult, format_submit_table, submit

_ON_FIRST_USE = {
    **dict.fromkeys(
        (
            "DEFAULT_HEAD_PORT",
            "Environment",
            "Instance",
            "ServerInfo",
            "agent_for",
            "environment",
            "instances",
            "load_entrypoint",
        ),
        "rollcap.workflow._env",
    ),
    **dict.fromkeys(
        ("EvalRequest", "Progress", "format_summary", "run_eval"), "rollcap.workflow._run"
    ),
    **dict.fromkeys(
        ("BenchmarkResult", "format_submit_table", "submit"), "rollcap.workflow._submit"
    ),
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_HEAD_PORT",
    "DEFAULT_HEAD_URL",
    "HEAD_URL_ENV",
    "BenchmarkResult",
    "Environment",
    "EvalRequest",
    "Instance",
    "Progress",
    "ServerInfo",
    "agent_for",
    "environment",
    "format_submit_table",
    "format_summary",
    "head_url",
    "instances",
    "list_servers",
    "load_entrypoint",
    "resolve_model_base_url",
    "run_eval",
    "submit",
]
