"""One thread that makes the model server's records durable, a batch at a time.

A record must be fsynced before its call's answer goes out, and the event loop must not block
on that. Handing each record to a thread pool costs a thread wake-up, a GIL hand-off and a
loop wake-up per call, and many threads syncing many files at once make the filesystem commit
its journal once per file. Here the calls that finish while a batch is being written queue up;
the thread takes them all at once, writes every file and then syncs them
(``CaptureStore.append_many``: one journal commit for the batch), and wakes each waiting loop
once per batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from rollcap.records import RawRecord
from rollcap.store import CaptureStore

__all__ = ["RecordWriter"]

_Item = tuple[str, RawRecord | Mapping[str, Any], "asyncio.Future[None]", asyncio.AbstractEventLoop]


def _settle(outcomes: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    for future, error in outcomes:
        if future.done():  # its waiter was cancelled; the record was written all the same
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class RecordWriter:
    """``await writer.append(rollout_id, record)`` returns once the record is durable."""

    def __init__(self, store: CaptureStore) -> None:
        self.store = store
        self._wake = threading.Condition()
        self._queue: list[_Item] = []
        self._thread: threading.Thread | None = None
        self._closing = False

    async def append(self, rollout_id: str, record: RawRecord | Mapping[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._wake:
            if self._closing:
                raise RuntimeError("the record writer is closed")
            self._queue.append((rollout_id, record, future, loop))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rollcap-record-writer", daemon=True
                )
                self._thread.start()
            self._wake.notify()
        await future

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait()
                batch, self._queue = self._queue, []
                if not batch:
                    return  # closing, and nothing left to write
            try:
                errors = self.store.append_many([(item[0], item[1]) for item in batch])
            except BaseException as exc:  # a bug in the store: every waiter hears of it
                errors = [exc] * len(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
            for (_, _, future, loop), error in zip(batch, errors, strict=True):
                by_loop.setdefault(loop, []).append((future, error))
            for loop, outcomes in by_loop.items():
                # A closed loop raises RuntimeError: nobody there waits any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, outcomes)

    def close(self) -> None:
        """Write what is queued, then stop the thread; a later ``append`` starts a new one."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._wake:  # a server started again (lifespan) writes through a new thread
            self._thread = None
            self._closing = False
