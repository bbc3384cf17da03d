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
    assert "invalid rollout id '../etc'" in capsys.readouterr().err


def test_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "list", str(tmp_path)]) == 0
    assert "no capture files" in capsys.readouterr().err


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
