"""Breaking a client's connection off on purpose, and saying so once instead of as an error."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rollcap._proxy.relay import BreakOffMiddleware, UpstreamBroke, upstream_broke


def test_upstream_broke_looks_inside_exception_groups() -> None:
    assert upstream_broke(UpstreamBroke("cut"))
    assert upstream_broke(
        BaseExceptionGroup("g", [ValueError(), ExceptionGroup("h", [UpstreamBroke()])])
    )
    assert not upstream_broke(ValueError("a bug"))
    assert not upstream_broke(ExceptionGroup("g", [ValueError()]))


async def test_the_middleware_leaves_the_response_unfinished_and_logs_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[Any] = []

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise UpstreamBroke("cut")

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("a bug")

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    log = logging.getLogger("rollcap.test")
    scope = {"type": "http", "method": "POST", "path": "/v1/responses"}
    with caplog.at_level(logging.WARNING, logger="rollcap.test"):
        await BreakOffMiddleware(broken, log)(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start"]  # no clean end follows
    assert [r.getMessage() for r in caplog.records] == [
        "POST /v1/responses: upstream broke off its answer; the client's connection is closed "
        "the same way"
    ]
    with pytest.raises(ValueError, match="a bug"):  # anything else is still an error
        await BreakOffMiddleware(failing, log)(scope, receive, send)
