from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from rollcap.collect import DispatchJournal, Rollout, dispatched_path
from rollcap.collect._plan import rollout_line_ids
from tests.store._helpers import watch_fsyncs


def test_the_journal_sits_beside_the_output() -> None:
    assert str(dispatched_path("/r/mcqa_rollouts.jsonl")) == "/r/mcqa_rollouts_dispatched.jsonl"
    # A compressed output's journal is plain, named after the output's plain name.
    assert str(dispatched_path("/r/out.jsonl.zst")) == "/r/out_dispatched.jsonl"


def test_a_batch_is_one_synced_write_of_one_line_per_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out_dispatched.jsonl"
    synced = watch_fsyncs(monkeypatch)
    writes: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: bytes | memoryview) -> int:
        writes.append(fd)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    with DispatchJournal(path) as journal:
        journal.record([Rollout(0, 0, 0, {"q": 1}), Rollout(3, 1, 2, {})])
        journal.record([])
        journal.record([Rollout(4, 0, 0, {})])
    # The new file's directory entry is synced once, each batch once.
    assert synced == [str(tmp_path), str(path), str(path)]
    assert len(writes) == 2
    lines = path.read_bytes().splitlines()
    assert [rollout_line_ids(line) for line in lines] == [(0, 0, 0), (3, 1, 2), (4, 0, 0)]
    assert orjson.loads(lines[1])["rollout_id"] == "3-1-a2"
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_reopened_journal_appends(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    for attempt in range(2):
        with DispatchJournal(path) as journal:
            journal.record([Rollout(0, 0, attempt, {})])
    assert [rollout_line_ids(line) for line in path.read_bytes().splitlines()] == [
        (0, 0, 0),
        (0, 0, 1),
    ]
