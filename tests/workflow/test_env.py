"""The environment: model, resources, agent and head servers, over real sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap import CaptureStore, read_model_call_records, resolve_model_base_url
from rollcap.config import ConfigError, load_config
from rollcap.gym import example_data_path
from rollcap.testing import FakeUpstream
from rollcap.workflow import environment
from rollcap.workflow._env import plan_servers
from tests.conftest import SECRETS

KEY = SECRETS[0]


def _config(upstream: str, capture_dir: Path) -> dict[str, Any]:
    return load_config(
        overrides=[
            f"++policy_base_url={upstream}/v1",
            f"++policy_api_key={KEY}",
            "++observability_enabled=true",
            f"++model_call_capture_dir={capture_dir}",
        ],
        env_file=None,
    )


def _first_task() -> dict[str, Any]:
    line = example_data_path("mcqa").read_text().splitlines()[0]
    task: dict[str, Any] = orjson.loads(line)
    return task


async def test_environment_serves_discovery_and_a_captured_rollout(tmp_path: Path) -> None:
    async with FakeUpstream(api_key=KEY) as upstream:
        config = _config(upstream.url, tmp_path)
        async with (
            environment(
                config, model_type="openai_model", resources_server="mcqa", head_port=0
            ) as env,
            aiohttp.ClientSession() as session,
        ):
            async with session.get(f"{env.head_url}/servers") as response:
                servers = await response.json()
            async with session.get(f"{env.head_url}/config") as response:
                shown = await response.text()
            agent = env.url_of("mcqa_simple_agent")
            task = {**_first_task(), "_ng_task_index": 3, "_ng_rollout_index": 1}
            async with session.post(f"{agent}/run", json=task) as response:
                assert response.status == 200, await response.text()
                result = await response.json()
            resolved = await _resolve(env.head_url)
    assert [(s["name"], s["kind"]) for s in servers] == [
        ("policy_model", "responses_api_models"),
        ("mcqa", "resources_servers"),
        ("mcqa_simple_agent", "responses_api_agents"),
    ]
    assert KEY not in shown
    assert orjson.loads(shown)["policy_api_key"] == "<redacted>"
    assert result["reward"] in (0.0, 1.0)
    assert result["response"]["object"] == "response"
    (call,) = read_model_call_records(CaptureStore(tmp_path), "3-1")
    assert call.dialect == "responses"
    assert call.request is not None
    assert call.request["input"] == task["responses_create_params"]["input"]
    assert resolved == f"{servers[0]['url']}/ng-rollout/7-0/v1"


async def _resolve(head: str) -> str:
    import asyncio

    # resolve_model_base_url is synchronous (agents call it once, at set-up).
    return await asyncio.to_thread(resolve_model_base_url, "policy_model", "7-0", head=head)


async def test_unknown_names_start_nothing(tmp_path: Path) -> None:
    config = _config("http://127.0.0.1:9", tmp_path)
    with pytest.raises(ConfigError, match="unknown resources server 'nope'"):
        async with environment(config, model_type="openai_model", resources_server="nope"):
            pass
    with pytest.raises(ConfigError, match="unknown agent 'x'"):
        async with environment(
            config, model_type="openai_model", resources_server="mcqa", agent="x"
        ):
            pass


def test_env_start_head_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "rollcap"), "env", "start",
                "--resources-server", "mcqa", "--model-type", "openai_model",
                "--head-port", str(port), "++policy_base_url=http://127.0.0.1:9/v1",
            ],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


GRADER = """
from rollcap.gym import ResourcesServer


class AlwaysRight(ResourcesServer):
    async def verify(self, body):
        return {"reward": 1.0, "graded_by": "always_right"}
"""


async def test_server_blocks_and_an_entrypoint_resources_server(tmp_path: Path) -> None:
    (tmp_path / "grader.py").write_text(GRADER)
    async with FakeUpstream(api_key=KEY) as upstream:
        config = _config(upstream.url, tmp_path / "calls")
        config |= {
            "policy_model": {"responses_api_models": {"openai_model": {}}},
            "lenient": {
                "resources_servers": {
                    "always_right": {"entrypoint": f"{tmp_path / 'grader.py'}:AlwaysRight"}
                }
            },
            "my_agent": {
                "responses_api_agents": {"mcqa_simple_agent": {"resources_server": "lenient"}}
            },
        }
        async with environment(config, head_port=0) as env, aiohttp.ClientSession() as session:
            task = {**_first_task(), "_ng_task_index": 0, "_ng_rollout_index": 0}
            async with session.post(f"{env.url_of('my_agent')}/run", json=task) as response:
                result = await response.json()
    assert [(s.name, s.kind, s.type) for s in env.servers] == [
        ("policy_model", "responses_api_models", "openai_model"),
        ("lenient", "resources_servers", "always_right"),
        ("my_agent", "responses_api_agents", "mcqa_simple_agent"),
    ]
    assert (result["reward"], result["graded_by"]) == (1.0, "always_right")
    assert len(CaptureStore(tmp_path / "calls").read("0-0")) == 1


def test_a_planned_agent_gets_the_model_servers_name_and_its_own_settings(tmp_path: Path) -> None:
    # What env start, eval run and a cluster's rollout workers build their agents from.
    config = _config("http://127.0.0.1:9", tmp_path) | {
        "policy_model": {"responses_api_models": {"openai_model": {}}},
        "calc": {"resources_servers": {"calculator": {}}},
        "tools": {
            "responses_api_agents": {"simple_agent": {"resources_server": "calc", "max_steps": 3}}
        },
    }
    plan = plan_servers(config)
    settings = plan.agent("tools").settings(("http://a:1", "http://b:2"), "http://r:3")
    assert (settings.model_server_name, settings.max_steps) == ("policy_model", 3)
    assert settings.model_base_url == ("http://a:1", "http://b:2")
    # The model server's bounds travel with the plan, to its replicas too.
    assert plan.model_settings.max_request_bytes == 100 * 1024 * 1024
    assert plan.header_read_timeout_s == 30.0
    bounded = plan_servers(config | {"max_request_bytes": 4096, "header_read_timeout_s": 2.5})
    assert bounded.model_settings.max_request_bytes == 4096
    assert bounded.header_read_timeout_s == 2.5


@pytest.mark.parametrize(
    ("blocks", "match"),
    [
        ({"r": {"resources_servers": {"a": {}, "b": {}}}}, "must name exactly one type"),
        ({"r": {"resources_servers": {"nope": {}}}}, "unknown resources server 'nope'"),
        ({"r": {"resources_servers": {"x": {"entrypoint": "json:nothing"}}}}, "no attribute"),
        ({"r": {"resources_servers": {"x": {"entrypoint": "no_such_mod:X"}}}}, "ModuleNotFound"),
        ({"r": {"resources_servers": {"x": {"entrypoint": "bare"}}}}, "module:attribute"),
        ({"a": {"responses_api_agents": {"mcqa_simple_agent": {}}}}, "name its resources_server"),
    ],
)
async def test_bad_server_blocks_start_nothing(
    tmp_path: Path, blocks: dict[str, Any], match: str
) -> None:
    config = _config("http://127.0.0.1:9", tmp_path) | blocks
    with pytest.raises(ConfigError, match=match):
        async with environment(config, model_type="openai_model", head_port=0):
            pass


def test_env_start_stops_every_server_on_ctrl_c(tmp_path: Path) -> None:
    import signal
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gym"), "env", "start",
            "--resources-server", "mcqa", "--model-type", "openai_model",
            "--head-port", str(port), "++policy_base_url=http://127.0.0.1:9/v1",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        urls = []
        for line in proc.stdout:
            if line.startswith("head server on"):
                break
            urls.append(line.split()[-1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/servers", timeout=30) as response:
            assert len(orjson.loads(response.read())) == 3
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.strip().endswith("stopped")
    assert "Traceback" not in err
    for url in [*urls, f"http://127.0.0.1:{port}"]:
        with pytest.raises(OSError, match="Connection refused"):
            urllib.request.urlopen(f"{url}/health", timeout=5)
