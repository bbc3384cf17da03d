"""The spec page's two-terminal workflow, as written, with both command names."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson

from rollcap import CaptureStore, aggregate_model_call_metrics
from rollcap.testing import FakeUpstream
from tests.conftest import SECRETS

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "resources_servers" / "mcqa" / "data" / "example.jsonl"
KEY = SECRETS[0]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_env_start_then_eval_run_no_serve(tmp_path: Path) -> None:
    capture_dir = tmp_path / "results" / "model-calls"
    capture_dir.mkdir(parents=True)
    output = tmp_path / "results" / "mcqa_rollouts.jsonl"
    port = _free_port()
    env = {**os.environ, "ROLLCAP_HEAD_URL": f"http://127.0.0.1:{port}"}
    with FakeUpstream.running_in_thread(api_key=KEY) as upstream:
        (tmp_path / "env.yaml").write_text(
            f"policy_api_key: {KEY}\n"
        )  # credentials, as the page says
        server = subprocess.Popen(
            [
                str(BIN / "gym"), "env", "start",
                "--resources-server", "mcqa", "--model-type", "openai_model",
                "--head-port", str(port), f"++policy_base_url={upstream.url}/v1",
                "++observability_enabled=true", f"++model_call_capture_dir={capture_dir}",
            ],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            for line in server.stdout:
                if line.startswith("head server on"):
                    break
            else:
                raise AssertionError("env start printed no head server line")
            done = subprocess.run(
                [
                    str(BIN / "rollcap"), "eval", "run", "--no-serve",
                    "--agent", "mcqa_simple_agent", "--input", str(EXAMPLE),
                    "--output", str(output), "--limit", "1", "--num-repeats", "1",
                    "++observability_enabled=true", f"++model_call_capture_dir={capture_dir}",
                ],
                cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=120,
            )  # fmt: skip
        finally:
            server.terminate()
            _, err = server.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    assert server.returncode == 0, err
    assert "mean reward" in done.stdout
    first = orjson.loads(output.read_text().splitlines()[0])
    attachment = first["ng_model_call_capture"]
    assert set(attachment) == {"rollout_id", "metrics", "calls"}
    assert attachment["rollout_id"] == "0-0"
    assert attachment["metrics"] == aggregate_model_call_metrics(CaptureStore(capture_dir), "0-0")
    assert attachment["metrics"]["num_calls"] == 1
    (call,) = attachment["calls"]
    assert call["model_ref"] == {"type": "responses_api_models", "name": "policy_model"}
    assert call["tokens_in"] == attachment["metrics"]["tokens_in"]
    assert "reward" in first
    assert "response" in first
    assert sorted(p.name for p in capture_dir.iterdir()) == ["0-0.capture.jsonl"]


def test_eval_run_starts_its_own_servers(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    with FakeUpstream.running_in_thread(api_key=KEY) as upstream:
        done = subprocess.run(
            [
                str(BIN / "rollcap"), "eval", "run", "--agent", "mcqa_simple_agent",
                "--model-type", "openai_model", "--head-port", str(_free_port()),
                "--input", str(EXAMPLE), "--output", str(output), "--limit", "3",
                "--num-repeats", "2", f"++policy_base_url={upstream.url}/v1",
                f"++policy_api_key={KEY}", "++observability_enabled=true",
                f"++model_call_capture_dir={tmp_path / 'calls'}",
            ],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in output.read_text().splitlines()]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in lines] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1),
    ]  # fmt: skip
    assert all(r["ng_model_call_capture"]["metrics"]["num_calls"] == 1 for r in lines)
    assert "WARNING" not in done.stdout


def test_eval_run_errors_are_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(BIN / "rollcap"), "eval", "run", "--no-serve", "--agent", "mcqa_simple_agent",
            "--input", str(EXAMPLE), "--output", str(tmp_path / "o.jsonl"),
            "--head-url", "http://127.0.0.1:9",
        ],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot reach the head server" in done.stderr
    missing = subprocess.run(
        [
            str(BIN / "rollcap"), "eval", "run", "--agent", "mcqa_simple_agent",
            "--model-type", "openai_model", "--input", str(tmp_path / "none.jsonl"),
            "--output", str(tmp_path / "o.jsonl"), "++policy_base_url=http://127.0.0.1:9/v1",
        ],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "no such file" in missing.stderr


def test_resume_after_killing_eval_run_halfway(tmp_path: Path) -> None:
    import signal
    import time

    output = tmp_path / "out.jsonl"
    calls = tmp_path / "calls"
    with FakeUpstream.running_in_thread(api_key=KEY) as upstream:
        args = [
            str(BIN / "rollcap"), "eval", "run", "--agent", "mcqa_simple_agent",
            "--model-type", "openai_model", "--head-port", "0",
            "--input", str(EXAMPLE), "--output", str(output), "--num-repeats", "8",
            "--concurrency", "2", f"++policy_base_url={upstream.url}/v1",
            f"++policy_api_key={KEY}", "++observability_enabled=true",
            f"++model_call_capture_dir={calls}",
        ]  # fmt: skip
        first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if output.exists() and len(output.read_bytes().splitlines()) >= 30:
                break
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        killed_at = len(output.read_bytes().splitlines())
        done = subprocess.run(
            [*args, "--resume"], capture_output=True, text=True, check=False, timeout=120
        )
    assert done.returncode == 0, done.stderr
    total = 27 * 8
    assert 30 <= killed_at < total  # the kill landed halfway
    lines = [orjson.loads(line) for line in output.read_text().splitlines()]
    pairs = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in lines]
    assert sorted(pairs) == pairs
    assert len(set(pairs)) == len(pairs) == total  # nothing lost, nothing twice
    store = CaptureStore(calls)
    for line in lines:
        rollout_id = line["rollout_id"]
        if line["_ng_attempt_index"]:
            assert rollout_id.endswith(f"-a{line['_ng_attempt_index']}")
        # Each rollout's attachment holds its own call only, never an earlier attempt's.
        assert line["ng_model_call_capture"]["metrics"]["num_calls"] == 1
        assert len(store.read(rollout_id)) == 1
