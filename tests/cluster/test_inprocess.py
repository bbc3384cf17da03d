from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap.cluster._inprocess import asgi_caller, lifespan


def _app(events: list[str]) -> Starlette:
    async def echo(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("fail"):
            return Response(b'{"error": "no"}', 502, media_type="application/json")
        return Response(orjson.dumps({"got": body, "path": request.url.path}), 200)

    @contextlib.asynccontextmanager
    async def span(app: Starlette) -> AsyncIterator[None]:
        events.append("start")
        yield
        events.append("stop")

    return Starlette(routes=[Route("/run", echo, methods=["POST"])], lifespan=span)


async def test_an_app_called_in_process_answers_as_over_http() -> None:
    events: list[str] = []
    app = _app(events)
    async with lifespan(app):
        assert events == ["start"]
        call = asgi_caller(app, "/run")
        status, body = await call(orjson.dumps({"x": 1}))
        assert (status, orjson.loads(body)) == (200, {"got": {"x": 1}, "path": "/run"})
        assert await call(orjson.dumps({"fail": True})) == (502, b'{"error": "no"}')
        assert (await asgi_caller(app, "/nope")(b"{}"))[0] == 404
    assert events == ["start", "stop"]
