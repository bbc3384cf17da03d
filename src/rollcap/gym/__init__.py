"""Evaluation-side servers: resources servers that grade, agents that run tasks.

``RESOURCES_SERVERS`` and ``AGENTS`` name the built-in implementations, so a command line can
build servers by name: ``create_resources_app(RESOURCES_SERVERS["mcqa"]())`` and
``create_agent_app(AGENTS["mcqa_simple_agent"].create(settings))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rollcap.gym._agents import (
    AgentSettings,
    DownstreamError,
    ResponsesAgent,
    SimpleResponsesAgent,
    create_agent_app,
)
from rollcap.gym._data import example_data_path
from rollcap.gym._http import InvalidRequest
from rollcap.gym._mcqa import McqaResourcesServer, extract_answer, parse_mcqa_task
from rollcap.gym._resources import ResourcesServer, create_resources_app


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """A built-in agent: how to build it, and the resources server it is meant to grade with."""

    create: Callable[[AgentSettings], ResponsesAgent]
    resources_server: str
    description: str


RESOURCES_SERVERS: Mapping[str, Callable[[], ResourcesServer]] = MappingProxyType(
    {"mcqa": McqaResourcesServer}
)
AGENTS: Mapping[str, AgentSpec] = MappingProxyType(
    {
        "mcqa_simple_agent": AgentSpec(
            create=SimpleResponsesAgent,
            resources_server="mcqa",
            description="one Responses call per task, graded by the mcqa resources server",
        ),
    }
)

__all__ = [
    "AGENTS",
    "RESOURCES_SERVERS",
    "AgentSettings",
    "AgentSpec",
    "DownstreamError",
    "InvalidRequest",
    "McqaResourcesServer",
    "ResourcesServer",
    "ResponsesAgent",
    "SimpleResponsesAgent",
    "create_agent_app",
    "create_resources_app",
    "example_data_path",
    "extract_answer",
    "parse_mcqa_task",
]
