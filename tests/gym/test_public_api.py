"""Freeze rollcap.gym's public names: the CLI builds servers from them."""

from __future__ import annotations

import pytest

import rollcap.gym

PUBLIC = {
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
}


def test_exported_names_are_frozen() -> None:
    assert set(rollcap.gym.__all__) == PUBLIC
    for name in rollcap.gym.__all__:
        assert hasattr(rollcap.gym, name), name


def test_registries_are_read_only() -> None:
    assert set(rollcap.gym.RESOURCES_SERVERS) == {"calculator", "mcqa"}
    assert set(rollcap.gym.AGENTS) == {"mcqa_simple_agent", "simple_agent"}
    with pytest.raises(TypeError):
        rollcap.gym.AGENTS["x"] = rollcap.gym.AGENTS["mcqa_simple_agent"]  # type: ignore[index]
