"""The model server's bounds over real sockets: request bodies, hang-ups, big records."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from rollcap.records import GAP_CAPTURE_OVER_LIMIT
from rollcap.server import ModelServerSettings
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream, expected_response
from tests.server.conftest import (
    CLIENT_KEY,
    ROUTES,
    UPSTREAM_KEY,
    client_headers,
    model_server,
    request_body,
    settings_for,
)

LIMIT = 16 * 1024


@contextlib.asynccontextmanager
async def _server(
    upstream: FakeUpstream, capture_dir: Path, **extra: object
) -> AsyncIterator[tuple[str, str]]:
    """An OpenAI-type and an Anthropic-type server taking request bodies up to ``LIMIT``."""
    openai = settings_for(upstream.url, capture_dir, max_request_bytes=LIMIT, **extra)
    anthropic = settings_for(
        upstream.url, capture_dir, max_request_bytes=LIMIT, model_type="anthropic_model", **extra
    )
    async with model_server(openai) as openai_url, model_server(anthropic) as anthropic_url:
        yield openai_url, anthropic_url


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _head(path: str, dialect: str, framing: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: test", "content-type: application/json", framing]
    lines += [f"{k}: {v}" for k, v in client_headers(dialect).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_answer(client: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer, read to the end of the connection (the server closes it)."""
    data = b""
    while chunk := client.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, body


def _expected_413(dialect: str) -> dict[str, object]:
    message = f"the request body is longer than max_request_bytes ({LIMIT})"
    if dialect == "messages":
        return {"type": "error", "error": {"type": "request_too_large", "message": message}}
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }


async def _records(store: CaptureStore, rollout_id: str, count: int = 1) -> list[dict[str, object]]:
    for _ in range(500):  # bounded: a lost record fails here instead of hanging
        records = store.read(rollout_id) if store.has_capture(rollout_id) else []
        if len(records) >= count:
            return records
        await asyncio.sleep(0.01)
    raise AssertionError(f"no record for {rollout_id}")


@pytest.mark.parametrize("dialect", list(ROUTES))
async def test_a_declared_body_over_the_limit_is_413_in_the_dialect_and_one_record(
    upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    store = CaptureStore(tmp_path)
    async with _server(upstream, tmp_path) as (openai_url, anthropic_url):
        url = anthropic_url if dialect == "messages" else openai_url
        path = f"/ng-rollout/big-{dialect}{ROUTES[dialect]}"

        def refused() -> tuple[int, dict[str, str], bytes]:
            with socket.create_connection(_address(url), timeout=10) as client:
                # Only the head: the server must answer without waiting for the body.
                client.sendall(_head(path, dialect, f"content-length: {LIMIT + 1}"))
                return _read_answer(client)

        # Read to the end: the body that never comes is waited for a moment, then the
        # connection closes.
        status, _, body = await asyncio.to_thread(refused)
        assert status == 413
        assert orjson.loads(body) == _expected_413(dialect)
        (record,) = await _records(store, f"big-{dialect}")
    assert (record["status_code"], record["error_category"]) == (413, "client_error")
    assert "request" not in record or record["request"] is None
    assert record["gaps"] == [
        {
            "code": GAP_CAPTURE_OVER_LIMIT,
            "detail": f"request: over max_request_bytes={LIMIT}, answered 413 and not kept",
        }
    ]
    assert upstream.requests == []  # nothing went upstream
    assert (
        record["upstream_attempted"],
        record["response_source"],
        record["local_response_reason"],
    ) == (False, "local", "invalid_request")


async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with _server(upstream, tmp_path) as (url, _):
        path = "/ng-rollout/chunked/v1/chat/completions"

        def upload() -> tuple[int, int]:
            with socket.create_connection(_address(url), timeout=10) as client:
                client.sendall(_head(path, "chat", "transfer-encoding: chunked"))
                client.setblocking(False)
                sent = 0
                piece = b"400\r\n" + b"x" * 1024 + b"\r\n"
                while sent < 100 * LIMIT:  # far more than the limit, if it were all read
                    try:
                        if client.recv(65536, socket.MSG_PEEK):
                            break  # the answer came
                    except BlockingIOError:
                        pass
                    try:
                        client.sendall(piece)
                    except (BlockingIOError, OSError):
                        break
                    sent += 1024
                    time.sleep(0.001)  # a client at a megabyte a second, reading as it sends
                client.setblocking(True)
                status, _, _ = _read_answer(client)
                return status, sent

        status, sent = await asyncio.to_thread(upload)
    assert status == 413
    assert sent < 10 * LIMIT  # answered long before the end, the rest never read
    (record,) = await _records(CaptureStore(tmp_path), "chunked")
    assert record["status_code"] == 413


async def test_an_uncaptured_body_over_the_limit_is_413_too(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with _server(upstream, tmp_path) as (url, _):

        def refused() -> tuple[int, dict[str, str], bytes]:
            with socket.create_connection(_address(url), timeout=10) as client:
                client.sendall(
                    _head(ROUTES["chat"], "chat", f"content-length: {LIMIT + 1}")
                    + b"x" * LIMIT  # some of it, not all
                )
                return _read_answer(client)

        status, _, body = await asyncio.to_thread(refused)
    assert status == 413
    assert orjson.loads(body) == _expected_413("chat")
    assert not any(tmp_path.iterdir())  # no prefix: no record


async def test_a_client_hanging_up_mid_body_is_one_log_line_and_a_cancelled_record(
    upstream: FakeUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with _server(upstream, tmp_path) as (url, _):

        def hang_up() -> None:
            with socket.create_connection(_address(url), timeout=10) as client:
                path = "/ng-rollout/hung-up/v1/chat/completions"
                client.sendall(_head(path, "chat", "content-length: 5000") + b'{"model": "m", ')

        await asyncio.to_thread(hang_up)
        (record,) = await _records(CaptureStore(tmp_path), "hung-up")
    assert record["error_category"] == "cancelled"
    assert record.get("request") is None
    assert record.get("request_raw") is None
    lines = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert [(r.name, r.levelno) for r in lines] == [("rollcap.server", logging.INFO)]
    assert "before its request body was whole (15 bytes in)" in lines[0].getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert upstream.requests == []


async def test_a_body_in_many_pieces_goes_upstream_and_into_the_record_as_sent(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    body = orjson.dumps(request_body("chat", stream=False, user="u" * 5000))
    async with _server(upstream, tmp_path) as (url, _):

        def upload() -> tuple[int, dict[str, str], bytes]:
            with socket.create_connection(_address(url), timeout=10) as client:
                path = "/ng-rollout/pieces/v1/chat/completions"
                framing = "transfer-encoding: chunked\r\nconnection: close"
                client.sendall(_head(path, "chat", framing))
                for at in range(0, len(body), 700):
                    piece = body[at : at + 700]
                    client.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                client.sendall(b"0\r\n\r\n")
                return _read_answer(client)

        status, _, _ = await asyncio.to_thread(upload)
        (record,) = await _records(CaptureStore(tmp_path), "pieces")
    assert status == 200
    assert upstream.requests[-1].body == body
    assert record["request"] == orjson.loads(body)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_big_record_built_off_the_loop_is_whole(
    upstream: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    # Over 64 KiB, a record is built in a builder thread, a slice at a time: the same record.
    headers = {**client_headers("chat"), "x-fake-content-bytes": "300000", "x-fake-events": "300"}
    body = request_body("chat", stream=stream)
    async with (
        _server(upstream, tmp_path) as (url, _),
        __import__("aiohttp").ClientSession() as session,
        session.post(f"{url}/ng-rollout/big/v1/chat/completions", json=body, headers=headers) as r,
    ):
        received = await r.read()
        (record,) = await _records(CaptureStore(tmp_path), "big")
    expected = expected_response("chat", body, headers)
    assert record["response"] == expected
    assert record["request"] == body
    if stream:
        assert record["response_raw"] == received.decode()
    assert "gaps" not in record


def test_the_bounds_must_be_positive_byte_counts() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_request_bytes must be a positive whole number"):
            ModelServerSettings("openai_model", "http://x", max_request_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capture_max_response_bytes must be a positive"):
        ModelServerSettings("openai_model", "http://x", capture_max_response_bytes=0)
    with pytest.raises(ValueError, match="websocket_max_sockets must be a positive"):
        ModelServerSettings("openai_model", "http://x", websocket_max_sockets=0)


__all__ = ["CLIENT_KEY", "UPSTREAM_KEY"]
