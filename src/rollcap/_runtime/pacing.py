"""Starting a burst of requests a few per turn of the event loop, health checks first.

A burst of new connections (hundreds of streams opened at once) would otherwise start all its
requests in one turn of the loop: each start (routing, reading the body, opening the upstream
connection, setting up the record) is short, but hundreds of them make one long turn, and every
request behind them, a health check included, waits for all of it. ``paced(app)`` lets at most
``per_turn`` requests begin in a turn and queues the rest, first come first served; the paths in
``exempt`` (``/health``) never wait. Requests already running are not touched, and a request
that arrives alone starts at once.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

__all__ = ["DEFAULT_PER_TURN", "HEALTH_PATHS", "Pacer", "paced"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_PER_TURN = 4
HEALTH_PATHS = frozenset({"/health"})


class Pacer:
    """Admits at most ``per_turn`` requests per turn of the running loop, in arrival order.

    Use on one event loop. A waiter that is cancelled gives its place to the next one.
    """

    def __init__(self, per_turn: int = DEFAULT_PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError(f"per_turn must be at least 1, got {per_turn}")
        self.per_turn = per_turn
        self._admitted = 0  # in the current turn
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._turn_armed = False

    @property
    def waiting(self) -> int:
        """How many requests wait for a later turn."""
        return len(self._waiting)

    async def admit(self) -> None:
        """Return in this turn if there is room and nobody waits, else in a later turn."""
        loop = asyncio.get_running_loop()
        self._arm(loop)
        if not self._waiting and self._admitted < self.per_turn:
            self._admitted += 1
            return
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append(future)
        await future

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._turn_armed:
            self._turn_armed = True
            loop.call_soon(self._new_turn, loop)

    def _new_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._turn_armed = False
        self._admitted = 0
        while self._waiting and self._admitted < self.per_turn:
            future = self._waiting.popleft()
            if not future.done():  # a cancelled waiter takes no place
                future.set_result(None)
                self._admitted += 1
        if self._waiting or self._admitted:
            self._arm(loop)


def paced(
    app: App, per_turn: int = DEFAULT_PER_TURN, exempt: Collection[str] = HEALTH_PATHS
) -> App:
    """``app`` with its HTTP requests started at most ``per_turn`` a turn (see the module);
    a request for a path in ``exempt`` starts at once. Other scopes (lifespan) pass through."""
    pacer = Pacer(per_turn)

    async def paced_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in exempt:
            await pacer.admit()
        await app(scope, receive, send)

    return paced_app
