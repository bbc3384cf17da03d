"""What a call draws from the world: ids unique across forks, both clocks read together."""

from __future__ import annotations

import multiprocessing
import time
import uuid

from rollcap.server._fresh import new_model_call_id, now


def test_model_call_ids_are_uuid4_hex_and_differ_across_fork() -> None:
    ids = {new_model_call_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(uuid.UUID(i).version == 4 and len(i) == 32 for i in ids)
    assert all(uuid.UUID(i).variant == uuid.RFC_4122 and uuid.UUID(i).hex == i for i in ids)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply(new_model_call_id)
    assert child != new_model_call_id()
    assert child not in ids


def test_now_reads_both_clocks() -> None:
    before_wall, before_mono = time.time(), time.monotonic()
    clock = now()
    assert before_wall <= clock.wall <= time.time()
    assert before_mono <= clock.mono <= time.monotonic()
