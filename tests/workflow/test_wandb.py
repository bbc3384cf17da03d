"""``eval run --wandb-project``: the tables read back from an offline W&B run directory."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap import CaptureStore, read_model_call_records
from rollcap.cli import EXIT_USAGE, main
from rollcap.config import ConfigError, load_config
from rollcap.gym import example_data_path
from rollcap.store._frames import MAGIC
from rollcap.testing import FakeUpstream
from rollcap.workflow import EvalRequest, run_eval
from rollcap.workflow._wandb import (
    CALL_COLUMNS,
    INSTALL_HINT,
    ROLLOUT_COLUMNS,
    call_rows,
    metric_rows,
    require_wandb,
    rollout_row,
)

PAYLOAD_KEYS = {"request", "response", "request_raw", "response_raw"}


def _table(run_dir: Path, name: str) -> dict[str, Any]:
    (path,) = run_dir.glob(f"files/media/table/{name}_*.table.json")
    table: dict[str, Any] = orjson.loads(path.read_bytes())
    return table


async def test_an_offline_run_logs_tables_without_trajectory_or_payloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    capture = tmp_path / "model-calls"
    output = tmp_path / "rollouts.jsonl"
    async with FakeUpstream() as upstream:
        config = load_config(
            overrides=[
                f"++policy_base_url={upstream.url}/v1",
                "++policy_api_key=unused",
                "++policy_model_name=tool_turns",  # the fake calls the tools twice, then answers
                "++observability_enabled=true",
                f"++model_call_capture_dir={capture}",
            ],
            env_file=None,
        )
        request = EvalRequest(
            agent="simple_agent",
            input_path=example_data_path("calculator"),
            output_path=output,
            limit=2,
            model_type="openai_model",
            head_port=0,
            wandb_project="rollcap-test",
        )
        summary, _ = await run_eval(request, config)
    assert summary.ran == 2
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert "W&B: logged to project rollcap-test" in capsys.readouterr().err

    rollouts = _table(run_dir, "rollouts")
    assert rollouts["columns"] == list(ROLLOUT_COLUMNS)
    assert len(rollouts["data"]) == 2
    assert b"ng_trajectory" not in orjson.dumps(rollouts)
    for row in rollouts["data"]:
        view = orjson.loads(row[-1])
        assert list(view)[-1] == "ng_model_call_capture"  # the export view's order
        assert view["ng_agent_observations"]["source"] == "simple_agent"
        assert "ng_perf" in view
        for call in view["ng_model_call_capture"]["calls"]:
            assert not PAYLOAD_KEYS & set(call)
        by_column = dict(zip(ROLLOUT_COLUMNS, row, strict=True))
        assert by_column["perf_num_turns"] == 3
        assert by_column["perf_num_tool_calls"] == 2
        assert by_column["num_calls"] == 3

    calls = _table(run_dir, "calls")
    assert calls["columns"] == list(CALL_COLUMNS)
    captured = [
        call
        for rollout_id in ("0-0", "1-0")
        for call in read_model_call_records(CaptureStore(capture), rollout_id)
    ]
    assert [dict(zip(CALL_COLUMNS, row, strict=True)) for row in calls["data"]] == [
        {"rollout_id": f"{i // 3}-0", **{k: getattr(c, k) for k in CALL_COLUMNS[1:]}}
        for i, c in enumerate(captured)
    ]

    metrics = _table(run_dir, "aggregate_metrics")
    values = {(group, name): value for _, group, name, value in metrics["data"]}
    assert values[("perf_summary", "mean_num_turns")] == 3.0
    assert values[("perf_summary", "overall_observability_coverage")] == 1.0
    assert values[("agent_metrics", "rollouts")] == 2
    assert ("key_metrics", "mean/reward") in values


def test_the_rows_leave_out_the_trajectory_and_every_payload() -> None:
    call = {"call_index": 0, "model_call_id": "c", "tokens_in": 3, "request": {"input": "secret"}}
    line = {
        "_ng_task_index": 0,
        "rollout_id": "0-0",
        "reward": True,  # not a number a table should show as one
        "response": {"output": []},
        "ng_model_call_capture": {
            "rollout_id": "0-0",
            "metrics": {"num_calls": 1},
            "calls": [call],
        },
        "ng_trajectory": {"model_calls": [{"request": {"input": "secret"}}]},
        "ng_perf": {"num_turns": 1},
    }
    row = rollout_row(line)
    assert b"secret" not in orjson.dumps(row)
    assert b"ng_trajectory" not in orjson.dumps(row)
    assert dict(zip(ROLLOUT_COLUMNS, row, strict=True))["reward"] is None
    # The call table names the columns it shows: never the payloads.
    assert call_rows(line) == [["0-0", 0, "c", *[None] * 6, 3, *[None] * 6]]
    assert not PAYLOAD_KEYS & set(CALL_COLUMNS)
    assert metric_rows([{"_ng_environment_server": {"n": 1}, "perf_summary": {"x": 1.5}}]) == [
        ['{"n":1}', "perf_summary", "x", 1.5]
    ]


def test_without_the_client_a_one_line_error_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an install without the extra has
    with pytest.raises(ConfigError, match=r"pip install 'rollcap\[wandb\]'"):
        require_wandb()
    output = tmp_path / "out.jsonl"
    code = main(
        [
            "eval", "run", "--agent", "simple_agent",
            "--input", str(example_data_path("calculator")), "--output", str(output),
            "--model-type", "openai_model", "--wandb-project", "p",
            "++policy_base_url=http://127.0.0.1:9/v1",
        ]
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == f"rollcap: error: {INSTALL_HINT}\n"
    assert not output.exists()  # nothing ran


async def test_a_failing_wandb_never_fails_the_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> str:
        raise OSError("no route to the W&B server")

    monkeypatch.setattr("rollcap.workflow._run.log_to_wandb", broken)
    async with FakeUpstream() as upstream:
        config = load_config(overrides=[f"++policy_base_url={upstream.url}/v1"], env_file=None)
        request = EvalRequest(
            agent="mcqa_simple_agent",
            input_path=example_data_path("mcqa"),
            output_path=tmp_path / "out.jsonl",
            limit=1,
            model_type="openai_model",
            head_port=0,
            wandb_project="p",
        )
        summary, _ = await run_eval(request, config)
    assert summary.ran == 1
    assert summary.output_path.read_bytes()
    err = capsys.readouterr().err
    assert "W&B: not logged: OSError: no route to the W&B server" in err


async def test_a_compressed_output_is_logged_and_the_captures_are_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    capture = tmp_path / "model-calls"
    output = tmp_path / "rollouts.jsonl.zst"
    async with FakeUpstream() as upstream:
        config = load_config(
            overrides=[
                f"++policy_base_url={upstream.url}/v1",
                "++observability_enabled=true",
                f"++model_call_capture_dir={capture}",
                "capture_compress=true",  # what eval run --compress-capture adds
            ],
            env_file=None,
        )
        request = EvalRequest(
            agent="mcqa_simple_agent",
            input_path=example_data_path("mcqa"),
            output_path=output,
            limit=2,
            model_type="openai_model",
            head_port=0,
            wandb_project="rollcap-test",
        )
        summary, _ = await run_eval(request, config)
    assert summary.ran == 2
    assert output.read_bytes().startswith(MAGIC)
    # Where W&B logged it: a W&B process keeps the WANDB_DIR of its first run.
    logged = re.search(r"W&B: logged to project rollcap-test \((.+)\)", capsys.readouterr().err)
    assert logged is not None
    rows = _table(Path(logged[1]).parent, "rollouts")["data"]
    by_column = [dict(zip(ROLLOUT_COLUMNS, row, strict=True)) for row in rows]
    assert [(row["rollout_id"], row["num_calls"]) for row in by_column] == [("0-0", 1), ("1-0", 1)]
    store = CaptureStore(capture)
    compressed = store.rollout_ids(compressed=True)
    assert (compressed, store.rollout_ids(compressed=False)) == (["0-0", "1-0"], [])
