"""One thread that does blocking work for an event loop, a batch at a time.

``asyncio.to_thread`` costs a thread-pool hand-off, a GIL hand-off and a loop wake-up per
call; on a loaded machine that can be more than a small file operation itself. Here the work
submitted while a batch runs queues up; the thread takes the whole queue at once, and wakes
each waiting loop once per batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["BatchThread", "call_each"]

T = TypeVar("T")
R = TypeVar("R")

Outcome = Any  # a result, or the BaseException the item raised


def call_each(items: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Outcome]:
    """Process function for plain calls: ``(function, args)`` items, run one after the other."""
    out: list[Outcome] = []
    for function, args in items:
        try:
            out.append(function(*args))
        except Exception as exc:
            out.append(exc)
    return out


def _settle(outcomes: list[tuple[asyncio.Future[Any], Outcome]]) -> None:
    for future, outcome in outcomes:
        if future.done():  # its waiter was cancelled; the work was done all the same
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class BatchThread(Generic[T, R]):
    """``await batch.submit(item)``: the item's result once ``process`` ran its batch.

    ``process(items)`` returns one outcome per item, in order: the result, or the exception
    that item raised (returned, not raised, so one bad item fails only its own caller).
    """

    def __init__(
        self,
        process: Callable[[list[T]], Sequence[R | BaseException]],
        name: str,
        *,
        idle_exit_s: float = 30.0,
    ):
        self._process = process
        self._name = name
        # A thread idle this long ends (the next submit starts another), so an owner that
        # never calls close() leaves no thread behind for good.
        self._idle_exit_s = idle_exit_s
        self._wake = threading.Condition()
        self._queue: list[tuple[T, asyncio.Future[R], asyncio.AbstractEventLoop]] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        _INSTANCES.add(self)

    def _forget_after_fork(self) -> None:
        # The parent's thread is not in the child, and its queue waits for the parent's loops.
        self._wake = threading.Condition()
        self._queue = []
        self._thread = None
        self._closing = False

    async def submit(self, item: T) -> R:
        return await self.enqueue(item)

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` now; the future gets its outcome. Cancelling the future leaves the
        work to be done all the same (the outcome is then dropped)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        with self._wake:
            if self._closing:
                raise RuntimeError(f"{self._name} is closing")
            self._queue.append((item, future, loop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wake.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    if not self._wake.wait(self._idle_exit_s) and not self._queue:
                        self._thread = None  # under the lock: the next submit starts a thread
                        return
                batch, self._queue = self._queue, []
                if not batch:
                    return  # closing, and nothing left to do
            try:
                outcomes: Sequence[Outcome] = self._process([item for item, _, _ in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"{self._name}: {len(outcomes)} outcomes for {len(batch)}")
            except BaseException as exc:  # a bug in process: every waiter hears of it
                outcomes = [exc] * len(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
            for (_, future, loop), outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(loop, []).append((future, outcome))
            for loop, settled in by_loop.items():
                # A closed loop raises RuntimeError: nobody there waits any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, settled)
            # Not held while the thread waits for the next batch: a batch of big records is
            # hundreds of megabytes.
            del batch, outcomes, by_loop

    @property
    def running(self) -> bool:
        with self._wake:
            return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Finish what is queued, then stop the thread; a later ``submit`` starts a new one."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._wake:
            self._thread = None
            self._closing = False


_INSTANCES: weakref.WeakSet[BatchThread[Any, Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for instance in list(_INSTANCES):
        instance._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
