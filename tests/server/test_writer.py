from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path

import pytest

from rollcap.server._writer import RecordWriter
from rollcap.store import CaptureStore
from tests.test_records import SPEC_RECORD


def _record(n: int) -> dict[str, object]:
    return {**SPEC_RECORD, "model_call_id": f"{n:032x}"}


async def test_concurrent_appends_are_durable_when_awaited_and_batched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    batch_sizes: list[int] = []
    real = store.append_many

    def spy(items):  # type: ignore[no-untyped-def]
        batch_sizes.append(len(items))
        return real(items)

    monkeypatch.setattr(store, "append_many", spy)
    writer = RecordWriter(store)

    async def one(n: int) -> None:
        await writer.append(f"r{n % 8}", _record(n))
        # Awaited means written: the line is in the file now.
        ids = [r["model_call_id"] for r in store.read(f"r{n % 8}")]
        assert f"{n:032x}" in ids

    await asyncio.gather(*(one(n) for n in range(200)))
    assert sum(batch_sizes) == 200
    assert len(batch_sizes) < 200  # calls that finished together shared a batch
    assert sum(len(store.read(f"r{k}")) for k in range(8)) == 200
    writer.close()
    store.close()


async def test_a_failed_write_raises_in_its_own_caller_only(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    writer = RecordWriter(store)
    results = await asyncio.gather(
        writer.append("good", _record(1)),
        writer.append("bad/id", _record(2)),
        return_exceptions=True,
    )
    assert results[0] is None
    assert isinstance(results[1], ValueError)
    assert len(store.read("good")) == 1
    writer.close()


async def test_close_writes_what_is_queued_and_a_later_append_starts_again(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    writer = RecordWriter(store)
    await writer.append("a", _record(1))
    await asyncio.to_thread(writer.close)
    assert not writer._thread.running
    await writer.append("a", _record(2))
    assert len(store.read("a")) == 2
    writer.close()


async def test_a_cancelled_waiter_does_not_lose_the_record(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    writer = RecordWriter(store)
    task = asyncio.ensure_future(writer.append("a", _record(1)))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.to_thread(writer.close)  # drains the queue
    assert len(store.read("a")) == 1


async def test_a_record_built_in_a_builder_thread_is_written_in_the_batches(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    writer = RecordWriter(store)
    loop_thread = threading.get_ident()
    built_in: list[int] = []

    def build(n: int) -> dict[str, object]:
        built_in.append(threading.get_ident())
        return _record(n)

    await asyncio.gather(*(writer.submit_built("a", functools.partial(build, n)) for n in range(6)))
    assert len(store.read("a")) == 6
    assert loop_thread not in built_in
    assert len(set(built_in)) <= 2
    await asyncio.to_thread(writer.close)


async def test_a_build_that_fails_fails_its_own_caller_only(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    writer = RecordWriter(store)

    def broken() -> dict[str, object]:
        raise ValueError("cannot build")

    results = await asyncio.gather(
        writer.submit_built("a", broken),
        writer.submit_built("a", lambda: _record(1)),
        return_exceptions=True,
    )
    assert isinstance(results[0], ValueError)
    assert results[1] is None
    assert len(store.read("a")) == 1
    await asyncio.to_thread(writer.close)


async def test_a_built_record_is_written_when_its_waiter_is_gone(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    writer = RecordWriter(store)
    started = threading.Event()

    def slow() -> dict[str, object]:
        started.wait(10)
        return _record(1)

    waiter = asyncio.ensure_future(asyncio.shield(writer.submit_built("a", slow)))
    await asyncio.sleep(0)
    waiter.cancel()
    started.set()
    await asyncio.gather(waiter, return_exceptions=True)
    for _ in range(500):  # bounded: a broken writer fails here instead of hanging
        if store.read("a"):
            break
        await asyncio.sleep(0.01)
    assert len(store.read("a")) == 1
    await asyncio.to_thread(writer.close)
