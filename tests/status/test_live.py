"""The status loop: it replaces the status file and marks the run finished at the end, and a
model server that is not there is listed, not fatal."""

from __future__ import annotations

from pathlib import Path

import orjson

from rollcap.status import LiveStatus, LiveStatusSettings, RunBoard, status_path


async def test_the_status_file_is_kept_and_finished(tmp_path: Path) -> None:
    board = RunBoard(
        LiveStatusSettings(interval_s=0.05), run_id="r", agent="a", planned=1, skipped=0,
        started=0.0, started_at=0.0,
    )  # fmt: skip
    path = status_path(tmp_path / "out.jsonl")
    assert path.name == "out_status.json"
    assert status_path(tmp_path / "out.jsonl.zst") == path  # a compressed output's, the same
    async with LiveStatus(board, path, servers=[("m", "http://127.0.0.1:9")]) as live:
        document = orjson.loads(path.read_bytes())
        assert document["run"]["finished"] is False
        assert document["servers"][0]["ok"] is False
        await live.refresh()
    assert orjson.loads(path.read_bytes())["run"]["finished"] is True
