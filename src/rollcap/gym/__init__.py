"""Evaluation-side servers: resources servers that grade and offer tools, agents that run tasks.

``RESOURCES_SERVERS`` and ``AGENTS`` name the built-in implementations, so a command line can
build servers by name: ``create_resources_app(RESOURCES_SERVERS["calculator"]())`` and
``create_agent_app(AGENTS["simple_agent"].create(settings))``. Built in: the resources servers
``mcqa`` (multiple choice, no tools) and ``calculator`` (arithmetic with three tools), each with
example data (``example_data_path``), and ``SimpleResponsesAgent`` as ``simple_agent`` (with
``calculator``) and ``mcqa_simple_agent`` (with ``mcqa``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rollcap.gym._agents import (
    AgentSettings,
    DownstreamError,
    ResponsesAgent,
    create_agent_app,
)
from rollcap.gym._calculator import CalculatorResourcesServer, extract_number
from rollcap.gym._data import example_data_path
from rollcap.gym._http import InvalidRequest
from rollcap.gym._mcqa import McqaResourcesServer, extract_answer, parse_mcqa_task
from rollcap.gym._resources import ResourcesServer, create_resources_app
from rollcap.gym._simple_agent import SimpleResponsesAgent


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """A built-in agent: how to build it, and the resources server it is meant to grade with."""

    create: Callable[[AgentSettings], ResponsesAgent]
    resources_server: str
    description: str


RESOURCES_SERVERS: Mapping[str, Callable[[], ResourcesServer]] = MappingProxyType(
    {"calculator": CalculatorResourcesServer, "mcqa": McqaResourcesServer}
)
AGENTS: Mapping[str, AgentSpec] = MappingProxyType(
    {
        "simple_agent": AgentSpec(
            create=SimpleResponsesAgent,
            resources_server="calculator",
            description="Responses calls and the calculator's tools in a loop, then verify",
        ),
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
    "CalculatorResourcesServer",
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
    "extract_number",
    "parse_mcqa_task",
]
