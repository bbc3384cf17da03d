"""The resources-server base app: the verify contract and its error answers."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap._runtime.serving import serving
from rollcap.gym import InvalidRequest, ResourcesServer, create_resources_app
from tests.gym.conftest import CLIENT_TIMEOUT


class Scripted(ResourcesServer):
    """Answers verify with whatever the test put in ``result`` (or raises it)."""

    name = "scripted"

    def __init__(self) -> None:
        self.result: Any = {"reward": 1}
        self.started = self.stopped = False

    async def verify(self, body: dict[str, Any]) -> dict[str, Any]:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result  # type: ignore[no-any-return]

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Scripted, str, aiohttp.ClientSession]]:
    server = Scripted()
    async with (
        serving(create_resources_app(server)) as url,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
    ):
        assert server.started
        yield server, url, session
    assert server.stopped


async def _verify(scripted: tuple[Scripted, str, aiohttp.ClientSession]) -> tuple[int, Any]:
    _, url, session = scripted
    async with session.post(url + "/verify", data=b"{}") as response:
        return response.status, orjson.loads(await response.read())


async def test_reward_comes_back_as_float_with_other_fields(
    scripted: tuple[Scripted, str, aiohttp.ClientSession],
) -> None:
    scripted[0].result = {"reward": 1, "note": "ok"}
    status, result = await _verify(scripted)
    assert status == 200
    assert result == {"reward": 1.0, "note": "ok"}
    assert isinstance(result["reward"], float)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"score": 1.0}, "verify returned no reward"),
        ({"reward": "1.0"}, "reward that is not a number: a string"),
        ({"reward": True}, "reward that is not a number: a boolean"),
        ({"reward": None}, "reward that is not a number: null"),
        ({"reward": math.nan}, "not finite"),
        ({"reward": math.inf}, "not finite"),
        ([1.0], "must return a JSON object with a numeric reward, got an array"),
        ({"reward": 1.0, "extra": object()}, "scripted verify"),
    ],
)
async def test_a_result_breaking_the_contract_is_500(
    scripted: tuple[Scripted, str, aiohttp.ClientSession],
    result: Any,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scripted[0].result = result
    status, body = await _verify(scripted)
    assert status == 500
    assert body["error"]["type"] == "server_error"
    assert message in body["error"]["message"]
    assert any(r.levelno == logging.ERROR for r in caplog.records)


async def test_an_exception_is_500_without_traceback(
    scripted: tuple[Scripted, str, aiohttp.ClientSession], caplog: pytest.LogCaptureFixture
) -> None:
    scripted[0].result = RuntimeError("grader exploded")
    status, body = await _verify(scripted)
    assert status == 500
    assert body == {
        "error": {
            "message": "scripted verify failed: RuntimeError: grader exploded",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert "Traceback" not in orjson.dumps(body).decode()
    # The traceback goes to the log, where the operator looks.
    assert any(r.exc_info for r in caplog.records if r.name == "rollcap.gym")


async def test_invalid_request_from_verify_is_400(
    scripted: tuple[Scripted, str, aiohttp.ClientSession],
) -> None:
    scripted[0].result = InvalidRequest("the task has no question")
    status, body = await _verify(scripted)
    assert status == 400
    assert body["error"] == {
        "message": "the task has no question",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


async def test_base_class_defaults(
    scripted: tuple[Scripted, str, aiohttp.ClientSession],
) -> None:
    _, url, session = scripted
    async with session.post(url + "/seed_session", data=b'{"x": 1}') as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == {}
    async with session.get(url + "/verify") as response:
        assert response.status == 405
    with pytest.raises(NotImplementedError):
        await ResourcesServer().verify({})
    assert ResourcesServer().tools() == []
    with pytest.raises(NotImplementedError):
        await ResourcesServer().call_tool("x", {})
    async with session.get(url + "/tools") as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == {"tools": []}
    async with session.post(url + "/tools/x", data=b"{}") as response:
        assert response.status == 404
        assert "scripted has no tool 'x'" in orjson.loads(await response.read())["error"]["message"]


class Echo(ResourcesServer):
    """One tool, ``echo``, that answers its arguments, refuses ``bad`` and breaks on ``boom``."""

    name = "echo"

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "name": "echo", "parameters": {"type": "object"}}]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if "bad" in arguments:
            raise InvalidRequest("bad is not an argument of echo")
        if "boom" in arguments:
            raise RuntimeError("echo exploded")
        return [name, arguments]


@pytest.mark.parametrize(
    ("body", "status", "answer"),
    [
        (b'{"x": 1}', 200, ["echo", {"x": 1}]),
        (b'{"bad": 1}', 400, "bad is not an argument of echo"),
        (b'{"boom": 1}', 500, "echo tool echo failed: RuntimeError: echo exploded"),
        (b"[1]", 400, "the request body must be a JSON object, got an array"),
    ],
)
async def test_a_tool_runs_and_its_failures_are_errors(
    body: bytes, status: int, answer: Any
) -> None:
    async with (
        serving(create_resources_app(Echo())) as url,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
    ):
        async with session.get(url + "/tools") as response:
            assert orjson.loads(await response.read())["tools"][0]["name"] == "echo"
        async with session.post(url + "/tools/echo", data=body) as response:
            assert response.status == status
            got = orjson.loads(await response.read())
    assert (got if status == 200 else got["error"]["message"]) == answer
