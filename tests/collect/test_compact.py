"""The collector's compactor: rollouts finishing together are compacted in one batch."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from rollcap.collect import CaptureCompactor
from rollcap.store import COMPRESSED_CAPTURE_SUFFIX, CaptureStore
from rollcap.store._frames import encode_frame
from tests.store._helpers import numbered_record


async def test_rollouts_finishing_together_share_one_batch_and_a_failure_only_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    ids = [f"{n}-0" for n in range(8)]
    for rollout in ids:
        store.append(rollout, numbered_record(0))
    (tmp_path / f"{ids[3]}{COMPRESSED_CAPTURE_SUFFIX}").write_bytes(encode_frame(b"other\n"))
    batches: list[int] = []
    real = store.compact_many

    def counted(rollout_ids: list[str], *, level: int) -> list[bool | BaseException]:
        batches.append(len(rollout_ids))
        return real(rollout_ids, level=level)

    monkeypatch.setattr(store, "compact_many", counted)
    compactor = CaptureCompactor(store, 9)
    with caplog.at_level(logging.WARNING, "rollcap.collect"):
        await asyncio.gather(*(compactor.compact(rollout) for rollout in ids))
    await asyncio.to_thread(compactor.close)
    assert sum(batches) == len(ids)
    assert len(batches) < len(ids)  # waiting rollouts went in together
    names = sorted(os.listdir(tmp_path))
    assert names.count(f"{ids[3]}.capture.jsonl") == 1  # its conflict kept it plain
    assert sum(name.endswith(COMPRESSED_CAPTURE_SUFFIX) for name in names) == len(ids)
    assert f"rollout {ids[3]}: its capture was not compacted (CaptureConflictError" in caplog.text


def test_a_bad_level_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="1 to 22"):
        CaptureCompactor(CaptureStore(tmp_path), 0)
