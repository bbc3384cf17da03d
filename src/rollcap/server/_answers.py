"""The model server's own answers: error bodies in the client's dialect, the answer to an upstream
that failed, an upstream's error reshaped for the client, and whole bodies read from upstream."""

from __future__ import annotations

import time

import aiohttp
import orjson
from starlette.responses import Response

from rollcap._json import load_json_object
from rollcap._proxy import forward
from rollcap._proxy.forward import UpstreamFailure
from rollcap.dialects import context_length_exceeded, get_dialect, openai_error
from rollcap.server._recorder import CallRecorder
from rollcap.server._translating import error_for_client

__all__ = [
    "error_body",
    "error_response",
    "failure_answer",
    "json_response",
    "read_whole",
    "upstream_error",
]


def error_body(dialect: str | None, kind: str, message: str) -> bytes:
    """The error as the client's dialect shapes it; OpenAI's shape off the dialect routes."""
    if dialect is None:
        return orjson.dumps(openai_error(message, kind=kind))
    return orjson.dumps(get_dialect(dialect).error_body(kind, message))


def json_response(body: bytes, status: int) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def error_response(dialect: str | None, status: int, kind: str, message: str) -> Response:
    return json_response(error_body(dialect, kind, message), status)


def failure_answer(
    failure: UpstreamFailure, dialect: str | None, recorder: CallRecorder | None
) -> Response:
    """The client's answer to an upstream that gave none, in its dialect; the record notes why."""
    if recorder is not None and failure.category is not None:
        recorder.upstream_failed(failure.category)
    return error_response(dialect, failure.status, failure.kind, str(failure))


def upstream_error(
    dialect: str, status: int, raw: bytes, recorder: CallRecorder | None
) -> Response:
    """A chat upstream's error answer, as the client's dialect shapes errors.

    The record is told when the error says the prompt exceeds the model's context: the
    reshaped body may no longer carry the code that says so.
    """
    if recorder is not None and context_length_exceeded(status, load_json_object(raw)):
        recorder.context_exceeded()
    return json_response(error_for_client(dialect, status, raw), status)


async def read_whole(
    upstream: aiohttp.ClientResponse, dialect: str | None, recorder: CallRecorder | None
) -> bytes | Response:
    """The upstream's whole body, or the error answer for a read that timed out or broke off.

    The response is released either way; the time the body arrived is the call's TTFT.
    """
    try:
        raw = await forward.read_whole(upstream)
    except UpstreamFailure as failure:
        return failure_answer(failure, dialect, recorder)
    if recorder is not None:
        recorder.first_byte(time.monotonic())
    return raw
