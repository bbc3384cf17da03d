"""The model server's open calls: the pure view, and ``GET /inflight`` over real sockets while
calls wait, stream and end, with capture on and off."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap.config import LiveStatusSettings
from rollcap.records import RawRecord
from rollcap.server._inflight import HELD, RECEIVING, STREAMING, WAITING, InflightCalls
from rollcap.server._writer import RecordWriter
from rollcap.testing import FakeUpstream
from tests._polling import until
from tests.server.conftest import client_headers, model_server, request_body, settings_for

# How long a test waits for the server to get somewhere: a bound on a hang, not a figure.
BOUND_S = 10.0


def test_a_calls_view_follows_it_and_holds_no_payload() -> None:
    calls = InflightCalls()
    call = calls.open("3-1-a2", "chat", started_at=1000.0, started=50.0, model_call_id="c" * 32)
    other = calls.open(None, "responses", started_at=1001.0, started=51.0)
    live = LiveStatusSettings()
    view = call.view(50.5, live)
    assert (view["attempt"], view["phase"], view["streamed"]) == (2, WAITING, None)
    assert (view["age_ms"], view["upstream_silence_ms"], view["client_idle_ms"]) == (
        500.0,
        500.0,
        500.0,
    )
    assert view["first_upstream_byte_ms"] is None
    call.answer_started(200, streamed=True)
    call.upstream_bytes(50.25, 100)
    call.upstream_bytes(50.75, 20)
    call.client(50.8, 90, last=False)
    view = call.view(51.0, live)
    assert view["phase"] == STREAMING
    assert (view["upstream_bytes"], view["client_bytes"]) == (120, 90)
    assert (view["first_upstream_byte_ms"], view["upstream_silence_ms"]) == (250.0, 250.0)
    assert view["client_idle_ms"] == 200.0
    assert set(view) == {
        "rollout_id", "attempt", "model_call_id", "dialect", "streamed", "state", "phase",
        "started_at", "age_ms", "first_upstream_byte_ms", "upstream_bytes", "client_bytes",
        "upstream_silence_ms", "client_idle_ms", "ended_ms_ago",
    }  # fmt: skip
    # A body read whole before it is answered is received, not streamed.
    other.upstream_bytes(51.5, 10)
    assert other.view(52.0, live)["phase"] == RECEIVING
    assert other.attempt is None
    calls.open("0-0", "messages", started_at=1002.0, started=52.0)
    # Oldest first, bounded, saying so.
    shown = calls.snapshot(53.0, limit=2)
    assert (shown["open"], shown["truncated"]) == (3, True)
    assert [c["rollout_id"] for c in shown["calls"]] == ["3-1-a2", None]
    calls.close(call, 53.0)
    calls.close(call, 53.0)  # closing twice is harmless
    assert [c["rollout_id"] for c in calls.snapshot(53.0)["calls"]] == [None, "0-0"]
    assert calls.snapshot(53.0)["truncated"] is False


async def _until(
    check: Callable[[], Awaitable[dict[str, Any]]], done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    return await until(check, done, bound_s=BOUND_S)


@pytest.mark.parametrize("capture", [True, False], ids=["capture-on", "capture-off"])
async def test_a_stream_is_open_while_it_streams_and_gone_when_the_client_leaves(
    upstream: FakeUpstream, tmp_path: Path, capture: bool
) -> None:
    settings = settings_for(upstream.url, tmp_path / "model-calls" if capture else None)
    async with model_server(settings) as url, aiohttp.ClientSession() as session:

        async def inflight() -> dict[str, Any]:
            async with session.get(url + "/inflight") as response:
                assert response.status == 200
                answer: dict[str, Any] = orjson.loads(await response.read())
                return answer

        assert (await inflight())["open"] == 0
        headers = client_headers("chat", **{"x-fake-events": "50", "x-fake-chunk-delay-ms": "100"})
        async with session.post(
            url + "/ng-rollout/3-1-a2/v1/chat/completions",
            json=request_body("chat", stream=True),
            headers=headers,
        ) as response:
            await response.content.readany()  # the stream has begun
            seen = await _until(inflight, lambda a: a["calls"][0]["client_bytes"] > 0)
            (call,) = seen["calls"]
            assert (call["rollout_id"], call["attempt"], call["dialect"]) == ("3-1-a2", 2, "chat")
            assert (call["phase"], call["streamed"]) == (STREAMING, True)
            assert call["upstream_bytes"] >= call["client_bytes"] > 0
            assert call["first_upstream_byte_ms"] is not None
            call_id = response.headers.get("x-rollcap-model-call-id")
            assert call["model_call_id"] == call_id  # None with capture off: no id is given
            assert b"Bearer" not in orjson.dumps(seen)
            response.close()  # the client gives up mid-stream
        await _until(inflight, lambda a: a["open"] == 0)


async def test_a_silent_upstream_shows_as_waiting_with_growing_silence(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    # The server gives up on a silent upstream after read_timeout_s; until then the call is open.
    settings = settings_for(upstream.url, tmp_path / "model-calls", read_timeout_s=1.0)
    async with model_server(settings) as url, aiohttp.ClientSession() as session:

        async def inflight() -> dict[str, Any]:
            async with session.get(url + "/inflight?limit=5") as response:
                answer: dict[str, Any] = orjson.loads(await response.read())
                return answer

        request = session.post(
            url + "/ng-rollout/0-0/v1/chat/completions",
            json=request_body("chat", stream=False),
            headers=client_headers("chat", "hang"),
        )
        task = asyncio.ensure_future(request)
        first = await _until(inflight, lambda a: a["open"] == 1)
        later = await _until(
            inflight,
            lambda a: (
                a["calls"][0]["upstream_silence_ms"] > first["calls"][0]["upstream_silence_ms"]
            ),
        )
        (call,) = later["calls"]
        assert (call["phase"], call["upstream_bytes"], call["client_bytes"]) == (WAITING, 0, 0)
        assert call["first_upstream_byte_ms"] is None
        async with await task as response:
            assert response.status == 504  # the server gave up on the upstream: the call is over
        assert (await inflight())["open"] == 0


async def test_an_answer_waiting_for_its_record_is_held_until_durable(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer's durability is held back until the test has looked.
    release = asyncio.Event()
    waiting: list[asyncio.Task[None]] = []
    submit = RecordWriter.submit

    def held_submit(
        self: RecordWriter, rollout_id: str, record: RawRecord | Mapping[str, Any]
    ) -> asyncio.Future[None]:
        durable = submit(self, rollout_id, record)

        async def later() -> None:
            await release.wait()
            await durable

        waiting.append(asyncio.ensure_future(later()))
        return waiting[-1]

    monkeypatch.setattr(RecordWriter, "submit", held_submit)
    settings = settings_for(upstream.url, tmp_path / "model-calls")
    async with model_server(settings) as url, aiohttp.ClientSession() as session:

        async def inflight() -> dict[str, Any]:
            async with session.get(url + "/inflight") as response:
                answer: dict[str, Any] = orjson.loads(await response.read())
                return answer

        request = asyncio.ensure_future(
            session.post(
                url + "/ng-rollout/0-0/v1/chat/completions",
                json=request_body("chat", stream=False),
                headers=client_headers("chat"),
            )
        )
        seen = await _until(inflight, lambda a: a["open"] == 1 and a["calls"][0]["phase"] == HELD)
        (call,) = seen["calls"]
        assert call["upstream_bytes"] > 0
        assert call["client_bytes"] == 0  # the answer waits for its record
        release.set()
        async with await request as response:
            assert response.status == 200
        await _until(inflight, lambda a: a["open"] == 0)


async def test_a_bad_limit_is_refused(upstream: FakeUpstream) -> None:
    async with (
        model_server(settings_for(upstream.url, None)) as url,
        aiohttp.ClientSession() as session,
    ):
        for bad in ("0", "x", "10001", "-1"):
            async with session.get(url + f"/inflight?limit={bad}") as response:
                assert response.status == 400
                assert "limit" in (await response.json())["error"]
