"""The capture worker: a Starlette app in front of a vLLM-compatible chat endpoint.

One captured call's way through it:

1. ``POST /v1/chat/completions`` with ``ng_capture``: the admission is read (a bad one, or
   ``"stream": true``, is refused with 400 and nothing goes upstream) and begun.
2. Upstream gets the request asking for token ids and logprobs (``_protocol.upstream_request``).
3. No usable answer (unreachable, timeout, an error status, a body that is not a JSON object):
   the call is failed, so the capture holds nothing in flight for it, and the client gets the
   upstream's status and body, or 502/504 with an error body (``_proxy.forward``'s map).
4. An answer: the call is completed in a thread (staging fsyncs; the event loop never waits on
   a disk) and the client gets the answer plus ``ng_commit_coords``, ``staged`` or
   ``capture_failed`` alike, except a pinned prefix the prompt does not start with: 409.

Every begun call ends in exactly one of ``complete_call_from_response`` and ``fail_call``,
whatever happens to the request (``_Worker._captured``).

Without ``ng_capture`` a request is passed through untouched (streams included), as are
``GET /v1/models`` calls, by the model server's forwarder (``_proxy.forward.pass_through``):
nothing is staged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._json import load_json_object
from rollcap._proxy.forward import UpstreamFailure, pass_through, read_whole
from rollcap._proxy.headers import for_client
from rollcap._proxy.relay import BreakOffMiddleware
from rollcap.dialects import openai_error
from rollcap.staging import (
    CAPTURE_FIELD,
    Admission,
    CommitCoords,
    DirectoryStagingSink,
    PendingCall,
    RolloutTokenCapture,
    VLLMCaptureAdapter,
)
from rollcap.worker._protocol import (
    Refusal,
    fails_closed,
    prefix_mismatch_body,
    read_admission,
    upstream_request,
    with_coords,
)
from rollcap.worker._settings import WorkerSettings, prepare_staging_dir
from rollcap.worker._upstream import Upstream

__all__ = ["create_worker_app"]

log = logging.getLogger("rollcap.worker")

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
_CAPTURE_MARK = CAPTURE_FIELD.encode()


def _json(body: bytes, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def _error(status: int, kind: str, message: str) -> Response:
    return _json(orjson.dumps(openai_error(message, kind=kind)), status)


@dataclass(frozen=True, slots=True)
class _Answered:
    status: int
    raw: bytes
    answer: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class _NoAnswer:
    """What the client gets when there is nothing to stage, and why, for the failed call."""

    response: Response
    reason: str


class _Worker:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.adapter = VLLMCaptureAdapter()
        self.capture = RolloutTokenCapture(
            DirectoryStagingSink(settings.staging_dir),
            self.adapter,
            settings.weight_version,
            max_rollouts=settings.max_rollouts,
        )
        self.upstream = Upstream(settings)
        self.staged = 0
        self.capture_failed = 0

    # -- routes --------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        # Cheap test first: most pass-through bodies are never parsed here.
        body: object = None
        if _CAPTURE_MARK in raw:
            with contextlib.suppress(orjson.JSONDecodeError):
                body = orjson.loads(raw)
        if not isinstance(body, dict) or CAPTURE_FIELD not in body:
            return await self.pass_through(request, raw)
        try:
            admission = read_admission(body)
        except Refusal as refusal:
            return _json(refusal.body(), 400)
        return await self._captured(request, body, admission)

    async def pass_through(self, request: Request, raw: bytes | None = None) -> Response:
        if raw is None:
            raw = await request.body()
        headers = self.upstream.headers(request.headers.items())
        try:
            upstream = await self.upstream.open(request.method, request.url.path, raw, headers)
        except UpstreamFailure as failure:
            return _error(failure.status, failure.kind, str(failure))
        return await pass_through(upstream, None)

    async def health(self, request: Request) -> Response:
        return _json(
            orjson.dumps(
                {
                    "status": "ok",
                    "upstream": self.settings.upstream_url,
                    "staging_dir": str(self.settings.staging_dir),
                    "weight_version": self.capture.weight_version,
                    "staged": self.staged,
                    "capture_failed": self.capture_failed,
                }
            ),
            200,
        )

    # -- one captured call ---------------------------------------------------------------------

    async def _captured(
        self, request: Request, body: dict[str, Any], admission: Admission
    ) -> Response:
        outgoing = orjson.dumps(upstream_request(self.adapter, body, admission))
        headers = self.upstream.headers(request.headers.items(), json_body=True)
        # In a thread: a parent the capture does not remember is looked up in the staging
        # directory. Shielded: a begun call must reach the try below, which ends it once.
        with anyio.CancelScope(shield=True):
            call = await anyio.to_thread.run_sync(self.capture.begin_call, admission)
        try:
            outcome = await self._ask(outgoing, headers)
        except BaseException:
            # Cancelled (the server is stopping) or a bug: the call still ends, once.
            self._fail(call, "the call was cancelled before the upstream answered")
            raise
        if isinstance(outcome, _NoAnswer):
            self._fail(call, outcome.reason)
            return outcome.response
        # Never abandoned on cancellation: the capture ends the call itself once it has it.
        coords = await anyio.to_thread.run_sync(
            self.capture.complete_call_from_response, call, outcome.answer
        )
        self._count(coords)
        if fails_closed(coords):
            return _json(prefix_mismatch_body(coords), 409)
        return _json(
            with_coords(outcome.raw, outcome.answer, coords), outcome.status, outcome.headers
        )

    async def _ask(self, body: bytes, headers: list[tuple[str, str]]) -> _Answered | _NoAnswer:
        try:
            upstream = await self.upstream.open("POST", CHAT_PATH, body, headers)
            raw = await read_whole(upstream)
        except UpstreamFailure as failure:
            return _NoAnswer(_error(failure.status, failure.kind, str(failure)), str(failure))
        if not 200 <= upstream.status < 300:
            # Upstream's own error, exactly as it sent it: status, body and headers.
            passed = Response(
                raw, status_code=upstream.status, headers=for_client(upstream.headers)
            )
            return _NoAnswer(passed, f"upstream answered HTTP {upstream.status}")
        answer = load_json_object(raw)
        if answer is None:
            return _NoAnswer(
                _error(502, "api_error", "upstream answered with invalid JSON"),
                "upstream answered with invalid JSON",
            )
        return _Answered(upstream.status, raw, answer, for_client(upstream.headers, rewritten=True))

    def _fail(self, call: PendingCall, reason: str) -> None:
        coords = self.capture.fail_call(call, reason)
        log.warning("capture worker: %s not staged: %s", coords.staging_key, reason)
        self._count(coords)

    def _count(self, coords: CommitCoords) -> None:
        if coords.staged:
            self.staged += 1
        else:
            self.capture_failed += 1


def create_worker_app(settings: WorkerSettings) -> Starlette:
    """The ASGI app of one capture worker.

    Creates the staging directory now; ``ValueError`` when calls could not be staged there.
    """
    prepare_staging_dir(settings.staging_dir)
    worker = _Worker(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await worker.upstream.start()
        try:
            yield
        finally:
            await worker.upstream.stop()

    routes = [
        Route(CHAT_PATH, worker.chat, methods=["POST"]),
        Route(MODELS_PATH, worker.pass_through, methods=["GET"]),
        Route("/health", worker.health, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(BreakOffMiddleware, log=log)],
    )
    app.state.worker = worker
    return app
