"""Keeping a collection's status live: ask the model servers, write the status file, tell the
head server; about once per ``interval_s``.

Nothing here can slow or fail a collection: a model server that does not answer in time is
listed as such, a status file that cannot be written is logged once, a head server that is
away is skipped. The file is replaced atomically (written beside it, then renamed), so a reader
never sees half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from rollcap.status._board import RunBoard, ServerAnswer
from rollcap.status._rules import LiveStatusSettings
from rollcap.store import plain_name

__all__ = ["LiveStatus", "ModelServers", "StatusOptions", "StatusSink", "status_path"]

log = logging.getLogger("rollcap.status")

StatusSink = Callable[[dict[str, Any]], None]
"""Told of each new status document, on the event loop (a progress bar's counts)."""

ModelServers = Sequence[tuple[str, str]] | Callable[[], Sequence[tuple[str, str]]]
"""The model servers to ask, as ``(name, base URL)``: fixed, or asked before each poll (replicas
that come and go)."""


@dataclass(frozen=True, slots=True)
class StatusOptions:
    """How a collection keeps its status live (``collect(status=...)``): the thresholds, the
    model servers to ask, the head server to tell, and who else hears of each document."""

    settings: LiveStatusSettings = field(default_factory=LiveStatusSettings)
    servers: ModelServers = ()
    head_url: str | None = None
    sinks: Sequence[StatusSink] = ()


def status_path(output_path: str | os.PathLike[str]) -> Path:
    """``<output stem>_status.json`` beside the output file (the stem of a compressed output's
    plain name: ``X.jsonl.zst`` has ``X_status.json``)."""
    output = Path(plain_name(os.fspath(output_path)))
    return output.with_name(f"{output.stem}_status.json")


class LiveStatus:
    """The status loop of one collection: ``async with`` it around the run.

    ``servers``: the model servers to ask, as ``(name, base URL)``; ``head_url``: the head
    server to tell (``PUT /status``), or ``None``; ``sinks``: told of each document.
    """

    def __init__(
        self,
        board: RunBoard,
        path: Path,
        *,
        servers: ModelServers = (),
        head_url: str | None = None,
        sinks: Sequence[StatusSink] = (),
    ) -> None:
        self.board = board
        self.path = path
        self._servers = servers
        self.head_url = None if head_url is None else head_url.rstrip("/")
        self.sinks = list(sinks)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._warned: set[str] = set()

    async def __aenter__(self) -> LiveStatus:
        interval = self.board.settings.interval_s
        timeout = aiohttp.ClientTimeout(total=max(1.0, 2 * interval))
        self._session = aiohttp.ClientSession(timeout=timeout)
        await self.refresh()
        self._task = asyncio.ensure_future(self._loop())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.board.finished = True
        try:
            await self.refresh(poll=False)
        finally:
            if self._session is not None:
                await self._session.close()

    async def _loop(self) -> None:
        interval = self.board.settings.interval_s
        while True:
            await asyncio.sleep(interval)
            await self.refresh()

    async def refresh(self, *, poll: bool = True) -> dict[str, Any]:
        """Ask the servers (``poll``), then write, tell and return the new document."""
        servers = self._servers() if callable(self._servers) else self._servers
        if poll and servers:
            ids = self.board.running_ids()
            asked = [self._ask(name, url.rstrip("/"), ids) for name, url in servers]
            self.board.observe(list(await asyncio.gather(*asked)), time.monotonic())
        document = self.board.document(time.monotonic(), time.time())
        data = orjson.dumps(document)
        await asyncio.to_thread(self._write, data)
        if self.head_url is not None:
            await self._tell_head(data)
        for sink in self.sinks:
            sink(document)
        return document

    async def _ask(self, name: str, url: str, ids: list[str]) -> ServerAnswer:
        assert self._session is not None
        try:
            async with self._session.post(
                url + "/inflight/rollouts",
                data=orjson.dumps(ids),
                headers={"content-type": "application/json"},
            ) as response:
                body = await response.read()
                if response.status != 200:
                    return ServerAnswer(name, url, error=f"HTTP {response.status}")
                rollouts = orjson.loads(body).get("rollouts")
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError) as exc:
            return ServerAnswer(name, url, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        if not isinstance(rollouts, dict):
            return ServerAnswer(name, url, error="no rollouts in its answer")
        return ServerAnswer(name, url, rollouts=rollouts)

    def _write(self, data: bytes) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            self._warn_once("file", "status file %s not written: %s", self.path, exc)

    async def _tell_head(self, data: bytes) -> None:
        assert self._session is not None
        try:
            async with self._session.put(
                f"{self.head_url}/status",
                data=data,
                headers={"content-type": "application/json"},
            ) as response:
                await response.read()
                if response.status != 204:
                    self._warn_once(
                        "head", "head server %s refused the status: HTTP %d", self.head_url,
                        response.status,
                    )  # fmt: skip
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._warn_once("head", "head server %s not told the status: %s", self.head_url, exc)

    def _warn_once(self, what: str, message: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, *args)
