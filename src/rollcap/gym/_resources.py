"""Resources servers: the side of an environment that seeds sessions and grades answers.

A resources server is a ``ResourcesServer`` subclass served by ``create_resources_app``:

- ``POST /verify``: the task line plus the agent's ``response``; answers the dict ``verify``
  returned, which holds a finite number ``reward`` (sent as a float) and any other fields.
- ``POST /seed_session``: whatever ``seed_session`` returns (``{}`` by default).
- ``GET /tools``: ``{"tools": [...]}``, the function tools an agent may call here, as the
  Responses API declares them (``{"type": "function", "name", "description", "parameters"}``);
  none by default.
- ``POST /tools/<name>``: run one of them; the body is the call's arguments (a JSON object),
  the answer the JSON value ``call_tool`` returned. An unknown tool is 404.
- ``GET /health``: ``{"status": "ok", "name": ...}``.

Errors are JSON in the OpenAI shape, ``{"error": {"message", "type", "param", "code"}}``, never a
traceback: a body that is not a JSON object, or an ``InvalidRequest`` raised by the server's
method, is 400; any other exception, or a verify result without a numeric reward, is 500 with a
message naming the problem (the traceback goes to the ``rollcap.gym`` log).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._json import json_type_name
from rollcap.gym._http import (
    InvalidRequest,
    error_response,
    json_response,
    read_json_object,
)

__all__ = ["ResourcesServer", "VerifyResultError", "check_verify_result", "create_resources_app"]

log = logging.getLogger("rollcap.gym")


class VerifyResultError(ValueError):
    """A verify result the contract does not allow (no numeric reward, not an object)."""


class ResourcesServer:
    """Base class: override ``verify`` (required) and ``seed_session`` (optional).

    ``start`` and ``stop`` run in the app's lifespan, for servers that hold resources.
    """

    name: str = "resources"  # an instance may set its own (the configured instance name)

    async def verify(self, body: dict[str, Any]) -> dict[str, Any]:
        """Grade one rollout: ``body`` is the task line plus ``response``. Must return a dict
        with a finite number ``reward``; raise ``InvalidRequest`` for a body it cannot grade."""
        raise NotImplementedError(f"{type(self).__name__} does not implement verify")

    async def seed_session(self, body: dict[str, Any]) -> dict[str, Any]:
        """Prepare per-rollout state before the agent runs; nothing to do by default."""
        return {}

    def tools(self) -> list[dict[str, Any]]:
        """The function tools an agent may call, as Responses API function tools; none here."""
        return []

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run tool ``name`` (one of ``tools()``) on ``arguments``; its result, a JSON value.

        Raise ``InvalidRequest`` for arguments it cannot take: the agent hands that error to
        the model as the tool's output.
        """
        raise NotImplementedError(f"{type(self).__name__} has no tool {name!r}")

    async def start(self) -> None:
        """Called once when the app starts serving."""

    async def stop(self) -> None:
        """Called once when the app stops serving."""


def check_verify_result(result: object) -> dict[str, Any]:
    """``result`` with ``reward`` as a float; ``VerifyResultError`` when it breaks the contract."""
    if not isinstance(result, dict):
        raise VerifyResultError(
            f"verify must return a JSON object with a numeric reward, got {json_type_name(result)}"
        )
    if "reward" not in result:
        raise VerifyResultError("verify returned no reward")
    reward = result["reward"]
    # bool is an int subclass, and True as a reward is a bug in the grader, not 1.0.
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise VerifyResultError(
            f"verify returned a reward that is not a number: {json_type_name(reward)}"
        )
    if not math.isfinite(reward):
        raise VerifyResultError(f"verify returned a reward that is not finite: {reward!r}")
    return {**result, "reward": float(reward)}


_Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def create_resources_app(server: ResourcesServer) -> Starlette:
    """The ASGI app of one resources server."""

    async def call(method: str, handler: _Handler, request: Request) -> Response:
        try:
            body = await read_json_object(request)
            result = await handler(body)
        except InvalidRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        except Exception as exc:
            log.exception("resources server %s: %s failed", server.name, method)
            return error_response(
                500, f"{server.name} {method} failed: {type(exc).__name__}: {exc}", "server_error"
            )
        try:
            if method == "verify":
                result = check_verify_result(result)
            elif not isinstance(result, dict):
                raise VerifyResultError(
                    f"{method} must return a JSON object, got {json_type_name(result)}"
                )
            payload = orjson.dumps(result)
        except (VerifyResultError, TypeError) as exc:
            # orjson raises a TypeError subclass for values JSON cannot hold.
            log.error("resources server %s: bad %s result: %s", server.name, method, exc)
            return error_response(500, f"{server.name} {method}: {exc}", "server_error")
        return Response(payload, media_type="application/json")

    async def verify(request: Request) -> Response:
        return await call("verify", server.verify, request)

    async def seed_session(request: Request) -> Response:
        return await call("seed_session", server.seed_session, request)

    async def tools(request: Request) -> Response:
        return json_response({"tools": server.tools()})

    async def call_tool(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in {tool.get("name") for tool in server.tools()}:
            return error_response(404, f"{server.name} has no tool {name!r}", "not_found_error")
        try:
            arguments = await read_json_object(request)
            result = await server.call_tool(name, arguments)
            payload = orjson.dumps(result)
        except InvalidRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        except Exception as exc:
            log.exception("resources server %s: tool %s failed", server.name, name)
            message = f"{server.name} tool {name} failed: {type(exc).__name__}: {exc}"
            return error_response(500, message, "server_error")
        return Response(payload, media_type="application/json")

    async def health(request: Request) -> Response:
        return json_response({"status": "ok", "name": server.name})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = Starlette(
        routes=[
            Route("/verify", verify, methods=["POST"]),
            Route("/seed_session", seed_session, methods=["POST"]),
            Route("/tools", tools, methods=["GET"]),
            Route("/tools/{name}", call_tool, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.resources_server = server
    return app
