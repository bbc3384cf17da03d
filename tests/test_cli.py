from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from rollcap.cli import main
from rollcap.store import CaptureStore
from tests.test_records import SPEC_RECORD


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    store = CaptureStore(tmp_path)
    store.append("0-0", SPEC_RECORD)
    store.append("0-0", SPEC_RECORD)
    store.append("1-0", SPEC_RECORD)
    with store.path_for("1-0").open("ab") as handle:
        handle.write(b'{"torn')
    return tmp_path


def test_capture_list(capture_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "list", str(capture_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["0-0", "2", "188", "56"]
    assert lines[2].split() == ["1-0", "1", "94", "28", "records_unreadable"]


def test_capture_show(capture_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "show", str(capture_dir), "0-0", "--no-payloads"]) == 0
    attachment = orjson.loads(capsys.readouterr().out)
    assert attachment["rollout_id"] == "0-0"
    assert attachment["metrics"]["num_calls"] == 2
    assert "request" not in attachment["calls"][0]


def test_bad_rollout_id_is_a_usage_error(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["capture", "show", str(capture_dir), "../etc"]) == 2
    assert "Invalid rollout id: '../etc'" in capsys.readouterr().err


def test_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "list", str(tmp_path)]) == 0
    assert "no capture files" in capsys.readouterr().err


def test_a_missing_directory_or_rollout_is_a_failure(
    capture_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "absent"
    assert main(["capture", "list", str(absent)]) == 1
    assert f"{absent}: no such capture directory" in capsys.readouterr().err
    assert main(["capture", "show", str(absent), "0-0"]) == 1
    assert "no such capture directory" in capsys.readouterr().err
    assert main(["capture", "show", str(capture_dir), "9-9"]) == 1
    assert "no capture of rollout '9-9'" in capsys.readouterr().err
    assert not absent.exists()  # looked for, never created


# Every `capture` command, given a path that is not there (`{missing}`; `{capture}` is a capture
# directory, `{rollouts}` a rollouts file): the command fails, exit 1, with the error on one line.
MISSING_INPUTS = [
    ("list", ["{missing}"], "{missing}: no such capture directory"),
    ("show", ["{missing}", "0-0"], "{missing}: no such capture directory"),
    ("show", ["{capture}", "9-9"], "no capture of rollout '9-9'"),
    ("attach", ["{rollouts}", "--capture-dir", "{missing}"], "capture directory {missing} does"),
    ("attach", ["{missing}", "--capture-dir", "{capture}"], "{missing}: no such rollouts file"),
    (
        "attach",
        ["{rollouts}", "--capture-dir", "{capture}", "-o", "{missing}/out.jsonl"],
        "{missing}: no such directory for the output",
    ),
    ("compress", ["{missing}"], "{missing}: no such capture directory"),
    ("decompress", ["{missing}"], "{missing}: no such capture directory"),
    ("export-otel", ["{missing}"], "{missing}: no such capture directory"),
    ("export-otel", ["{capture}", "--rollouts", "{missing}"], "{missing}: no such rollouts file"),
    ("report", ["{missing}"], "{missing}: no such directory"),
    ("report", ["{capture}", "--rollouts", "{missing}"], "{missing}: no such rollouts file"),
    ("report", ["{capture}", "-o", "{missing}/r.html"], "{missing}: no such directory for the"),
    ("report", ["{capture}", "--compare", "{missing}"], "{missing}: no such file or directory"),
    ("view", ["{missing}"], "{missing}: no such directory"),
    ("view", ["{capture}", "--staging", "{missing}"], "{missing}: no such staging directory"),
]


def _capture_commands() -> set[str]:
    import argparse

    from rollcap.cli import _parser

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    return set(choices(choices(_parser())["capture"]))


def test_every_capture_command_is_checked_for_missing_inputs() -> None:
    # A new capture command fails this until MISSING_INPUTS says how it treats a missing path.
    assert {command for command, _, _ in MISSING_INPUTS} == _capture_commands()


@pytest.mark.parametrize(("command", "args", "message"), MISSING_INPUTS)
def test_a_missing_input_is_a_one_line_failure(
    command: str,
    args: list[str],
    message: str,
    capture_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    rollouts = elsewhere / "r.jsonl"
    rollouts.write_bytes(b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    paths = {"missing": str(elsewhere / "absent"), "capture": str(capture_dir)}
    paths["rollouts"] = str(rollouts)
    before = sorted(p.name for p in elsewhere.iterdir())
    assert main(["capture", command, *(arg.format(**paths) for arg in args)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("rollcap: error: ")
    assert captured.err.count("\n") == 1, captured.err
    assert message.format(**paths) in captured.err
    assert "Errno" not in captured.err  # said in words, not as the OS's error
    assert captured.out == ""
    assert sorted(p.name for p in elsewhere.iterdir()) == before  # nothing written or created
    assert rollouts.read_bytes() == b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n'


def test_console_scripts_are_installed(capture_dir: Path) -> None:
    bin_dir = Path(sys.executable).parent
    for name in ("rollcap", "gym"):
        done = subprocess.run(
            [str(bin_dir / name), "capture", "list", str(capture_dir)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "0-0" in done.stdout


def _rollcap(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "rollcap"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["++observability_enabled=true"], "model_call_capture_dir is required"),
        (
            ["++observability_enabled=true", "++model_call_capture_dir=rel/dir"],
            "model_call_capture_dir must be an absolute path, got 'rel/dir'",
        ),
        (["nonsense"], "must look like key=value"),
        (["++policy_base_url=http://127.0.0.1:9", "--model-type=x"], "unknown or not yet"),
        ([], "needs policy_base_url"),
    ],
)
def test_serve_model_config_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    if not any(a.startswith("--model-type") for a in args):
        args = ["--model-type", "openai_model", *args]
    done = _rollcap("serve", "model", "--port", "0", *args)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1
    assert message in done.stderr


def test_serve_model_port_in_use_is_a_clear_error() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _rollcap(
            "serve", "model", "--model-type", "openai_model", "--port", str(port),
            "++policy_base_url=http://127.0.0.1:9",
        )  # fmt: skip
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def test_serve_model_runs_until_interrupted(tmp_path: Path) -> None:
    import signal
    import urllib.request

    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gym"), "serve", "model",
            "--model-type", "openai_model", "--port", "0",
            "++policy_base_url=http://127.0.0.1:9/v1", "++observability_enabled=true",
            f"++model_call_capture_dir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"capture: {tmp_path}" in banner
        url = banner.split(" on ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
            health = orjson.loads(response.read())
        assert health["capture_enabled"] is True
        assert health["name"] == "policy_model"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in err


def test_capture_report_writes_one_page(
    capture_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "run.html"
    out.parent.mkdir()
    assert main(["capture", "report", str(capture_dir), "-o", str(out)]) == 0
    note, printed = capsys.readouterr().out.split("\n", 1)
    assert note == "rollouts: none found beside the capture directory (name one with --rollouts)"
    assert printed.startswith(f"wrote {out} (")
    assert "2 rollouts, 3 calls" in printed
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_capture_report_finds_a_job_directory_and_says_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    CaptureStore(job / "model-calls").append("0-0", SPEC_RECORD)
    (job / "rollouts.jsonl").write_bytes(b'{"rollout_id": "0-0", "reward": 1}\n')
    out = tmp_path / "r.html"
    args = ["capture", "report", str(job), "-o", str(out), "--payload-budget", "0"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"1 rollouts, 1 calls from {job / 'model-calls'}" in printed
    assert "the payloads of 1 rollouts" in printed


def test_capture_report_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["capture", "report", str(tmp_path), "--payload-budget", "lots"])
    assert exited.value.code == 2
    assert "invalid size 'lots'" in capsys.readouterr().err
    assert main(["capture", "report", str(tmp_path / "absent")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_capture_view_serves_until_interrupted(capture_dir: Path) -> None:
    import signal
    import urllib.request

    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "rollcap"), "capture", "view", str(capture_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert banner.startswith(f"rollcap capture view of {capture_dir} on http://127.0.0.1:")
        url = banner.split(" on ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(f"{url}api/summary", timeout=30) as response:
            summary = orjson.loads(response.read())
        assert summary["rollouts"]["id"] == ["0-0", "1-0"]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in err
