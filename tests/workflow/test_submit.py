"""rollcap eval submit: several benchmarks, capture on by default, opt-out, custom directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import yaml

from rollcap import CaptureStore
from rollcap.testing import FakeUpstream
from tests.conftest import SECRETS

BIN = Path(sys.executable).parent
EXAMPLE = Path(__file__).resolve().parents[2] / "resources_servers/mcqa/data/example.jsonl"


def _submit(driver: dict[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "driver.yaml"
    path.write_text(yaml.safe_dump(driver, sort_keys=False))
    return subprocess.run(
        [str(BIN / "gym"), "eval", "submit", "-c", str(path)],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip


def test_three_benchmarks_default_opted_out_and_moved(tmp_path: Path) -> None:
    custom = tmp_path / "elsewhere" / "calls"
    bench = {"agent": "mcqa_simple_agent", "input": str(EXAMPLE), "model_type": "openai_model"}
    with FakeUpstream.running_in_thread(api_key=SECRETS[0]) as upstream:
        (tmp_path / "env.yaml").write_text(f"policy_api_key: {SECRETS[0]}\n")
        done = _submit(
            {
                "policy_base_url": f"{upstream.url}/v1",
                "driver": {
                    "job_dir": "jobs",
                    "benchmarks": {
                        "default": {**bench, "limit": 2},
                        "opted_out": {**bench, "limit": 1, "run": {"observability_enabled": False}},
                        "moved": {
                            **bench,
                            "limit": 1,
                            "num_repeats": 2,
                            "run": {"model_call_capture_dir": str(custom)},
                        },
                    },
                },
            },
            tmp_path,
        )
    assert done.returncode == 0, done.stderr
    jobs = tmp_path / "jobs"
    assert sorted(CaptureStore(jobs / "default" / "model-calls").rollout_ids()) == ["0-0", "1-0"]
    assert not (jobs / "opted_out" / "model-calls").exists()
    assert sorted(CaptureStore(custom).rollout_ids()) == ["0-0", "0-1"]
    assert not (jobs / "moved" / "model-calls").exists()
    opted = [
        orjson.loads(x) for x in (jobs / "opted_out" / "rollouts.jsonl").read_text().splitlines()
    ]
    assert len(opted) == 1
    assert "ng_model_call_capture" not in opted[0]
    moved = (jobs / "moved" / "rollouts.jsonl").read_text().splitlines()
    assert len(moved) == 2
    table = done.stdout.splitlines()
    assert table[0].split()[:2] == ["benchmark", "rollouts"]
    assert [row.split()[0] for row in table[1:]] == ["default", "opted_out", "moved"]
    assert table[2].endswith("off")


def test_bad_driver_is_one_line_exit_2(tmp_path: Path) -> None:
    done = _submit({"driver": {"benchmarks": {"x": {"agent": "mcqa_simple_agent"}}}}, tmp_path)
    assert done.returncode == 2
    assert "driver.benchmarks.x.input is required" in done.stderr
    done = _submit(
        {
            "driver": {
                "benchmarks": {
                    "x": {
                        "agent": "mcqa_simple_agent",
                        "input": str(EXAMPLE),
                        "model_type": "openai_model",
                        "run": {"model_call_capture_dir": "relative/dir"},
                    }
                }
            }
        },
        tmp_path,
    )
    assert done.returncode == 2
    assert "model_call_capture_dir must be an absolute path" in done.stderr
