"""The model server over real sockets, against the fake upstream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send
from yarl import URL

from rollcap.server._middleware import CaptureMiddleware, CaptureState
from rollcap.store import CAPTURE_SUFFIX, CaptureStore, _group_commit
from rollcap.testing import FakeUpstream
from tests.conftest import SECRETS
from tests.server.conftest import (
    CLIENT_KEY,
    ROUTES,
    UPSTREAM_KEY,
    Stack,
    client_headers,
    model_server,
    request_body,
    settings_for,
)

DIALECTS = list(ROUTES)


async def _call(
    session: aiohttp.ClientSession,
    url: str,
    dialect: str,
    *,
    stream: bool,
    scenario: str = "text",
    direct: bool = False,
) -> tuple[int, bytes, dict[str, str]]:
    # Straight to the upstream a client needs the upstream's own key; through rollcap it sends
    # its own, which rollcap replaces.
    key = UPSTREAM_KEY if direct else CLIENT_KEY
    async with session.post(
        url,
        data=orjson.dumps(request_body(dialect, stream=stream)),
        headers={"content-type": "application/json", **client_headers(dialect, scenario, key=key)},
    ) as response:
        try:
            body = await response.read()
        except aiohttp.ClientPayloadError:
            body = b"<cut>"
        return response.status, body, dict(response.headers)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("scenario", ["text", "tool", "reasoning"])
async def test_body_bytes_identical_direct_capture_on_and_off(
    stack: Stack, tmp_path: Path, dialect: str, stream: bool, scenario: str
) -> None:
    direct = await _call(
        stack.session,
        stack.direct_url(dialect),
        dialect,
        stream=stream,
        scenario=scenario,
        direct=True,
    )
    on = await _call(
        stack.session, stack.url(dialect, "r-1"), dialect, stream=stream, scenario=scenario
    )
    model_type = "anthropic_model" if dialect == "messages" else "openai_model"
    async with model_server(settings_for(stack.upstream.url, None, model_type=model_type)) as url:
        off = await _call(
            stack.session,
            f"{url}/ng-rollout/r-1{ROUTES[dialect]}",
            dialect,
            stream=stream,
            scenario=scenario,
        )
    assert direct[0] == on[0] == off[0] == 200
    assert direct[1] == on[1] == off[1]
    assert direct[2]["Content-Type"] == on[2]["Content-Type"] == off[2]["Content-Type"]
    assert "x-rollcap-model-call-id" in on[2]
    assert "x-rollcap-model-call-id" not in off[2]
    (record,) = stack.store.read("r-1")
    assert record["model_call_id"] == on[2]["x-rollcap-model-call-id"]
    assert record["dialect"] == dialect
    assert record["status_code"] == 200
    assert record["error_category"] is None
    assert record["request"] == request_body(dialect, stream=stream)
    if stream:
        assert record["response_raw"] == on[1].decode()
        reassembled = orjson.loads(direct[1]) if not stream else None
        assert reassembled is None
    else:
        assert record["response"] == orjson.loads(direct[1])
        assert "response_raw" not in record
    assert record["latency_ms"] >= record["latency_ttft_ms"] >= 0


async def test_streamed_record_holds_the_reassembled_answer(stack: Stack) -> None:
    for dialect in DIALECTS:
        _, plain, _ = await _call(
            stack.session, stack.direct_url(dialect), dialect, stream=False, direct=True
        )
        await _call(stack.session, stack.url(dialect, f"s-{dialect}"), dialect, stream=True)
        (record,) = stack.store.read(f"s-{dialect}")
        assert record["response"] == orjson.loads(plain), dialect


# (scenario, streamed?) -> error_category; None: no error.
EXPECTED = {
    ("http_400", False): "client_error",
    ("http_400", True): "client_error",
    ("http_401", False): "auth",
    ("http_404", True): "not_found",
    ("http_429", False): "rate_limit",
    ("http_429", True): "rate_limit",
    ("http_500", False): "upstream_error",
    ("http_503", True): "upstream_error",
    ("malformed_json", False): "capture_parse_error",
    ("malformed_json", True): None,  # one bad line inside a complete stream: the answer stands
    ("truncate", True): "stream_truncated",
    ("truncate", False): "capture_parse_error",
    ("stream_error", True): "upstream_error",
    ("stream_error", False): "upstream_error",
}


def _comparable(body: bytes) -> object:
    """The body, less the request id an Anthropic error carries (new for every request)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if isinstance(value, dict):
        value.pop("request_id", None)
    return value


def _fd_count() -> int:
    """Open descriptors other than capture files, which the store keeps open on purpose."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += not os.readlink(f"/proc/self/fd/{fd}").endswith(".capture.jsonl")
    return count


async def _settle(stack: Stack) -> None:
    for _ in range(200):
        if stack.upstream.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


async def test_failure_modes_every_dialect(stack: Stack) -> None:
    # Warm up so that pooled connections opened on first use do not count as leaks.
    for dialect in DIALECTS:
        await _call(stack.session, stack.url(dialect, "warm"), dialect, stream=True)
        await _call(stack.session, stack.direct_url(dialect), dialect, stream=True, direct=True)
    await _settle(stack)
    fds, tasks = _fd_count(), len(asyncio.all_tasks())
    n = 0
    for dialect in DIALECTS:
        for (scenario, stream), category in EXPECTED.items():
            n += 1
            rollout = f"f-{n}"
            direct = await _call(
                stack.session,
                stack.direct_url(dialect),
                dialect,
                stream=stream,
                scenario=scenario,
                direct=True,
            )
            got = await _call(
                stack.session,
                stack.url(dialect, rollout),
                dialect,
                stream=stream,
                scenario=scenario,
            )
            case = (dialect, scenario, stream)
            assert got[0] == direct[0], case
            assert _comparable(got[1]) == _comparable(direct[1]), case
            (record,) = stack.store.read(rollout)
            assert record["error_category"] == category, case
            assert record["status_code"] == direct[0], case
    # incomplete is an error for Responses only; elsewhere it is a finish reason.
    for dialect, category in [("responses", "incomplete"), ("chat", None), ("messages", None)]:
        for stream in (False, True):
            n += 1
            await _call(
                stack.session,
                stack.url(dialect, f"f-{n}"),
                dialect,
                stream=stream,
                scenario="incomplete",
            )
            (record,) = stack.store.read(f"f-{n}")
            assert record["error_category"] == category, (dialect, stream)
    # Still serving, and nothing left behind.
    status, _, _ = await _call(stack.session, stack.url("chat", "after"), "chat", stream=True)
    assert status == 200
    await _settle(stack)
    assert _fd_count() <= fds
    assert len(asyncio.all_tasks()) <= tasks


async def test_upstream_gone_and_disconnecting_is_connection(stack: Stack, tmp_path: Path) -> None:
    for dialect in DIALECTS:
        status, body, _ = await _call(
            stack.session,
            stack.url(dialect, f"d-{dialect}"),
            dialect,
            stream=True,
            scenario="disconnect",
        )
        assert status == 502
        assert b"upstream unreachable" in body
        (record,) = stack.store.read(f"d-{dialect}")
        assert record["error_category"] == "connection"
        assert record["status_code"] is None
    closed = FakeUpstream()
    await closed.start()
    url = closed.url
    await closed.stop()
    async with model_server(settings_for(url, tmp_path / "gone")) as server:
        status, _, _ = await _call(
            stack.session, f"{server}/ng-rollout/g/v1/chat/completions", "chat", stream=False
        )
    assert status == 502
    (record,) = CaptureStore(tmp_path / "gone").read("g")
    assert record["error_category"] == "connection"


async def test_upstream_too_slow_is_timeout(upstream: FakeUpstream, tmp_path: Path) -> None:
    settings = settings_for(upstream.url, tmp_path, read_timeout_s=0.3)
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        for stream in (False, True):
            status, body, _ = await _call(
                session,
                f"{url}/ng-rollout/t-{stream}/v1/chat/completions",
                "chat",
                stream=stream,
                scenario="hang",
            )
            assert status == 504
            assert b"did not answer in time" in body
            (record,) = CaptureStore(tmp_path).read(f"t-{stream}")
            assert record["error_category"] == "timeout"


def _log_syncs(monkeypatch: pytest.MonkeyPatch, log: list[tuple[str, str]], delay: float) -> None:
    """``("synced", rollout)`` goes into ``log`` once a capture file's fsync has returned.

    Each sync takes ``delay`` longer, so that an answer sent before its record's sync would
    reach the client first: the order in ``log`` proves the sync, where reading the file back
    proves only the write (a read succeeds from the page cache before the sync).
    """

    def fsync(fd: int) -> None:
        time.sleep(delay)
        _REAL_FSYNC(fd)
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.endswith(CAPTURE_SUFFIX):
            log.append(("synced", name.removesuffix(CAPTURE_SUFFIX)))

    _patch_syncs(monkeypatch, fsync)


def _patch_syncs(monkeypatch: pytest.MonkeyPatch, sync: Callable[[int], None]) -> None:
    """``sync`` in place of both of the store's ways to make a batch durable: an ``fsync`` of
    each file, and the one ``syncfs`` (called on one of the batch's files) of ``sync="syncfs"``,
    which is what ``auto`` takes on ext4 and xfs."""
    monkeypatch.setattr(os, "fsync", sync)
    monkeypatch.setattr("rollcap.store._files.syncfs", sync)


async def test_terminal_event_leaves_only_after_the_record_is_synced(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminals = {"responses": b"response.completed", "chat": b"[DONE]", "messages": b"message_stop"}
    log: list[tuple[str, str]] = []
    _log_syncs(monkeypatch, log, delay=0.1)
    for dialect in DIALECTS:
        rollout = f"held-{dialect}"
        async with stack.session.post(
            stack.url(dialect, rollout),
            json=request_body(dialect, stream=True),
            headers=client_headers(dialect, **{"x-fake-events": "20"}),
        ) as response:
            seen = b""
            async for chunk in response.content.iter_any():
                seen += chunk
                if terminals[dialect] in seen and seen.endswith(b"\n\n"):
                    log.append(("seen", rollout))  # the client has the whole terminal event
                    (record,) = stack.store.read(rollout)
                    assert record["model_call_id"] == response.headers["x-rollcap-model-call-id"]
                    break
            else:
                pytest.fail(f"no terminal event for {dialect}")
        assert log.index(("synced", rollout)) < log.index(("seen", rollout)), log


async def test_client_gone_mid_stream_is_recorded_as_cancelled(stack: Stack) -> None:
    async with stack.session.post(
        stack.url("responses", "gone"),
        json=request_body("responses", stream=True),
        headers=client_headers(
            "responses", **{"x-fake-chunk-delay-ms": "50", "x-fake-events": "100"}
        ),
    ) as response:
        await response.content.readany()
        response.close()
    for _ in range(300):
        if stack.store.read("gone"):
            break
        await asyncio.sleep(0.01)
    (record,) = stack.store.read("gone")
    assert record["error_category"] == "cancelled"
    assert record["status_code"] == 200
    # The upstream stream is let go too, not read to its end for nobody.
    await _settle(stack)
    assert stack.upstream.in_flight == 0


async def test_capture_off_strips_prefix_and_writes_nothing(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with model_server(settings_for(upstream.url, None)) as url, aiohttp.ClientSession() as s:
        status, _, headers = await _call(
            s, f"{url}/ng-rollout/x-1/v1/chat/completions", "chat", stream=False
        )
        assert status == 200
        assert "x-rollcap-model-call-id" not in headers
        async with s.get(f"{url}/health") as response:
            health = await response.json()
    assert health["capture_enabled"] is False
    assert health["captured"] == 0
    assert list(tmp_path.iterdir()) == []
    assert upstream.requests[-1].path == "/v1/chat/completions"


async def test_uncorrelated_calls_are_counted(stack: Stack) -> None:
    await _call(stack.session, stack.url("chat", None), "chat", stream=False)
    await _call(stack.session, stack.url("chat", None), "chat", stream=True)
    await _call(stack.session, stack.url("chat", "c-1"), "chat", stream=False)
    async with stack.session.get(f"{stack.openai_url}/health") as response:
        health = await response.json()
    assert (health["captured"], health["uncorrelated"]) == (1, 2)
    assert stack.store.rollout_ids() == ["c-1"]


@pytest.mark.parametrize("bad", ["..", "%2e%2e", "a%2Fb", "-x", "x" * 201])
async def test_bad_rollout_id_in_prefix_is_400(stack: Stack, bad: str) -> None:
    # encoded=True: the path goes out exactly as written, as a hostile client would send it.
    url = URL(f"{stack.openai_url}/ng-rollout/{bad}/v1/chat/completions", encoded=True)
    async with stack.session.post(url, json={}) as response:
        assert response.status == 400
        body = await response.json()
    assert "Invalid rollout id" in body["error"]["message"]
    assert stack.store.rollout_ids() == []


async def test_session_id_is_recorded(stack: Stack) -> None:
    # By default only x-session-id is read: Codex's session-id is not.
    for session in ({"x-session-id": "agent-session-42"}, {"session-id": "codex-1"}):
        async with stack.session.post(
            stack.url("chat", "sess"),
            json=request_body("chat", stream=False),
            headers={**client_headers("chat"), **session},
        ) as response:
            await response.read()
    first, second = stack.store.read("sess")
    assert first["client_session_id"] == "agent-session-42"
    assert "client_session_id" not in second


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # Codex CLI names its session ``session-id``, Claude Code ``x-claude-code-session-id``.
        ({"session-id": "codex-1"}, "codex-1"),
        ({"x-claude-code-session-id": "claude-1"}, "claude-1"),
        # Both sent: the list's order decides, not the request's.
        ({"x-session-id": "plain", "session-id": "codex-2"}, "codex-2"),
        ({"X-Claude-Code-Session-Id": "claude-2", "x-session-id": "plain"}, "claude-2"),
        ({"x-session-id": "plain"}, "plain"),
        ({"x-other": "no"}, None),
    ],
)
async def test_session_id_comes_from_the_first_configured_header_present(
    upstream: FakeUpstream, tmp_path: Path, headers: dict[str, str], expected: str | None
) -> None:
    capture_dir = tmp_path / "calls"
    settings = settings_for(
        upstream.url,
        capture_dir,
        client_session_headers=("session-id", "x-claude-code-session-id", "x-session-id"),
    )
    async with (
        model_server(settings) as url,
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/ng-rollout/s/v1/chat/completions",
            json=request_body("chat", stream=False),
            headers={**client_headers("chat"), **headers},
        ) as response,
    ):
        await response.read()
    assert CaptureStore(capture_dir).read("s")[0].get("client_session_id") == expected


async def test_the_clients_query_string_goes_upstream(stack: Stack) -> None:
    # The Anthropic SDK's beta client posts to /v1/messages?beta=true.
    async with stack.session.post(
        URL(stack.url("messages", "q") + "?beta=true", encoded=True),
        json=request_body("messages", stream=False),
        headers=client_headers("messages"),
    ) as response:
        assert response.status == 200
    received = stack.upstream.requests[-1]
    assert (received.path, received.query) == ("/v1/messages", "beta=true")
    assert len(stack.store.read("q")) == 1


async def test_configured_credentials_go_upstream_never_the_clients(stack: Stack) -> None:
    await _call(stack.session, stack.url("chat", "k"), "chat", stream=False)
    await _call(stack.session, stack.url("messages", "k"), "messages", stream=False)
    chat, messages = stack.upstream.requests[-2:]
    assert chat.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert messages.headers["x-api-key"] == UPSTREAM_KEY
    assert messages.headers["anthropic-version"] == "2023-06-01"
    for received in (chat, messages):
        assert all(SECRETS[1] not in value for value in received.headers.values())


@pytest.mark.parametrize("breakage", ["not_a_directory", "disk_full"])
async def test_capture_failure_never_fails_the_call(
    upstream: FakeUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture, breakage: str
) -> None:
    if breakage == "not_a_directory":
        (tmp_path / "file").write_text("x")
        capture_dir = tmp_path / "file" / "calls"
    else:
        capture_dir = tmp_path / "calls"
        capture_dir.mkdir()
        (capture_dir / "r-1.capture.jsonl").symlink_to("/dev/full")
    caplog.set_level(logging.ERROR, logger="rollcap")
    async with (
        model_server(settings_for(upstream.url, capture_dir)) as url,
        aiohttp.ClientSession() as s,
    ):
        for stream in (False, True):
            status, body, _ = await _call(
                s, f"{url}/ng-rollout/r-1/v1/chat/completions", "chat", stream=stream
            )
            assert status == 200
            assert body
        async with s.get(f"{url}/health") as response:
            assert (await response.json())["capture_failures"] == 2
    failures = [r for r in caplog.records if "capture write failed" in r.getMessage()]
    assert len(failures) == 2
    if breakage == "disk_full":
        assert (capture_dir / "r-1.capture.incomplete").exists()
        assert "No space left" in failures[0].getMessage()


async def test_no_secret_reaches_capture_files_or_logs(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for dialect in DIALECTS:
        for scenario in ("text", "http_401", "tool"):
            for stream in (False, True):
                await _call(
                    stack.session,
                    stack.url(dialect, "sec"),
                    dialect,
                    stream=stream,
                    scenario=scenario,
                )
    written = b"".join(p.read_bytes() for p in stack.store.directory.iterdir())
    assert written
    for secret in SECRETS:
        assert secret.encode() not in written
        assert secret not in caplog.text


async def test_exception_in_the_server_is_recorded_and_answered_500(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollcap.server import _app

    real_forward = _app._Forwarder.forward
    calls = {"n": 0}

    async def flaky_forward(self: Any, request: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            await request.body()
            raise RuntimeError("a bug in the server")
        return await real_forward(self, request)

    monkeypatch.setattr(_app._Forwarder, "forward", flaky_forward)
    # After a 500 from an exception the server closes the connection: no reuse.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        model_server(settings_for(upstream.url, tmp_path)) as url,
        aiohttp.ClientSession(connector=connector) as s,
    ):
        first = await _call(s, f"{url}/ng-rollout/boom/v1/chat/completions", "chat", stream=False)
        second = await _call(s, f"{url}/ng-rollout/boom/v1/chat/completions", "chat", stream=False)
    assert first[0] == 500
    assert second[0] == 200
    broken, fine = CaptureStore(tmp_path).read("boom")
    assert (broken["status_code"], broken["error_category"]) == (500, "upstream_error")
    assert (fine["status_code"], fine["error_category"]) == (200, None)


async def test_permission_denied_is_logged_and_the_call_still_served(
    upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def denied(handle: object, fd: int, batch: object) -> bool:
        raise PermissionError(13, "Permission denied", "p.capture.jsonl")

    monkeypatch.setattr(_group_commit, "_write", denied)
    caplog.set_level(logging.ERROR, logger="rollcap")
    async with (
        model_server(settings_for(upstream.url, tmp_path)) as url,
        aiohttp.ClientSession() as s,
    ):
        status, body, _ = await _call(
            s, f"{url}/ng-rollout/p/v1/responses", "responses", stream=True
        )
    assert status == 200
    assert b"response.completed" in body
    (line,) = [r.getMessage() for r in caplog.records if "capture write failed" in r.getMessage()]
    assert "PermissionError: Permission denied" in line
    assert (tmp_path / "p.capture.incomplete").exists()


async def test_capture_directory_removed_while_serving_is_recreated(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture_dir = tmp_path / "calls"
    async with (
        model_server(settings_for(upstream.url, capture_dir)) as url,
        aiohttp.ClientSession() as s,
    ):
        await _call(s, f"{url}/ng-rollout/r/v1/chat/completions", "chat", stream=False)
        for path in capture_dir.iterdir():
            path.unlink()
        capture_dir.rmdir()
        await _call(s, f"{url}/ng-rollout/r/v1/chat/completions", "chat", stream=True)
    assert len(CaptureStore(capture_dir).read("r")) == 1


async def test_stopping_the_server_closes_every_capture_file(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    def open_capture_files() -> int:
        return sum(
            os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        )

    async with (
        model_server(settings_for(upstream.url, tmp_path)) as url,
        aiohttp.ClientSession() as s,
    ):
        for n in range(5):
            await _call(s, f"{url}/ng-rollout/open-{n}/v1/chat/completions", "chat", stream=False)
        assert open_capture_files() == 5  # kept open between appends, on purpose
    assert open_capture_files() == 0


@pytest.mark.parametrize("quiet", [True, False])
async def test_a_deliberately_broken_stream_is_logged_as_such_not_as_a_server_error(
    stack: Stack,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    quiet: bool,
) -> None:
    from rollcap._proxy import relay

    if not quiet:  # without the filter uvicorn's own line shows: the check below can fail
        monkeypatch.setattr(relay._FILTER, "filter", lambda record: True)
    caplog.set_level(logging.INFO)
    status, body, _ = await _call(
        stack.session, stack.url("chat", "broke"), "chat", stream=True, scenario="truncate"
    )
    assert (status, body) == (200, b"<cut>")  # the client's stream broke as upstream's did
    await _settle(stack)
    messages = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    unfinished = [m for m in messages if "without completing response" in m[2]]
    ours = [m for m in messages if "upstream broke off its answer" in m[2]]
    if quiet:
        assert unfinished == []
        assert len(ours) == 1
        assert ours[0][:2] == ("rollcap.server", logging.WARNING)
        assert "/v1/chat/completions" in ours[0][2]
    else:
        assert len(unfinished) == 1
    # Another unfinished response (not rollcap's doing) would still be reported.
    assert relay._FILTER.filter(
        logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, relay._UNFINISHED, (), None)
    )


async def test_upstream_silent_mid_stream_breaks_the_client_stream_and_is_timeout(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    settings = settings_for(upstream.url, tmp_path, read_timeout_s=0.3)
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/ng-rollout/silent/v1/chat/completions",
            data=orjson.dumps(request_body("chat", stream=True)),
            headers={
                "content-type": "application/json",
                **client_headers("chat", "text", key=CLIENT_KEY),
                "x-fake-events": "3",
                "x-fake-chunk-delay-ms": "1000",
            },
        ) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()  # not a clean end an SDK could take for a whole answer
        for _ in range(300):
            if CaptureStore(tmp_path).read("silent"):
                break
            await asyncio.sleep(0.01)
    (record,) = CaptureStore(tmp_path).read("silent")
    assert record["error_category"] == "timeout"
    assert record["status_code"] == 200


async def test_a_non_streamed_answer_leaves_whole_only_once_its_record_is_synced(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Status, headers and body go out together after the record is synced: a client that has
    # the status can rely on the record, and it reads the answer in one piece, not two.
    log: list[tuple[str, str]] = []
    _log_syncs(monkeypatch, log, delay=0.2)
    for dialect in DIALECTS:
        rollout = f"whole-{dialect}"
        async with stack.session.post(
            stack.url(dialect, rollout),
            json=request_body(dialect, stream=False),
            headers=client_headers(dialect),
        ) as response:
            log.append(("seen", rollout))  # the status line is here
            (record,) = stack.store.read(rollout)
            assert record["model_call_id"] == response.headers["x-rollcap-model-call-id"]
            assert orjson.loads(await response.read()) == record["response"]
        assert log.index(("synced", rollout)) < log.index(("seen", rollout)), log


async def _raw_exchange(url: str, dialect: str, scenario: str, *, direct: bool) -> bytes:
    """Everything the server sends for one non-streamed call, up to its closing the socket."""
    target = URL(url)
    body = orjson.dumps(request_body(dialect, stream=False))
    headers = client_headers(dialect, scenario, key=UPSTREAM_KEY if direct else CLIENT_KEY)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        writer.write(
            (
                f"POST {target.raw_path} HTTP/1.1\r\nhost: {target.host}\r\n{head}"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        return await asyncio.wait_for(reader.read(-1), 10)
    finally:
        writer.close()


async def test_a_non_streamed_answer_cut_by_upstream_reaches_the_client_cut_the_same_way(
    stack: Stack,
) -> None:
    # Holding the status back with the body must not swallow what upstream did send: the
    # client gets the same status, the same length and the same partial body, then the break.
    for dialect in DIALECTS:
        rollout = f"cut-{dialect}"
        direct = await _raw_exchange(stack.direct_url(dialect), dialect, "truncate", direct=True)
        got = await _raw_exchange(stack.url(dialect, rollout), dialect, "truncate", direct=False)
        direct_head, _, direct_body = direct.partition(b"\r\n\r\n")
        got_head, _, got_body = got.partition(b"\r\n\r\n")
        assert got_head.split(b"\r\n")[0] == direct_head.split(b"\r\n")[0]  # the status line
        length = [h for h in direct_head.lower().split(b"\r\n") if h.startswith(b"content-length")]
        assert length
        assert length[0] in got_head.lower().split(b"\r\n")
        assert got_body == direct_body
        assert len(got_body) < int(length[0].split(b":")[1])
        (record,) = stack.store.read(rollout)
        assert record["error_category"] == "capture_parse_error"


_REAL_FSYNC = os.fsync


def _slow_fsync(delay: float) -> Callable[[int], None]:
    def fsync(fd: int) -> None:
        time.sleep(delay)
        _REAL_FSYNC(fd)

    return fsync


async def _cancelled_mid_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: Callable[[int], None]
) -> CaptureState:
    """Run one captured call through the middleware alone and cancel it while its record is
    being synced; the server's state once the record's outcome came."""
    _patch_syncs(monkeypatch, fsync)
    state = CaptureState("policy_model", CaptureStore(tmp_path))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-1"}'})

    path = "/ng-rollout/late-1/v1/chat/completions"
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode()}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"model": "m"}', "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = CaptureMiddleware(app, state)
    task = asyncio.ensure_future(middleware(scope, receive, send))
    await asyncio.sleep(0.1)  # the record is queued; its fsync takes 0.3 s
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sent == []  # nothing reached the client before the record was durable
    assert (state.captured, state.capture_failures) == (0, 0)  # the caller did not wait
    await asyncio.wait_for(asyncio.gather(*middleware._late), 10)  # the outcome, when it comes
    assert state.writer is not None
    await asyncio.to_thread(state.writer.close)
    return state


async def test_a_call_cancelled_while_its_record_is_synced_leaves_and_the_record_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = await _cancelled_mid_write(tmp_path, monkeypatch, _slow_fsync(0.3))
    assert (state.captured, state.capture_failures) == (1, 0)
    (record,) = CaptureStore(tmp_path).read("late-1")
    assert record["response"] == {"id": "chatcmpl-1"}


async def test_a_record_that_fails_after_its_caller_was_cancelled_is_still_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def failing_fsync(fd: int) -> None:
        time.sleep(0.3)
        raise OSError(28, "No space left on device")

    with caplog.at_level(logging.ERROR, logger="rollcap.server"):
        state = await _cancelled_mid_write(tmp_path, monkeypatch, failing_fsync)
    assert (state.captured, state.capture_failures) == (0, 1)
    assert CaptureStore(tmp_path).is_incomplete("late-1")
    assert "capture write failed for rollout late-1" in caplog.text


def test_a_model_servers_settings_come_from_the_runs(tmp_path: Path) -> None:
    from rollcap.config import RunSettings
    from rollcap.server import ModelServerSettings

    run = RunSettings.from_config(
        {
            "observability_enabled": True,
            "model_call_capture_dir": str(tmp_path / "capture"),
            "policy_base_url": "http://upstream/v1",
            "policy_api_key": "run-key",
            "pass_client_credentials": True,
            "token_id_capture": {
                "enabled": True,
                "external_staging": True,
                "rebuild_response": False,
                "dir": str(tmp_path / "ledger"),
            },
            "max_request_bytes": 1000,
            "capture_max_response_bytes": 2000,
        }
    )
    settings = ModelServerSettings.from_run(run, "vllm_model")
    assert settings.model_type == "vllm_model"
    assert settings.name == "policy_model"
    assert settings.base_url == "http://upstream/v1"
    assert settings.api_key == "run-key"
    assert settings.capture_dir == tmp_path / "capture"
    assert settings.pass_client_credentials is True
    assert settings.token_capture.external_staging is True
    assert settings.token_capture.dir == tmp_path / "ledger"
    assert (settings.max_request_bytes, settings.capture_max_response_bytes) == (1000, 2000)

    own = ModelServerSettings.from_run(
        run, "vllm_model", name="m2", base_url=("http://a/v1", "http://b/v1"), api_key="own"
    )
    assert (own.name, own.base_url, own.api_key) == ("m2", ("http://a/v1", "http://b/v1"), "own")


def test_a_model_server_refuses_an_unknown_capture_sync() -> None:
    from rollcap.server import ModelServerSettings

    with pytest.raises(ValueError, match="capture_sync must be one of auto, fsync, syncfs"):
        ModelServerSettings(model_type="openai_model", base_url=None, capture_sync="dsync")
