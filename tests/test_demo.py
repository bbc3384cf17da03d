from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap import CaptureStore, aggregate_model_call_metrics, read_model_call_records
from rollcap.demo import DEFAULT_TEMPERATURE, main

TASKS = 2
REPEATS = 3


@dataclass(frozen=True)
class DemoRun:
    results: Path
    out: str
    lines: list[dict[str, Any]]


def _answer(line: dict[str, Any]) -> str:
    return "\n".join(
        part["text"]
        for item in line["response"]["output"]
        if item.get("type") == "message"
        for part in item["content"]
        if part.get("type") == "output_text"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[DemoRun]:
    """The demo run twice, into two directories, with the same options (the defaults' repeats,
    temperature and seed): the embedded model is fast enough for two small runs."""
    done = []
    for name in ("first", "second"):
        results = tmp_path_factory.mktemp(name) / "demo"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["--limit", str(TASKS), "--results", str(results)]) == 0
        output = results / "mcqa_rollouts.jsonl"
        lines = [orjson.loads(line) for line in output.read_bytes().splitlines()]
        done.append(DemoRun(results, out.getvalue(), lines))
    return done


def test_demo_runs_mcqa_on_the_embedded_model_with_capture(runs: list[DemoRun]) -> None:
    run = runs[0]
    output = run.results / "mcqa_rollouts.jsonl"
    # It writes the report and names the command that makes it.
    report = run.results / "report.html"
    assert report.stat().st_size > 0
    assert f"rollcap capture report {run.results}" in run.out
    assert [line["rollout_id"] for line in run.lines] == [
        f"{task}-{repeat}" for task in range(TASKS) for repeat in range(REPEATS)
    ]
    store = CaptureStore(run.results / "model-calls")
    for line in run.lines:
        attachment = line["ng_model_call_capture"]
        assert attachment["metrics"] == aggregate_model_call_metrics(store, line["rollout_id"])
        assert attachment["metrics"]["num_calls"] == 1
        assert attachment["metrics"]["tokens_out"] > 0
        assert line["reward"] in (0.0, 1.0)
    assert "mean reward" in run.out
    assert str(output) in run.out
    assert "WARNING" not in run.out


def test_the_rollouts_of_a_task_differ(runs: list[DemoRun]) -> None:
    run = runs[0]
    store = CaptureStore(run.results / "model-calls")
    for line in run.lines:
        # What the model was sent, as captured: the demo's temperature and the repeat's seed.
        [call] = read_model_call_records(store, line["rollout_id"])
        assert call.request is not None
        sampling = {key: call.request.get(key) for key in ("temperature", "seed")}
        expected = {"temperature": DEFAULT_TEMPERATURE, "seed": line["_ng_rollout_index"]}
        assert sampling == expected
        # The line holds the parameters as they were sent.
        assert {key: line["responses_create_params"][key] for key in sampling} == expected
    answers: dict[int, set[str]] = {}
    for line in run.lines:
        answers.setdefault(line["_ng_task_index"], set()).add(_answer(line))
    assert any(len(texts) > 1 for texts in answers.values()), answers


def test_a_rerun_gives_the_same_rollouts(runs: list[DemoRun]) -> None:
    first, second = (
        [(line["rollout_id"], _answer(line), line["reward"]) for line in run.lines] for run in runs
    )
    assert first == second
    assert all(answer for _, answer, _ in first)


@pytest.mark.parametrize(
    "argv",
    [["--repeats", "0"], ["--temperature", "2.5"], ["--temperature", "nan"], ["--seed", "-1"]],
)
def test_bad_options_are_refused_before_anything_runs(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--results", str(tmp_path / "demo")])
    assert exited.value.code == 2
    assert "must be" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
