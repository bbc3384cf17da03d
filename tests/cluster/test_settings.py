"""The ``ray`` settings and ``--ray`` without Ray installed (simulated: no cluster needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rollcap.cli import main
from rollcap.cluster import INSTALL_HINT, ClusterSettings, require_ray
from rollcap.config import ConfigError


def test_defaults_then_the_ray_section_then_overrides() -> None:
    assert ClusterSettings.from_config({}) == ClusterSettings()
    config = {"ray": {"enabled": True, "replicas": 4, "address": "10.0.0.1:6379"}}
    settings = ClusterSettings.from_config(config, replicas=2, address=None)
    assert (settings.enabled, settings.replicas, settings.address) == (True, 2, "10.0.0.1:6379")
    assert settings.lost_retries == 1
    assert settings.workers_per_node == 1


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"replicas": 0}, "ray.replicas must be an integer of at least 1"),
        ({"workers_per_node": True}, "ray.workers_per_node"),
        ({"lost_retries": -1}, "ray.lost_retries must be an integer of at least 0"),
        ({"enabled": "yes"}, "ray.enabled must be true or false"),
        ({"address": ""}, "ray.address must be a non-empty string"),
        ({"replica": 2}, "unknown ray setting"),
    ],
)
def test_bad_settings_name_the_key(section: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ClusterSettings.from_config({"ray": section})
    with pytest.raises(ConfigError, match="ray must be a mapping"):
        ClusterSettings.from_config({"ray": [1]})


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the extra were not installed: `import ray` raises ImportError.
    monkeypatch.setitem(sys.modules, "ray", None)


@pytest.mark.usefixtures("no_ray")
def test_without_ray_the_error_names_the_install() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'rollcap\[ray\]'"):
        require_ray()
    assert INSTALL_HINT == "pip install 'rollcap[ray]'"


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize(
    "command",
    [
        ["eval", "run", "--agent", "mcqa_simple_agent", "--input", "in.jsonl", "--output", "o"],
        ["env", "start", "--resources-server", "mcqa", "--model-type", "openai_model"],
    ],
)
def test_ray_without_the_extra_is_one_line(
    command: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([*command, "--ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("rollcap: error: --ray needs Ray")
    assert INSTALL_HINT in err


def test_replicas_without_ray_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    command = ["eval", "run", "--agent", "a", "--input", "i", "--output", "o", "--replicas", "2"]
    assert main(command) == 2
    assert "--replicas runs replicas on a Ray cluster: add --ray" in capsys.readouterr().err


@pytest.mark.usefixtures("no_ray")
def test_an_override_right_after_ray_stays_an_override(capsys: pytest.CaptureFixture[str]) -> None:
    # `--ray ++x=1`: argparse hands the override to --ray as its address; it goes back. The
    # override is applied (a bad one is named), and --ray still asks for Ray.
    command = ["eval", "run", "--agent", "a", "--input", "i", "--output", "o", "--ray"]
    assert main([*command, "nope=1"]) == 2
    assert "no key 'nope' to change" in capsys.readouterr().err
    assert main([*command, "++ray.replicas=2"]) == 2
    assert "--ray needs Ray" in capsys.readouterr().err
