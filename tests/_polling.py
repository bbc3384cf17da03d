"""Waiting in a test for a server to get somewhere, bounded so that a hang fails the test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def until(
    check: Callable[[], Awaitable[dict[str, Any]]],
    done: Callable[[dict[str, Any]], bool],
    *,
    bound_s: float,
    every_s: float = 0.05,
) -> dict[str, Any]:
    """``check()`` again, every ``every_s``, until ``done`` holds of its answer; the test fails
    with the last answer after ``bound_s`` (a bound on a hang, not a figure)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while True:
        answer = await check()
        if done(answer):
            return answer
        assert loop.time() < deadline, answer
        await asyncio.sleep(every_s)
