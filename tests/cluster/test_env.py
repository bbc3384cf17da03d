"""``env start --ray`` and ``eval run --ray``: the commands, on the simulated cluster (``ray``),
and the parts that need no cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from tests.cluster.conftest import SimCluster, lines_of

from rollcap import resolve_model_base_url
from rollcap.affinity import choose_replica
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream

ray = pytest.importorskip("ray")


BIN = Path(sys.executable).parent
EXAMPLE = Path(__file__).resolve().parents[2] / "resources_servers/mcqa/data/example.jsonl"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _common(upstream: str, capture: Path) -> list[str]:
    return [
        f"++policy_base_url={upstream}/v1",
        "++observability_enabled=true",
        f"++model_call_capture_dir={capture}",
        "++ray.host=127.0.0.1",  # every node of the simulated cluster is this host
    ]


@pytest.mark.ray
def test_env_start_on_ray_then_eval_run_no_serve_on_ray(sim: SimCluster, tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    output = tmp_path / "rollouts.jsonl"
    port = _free_port()
    head = f"http://127.0.0.1:{port}"
    with FakeUpstream.running_in_thread() as upstream:
        server = subprocess.Popen(
            [
                str(BIN / "rollcap"), "env", "start", "--resources-server", "mcqa",
                "--model-type", "openai_model", "--head-port", str(port),
                "--ray", sim.cluster.address, "--replicas", "2", *_common(upstream.url, capture),
            ],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            printed = []
            for out in server.stdout:
                printed.append(out)
                if out.startswith("head server on"):
                    break
            else:
                raise AssertionError("env start printed no head server line")
            assert sum("replica" in out for out in printed) == 2
            from rollcap.workflow import list_servers

            (model,) = [s for s in list_servers(head) if s["kind"] == "responses_api_models"]
            urls = [r["url"] for r in model["replicas"]]
            assert len(set(urls)) == 2
            assert model["url"] in urls
            for rollout_id in ("0-0", "1-0", "2-0"):
                resolved = resolve_model_base_url("policy_model", rollout_id, head=head)
                assert resolved == f"{choose_replica(rollout_id, urls)}/ng-rollout/{rollout_id}/v1"
            done = subprocess.run(
                [
                    str(BIN / "rollcap"), "eval", "run", "--no-serve", "--head-url", head,
                    "--agent", "mcqa_simple_agent", "--input", str(EXAMPLE),
                    "--output", str(output), "--limit", "6",
                    "--ray", sim.cluster.address, *_common(upstream.url, capture),
                ],
                cwd=tmp_path, capture_output=True, text=True, check=False, timeout=180,
            )  # fmt: skip
        finally:
            server.terminate()
            _, err = server.communicate(timeout=60)
    assert done.returncode == 0, done.stderr
    assert server.returncode == 0, err
    assert "rollouts 6 (this run 6, failed 0, skipped 0)" in done.stdout
    store = CaptureStore(capture)
    for line in lines_of(output):
        assert line["ng_model_call_capture"]["metrics"]["num_calls"] == 1
        assert len(store.read(line["rollout_id"])) == 1
    # Every call went through a replica to the upstream once.
    assert len(upstream.requests) == 6


@pytest.mark.ray
def test_eval_run_on_ray_starts_the_environment_on_the_cluster(
    sim: SimCluster, tmp_path: Path
) -> None:
    capture = tmp_path / "calls"
    output = tmp_path / "rollouts.jsonl"
    with FakeUpstream.running_in_thread() as upstream:
        done = subprocess.run(
            [
                str(BIN / "rollcap"), "eval", "run", "--agent", "mcqa_simple_agent",
                "--model-type", "openai_model", "--input", str(EXAMPLE), "--output", str(output),
                "--limit", "8", "--num-repeats", "2",
                "--ray", sim.cluster.address, "--replicas", "2", *_common(upstream.url, capture),
            ],
            cwd=tmp_path, capture_output=True, text=True, check=False, timeout=180,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rollouts 16 (this run 16, failed 0, skipped 0)" in done.stdout
    lines = lines_of(output)
    assert [line["rollout_id"] for line in lines] == [f"{t}-{r}" for t in range(8) for r in (0, 1)]
    dispatched = [
        orjson.loads(x)
        for x in output.with_name("rollouts_dispatched.jsonl").read_bytes().splitlines()
    ]
    assert sorted(d["rollout_id"] for d in dispatched) == sorted(
        line["rollout_id"] for line in lines
    )
