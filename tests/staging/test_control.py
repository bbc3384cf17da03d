"""The control route's client against a real aiohttp server on 127.0.0.1, and the token check."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from rollcap.staging._control import (
    DEFAULT_CONTROL_TOKEN_ENV,
    MANIFEST_PATH_TEMPLATE,
    RolloutControlClient,
    bearer_matches,
)
from rollcap.staging._ledger import FileLineageStore
from rollcap.staging._records import REASON_UNRESOLVED_PARENT, REASON_WORKER_CAPTURE_FAILED

TOKEN = "control-token-1f0e"
UNAUTHORIZED = {"detail": "missing or invalid control-plane bearer token"}


class ControlServer:
    """A stand-in model server serving STAGING §8.2's route over a real ledger."""

    def __init__(self, ledger: FileLineageStore) -> None:
        self.ledger = ledger
        self.peers: list[Any] = []
        self.overrides: dict[str, web.Response] = {}
        self.delay_s = 0.0

    async def manifest(self, request: web.Request) -> web.Response:
        self.peers.append(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        if not bearer_matches(request.headers.get("Authorization"), TOKEN):
            return web.json_response(UNAUTHORIZED, status=401)
        rollout_id = request.match_info["rollout_id"]
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if rollout_id in self.overrides:
            return self.overrides[rollout_id]
        try:
            manifest = self.ledger.manifest(rollout_id)
        except ValueError as exc:
            return web.json_response({"detail": str(exc)}, status=400)
        return web.json_response(manifest.model_dump(mode="json"))


@contextlib.asynccontextmanager
async def control_server(server: ControlServer) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get(MANIFEST_PATH_TEMPLATE, server.manifest)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def ledger(tmp_path: Path) -> FileLineageStore:
    store = FileLineageStore(tmp_path)
    store.record_failure("r1", "c1", REASON_WORKER_CAPTURE_FAILED)
    store.record_failure("r1", "c2", REASON_UNRESOLVED_PARENT)
    return store


@pytest.fixture
async def served(ledger: FileLineageStore) -> AsyncIterator[tuple[ControlServer, str]]:
    server = ControlServer(ledger)
    async with control_server(server) as url:
        yield server, url


def client(url: str, *, token: str = TOKEN, timeout_s: float = 5.0) -> RolloutControlClient:
    return RolloutControlClient(url, auth_token=token, request_timeout_s=timeout_s)


def test_the_route_and_the_token_variable() -> None:
    assert (
        MANIFEST_PATH_TEMPLATE == "/training-token-capture/control/rollouts/{rollout_id}/manifest"
    )
    assert DEFAULT_CONTROL_TOKEN_ENV == "NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN"


async def test_a_manifest_is_read_over_the_route(served: tuple[ControlServer, str]) -> None:
    server, url = served
    async with client(url + "/") as control:
        manifest = await control.manifest("r1")
        again = await control.manifest("r1")
        empty = await control.manifest("unknown")

    assert manifest == again
    assert manifest.rollout_id == "r1"
    assert manifest.records == []
    assert [(f.model_call_id, f.reason) for f in manifest.failures] == [
        ("c1", REASON_WORKER_CAPTURE_FAILED),
        ("c2", REASON_UNRESOLVED_PARENT),
    ]
    assert empty.model_dump(mode="json") == {
        "schema_version": 2,
        "rollout_id": "unknown",
        "records": [],
        "failures": [],
    }
    # One session, so one kept-alive connection for all three requests.
    assert len(server.peers) == 3
    assert len(set(server.peers)) == 1


async def test_a_wrong_token_is_a_runtime_error_quoting_status_and_body(
    served: tuple[ControlServer, str],
) -> None:
    _, url = served
    async with client(url, token="not-the-token") as control:
        with pytest.raises(RuntimeError) as caught:
            await control.manifest("r1")

    message = str(caught.value)
    expected_url = f"{url}/training-token-capture/control/rollouts/r1/manifest"
    assert message.startswith(f"ledger control request GET {expected_url} answered 401: ")
    assert '"detail": "missing or invalid control-plane bearer token"' in message
    assert "not-the-token" not in message


async def test_a_ledger_refusal_is_a_runtime_error_with_the_400_body(
    served: tuple[ControlServer, str],
) -> None:
    _, url = served
    async with client(url) as control:
        # "bad id" travels unescaped; aiohttp's URL quoting makes it %20, which the server
        # decodes back into the id its ledger refuses.
        with pytest.raises(RuntimeError, match="answered 400") as caught:
            await control.manifest("bad id")
    assert "Invalid rollout id: 'bad id'" in str(caught.value)


async def test_a_slow_server_exceeds_the_timeout(served: tuple[ControlServer, str]) -> None:
    server, url = served
    server.delay_s = 1.0
    async with client(url, timeout_s=0.2) as control:
        with pytest.raises(RuntimeError) as caught:
            await control.manifest("r1")
    assert str(caught.value) == (
        f"ledger control request GET {url}/training-token-capture/control/rollouts/r1/manifest"
        " exceeded 0.2s"
    )


async def test_a_body_that_is_not_a_manifest_is_refused(served: tuple[ControlServer, str]) -> None:
    server, url = served
    server.overrides["text"] = web.Response(text="not json", status=200)
    server.overrides["shape"] = web.json_response({"rollout_id": "shape", "records": 3})
    server.overrides["other"] = web.json_response({"schema_version": 2, "rollout_id": "r9"})
    server.overrides["moved"] = web.Response(status=307, headers={"Location": "http://x.invalid/"})
    async with client(url) as control:
        with pytest.raises(RuntimeError, match="not JSON: not json"):
            await control.manifest("text")
        with pytest.raises(ValidationError):
            await control.manifest("shape")
        with pytest.raises(RuntimeError, match="manifest of rollout 'r9'"):
            await control.manifest("other")
        with pytest.raises(RuntimeError, match="answered 307"):
            await control.manifest("moved")


async def test_a_server_that_is_not_there_is_a_runtime_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with client(f"http://127.0.0.1:{port}") as control:
        with pytest.raises(RuntimeError, match=r"ledger control request GET .* failed"):
            await control.manifest("r1")


def test_the_url_is_the_base_without_its_trailing_slash_plus_the_route() -> None:
    control = client("http://gate.example:8000/prefix//")
    assert control.base_url == "http://gate.example:8000/prefix"
    assert control.manifest_url("0-0") == (
        "http://gate.example:8000/prefix/training-token-capture/control/rollouts/0-0/manifest"
    )


@pytest.mark.parametrize(
    "bad", ["", "gate:8000", "127.0.0.1:8000", "ftp://gate/", "http://", "/relative"]
)
def test_a_base_url_that_is_not_http_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="base URL"):
        client(bad)


@pytest.mark.parametrize("token", ["", None])
def test_an_empty_token_is_refused(token: Any) -> None:
    with pytest.raises(ValueError, match="non-empty auth token"):
        RolloutControlClient("http://127.0.0.1:1", auth_token=token, request_timeout_s=1.0)


@pytest.mark.parametrize("timeout_s", [0, 0.0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_timeout_that_is_not_positive_is_refused(timeout_s: Any) -> None:
    with pytest.raises(ValueError, match="request_timeout_s"):
        RolloutControlClient("http://127.0.0.1:1", auth_token=TOKEN, request_timeout_s=timeout_s)


async def test_a_closed_client_refuses_requests(served: tuple[ControlServer, str]) -> None:
    _, url = served
    control = client(url)
    await control.manifest("r1")
    await control.close()
    await control.close()
    with pytest.raises(RuntimeError, match="closed"):
        await control.manifest("r1")


async def test_closing_an_unused_client_is_fine() -> None:
    await client("http://127.0.0.1:1").close()


def test_the_bearer_check_is_exact() -> None:
    assert bearer_matches(f"Bearer {TOKEN}", TOKEN)
    assert not bearer_matches(None, TOKEN)
    assert not bearer_matches("", TOKEN)
    assert not bearer_matches(TOKEN, TOKEN)
    assert not bearer_matches(f"bearer {TOKEN}", TOKEN)
    assert not bearer_matches(f"Bearer  {TOKEN}", TOKEN)
    assert not bearer_matches(f"Bearer {TOKEN} ", TOKEN)
    assert not bearer_matches(f"Bearer {TOKEN}x", TOKEN)
    assert not bearer_matches("Bearer é", TOKEN)
    assert not bearer_matches("Bearer ", "")
    assert bearer_matches("Bearer é", "é")
