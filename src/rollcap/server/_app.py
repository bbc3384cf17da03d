"""The model server: Starlette routes forwarding to the upstream over one aiohttp session."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from rollcap._json import load_json_object
from rollcap._proxy.forward import (
    Observer,
    UpstreamFailure,
    forwarding_session,
    open_upstream,
    pass_through,
    relay,
)
from rollcap._proxy.relay import StreamResponse
from rollcap.config import (
    CLIENT_SESSION_HEADERS,
    MAX_REQUEST_BYTES,
    WEBSOCKET_MAX_SOCKETS,
    WEBSOCKET_MAX_STORED_RESPONSES,
    LiveStatusSettings,
    RunSettings,
    TokenCaptureSettings,
)
from rollcap.records import CAPTURE_MAX_RESPONSE_BYTES, ErrorCategory
from rollcap.routing import SCOPE_ROLLOUT_ID_KEY
from rollcap.server._answers import (
    error_body,
    failure_answer,
    json_response,
    read_whole,
    upstream_error,
)
from rollcap.server._fresh import new_model_call_id
from rollcap.server._inflight import DEFAULT_LIMIT, OpenCall
from rollcap.server._metrics import CONTENT_TYPE, ServerMetrics
from rollcap.server._middleware import (
    BODY_KEY,
    DIALECT_ROUTES,
    INFLIGHT_KEY,
    RECORDER_KEY,
    CaptureMiddleware,
    CaptureState,
    request_body,
)
from rollcap.server._recorder import CallRecorder, LocalReason
from rollcap.server._socket import RESPONSES_PATH, ResponsesSockets
from rollcap.server._translating import CHAT_PATH, TO_CHAT, StreamTranslator, Translation
from rollcap.server._upstream import LOCAL_MODEL, Backend, backend_for
from rollcap.sse import SSEDecoder, encode_event, is_event_stream
from rollcap.store import CaptureStore, check_sync

if TYPE_CHECKING:
    from rollcap.server._staged import StagedCalls

__all__ = ["ModelServerSettings", "create_model_app"]


@dataclass(frozen=True, slots=True)
class ModelServerSettings:
    """One model server. ``capture_dir`` None means capture off (the prefix is still stripped).

    ``max_request_bytes``: a longer request body is answered 413; ``capture_max_response_bytes``:
    the most of one response a capture record keeps (``CallRecorder``).
    """

    model_type: str
    base_url: str | tuple[str, ...] | None  # several: each rollout sticks to one
    api_key: str | None = None
    name: str = "policy_model"
    capture_dir: Path | None = None
    pass_client_credentials: bool = False
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 600.0  # longest silence between two upstream bytes
    backend_options: dict[str, str] = field(default_factory=dict)
    # RL token staging through a capture worker (upstream = the worker); see ``_staged``.
    token_capture: TokenCaptureSettings = field(default_factory=TokenCaptureSettings)
    max_request_bytes: int = MAX_REQUEST_BYTES
    capture_max_response_bytes: int = CAPTURE_MAX_RESPONSE_BYTES
    # Read as the record's client_session_id, in this order (lower-case names).
    client_session_headers: tuple[str, ...] = CLIENT_SESSION_HEADERS
    # The thresholds of the states /inflight gives (stalled, cancelled's linger).
    live_status: LiveStatusSettings = field(default_factory=LiveStatusSettings)
    # Responses WebSockets open at once, and the responses a translated one keeps.
    websocket_max_sockets: int = WEBSOCKET_MAX_SOCKETS
    websocket_max_stored_responses: int = WEBSOCKET_MAX_STORED_RESPONSES
    # How a batch of records is made durable (``CaptureStore``'s ``sync``).
    capture_sync: str = "auto"

    def __post_init__(self) -> None:
        for key in (
            "max_request_bytes",
            "capture_max_response_bytes",
            "websocket_max_sockets",
            "websocket_max_stored_responses",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive whole number, got {value!r}")
        staging = self.token_capture
        if staging.external_staging:
            if self.model_type != "vllm_model":
                raise ValueError(
                    "token_id_capture.external_staging needs model type vllm_model (a capture "
                    f"worker in front of a vLLM-compatible chat endpoint), got {self.model_type!r}"
                )
            if staging.dir is None or not Path(staging.dir).is_absolute():
                raise ValueError(
                    "token_id_capture.external_staging needs an absolute ledger directory "
                    "(token_id_capture.dir or model_call_capture_dir)"
                )
        check_sync(self.capture_sync, "capture_sync")
        if self.capture_dir is not None and not Path(self.capture_dir).is_absolute():
            raise ValueError(
                f"model_call_capture_dir must be an absolute path, got {str(self.capture_dir)!r}"
            )

    @classmethod
    def from_run(
        cls,
        run: RunSettings,
        model_type: str,
        *,
        name: str = "policy_model",
        base_url: str | tuple[str, ...] | None = None,
        api_key: str | None = None,
    ) -> ModelServerSettings:
        """A model server's settings from a run's: its upstream, credentials, capture and
        staging directories and body limits. ``base_url`` and ``api_key``, when given,
        replace the run's (one model server's own ``policy_base_url`` and key)."""
        return cls(
            model_type=model_type,
            base_url=run.policy_base_url if base_url is None else base_url,
            api_key=run.policy_api_key if api_key is None else api_key,
            name=name,
            capture_dir=run.capture_dir,
            pass_client_credentials=run.pass_client_credentials,
            token_capture=run.token_capture,
            max_request_bytes=run.max_request_bytes,
            capture_max_response_bytes=run.capture_max_response_bytes,
            client_session_headers=run.client_session_headers,
            live_status=run.live_status,
            websocket_max_sockets=run.websocket_max_sockets,
            websocket_max_stored_responses=run.websocket_max_stored_responses,
            capture_sync=run.capture_sync,
        )


class _Forwarder:
    def __init__(self, backend: Backend, settings: ModelServerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.session: aiohttp.ClientSession | None = None
        self.staged: StagedCalls | None = None
        staging = settings.token_capture
        if staging.external_staging:
            # Imported only here: a server without RL staging does not load it.
            from rollcap.server._staged import StagedCalls
            from rollcap.staging import FileLineageStore

            assert staging.dir is not None  # checked by the settings
            self.staged = StagedCalls(
                FileLineageStore(staging.dir), backend=staging.external_staging_backend
            )

    async def start(self) -> None:
        self.session = forwarding_session(
            connect_timeout_s=self.settings.connect_timeout_s,
            read_timeout_s=self.settings.read_timeout_s,
        )

    def upstream_session(self) -> aiohttp.ClientSession:
        assert self.session is not None, "the server's lifespan did not start"
        return self.session

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def forward(self, request: Request) -> Response:
        path = request.scope["path"]  # request.url builds a whole URL object per call
        dialect = DIALECT_ROUTES.get(path)
        recorder: CallRecorder | None = request.scope.get(RECORDER_KEY)
        inflight: OpenCall | None = request.scope.get(INFLIGHT_KEY)
        observer = _observer(recorder, inflight)
        if self.staged is not None and dialect is not None:
            if self.staged.applies(request, dialect):
                return await self.staged.forward(request, dialect, recorder, self._open)
            # Not a training call: the worker must not see an admission a client wrote itself.
            request.scope[BODY_KEY] = self.staged.scrub(await request_body(request))
        if self.backend.translate_to_chat and dialect in TO_CHAT:
            assert dialect is not None
            return await self._translated(request, dialect, recorder, observer, inflight)
        # Passed through as the client addressed it, query included; a translated call goes to
        # another route, where the client's query means nothing.
        query = request.scope.get("query_string", b"").decode("latin-1")
        opened = await self._open(
            request, path, await request_body(request), dialect, recorder, query
        )
        if isinstance(opened, Response):
            return opened
        return await pass_through(opened, observer)

    async def _open(
        self,
        request: Request,
        path: str,
        body: bytes | bytearray,
        dialect: str | None,
        recorder: CallRecorder | None,
        client_query: str = "",
    ) -> aiohttp.ClientResponse | Response:
        """The upstream's response, or the server's own error answer when there is none."""
        assert self.session is not None, "the server's lifespan did not start"
        headers = self.backend.headers(request.headers.items())
        url = self.backend.url_for(path, request.scope.get(SCOPE_ROLLOUT_ID_KEY), client_query)
        if recorder is not None:
            recorder.upstream_attempt()
        try:
            upstream = await open_upstream(self.session, request.method, url, body, headers)
        except UpstreamFailure as failure:
            return failure_answer(failure, dialect, recorder)
        if recorder is not None:
            recorder.upstream_status(upstream.status)
        return upstream

    async def _translated(
        self,
        request: Request,
        dialect: str,
        recorder: CallRecorder | None,
        observer: Observer | None,
        inflight: OpenCall | None,
    ) -> Response:
        """A Responses or Messages call answered by a chat-only upstream."""
        try:
            client_request = orjson.loads(await request_body(request))
            if not isinstance(client_request, dict):
                raise ValueError("the request body must be a JSON object")
            translation = Translation(
                dialect, client_request, answer_id=new_model_call_id(), created=time.time()
            )
        except (orjson.JSONDecodeError, ValueError) as exc:
            if recorder is not None:
                recorder.answered_locally(LocalReason.INVALID_REQUEST)
            return json_response(
                error_body(dialect, "invalid_request_error", f"invalid request: {exc}"), 400
            )
        body = orjson.dumps(translation.chat_request)
        opened = await self._open(request, CHAT_PATH, body, dialect, recorder)
        if isinstance(opened, Response):
            return opened
        upstream = opened
        if 200 <= upstream.status < 300 and is_event_stream(upstream.headers.get("content-type")):
            return StreamResponse(
                self._translated_stream(upstream, translation.stream(), observer),
                200,
                {"content-type": "text/event-stream; charset=utf-8"},
            )
        raw = await read_whole(upstream, dialect, recorder)
        if isinstance(raw, Response):
            return raw
        if inflight is not None:
            inflight.upstream_bytes(time.monotonic(), len(raw))
        if not 200 <= upstream.status < 300:
            return upstream_error(dialect, upstream.status, raw, recorder)
        chat = load_json_object(raw)
        if chat is None:
            if recorder is not None:
                recorder.answered_locally(LocalReason.UPSTREAM_ANSWER_INVALID)
            return json_response(
                error_body(dialect, "api_error", "upstream answered with invalid JSON"), 502
            )
        return json_response(orjson.dumps(translation.answer(chat)), upstream.status)

    async def _translated_stream(
        self,
        upstream: aiohttp.ClientResponse,
        translator: StreamTranslator,
        observer: Observer | None,
    ) -> AsyncGenerator[bytes, None]:
        # The upstream's chunks come through the forwarder's relay, so a timeout, a broken
        # stream and the release of the connection are handled in one place.
        decoder = SSEDecoder()
        async with contextlib.aclosing(relay(upstream, observer)) as chunks:
            async for chunk in chunks:
                out = [e for event in decoder.feed(chunk) for e in translator.feed(event)]
                if out:
                    yield b"".join(encode_event(e) for e in out)
        out = [e for event in decoder.flush() for e in translator.feed(event)]
        out += translator.finish()
        if out:
            yield b"".join(encode_event(e) for e in out)


class _Watchers:
    """Two observers of one forwarded answer: the call's recorder and its open call."""

    __slots__ = ("_call", "_recorder")

    def __init__(self, recorder: CallRecorder, call: OpenCall) -> None:
        self._recorder = recorder
        self._call = call

    def upstream_bytes(self, mono: float, size: int) -> None:
        self._recorder.upstream_bytes(mono, size)
        self._call.upstream_bytes(mono, size)

    def upstream_failed(self, category: ErrorCategory) -> None:
        self._recorder.upstream_failed(category)


def _observer(recorder: CallRecorder | None, inflight: OpenCall | None) -> Observer | None:
    """Who hears of the upstream's bytes: the recorder (capture on) and the open call."""
    if recorder is None or inflight is None:
        return recorder if inflight is None else inflight
    return _Watchers(recorder, inflight)


def _control_token(variable: str) -> str:
    """The control route's bearer token, from the environment only (never configuration)."""
    token = os.environ.get(variable, "")
    if not token:
        raise ValueError(
            f"token_id_capture.external_staging needs the control-plane bearer token in the "
            f"environment variable {variable} (token_id_capture.control_auth_token_env); it is "
            "missing or empty"
        )
    return token


MAX_INFLIGHT_LIMIT = 10_000
# The most rollout ids one POST /inflight/rollouts may ask about.
MAX_INFLIGHT_ROLLOUTS = 100_000


def _bad(message: str) -> Response:
    return json_response(orjson.dumps({"error": message}), 400)


def create_model_app(settings: ModelServerSettings) -> Starlette:
    """The ASGI app of one model server (capture middleware included).

    With external staging, ``ValueError`` when the control route's token is not in the
    environment: a ledger nobody can read safely is not started.
    """
    backend = backend_for(
        settings.model_type,
        base_url=settings.base_url,
        api_key=settings.api_key,
        pass_client_credentials=settings.pass_client_credentials,
        extra=settings.backend_options,
    )
    forwarder = _Forwarder(backend, settings)
    store = (
        CaptureStore(settings.capture_dir, sync=settings.capture_sync)
        if settings.capture_dir is not None
        else None
    )
    state = CaptureState(server_name=settings.name, store=store, live=settings.live_status)
    metrics = ServerMetrics(state)
    state.call_ended = metrics.call_ended
    if store is not None:
        store.sync_timed = metrics.sync_timed

    async def inflight(request: Request) -> Response:
        raw = request.query_params.get("limit", str(DEFAULT_LIMIT))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_INFLIGHT_LIMIT:
            return _bad(f"limit: a whole number from 1 to {MAX_INFLIGHT_LIMIT}, not {raw!r}")
        snapshot = state.inflight.snapshot(time.monotonic(), int(raw))
        return Response(
            orjson.dumps({"name": settings.name, **snapshot}),
            media_type="application/json",
            headers={"cache-control": "no-store"},
        )

    async def inflight_rollouts(request: Request) -> Response:
        try:
            ids = orjson.loads(await request_body(request))
        except orjson.JSONDecodeError as exc:
            return _bad(f"the body must be a JSON list of rollout ids: {exc}")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return _bad("the body must be a JSON list of rollout ids")
        if len(ids) > MAX_INFLIGHT_ROLLOUTS:
            return _bad(f"at most {MAX_INFLIGHT_ROLLOUTS} rollout ids at once, not {len(ids)}")
        rollouts = state.inflight.rollouts(ids, time.monotonic())
        return Response(
            orjson.dumps({"name": settings.name, "rollouts": rollouts}),
            media_type="application/json",
            headers={"cache-control": "no-store"},
        )

    async def get_metrics(request: Request) -> Response:
        return Response(metrics.exposition(), headers={"content-type": CONTENT_TYPE})

    async def health(request: Request) -> Response:
        return Response(
            orjson.dumps(
                {
                    "status": "ok",
                    "name": settings.name,
                    "model_type": settings.model_type,
                    "capture_enabled": store is not None,
                    "captured": state.captured,
                    "uncorrelated": state.uncorrelated,
                    "capture_failures": state.capture_failures,
                }
            ),
            media_type="application/json",
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as local:
            if settings.model_type == LOCAL_MODEL:
                from rollcap.local import embedded_chat_server

                url = await local.enter_async_context(embedded_chat_server())
                forwarder.backend = dataclasses.replace(forwarder.backend, base_url=url)
            await forwarder.start()
            try:
                yield
            finally:
                await forwarder.stop()
                if state.writer is not None:
                    await anyio.to_thread.run_sync(state.writer.close)
                if store is not None:
                    store.close()  # the store keeps rollout files open between appends
                if forwarder.staged is not None:
                    await anyio.to_thread.run_sync(forwarder.staged.close)

    routes: list[BaseRoute] = [
        Route(path, forwarder.forward, methods=["POST"]) for path in DIALECT_ROUTES
    ]
    routes += [
        Route("/v1/models", forwarder.forward, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/inflight", inflight, methods=["GET"]),
        Route("/inflight/rollouts", inflight_rollouts, methods=["POST"]),
        Route("/metrics", get_metrics, methods=["GET"]),
        WebSocketRoute(
            RESPONSES_PATH,
            ResponsesSockets(
                lambda: forwarder.backend,
                forwarder.upstream_session,
                max_sockets=settings.websocket_max_sockets,
                max_stored_responses=settings.websocket_max_stored_responses,
            ).serve,
        ),
    ]
    if forwarder.staged is not None:
        from rollcap.staging import MANIFEST_PATH_TEMPLATE

        token = _control_token(settings.token_capture.control_auth_token_env)
        routes.append(
            Route(
                MANIFEST_PATH_TEMPLATE,
                forwarder.staged.manifest_route(token),
                methods=["GET"],
            )
        )
    # Starlette keeps its error handler outermost, so the capture middleware sees an exception
    # raised by a route (and records the call) before the client is answered 500.
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(
                CaptureMiddleware,
                state=state,
                max_request_bytes=settings.max_request_bytes,
                capture_max_response_bytes=settings.capture_max_response_bytes,
                session_headers=settings.client_session_headers,
            )
        ],
    )
    app.state.capture = state
    return app
