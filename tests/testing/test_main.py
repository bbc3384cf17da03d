"""``python -m rollcap.testing``: prints its URL, serves, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import httpx2
import pytest

from rollcap.testing.__main__ import main

# Bounds every wait on the child process: a broken command fails instead of hanging the suite.
LIMIT_S = 30


async def _start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rollcap.testing",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _first_line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), LIMIT_S)
    return line.decode().strip()


async def _finish(process: asyncio.subprocess.Process) -> tuple[int, bytes]:
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), LIMIT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stderr


async def test_serves_until_sigterm() -> None:
    process = await _start()
    try:
        url = await _first_line(process)
        assert url.startswith("http://127.0.0.1:")
        async with httpx2.AsyncClient(base_url=url, timeout=LIMIT_S) as http:
            assert (await http.get("/health")).json()["status"] == "ok"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = await http.post("/v1/chat/completions", json=body)
            assert response.json()["object"] == "chat.completion"
    finally:
        process.send_signal(signal.SIGTERM)
        returncode, stderr = await _finish(process)
    assert returncode == 0, stderr.decode()


async def test_api_key_and_sigint() -> None:
    process = await _start("--api-key", "sk-cli")
    try:
        url = await _first_line(process)
        async with httpx2.AsyncClient(base_url=url, timeout=LIMIT_S) as http:
            assert (await http.get("/v1/models")).status_code == 401
            ok = await http.get("/v1/models", headers={"authorization": "Bearer sk-cli"})
            assert ok.status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        returncode, _ = await _finish(process)
    assert returncode == 0


async def test_busy_port_is_an_error() -> None:
    first = await _start()
    try:
        url = await _first_line(first)
        port = url.rsplit(":", 1)[1]
        second = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rollcap.testing",
            "--port",
            port,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        returncode, stderr = await _finish(second)
        assert returncode == 1
        assert b"error:" in stderr
    finally:
        first.send_signal(signal.SIGTERM)
        await _finish(first)


def test_bad_arguments_exit_with_usage() -> None:
    with pytest.raises(SystemExit) as raised:
        main(["--port", "not-a-number"])
    assert raised.value.code == 2
