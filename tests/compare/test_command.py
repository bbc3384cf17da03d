"""``rollcap compare`` and ``rollcap capture report --compare`` from the command line, on two
real MCQA runs that the fake upstream answered as ``choice-1`` and ``choice-2``."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from rollcap.cli import main
from rollcap.compare import Comparison


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_printed_comparison_of_two_runs(
    choice_runs: tuple[Path, Path], comparison: Comparison, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = choice_runs
    code, out, _ = _run(["compare", str(a), str(b)], capsys)
    assert code == 0
    overall = comparison.data["overall"]
    reward = overall["metrics"]["reward"]
    lines = out.splitlines()
    assert lines[0] == f"A: {a} (27 rollouts, 0 failed)"
    assert "mcqa: 27 tasks matched, 0 only in A, 0 only in B" in lines
    row = next(line for line in lines if line.strip().startswith("reward "))
    assert f"{reward['a']['mean']:.3f} [{reward['a']['ci'][0]:.3f}" in row
    assert f"{reward['diff']['mean']:+.3f}" in row
    test = overall["test"]
    assert test["name"] == "mcnemar_exact"  # one 0/1 reward per task
    assert (
        f"McNemar's exact test ({test['a_only']} tasks solved by A only, "
        f"{test['b_only']} by B only): p = {test['p_value']:.4g}" in out
    )
    flips = overall["flips"]
    assert flips["better"] + flips["worse"] > 0  # the seeds answer some tasks differently
    assert f"flips: {flips['better']} tasks better in B, {flips['worse']} worse" in out
    worse = [c for c in overall["changes"] if c["change"] < 0]
    assert worse
    assert f"task {worse[0]['task_index']['a']} 1.00 -> 0.00  {worse[0]['label']}" in out
    assert "tasks would detect a reward difference of 0.05 with 80% power" in out
    assert "verdict" not in out  # no gate asked for


def test_json_reads_back_as_the_document(
    choice_runs: tuple[Path, Path], comparison: Comparison, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["compare", *map(str, choice_runs), "--json"], capsys)
    assert code == 0
    doc = orjson.loads(out)
    assert doc == orjson.loads(orjson.dumps(comparison.data))
    assert doc["overall"]["tasks"] == {"matched": 27, "only_a": 0, "only_b": 0}
    changed = [c for c in doc["overall"]["changes"] if c["change"]]
    assert len(changed) == doc["overall"]["flips"]["better"] + doc["overall"]["flips"]["worse"]
    assert all(len(c["rollouts"]["a"]) == 1 for c in doc["overall"]["changes"])


def test_the_gate_reads_the_upper_bound_of_the_interval(
    choice_runs: tuple[Path, Path], comparison: Comparison, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = map(str, choice_runs)
    high = comparison.data["overall"]["metrics"]["reward"]["diff"]["ci"][1]
    margin = max(0.0, -high) + 0.01  # past the bound: B is not shown to be that much worse
    code, out, _ = _run(["compare", a, b, "--fail-if-worse", f"{margin:.4f}"], capsys)
    assert code == 0
    assert f"verdict: PASS: the 95% interval's upper bound of B - A, {high:+.4f}" in out
    code, out, _ = _run(["compare", a, b, "--fail-if-worse", "0"], capsys)
    assert code == (1 if high < 0 else 0)
    assert ("verdict: FAIL" in out) == (high < 0)


def test_a_planted_regression_fails_the_gate(
    choice_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = choice_runs
    # B: run A with every reward set to 0, the tasks A solved now failing.
    worse = tmp_path / "worse_rollouts.jsonl"
    lines = [orjson.loads(x) for x in (a / "rollouts.jsonl").read_bytes().splitlines()]
    worse.write_bytes(b"".join(orjson.dumps({**x, "reward": 0.0}) + b"\n" for x in lines))
    code, out, _ = _run(["compare", str(a), str(worse), "--fail-if-worse", "0.02"], capsys)
    solved = sum(1 for x in lines if x["reward"] == 1.0)
    assert solved >= 3
    assert code == 1
    assert "verdict: FAIL" in out
    assert f"flips: 0 tasks better in B, {solved} worse" in out


def test_nothing_matched_says_to_name_a_key(
    choice_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = choice_runs
    other = tmp_path / "other_rollouts.jsonl"
    lines = [orjson.loads(x) for x in (a / "rollouts.jsonl").read_bytes().splitlines()]
    reworded = []
    for line in lines:
        params = line["responses_create_params"]
        params["input"][0]["content"] = "Reworded: " + params["input"][0]["content"]
        reworded.append(orjson.dumps(line) + b"\n")
    other.write_bytes(b"".join(reworded))
    code, out, _ = _run(["compare", str(a), str(other)], capsys)
    assert code == 0
    assert "0 tasks matched, 27 only in A, 27 only in B" in out
    assert "name the field that identifies a task with --key" in out
    code, out, _ = _run(["compare", str(a), str(other), "--key", "_ng_task_index"], capsys)
    assert "27 tasks matched" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail-if-worse", "-1"], "must be a number >= 0"),
        (["--fail-if-worse", "nan"], "must be a number >= 0"),
        (["--resamples", "0"], "must be an integer from 1"),
    ],
)
def test_bad_options_are_usage_errors(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(tmp_path), str(tmp_path), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_or_empty_run_is_a_one_line_error(
    tmp_path: Path, choice_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = choice_runs
    code, _, err = _run(["compare", str(a), str(tmp_path / "absent")], capsys)
    assert code == 1
    assert err == f"rollcap: error: {tmp_path / 'absent'}: no such file or directory\n"
    (tmp_path / "empty").mkdir()
    code, _, err = _run(["compare", str(a), str(tmp_path / "empty")], capsys)
    assert code == 2
    assert "no rollouts file to compare" in err


def test_the_report_compares_too(
    choice_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = choice_runs
    output = tmp_path / "compare.html"
    code, out, _ = _run(
        ["capture", "report", str(a), "--compare", str(b), "-o", str(output)], capsys
    )
    assert code == 0
    assert out.startswith(f"wrote {output} (")
    assert "27 tasks matched" in out
    page = output.read_text()
    assert '"mode":"compare"' in page.replace(" ", "")
    assert output.stat().st_mode & 0o777 == 0o600
    code, _, err = _run(
        ["capture", "report", str(a), "--compare", str(b), "--rollouts", str(output)], capsys
    )
    assert code == 2
    assert "--rollouts is not taken with --compare" in err
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    code, _, err = _run(["capture", "report", str(copy), "--key", "x"], capsys)
    assert code == 2
    assert "--key and --cluster are taken with --compare only" in err


def test_without_the_extra_both_commands_say_how_to_install_it(
    choice_runs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    a, b = map(str, choice_runs)
    report = ["capture", "report", a, "--compare", b, "-o", str(tmp_path / "c.html")]
    for argv in (["compare", a, b], report):
        code, out, err = _run(argv, capsys)
        assert code == 2
        assert out == ""
        assert err == (
            "rollcap: error: rollcap compare needs scipy and statsmodels: "
            "pip install 'rollcap[compare]'\n"
        )
    assert not (tmp_path / "c.html").exists()
