"""SIGKILL the model server in the middle of 200 streams: what a client saw end is on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson

from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY

STREAMS = 200
ROLLOUTS = 20
TERMINAL = b"data: [DONE]"


async def _start_server(
    upstream: FakeUpstream, capture_dir: Path
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "rollcap"), "serve", "model",
            "--model-type", "openai_model", "--port", "0",
            f"++policy_base_url={upstream.url}/v1", f"++policy_api_key={UPSTREAM_KEY}",
            "++observability_enabled=true", f"++model_call_capture_dir={capture_dir}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    banner = await asyncio.to_thread(proc.stdout.readline)
    return proc, banner.split(" on ", 1)[1].split(" ", 1)[0]


async def _stream(
    session: aiohttp.ClientSession, url: str, n: int, finished: dict[str, bool]
) -> None:
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": f"question {n}"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {
        "authorization": f"Bearer {CLIENT_KEY}",
        "x-fake-chunk-delay-ms": "15",
        "x-fake-events": str(1 + n % 60),  # calls end at spread-out times
    }
    with contextlib.suppress(aiohttp.ClientError):
        async with session.post(
            f"{url}/ng-rollout/crash-{n % ROLLOUTS}/v1/chat/completions", json=body, headers=headers
        ) as response:
            call_id = response.headers["x-rollcap-model-call-id"]
            finished[call_id] = False
            seen = b""
            async for chunk in response.content.iter_any():
                seen += chunk
                if TERMINAL in seen:
                    finished[call_id] = True


async def test_sigkill_during_200_streams_loses_no_finished_record(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    proc, url = await _start_server(upstream, tmp_path)
    finished: dict[str, bool] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            calls = [
                asyncio.create_task(_stream(session, url, n, finished)) for n in range(STREAMS)
            ]
            # Kill once some streams have ended and many are still running.
            for _ in range(1000):
                if sum(finished.values()) >= STREAMS // 4:
                    break
                await asyncio.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()

    done = {call_id for call_id, ended in finished.items() if ended}
    assert STREAMS // 4 <= len(done) < STREAMS  # the kill landed mid-run
    store = CaptureStore(tmp_path)
    on_disk: set[str] = set()
    for rollout_id in store.rollout_ids():
        available = store.read_available(rollout_id)
        assert available.bad_lines <= 1, rollout_id
        # Every line parses but, at most, the very last one, torn by the kill.
        whole = [index for index, _ in available.records]
        assert whole == list(range(len(whole))), rollout_id
        for _, record in available.records:
            orjson.dumps(record)
            on_disk.add(record["model_call_id"])
    assert done <= on_disk
