"""JSON in and out for the gym servers: one error shape, one way to read a body."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rollcap._json import json_type_name
from rollcap.dialects import openai_error

__all__ = ["InvalidRequest", "error_response", "json_response", "read_json_object"]


class InvalidRequest(ValueError):
    """The caller sent something unusable: answered 400 with this exception's message.

    Resources servers and agents raise it from their own methods too, so a task line missing a
    field is the caller's error (400), not the server's (500).
    """


def json_response(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def error_response(status: int, message: str, kind: str, /, **extra: Any) -> Response:
    """``{"error": {"message", "type", "param", "code", ...extra}}``: the OpenAI error shape."""
    return json_response(openai_error(message, kind=kind, **extra), status)


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; ``InvalidRequest`` for anything else."""
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {json_type_name(body)}")
    return body
