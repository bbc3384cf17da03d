from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rollcap import CaptureStore, aggregate_model_call_metrics
from rollcap.demo import main


def test_demo_runs_mcqa_on_the_embedded_model_with_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--limit", "2", "--results", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    output = tmp_path / "demo" / "mcqa_rollouts.jsonl"
    # It writes the report and names the command that makes it.
    report = tmp_path / "demo" / "report.html"
    assert report.stat().st_size > 0
    assert f"rollcap capture report {tmp_path / 'demo'}" in out
    lines = [orjson.loads(line) for line in output.read_text().splitlines()]
    assert [line["rollout_id"] for line in lines] == ["0-0", "1-0"]
    store = CaptureStore(tmp_path / "demo" / "model-calls")
    for line in lines:
        attachment = line["ng_model_call_capture"]
        assert attachment["metrics"] == aggregate_model_call_metrics(store, line["rollout_id"])
        assert attachment["metrics"]["num_calls"] == 1
        assert attachment["metrics"]["tokens_out"] > 0
        assert line["reward"] in (0.0, 1.0)
    assert "mean reward" in out
    assert str(output) in out
    assert "WARNING" not in out
