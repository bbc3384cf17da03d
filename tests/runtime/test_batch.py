from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from rollcap._runtime.batch import BatchThread, call_each


async def test_results_come_back_to_their_own_callers_in_batches() -> None:
    sizes: list[int] = []

    def double(items: list[int]) -> Sequence[int | BaseException]:
        sizes.append(len(items))
        return [ValueError(f"odd {i}") if i % 7 == 3 else i * 2 for i in items]

    batch: BatchThread[int, int] = BatchThread(double, "test-batch")
    results = await asyncio.gather(*(batch.submit(i) for i in range(100)), return_exceptions=True)
    for i, result in enumerate(results):
        if i % 7 == 3:
            assert isinstance(result, ValueError)
            assert str(result) == f"odd {i}"
        else:
            assert result == i * 2
    assert sum(sizes) == 100
    assert len(sizes) < 100
    batch.close()


async def test_a_process_that_breaks_fails_every_waiter_of_its_batch() -> None:
    def broken(items: list[int]) -> Sequence[int]:
        return []  # wrong length: a bug, reported to each caller

    batch: BatchThread[int, int] = BatchThread(broken, "test-batch")
    with pytest.raises(RuntimeError, match="0 outcomes for 1"):
        await batch.submit(1)
    batch.close()


async def test_call_each_runs_plain_calls_and_keeps_their_exceptions() -> None:
    batch: BatchThread[tuple[object, tuple[object, ...]], object] = BatchThread(
        call_each,  # type: ignore[arg-type]
        "test-batch",
    )
    assert await batch.submit((divmod, (7, 2))) == (3, 1)
    with pytest.raises(ZeroDivisionError):
        await batch.submit((divmod, (7, 0)))
    batch.close()


async def test_close_finishes_the_queue_stops_the_thread_and_a_new_submit_restarts() -> None:
    release = threading.Event()
    done: list[int] = []

    def slow(items: list[int]) -> Sequence[None]:
        release.wait(5)
        done.extend(items)
        return [None] * len(items)

    batch: BatchThread[int, None] = BatchThread(slow, "test-batch-close")
    first = asyncio.ensure_future(batch.submit(1))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(batch.submit(2))  # queued behind the running batch
    await asyncio.sleep(0.05)
    second.cancel()  # its caller leaves; the work is still done
    release.set()
    await first
    await asyncio.to_thread(batch.close)
    assert done == [1, 2]
    assert not batch.running
    await batch.submit(3)
    assert done == [1, 2, 3]
    batch.close()


async def test_an_idle_thread_ends_by_itself_and_a_new_submit_starts_another() -> None:
    batch: BatchThread[int, int] = BatchThread(list, "test-batch-idle", idle_exit_s=0.05)
    assert await batch.submit(1) == 1
    assert batch.running
    for _ in range(100):
        if not batch.running:
            break
        await asyncio.sleep(0.02)
    assert not batch.running
    assert await batch.submit(2) == 2
    batch.close()


def test_a_forked_child_gets_a_working_batch_thread_of_its_own() -> None:
    import multiprocessing

    batch: BatchThread[int, int] = BatchThread(list, "test-batch-fork")

    async def use() -> int:
        return await batch.submit(7)

    assert asyncio.run(use()) == 7  # the parent's thread is running now
    assert batch.running

    def child(out: multiprocessing.SimpleQueue[int]) -> None:
        out.put(asyncio.run(use()))

    context = multiprocessing.get_context("fork")
    out: multiprocessing.SimpleQueue[int] = context.SimpleQueue()
    process = context.Process(target=child, args=(out,))
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert out.get() == 7
    batch.close()
