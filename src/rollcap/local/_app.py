"""The embedded chat server: an OpenAI-compatible Chat Completions API over a ``LocalEngine``.

Routes: ``POST /v1/chat/completions`` (a ``chat.completion`` with usage, or with ``stream: true``
``chat.completion.chunk`` events, the usage chunk when ``stream_options.include_usage`` asks for
it, then ``data: [DONE]``), ``GET /v1/models`` and ``GET /health``. No credentials: it listens on
loopback only, behind the model server.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollcap.dialects import openai_error
from rollcap.local._engine import LocalEngine, Prompt
from rollcap.local._protocol import (
    ChatCall,
    ChatRequestError,
    Completion,
    chunk_body,
    completion_body,
    models_body,
    parse_chat_request,
)

__all__ = ["create_chat_app"]

logger = logging.getLogger(__name__)
_SERVER_ERROR = openai_error("the embedded model failed", kind="server_error", code="server_error")


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _event(body: Any) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


def create_chat_app(engine: LocalEngine) -> Starlette:
    """The ASGI app serving ``engine``; the caller owns the engine (loads and closes it)."""
    started = int(time.time())

    async def chat(request: Request) -> Response:
        try:
            call = parse_chat_request(orjson.loads(await request.body()))
            prompt = await engine.aprompt(call.messages)
        except orjson.JSONDecodeError as exc:
            return _json(openai_error(f"the request body is not JSON: {exc}"), 400)
        except ChatRequestError as exc:
            return _json(openai_error(str(exc), param=exc.param, code=exc.code), 400)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if call.stream:
            return StreamingResponse(
                _chunks(engine, call, prompt, completion_id, created),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        try:
            completion = await engine.complete(prompt, call.sampling)
        except Exception:
            logger.exception("the embedded model failed")
            return _json(_SERVER_ERROR, 500)
        return _json(
            completion_body(
                completion, completion_id=completion_id, created=created, model=engine.model_id
            )
        )

    async def models(request: Request) -> Response:
        return _json(models_body(engine.model_id, started))

    async def health(request: Request) -> Response:
        return _json({"status": "ok", "model": engine.model_id})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


async def _chunks(
    engine: LocalEngine, call: ChatCall, prompt: Prompt, completion_id: str, created: int
) -> AsyncIterator[bytes]:
    top: dict[str, Any] = {
        "completion_id": completion_id,
        "created": created,
        "model": engine.model_id,
        "include_usage": call.include_usage,
    }
    yield _event(chunk_body(**top, delta={"role": "assistant", "content": "", "refusal": None}))
    try:
        async for item in engine.stream(prompt, call.sampling):
            if isinstance(item, Completion):
                yield _event(chunk_body(**top, finish_reason=item.finish_reason))
                if call.include_usage:
                    yield _event(chunk_body(**top, usage=item))
            else:
                yield _event(chunk_body(**top, delta={"content": item}))
    except Exception:
        # Headers are gone already: the error travels as an event, as OpenAI sends one.
        logger.exception("the embedded model failed mid-stream")
        yield _event(_SERVER_ERROR)
    yield b"data: [DONE]\n\n"
