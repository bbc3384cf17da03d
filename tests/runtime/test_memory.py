"""Handing freed memory back once a burst of big calls is over."""

from __future__ import annotations

import asyncio

import pytest

from rollcap._runtime import memory
from rollcap._runtime.memory import MemoryReleaser, release_free_memory


def test_release_free_memory_says_whether_it_could() -> None:
    assert release_free_memory() is (memory._TRIM is not None)


async def test_a_release_comes_once_enough_was_kept_and_the_calls_went_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released: list[bool] = []

    def release() -> bool:
        released.append(True)
        return True

    monkeypatch.setattr(memory, "release_free_memory", release)
    releaser = MemoryReleaser(threshold=1000, quiet_s=0.05)
    releaser.note(400)
    releaser.note(400)
    await asyncio.sleep(0.2)
    assert released == []  # not enough kept: nothing to hand back
    releaser.note(400)  # 1200: enough
    for _ in range(3):  # calls keep ending: the release waits for quiet
        await asyncio.sleep(0.02)
        releaser.note(10)
    assert released == []
    for _ in range(100):  # bounded wait for the executor
        if released:
            break
        await asyncio.sleep(0.01)
    assert released == [True]
    assert releaser.releases == 1
    releaser.note(999)
    await asyncio.sleep(0.2)
    assert released == [True]  # counted afresh after a release
    releaser.close()
