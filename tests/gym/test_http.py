"""The gym servers' JSON in and out: one error shape, one way to read a body."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from starlette.requests import Request

from rollcap.gym import InvalidRequest
from rollcap.gym._http import error_response, read_json_object


def _request(body: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


async def test_a_json_object_body_is_read() -> None:
    assert await read_json_object(_request(b'{"a": 1}')) == {"a": 1}


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{nope", "not valid JSON"), (b"[1]", "must be a JSON object, got an array")],
)
async def test_anything_else_is_the_callers_error(body: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        await read_json_object(_request(body))


def test_errors_have_the_openai_shape_with_extra_fields() -> None:
    response = error_response(502, "model server unreachable", "upstream_error", server="model")
    assert response.status_code == 502
    assert orjson.loads(response.body) == {
        "error": {
            "message": "model server unreachable",
            "type": "upstream_error",
            "param": None,
            "code": None,
            "server": "model",
        }
    }
