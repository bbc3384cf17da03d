"""The calculator resources server: its tools, its grading, over a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap._runtime.serving import serving
from rollcap.gym import (
    RESOURCES_SERVERS,
    CalculatorResourcesServer,
    InvalidRequest,
    create_resources_app,
    example_data_path,
    extract_number,
)
from tests.gym.conftest import CLIENT_TIMEOUT, responses_object


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("126", 126),
        ("The answer is 126.", 126),
        ("First 3, then 4, so 7", 7),
        ("It is -15.", -15),
        ("2.5", 2.5),
        ("That makes 1,250 pencils", 1250),
        ("**42**", 42),
        ("x2 and B12 are not numbers", None),
        ("no number here", None),
    ],
)
def test_extract_number_takes_the_last_number(text: str, number: float | None) -> None:
    assert extract_number(text) == number


def test_three_tools_declared_as_the_responses_api_declares_function_tools() -> None:
    tools = CalculatorResourcesServer().tools()
    assert [tool["name"] for tool in tools] == ["add", "subtract", "multiply"]
    for tool in tools:
        assert tool["type"] == "function"
        assert tool["parameters"]["required"] == ["a", "b"]
    assert RESOURCES_SERVERS["calculator"] is CalculatorResourcesServer


@pytest.mark.parametrize(
    ("name", "a", "b", "result"),
    [("add", 17, 25, 42), ("subtract", 1000, 42, 958), ("multiply", 2.5, 8, 20.0)],
)
async def test_the_tools_compute(name: str, a: float, b: float, result: float) -> None:
    assert await CalculatorResourcesServer().call_tool(name, {"a": a, "b": b}) == {"result": result}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"a": 1}, "b must be a finite number, got nothing"),
        ({"a": True, "b": 1}, "a must be a finite number, got a boolean"),
        ({"a": 1, "b": 2, "c": 3}, "add takes a and b, not c"),
    ],
)
async def test_bad_arguments_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        await CalculatorResourcesServer().call_tool("add", arguments)


@pytest.fixture
async def calculator() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with (
        serving(create_resources_app(CalculatorResourcesServer())) as url,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
    ):
        yield url, session


async def _post(calculator: tuple[str, aiohttp.ClientSession], path: str, body: Any) -> Any:
    url, session = calculator
    async with session.post(url + path, data=orjson.dumps(body)) as response:
        return response.status, orjson.loads(await response.read())


async def test_tools_over_http(calculator: tuple[str, aiohttp.ClientSession]) -> None:
    assert await _post(calculator, "/tools/multiply", {"a": 123, "b": 45}) == (
        200,
        {"result": 5535},
    )
    status, body = await _post(calculator, "/tools/divide", {"a": 1, "b": 2})
    assert status == 404
    status, body = await _post(calculator, "/tools/add", {"a": "1", "b": 2})
    assert (status, body["error"]["message"]) == (400, "a must be a finite number, got a string")


@pytest.mark.parametrize(
    ("text", "reward", "extracted"),
    [("126", 1.0, 126), ("I get 125.", 0.0, 125), ("I do not know", 0.0, None)],
)
async def test_verify_grades_the_last_number(
    calculator: tuple[str, aiohttp.ClientSession], text: str, reward: float, extracted: Any
) -> None:
    task = orjson.loads(example_data_path("calculator").read_bytes().splitlines()[1])
    assert task["expected_answer"] == 126
    response = responses_object(text, "m")
    status, body = await _post(calculator, "/verify", {**task, "response": response})
    assert status == 200
    assert body == {"reward": reward, "extracted_answer": extracted, "resolved": reward == 1.0}


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"expected_answer": "126", "response": {}}, "expected_answer must be a number"),
        ({"expected_answer": 126}, "got none"),
    ],
)
async def test_verify_refuses_what_it_cannot_grade(
    calculator: tuple[str, aiohttp.ClientSession], task: dict[str, Any], message: str
) -> None:
    status, body = await _post(calculator, "/verify", task)
    assert status == 400
    assert message in body["error"]["message"]


def test_every_example_answer_is_right() -> None:
    lines = example_data_path("calculator").read_bytes().splitlines()
    assert len(lines) == 12
    for raw in lines:
        task = orjson.loads(raw)
        assert "tools" not in task["responses_create_params"]  # the server's are used
        assert isinstance(task["expected_answer"], int)
