"""Agent servers: run one task against the policy model and have the answer graded.

``create_agent_app(agent)`` serves a ``ResponsesAgent``:

- ``POST /run``: one task line plus ``_ng_task_index``, ``_ng_rollout_index``,
  ``_ng_attempt_index`` (and optionally ``_ng_rollout_id``). Answers what ``agent.run`` returns;
  for ``SimpleResponsesAgent`` (``_simple_agent``): ``{"response": <Responses object>, "reward":
  float, ...the other fields verify returned[, "ng_trajectory"]}``.
- ``POST /v1/responses``, ``POST /ng-rollout/<rollout_id>/v1/responses``: the agent as a
  Responses endpoint (a self-call). The prefix is stripped before routing, the id kept in the
  scope under ``SCOPE_ROLLOUT_ID_KEY``, and the model call goes out under the same prefix, so a
  harness that calls its agent through the prefix gets its model calls captured. Nothing else is
  routed under the prefix (404).
- ``GET /health``.

Errors are JSON in the OpenAI shape, ``{"error": {"message", "type", "param", "code", ...}}``: a
malformed body is 400; a model or resources server that cannot be reached or answers an error is
502 (504 when it is too slow), with ``server`` (``"model"`` or ``"resources"``) and, when it
answered, its ``status``.

Every outgoing call of one app goes through one ``aiohttp.ClientSession``, opened in the app's
lifespan and closed at shutdown.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rollcap._json import load_json_object
from rollcap._proxy.asgi import send_json
from rollcap._proxy.forward import UpstreamFailure, read_whole, relay, upstream_failures
from rollcap._proxy.relay import BreakOffMiddleware, StreamResponse
from rollcap.affinity import choose_replica
from rollcap.dialects import error_message, openai_error
from rollcap.gym._http import (
    InvalidRequest,
    error_response,
    json_response,
    read_json_object,
)
from rollcap.gym._resources import VerifyResultError, check_verify_result
from rollcap.routing import split_prefix, strip_prefix, url_path_for_request
from rollcap.sse import is_event_stream

__all__ = [
    "RESPONSES_PATH",
    "AgentSettings",
    "DownstreamError",
    "ResponsesAgent",
    "create_agent_app",
]

log = logging.getLogger("rollcap.gym")

RESPONSES_PATH = "/v1/responses"
MODEL_CALL_ID_HEADER = "x-rollcap-model-call-id"
# Model-server response headers worth handing on to a self-call's client.
_RELAYED_HEADERS = ("content-type", MODEL_CALL_ID_HEADER, "x-request-id")
_ERROR_DETAIL_CHARS = 500


def _normalized_base_url(field: str, url: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{field} {url!r} must start with http:// or https://")
    return url.rstrip("/")


def _model_root(url: str) -> str:
    model = _normalized_base_url("model_base_url", url)
    return model[: -len("/v1")] if model.endswith("/v1") else model


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """One agent server's configuration.

    ``model_base_url`` is the policy model server's root (``http://host:port``; a trailing
    ``/v1`` is accepted and dropped, since the agent adds ``/v1/responses`` after the rollout
    prefix), or the roots of its replicas: each rollout's calls then go to one of them
    (``rollcap.affinity.choose_replica`` of the rollout id), calls without a rollout to the
    first. ``model_name`` fills in a request's ``model`` when it has none. Timeouts are in
    seconds: ``model_read_timeout_s`` is the longest silence allowed between two bytes of a model
    answer (a long generation is fine while it streams), ``verify_timeout_s`` the whole verify
    call. ``token_id_capture`` sends the agent's model calls as RL training calls
    (``/ng-rollout/<id>/training-token-capture/...``), whose token ids are staged.
    """

    model_base_url: str | tuple[str, ...]
    resources_base_url: str
    model_name: str | None = None
    name: str = "agent"
    connect_timeout_s: float = 30.0
    model_read_timeout_s: float = 600.0
    verify_timeout_s: float = 300.0
    model_server_name: str | None = None
    max_steps: int = 10
    token_id_capture: bool = False

    def __post_init__(self) -> None:
        given = self.model_base_url
        urls = tuple(_model_root(url) for url in ((given,) if isinstance(given, str) else given))
        if not urls:
            raise ValueError("model_base_url must name at least one model server")
        object.__setattr__(self, "model_base_url", urls[0] if len(urls) == 1 else urls)
        resources = _normalized_base_url("resources_base_url", self.resources_base_url)
        object.__setattr__(self, "resources_base_url", resources)
        for field in ("connect_timeout_s", "model_read_timeout_s", "verify_timeout_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{field} must be a number > 0, got {value!r}")
        steps = self.max_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {steps!r}")


class DownstreamError(Exception):
    """A model or resources server failed a call; the agent answers ``status`` (502 or 504)."""

    def __init__(
        self, message: str, *, server: str, status: int = 502, server_status: int | None = None
    ) -> None:
        super().__init__(message)
        self.server = server
        self.status = status
        self.server_status = server_status

    def response(self) -> Response:
        extra: dict[str, Any] = {"server": self.server}
        if self.server_status is not None:
            extra["status"] = self.server_status
        kind = "timeout" if self.status == 504 else "upstream_error"
        return error_response(self.status, str(self), kind, **extra)


def _error_detail(raw: bytes) -> str:
    """The message of an error body, for the agent's own error: its ``error.message`` if any."""
    message = error_message(load_json_object(raw) or {})
    if message is not None:
        return message[:_ERROR_DETAIL_CHARS]
    text = raw.decode("utf-8", "replace").strip()
    return text[:_ERROR_DETAIL_CHARS] or "(empty body)"


class ResponsesAgent:
    """Base class of agents: subclasses implement ``run``; ``responses`` forwards by default.

    Helpers for subclasses: ``call_model`` (a Responses call under a given path, the answer as a
    dict) and ``verify`` (the resources server's grading, reward checked). Both raise
    ``DownstreamError``, which the app turns into a 502/504 answer.
    """

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError(f"agent {self.name} is not started (the app's lifespan opens it)")
        return self._session

    async def start(self) -> None:
        if self._session is not None:
            raise RuntimeError(f"agent {self.name} is already started")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout_s),
        )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- what subclasses override

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run one task line; raise ``InvalidRequest`` for a body it cannot run."""
        raise NotImplementedError(f"{type(self).__name__} does not implement run")

    async def responses(self, params: dict[str, Any], request: Request) -> Response:
        """Answer a self-call: forward it to the policy model under the inbound call's prefix.

        The model server's status and body come back unchanged, streamed when it streams.
        """
        url = self.model_url(url_path_for_request(RESPONSES_PATH, request))
        headers = {"content-type": "application/json"}
        session_id = request.headers.get("x-session-id")
        if session_id is not None:
            headers["x-session-id"] = session_id
        upstream = await self._open_model(url, self.with_model(params), headers)
        relayed = {k: upstream.headers[k] for k in _RELAYED_HEADERS if k in upstream.headers}
        if is_event_stream(upstream.headers.get("content-type")):
            return StreamResponse(relay(upstream, None), upstream.status, relayed)
        raw = await self._read_model(upstream, url)
        return Response(raw, status_code=upstream.status, headers=relayed)

    # -- helpers

    def model_url(self, url_path: str) -> str:
        """The model server's URL of ``url_path``: with replicas, the one its rollout (from the
        path's ``/ng-rollout/<id>`` prefix) sticks to."""
        bases = self.settings.model_base_url
        if isinstance(bases, str):
            return bases + url_path
        rollout_id, _ = split_prefix(url_path)
        return (bases[0] if rollout_id is None else choose_replica(rollout_id, bases)) + url_path

    def with_model(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the configured model name when it names none."""
        if params.get("model") is None and self.settings.model_name is not None:
            return {**params, "model": self.settings.model_name}
        return params

    def _model_failure(self, url: str, failure: UpstreamFailure) -> DownstreamError:
        if failure.timed_out:
            seconds = self.settings.model_read_timeout_s
            message = f"model server at {url} sent nothing for {seconds:g} s"
        else:
            message = f"model server {failure.what} at {url}: {failure.detail}"
        return DownstreamError(message, server="model", status=failure.status)

    async def _open_model(
        self, url: str, params: dict[str, Any], headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.settings.connect_timeout_s,
            sock_read=self.settings.model_read_timeout_s,
        )
        try:
            with upstream_failures():
                return await self.session.post(
                    url, data=orjson.dumps(params), headers=headers, timeout=timeout
                )
        except UpstreamFailure as failure:
            raise self._model_failure(url, failure) from None

    async def call_model(self, url_path: str, params: dict[str, Any]) -> dict[str, Any]:
        """POST a Responses request to the model server at ``url_path``; the answer object."""
        answer, _ = await self.call_model_traced(url_path, params)
        return answer

    async def call_model_traced(
        self, url_path: str, params: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """As ``call_model``, with the id the model server captured the call under
        (``x-rollcap-model-call-id``), or ``None`` when it did not capture it."""
        url = self.model_url(url_path)
        headers = {"content-type": "application/json"}
        upstream = await self._open_model(url, params, headers)
        call_id = upstream.headers.get(MODEL_CALL_ID_HEADER)
        raw = await self._read_model(upstream, url)
        return _json_answer("model", url, upstream.status, raw), call_id

    async def _read_model(self, upstream: aiohttp.ClientResponse, url: str) -> bytes:
        """The model server's whole answer; its failures as the agent reports them."""
        try:
            return await read_whole(upstream)
        except UpstreamFailure as failure:
            raise self._model_failure(url, failure) from None

    async def _resources(self, method: str, path: str, payload: object = None) -> tuple[int, bytes]:
        """One call to the resources server: its status and whole body; its failures as the
        agent reports them."""
        url = self.settings.resources_base_url + path
        timeout = aiohttp.ClientTimeout(
            total=self.settings.verify_timeout_s, sock_connect=self.settings.connect_timeout_s
        )
        data = None if payload is None else orjson.dumps(payload)
        headers = {"content-type": "application/json"}
        try:
            with upstream_failures():
                answer = await self.session.request(
                    method, url, data=data, headers=headers, timeout=timeout
                )
            return answer.status, await read_whole(answer)
        except UpstreamFailure as failure:
            if failure.timed_out:
                seconds = self.settings.verify_timeout_s
                message = f"resources server at {url} did not answer in {seconds:g} s"
            else:
                message = f"resources server {failure.what} at {url}: {failure.detail}"
            raise DownstreamError(message, server="resources", status=failure.status) from None

    async def list_tools(self) -> list[dict[str, Any]]:
        """The resources server's function tools (``GET /tools``); none when it has no such
        route (404)."""
        status, raw = await self._resources("GET", "/tools")
        if status == 404:
            return []
        url = self.settings.resources_base_url + "/tools"
        tools = _json_answer("resources", url, status, raw).get("tools")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise DownstreamError(
                f"resources server at {url}: tools must be a list of objects",
                server="resources",
                server_status=status,
            )
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[int, str]:
        """Run a tool on the resources server (``POST /tools/<name>``): its HTTP status and its
        answer as text, which is the tool's output as the model sees it (an error too)."""
        status, raw = await self._resources("POST", f"/tools/{quote(name, safe='')}", arguments)
        return status, raw.decode("utf-8", "replace")

    async def verify(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` to the resources server's ``/verify``; its result, reward a float."""
        url = self.settings.resources_base_url + "/verify"
        status, raw = await self._resources("POST", "/verify", payload)
        result = _json_answer("resources", url, status, raw)
        try:
            return check_verify_result(result)
        except VerifyResultError as exc:
            raise DownstreamError(
                f"resources server at {url}: {exc}", server="resources", server_status=status
            ) from None


def _json_answer(server: str, url: str, status: int, raw: bytes) -> dict[str, Any]:
    if not 200 <= status < 300:
        raise DownstreamError(
            f"{server} server answered {status} from {url}: {_error_detail(raw)}",
            server=server,
            server_status=status,
        )
    answer = load_json_object(raw)
    if answer is None:
        raise DownstreamError(
            f"{server} server answered {status} from {url} with a body that is not a JSON object",
            server=server,
            server_status=status,
        )
    return answer


class _SelfCallPrefix:
    """Strip ``/ng-rollout/<id>`` from a self-call into a child scope that keeps the id.

    Pure ASGI: it only rewrites the scope, so responses (streams included) pass untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            rollout_id, child = strip_prefix(scope)
        except ValueError as exc:
            await send_json(send, 400, orjson.dumps(openai_error(str(exc))))
            return
        if rollout_id is not None and child["path"] != RESPONSES_PATH:
            message = f"only {RESPONSES_PATH} is served under the rollout prefix"
            await send_json(send, 404, orjson.dumps(openai_error(message, kind="not_found_error")))
            return
        await self.app(child, receive, send)


def create_agent_app(agent: ResponsesAgent) -> Starlette:
    """The ASGI app of one agent server; its lifespan opens and closes the agent's session."""

    async def answer(what: str, work: Callable[[], Awaitable[Response]]) -> Response:
        # One error policy for both routes: the caller's mistake is a 400, a server behind the
        # agent failing is its own status, anything else a 500 with the cause, never a trace.
        try:
            return await work()
        except InvalidRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        except DownstreamError as exc:
            log.warning("agent %s: %s failed: %s", agent.name, what, exc)
            return exc.response()
        except Exception as exc:
            log.exception("agent %s: %s failed", agent.name, what)
            return error_response(
                500, f"agent {agent.name} failed: {type(exc).__name__}: {exc}", "server_error"
            )

    async def run(request: Request) -> Response:
        async def work() -> Response:
            return json_response(await agent.run(await read_json_object(request)))

        return await answer("run", work)

    async def responses(request: Request) -> Response:
        async def work() -> Response:
            return await agent.responses(await read_json_object(request), request)

        return await answer("self-call", work)

    async def health(request: Request) -> Response:
        return json_response({"status": "ok", "name": agent.name})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await agent.start()
        try:
            yield
        finally:
            await agent.stop()

    app = Starlette(
        routes=[
            Route("/run", run, methods=["POST"]),
            Route(RESPONSES_PATH, responses, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
        # A model stream that breaks off mid-way breaks the self-call's client stream the same way.
        middleware=[Middleware(BreakOffMiddleware, log=log), Middleware(_SelfCallPrefix)],
    )
    app.state.agent = agent
    return app
