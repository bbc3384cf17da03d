"""The model server's own answers: error bodies in the client's dialect, and whole bodies read
from upstream with the failures a read can end in."""

from __future__ import annotations

import time

import aiohttp
import orjson
from starlette.responses import Response

from rollcap.dialects import get_dialect, openai_error
from rollcap.server._recorder import CallFailure, CallRecorder

__all__ = ["error_body", "error_response", "json_response", "read_whole"]


def error_body(dialect: str | None, kind: str, message: str) -> bytes:
    """The error as the client's dialect shapes it; OpenAI's shape off the dialect routes."""
    if dialect is None:
        return orjson.dumps(openai_error(message, kind=kind))
    return orjson.dumps(get_dialect(dialect).error_body(kind, message))


def json_response(body: bytes, status: int) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def error_response(dialect: str | None, status: int, kind: str, message: str) -> Response:
    return json_response(error_body(dialect, kind, message), status)


async def read_whole(
    upstream: aiohttp.ClientResponse, dialect: str | None, recorder: CallRecorder | None
) -> bytes | Response:
    """The upstream's whole body, or the error answer for a read that timed out or broke off.

    The response is released either way; the first byte's time is the call's TTFT.
    """
    try:
        raw = await upstream.read()
        if recorder is not None:
            recorder.first_byte(time.monotonic())
        return raw
    except TimeoutError:
        if recorder is not None:
            recorder.fail(CallFailure.TIMEOUT)
        return error_response(dialect, 504, "timeout", "upstream too slow")
    except aiohttp.ClientError as exc:
        return error_response(dialect, 502, "api_error", f"upstream broke off its answer: {exc}")
    finally:
        upstream.release()
