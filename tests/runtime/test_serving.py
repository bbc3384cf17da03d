"""Serving on sockets bound up front: a busy port is a clear error, before anything starts."""

from __future__ import annotations

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rollcap._runtime.serving import bind, serving, serving_in_thread


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


APP = Starlette(routes=[Route("/", _hello)])


async def test_serving_yields_the_base_url_of_a_running_server() -> None:
    async with (
        serving(APP) as url,
        aiohttp.ClientSession() as session,
        session.get(url + "/") as response,
    ):
        assert await response.text() == "hello"


def test_a_busy_port_names_the_address() -> None:
    with bind("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)


def test_serving_in_a_thread_for_synchronous_callers() -> None:
    import urllib.request

    with serving_in_thread(APP) as url, urllib.request.urlopen(url + "/", timeout=10) as answer:
        assert answer.read() == b"hello"
