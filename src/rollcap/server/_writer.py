"""One thread that makes the model server's records durable, a batch at a time.

A record must be fsynced before its call's answer goes out, and the event loop must not block
on that. The records of calls that finish while a batch is being written queue up; the thread
(``rollcap._runtime.batch``) takes them all at once, writes every file and then syncs them in a
few overlapping lanes (``CaptureStore.append_many``), and wakes each waiting loop once per
batch: under load, far fewer thread hand-offs and syncs than one append per record.

A record too big to build on the event loop (``submit_built``) is built by one of two builder
threads, then joins the batches. Two at a time, from build to sync, whatever the number of calls
that end at once: the calls hold what their records are built from anyway, and only two
records' worth more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rollcap._runtime.batch import BatchThread
from rollcap.records import RawRecord
from rollcap.store import CaptureStore

__all__ = ["RecordWriter"]


class RecordWriter:
    """``await writer.append(rollout_id, record)`` returns once the record is durable."""

    def __init__(self, store: CaptureStore) -> None:
        self.store = store
        self._thread: BatchThread[tuple[str, RawRecord | Mapping[str, Any]], None] = BatchThread(
            store.append_many, "rollcap-record-writer"
        )
        # Two: a second big record need not wait for the first, and more would only share the
        # interpreter lock (and hold more records' memory at once).
        self._builders: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        self._building: set[asyncio.Task[None]] = set()

    async def append(self, rollout_id: str, record: RawRecord | Mapping[str, Any]) -> None:
        await self._thread.submit((rollout_id, record))

    def submit(
        self, rollout_id: str, record: RawRecord | Mapping[str, Any]
    ) -> asyncio.Future[None]:
        """Queue the record now; the future completes once it is durable (or with the error).

        The record is written whether or not anyone still waits on the future.
        """
        return self._thread.enqueue((rollout_id, record))

    def submit_built(
        self, rollout_id: str, build: Callable[[], RawRecord | Mapping[str, Any]]
    ) -> asyncio.Future[None]:
        """As ``submit``, for a record that ``build`` makes in a builder thread.

        Two such records at most are on their way at once, from their build to their sync:
        the others wait unbuilt, their calls holding only what they held already. The record
        is built and written whether or not anyone still waits on the future.
        """
        task = asyncio.ensure_future(self._build_and_write(rollout_id, build))
        self._building.add(task)
        task.add_done_callback(self._building.discard)
        return task

    async def _build_and_write(
        self, rollout_id: str, build: Callable[[], RawRecord | Mapping[str, Any]]
    ) -> None:
        if self._builders is None:
            self._builders = ThreadPoolExecutor(2, thread_name_prefix="rollcap-record-builder")
            self._slots = asyncio.Semaphore(2)
        assert self._slots is not None
        async with self._slots:
            loop = asyncio.get_running_loop()
            record = await loop.run_in_executor(self._builders, build)
            written = self._thread.enqueue((rollout_id, record))
            del record  # held by the writer until it is written, no longer here
            await written

    def close(self) -> None:
        """Write what is queued, then stop the threads; a later ``append`` starts a new one."""
        builders, self._builders = self._builders, None
        if builders is not None:
            builders.shutdown(wait=True)
        self._thread.close()
