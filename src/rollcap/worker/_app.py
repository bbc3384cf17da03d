"""The capture worker: a Starlette app in front of a vLLM-compatible chat endpoint.

It is the worker of STAGING (NeMo Gym 0.7.0's external staging), with ``DirectoryStagingSink``
as its sink and source; it keeps nothing per rollout or per call. One admitted call's way
through it:

1. ``POST /v1/chat/completions`` with ``ng_capture``: the admission is read (a bad one,
   ``"stream": true``, or a body pin other than the admission's inline prefix is refused with
   400 and nothing goes upstream).
2. A continuation's prefix is the concatenated ``token_ids_delta`` of its ``staging_chain``,
   fetched from the staging directory (in a thread) and checked to be the chain the
   admission's ``parent_chain_hash`` commits to, or the admission's inline prefix; the engine
   gets it as ``required_prefix_token_ids`` (``VLLMCaptureAdapter.enter_prefix``), so it
   continues from the exact ids, never a re-tokenization. A prefix that cannot be resolved
   (a missing or broken chain) still gets its answer, with ``capture_failed`` coordinates.
3. No usable answer (unreachable, timeout, an error status, a body that is not a JSON object):
   the call is failed and the gate gets the upstream's status and body, or 502/504.
4. An answer: the call is completed in a thread (staging fsyncs; the event loop never waits on
   a disk) and the gate gets the answer plus ``ng_commit_coords``, ``staged`` or
   ``capture_failed`` alike (an engine that did not honour the pinned prefix is one).

Every begun call ends in exactly one of ``complete_call_from_response`` and ``fail_call``,
whatever happens to the request (``_Worker._captured``); ``/health`` counts them (``staged``,
``capture_failed``, ``in_flight``). Without ``ng_capture`` a request is passed through
untouched (streams included), as are ``GET /v1/models`` calls: nothing is staged.
"""

from __future__ import annotations

import contextlib
import logging
import threading
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
    ActiveCall,
    CaptureAdmission,
    CaptureError,
    CommitCoords,
    DirectoryStagingSink,
    RolloutTokenCapture,
    VLLMCaptureAdapter,
    hash_token_ids,
)
from rollcap.worker._prefixes import PrefixCache
from rollcap.worker._protocol import (
    Refusal,
    chain_prefix,
    engine_request,
    failed_coords,
    read_admission,
    with_coords,
)
from rollcap.worker._settings import WorkerSettings, prepare_staging_dir
from rollcap.worker._upstream import Upstream

__all__ = ["create_worker_app"]

log = logging.getLogger("rollcap.worker")

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
_CAPTURE_MARK = CAPTURE_FIELD.encode()
_ESCAPE_MARK = b"\\u"


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
        self.sink = DirectoryStagingSink(settings.staging_dir)
        self.adapter = VLLMCaptureAdapter()
        self.capture = RolloutTokenCapture(
            sink=self.sink,
            weight_version_fn=lambda: settings.weight_version,
            adapter=self.adapter,
        )
        self.prefixes = PrefixCache(settings.prefix_cache_ids)
        self.upstream = Upstream(settings)
        # Completions end in worker threads: the counters change under a lock.
        self._lock = threading.Lock()
        self.staged = 0
        self.capture_failed = 0
        self.in_flight = 0

    # -- routes --------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        # Cheap test first: most pass-through bodies are never parsed here. A body with JSON
        # escapes is parsed too: the key may be spelled with one.
        body: object = None
        if _CAPTURE_MARK in raw or _ESCAPE_MARK in raw:
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
            upstream = await self.upstream.open(
                request.method, request.url.path, raw, headers, query=request.url.query
            )
        except UpstreamFailure as failure:
            return _error(failure.status, failure.kind, str(failure))
        return await pass_through(upstream, None)

    async def health(self, request: Request) -> Response:
        with self._lock:
            counts = {
                "staged": self.staged,
                "capture_failed": self.capture_failed,
                "in_flight": self.in_flight,
            }
        return _json(
            orjson.dumps(
                {
                    "status": "ok",
                    "upstream": self.settings.upstream_url,
                    "staging_dir": str(self.settings.staging_dir),
                    "weight_version": self.settings.weight_version,
                    **counts,
                }
            ),
            200,
        )

    # -- one captured call ---------------------------------------------------------------------

    async def _captured(
        self, request: Request, body: dict[str, Any], admission: CaptureAdmission
    ) -> Response:
        headers = self.upstream.headers(request.headers.items(), json_body=True)
        try:
            prefix = await self._prefix(admission)
            call = self.capture.begin_call(admission, prefix_token_ids=prefix)
        except Exception as exc:
            # Nothing can be staged; the engine still answers, and the gate learns so.
            log.warning(
                "capture worker: %s/%s not staged: %s",
                admission.rollout_id,
                admission.model_call_id,
                exc,
            )
            return await self._unstaged(body, headers, admission)
        with self._lock:
            self.in_flight += 1
        pinned = call.prefix_token_ids if admission.mode == "token_in" else None
        try:
            outcome = await self._ask(
                orjson.dumps(engine_request(body, pinned, self.adapter)), headers
            )
            if isinstance(outcome, _NoAnswer):
                self._fail(call, outcome.reason)
                return outcome.response
            # In a thread: staging fsyncs, and the event loop never waits on a disk. Not
            # abandoned on cancellation: once the thread has the call, it ends it.
            coords = await anyio.to_thread.run_sync(self._complete, call, outcome.answer)
        except BaseException:
            # Cancelled (the client left, the server is stopping) or a bug: the call still
            # ends, once (a no-op when the thread ended it already).
            self._fail(call, "the request ended before the call was staged")
            raise
        return _json(
            with_coords(outcome.raw, outcome.answer, coords), outcome.status, outcome.headers
        )

    async def _prefix(self, admission: CaptureAdmission) -> list[int] | None:
        """A continuation's exact prefix: its chain's deltas (fetched from the staging
        directory in a thread, checked against the admission), or the inline ids."""
        if admission.mode == "text":
            return None
        if not admission.staging_chain:
            return list(admission.required_prefix_token_ids)
        cached = self.prefixes.prefix(admission)
        if cached is not None:
            return cached
        snapshots = await anyio.to_thread.run_sync(self.sink.fetch, list(admission.staging_chain))
        return chain_prefix(admission, snapshots)

    async def _unstaged(
        self, body: dict[str, Any], headers: list[tuple[str, str]], admission: CaptureAdmission
    ) -> Response:
        """The engine's answer to a call that could not be begun, with failed coordinates
        (or the engine's failure, as for a begun call)."""
        with self._lock:
            self.capture_failed += 1
        outcome = await self._ask(orjson.dumps(engine_request(body, None, self.adapter)), headers)
        if isinstance(outcome, _NoAnswer):
            return outcome.response
        coords = failed_coords(admission, self.settings.weight_version)
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

    def _complete(self, call: ActiveCall, answer: dict[str, Any]) -> CommitCoords:
        """Stage the call from the engine's answer (blocking: run in a thread)."""
        coords = self.capture.complete_call_from_response(call, answer)
        self._ended(coords)
        if coords.staged:
            self._remember(coords, answer)
        return coords

    def _remember(self, coords: CommitCoords, answer: dict[str, Any]) -> None:
        """Keep the staged call's full ids for its continuation, when they are the ones its
        coordinates commit to (the cumulative hash, over the engine's prompt then generation)."""
        assert coords.staging_key is not None
        assert coords.chain_hash is not None
        try:
            ids = (
                self.adapter.extract_prompt_ids(answer) + self.adapter.extract_generation(answer)[0]
            )
        except (TypeError, ValueError):
            return
        if len(ids) == coords.cum_len and hash_token_ids(ids) == coords.cumulative_hash:
            self.prefixes.remember(
                coords.rollout_id,
                coords.model_call_id,
                coords.staging_key,
                coords.chain_hash,
                ids,
            )

    def _fail(self, call: ActiveCall, reason: str) -> None:
        """End the call as ``capture_failed``, unless something ended it already."""
        try:
            coords = self.capture.fail_call(call, reason=reason)
        except CaptureError:
            return  # completed (staged or not) before: a call ends once
        log.warning(
            "capture worker: %s/%s not staged: %s", coords.rollout_id, coords.model_call_id, reason
        )
        self._ended(coords)

    def _ended(self, coords: CommitCoords) -> None:
        with self._lock:
            self.in_flight -= 1
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
