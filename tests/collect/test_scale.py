"""10,000 tasks at concurrency 64: everything arrives, and memory does not grow with the count."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from rollcap import CaptureStore
from rollcap._runtime.serving import serving
from rollcap.collect import CollectionSummary, collect
from tests.collect.conftest import StubAgent, make_app, write_input

CALLS_PER_TASK = 2


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


async def _peak_of_run(
    agent: StubAgent, tmp_path: Path, capture_dir: Path, num_tasks: int
) -> tuple[CollectionSummary, int]:
    source = write_input(
        tmp_path / f"in-{num_tasks}.jsonl",
        ({"t": i, "calls": CALLS_PER_TASK} for i in range(num_tasks)),
    )
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    async with asyncio.timeout(300):
        summary = await collect(
            agent.url,
            source,
            tmp_path / f"out-{num_tasks}.jsonl",
            capture_dir=capture_dir,
            concurrency=64,
        )
    return summary, tracemalloc.get_traced_memory()[1] - before


@pytest.fixture
async def agent(capture_dir: Path) -> AsyncIterator[StubAgent]:
    """The stub agent, keeping no list of the rollouts it ran: it shares this process, and its
    own bookkeeping would count as the collector's memory."""
    stub = StubAgent(url="", store=CaptureStore(capture_dir))
    async with serving(make_app(stub, record_runs=False)) as url:
        stub.url = url
        yield stub
    stub.store.close()


@pytest.mark.slow
@pytest.mark.usefixtures("traced")
async def test_ten_thousand_tasks_in_flat_memory(
    tmp_path: Path, capture_dir: Path, agent: StubAgent
) -> None:
    # Both runs share the capture directory: the second clears each id before dispatching it.
    small, small_peak = await _peak_of_run(agent, tmp_path, capture_dir, 2000)
    large, large_peak = await _peak_of_run(agent, tmp_path, capture_dir, 10_000)

    assert (large.ran, large.failed, large.metrics["rollouts"]) == (10_000, 0, 10_000)
    assert large.metrics["num_calls"] == 10_000 * CALLS_PER_TASK
    assert large.rollouts_without_calls == 0
    with open(large.output_path, "rb") as f:
        keys = [orjson.loads(line)["_ng_task_index"] for line in f]
    assert keys == list(range(10_000))
    files = list(capture_dir.glob("*.capture.jsonl"))
    assert len(files) == 10_000
    assert sum(path.read_bytes().count(b"\n") for path in files) == 10_000 * CALLS_PER_TASK
    assert small.metrics["num_calls"] == 2000 * CALLS_PER_TASK
    # Five times the tasks, well under twice the peak: nothing is held per task but a few ints.
    assert large_peak < 2 * small_peak, (small_peak, large_peak)
