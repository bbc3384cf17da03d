"""``rollcap serve worker``: its errors, and one run in front of the fake upstream."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.cli import main
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    CaptureAdmission,
    CommitCoords,
    DirectoryStagingSink,
)
from rollcap.testing import FakeUpstream
from tests.conftest import SECRETS

UPSTREAM_KEY = SECRETS[0]
KEY_ENV = "ROLLCAP_TEST_WORKER_UPSTREAM_KEY"


def _worker(*args: str) -> list[str]:
    return ["serve", "worker", "--upstream", "http://127.0.0.1:9/v1", "--port", "0", *args]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--staging-dir", "rel/dir"], "must be an absolute path, got 'rel/dir'"),
        (["--staging-dir", "{file}"], "is not a directory"),
        (["--staging-dir", "{file}/below"], "cannot be created"),
        (["--staging-dir", "{tmp}", "--weight-version", "-1"], "weight version"),
        (["--staging-dir", "{tmp}", "--prefix-cache-ids", "-1"], "prefix_cache_ids must be"),
        (["--staging-dir", "{tmp}", "--api-key-env", "ROLLCAP_TEST_UNSET"], "is unset"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    args = [a.format(file=a_file, tmp=tmp_path / "staging") for a in args]
    assert main(_worker(*args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("rollcap: error: ")
    assert message in err


def test_a_bad_upstream_url_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "worker", "--upstream", "127.0.0.1:8000", "--staging-dir", str(tmp_path)]
    assert main(args) == 2
    assert "must start with http:// or https://" in capsys.readouterr().err


def test_a_busy_port_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = _worker("--staging-dir", str(tmp_path), "--port", str(port))
        assert main(args) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=orjson.dumps(body), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def test_serve_worker_stages_calls_until_interrupted(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    env = {**os.environ, KEY_ENV: UPSTREAM_KEY}
    with FakeUpstream.running_in_thread(api_key=UPSTREAM_KEY) as upstream:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "rollcap"), "serve", "worker",
                "--upstream", upstream.url + "/v1", "--staging-dir", str(staging),
                "--port", "0", "--weight-version", "3", "--api-key-env", KEY_ENV,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            banner = proc.stdout.readline()
            assert banner.startswith("rollcap capture worker on http://127.0.0.1:")
            assert banner.rstrip().endswith(f" -> {upstream.url}/v1; staging: {staging}")
            url = banner.split(" on ", 1)[1].split(" ", 1)[0]
            admission = CaptureAdmission(rollout_id="cli-0", model_call_id="a1", mode="text")
            messages = [{"role": "user", "content": "Which option?"}]
            body = {
                "model": "fake-model",
                "messages": messages,
                CAPTURE_FIELD: admission.model_dump(mode="json"),
            }
            status, answer = _post(f"{url}/v1/chat/completions", body)
            refused, error = _post(f"{url}/v1/chat/completions", {**body, "stream": True})
            invalid, bad = _post(
                f"{url}/v1/chat/completions", {**body, CAPTURE_FIELD: {"rollout_id": "cli-0"}}
            )
            with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
                health = orjson.loads(response.read())
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)

    assert status == 200, answer
    coords = CommitCoords.model_validate(answer[COORDS_FIELD])
    assert (coords.staged, coords.staging_key, coords.weight_version) == (True, "cli-0/a1", 3)
    record = DirectoryStagingSink(staging).fetch_record("cli-0/a1")
    assert record.token_ids_delta == answer["prompt_token_ids"] + answer["choices"][0]["token_ids"]
    assert (record.weight_version, record.digest) == (3, coords.digest)
    assert (staging / "cli-0" / "a1" / "record.json").is_file()
    assert (refused, error["error"]["param"]) == (400, "stream")
    assert (invalid, bad["error"]["param"]) == (400, CAPTURE_FIELD)
    assert (health["staged"], health["capture_failed"], health["in_flight"]) == (1, 0, 0)
    assert health["weight_version"] == 3
    assert proc.returncode == 0, err
    assert "stopped" in err
    assert UPSTREAM_KEY not in err
