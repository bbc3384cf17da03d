"""``rollcap status``'s table, rendered, and its exit once the run finished."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import rich.console

from rollcap.status import LiveStatusSettings, RunBoard, ServerAnswer, StatusSource
from rollcap.status._terminal import describe_doing, watch


def _board() -> RunBoard:
    board = RunBoard(
        LiveStatusSettings(stalled_upstream_s=5), run_id="/r/out.jsonl", agent="simple_agent",
        planned=3, skipped=0, started=0.0, started_at=0.0,
    )  # fmt: skip
    board.start("0-0", task_index=0, rollout_index=0, attempt=0, redispatched=False, now=0.0)
    call = {"state": "stalled", "phase": "streaming", "started_at": 1.0, "age_ms": 9000.0,
            "upstream_silence_ms": 8000.0, "dialect": "chat"}  # fmt: skip
    board.observe(
        [ServerAnswer("policy_model", "http://m", rollouts={"0-0": {"open_calls": [call]}})], 10.0
    )
    return board


def test_the_table_shows_the_stalled_rollout_and_the_run_ends(tmp_path: Path) -> None:
    board = _board()
    path = tmp_path / "out_status.json"
    path.write_bytes(orjson.dumps(board.document(10.0, 10.0)))
    out = io.StringIO()
    console = rich.console.Console(file=out, width=160)
    assert watch(StatusSource(path=path), console=console, once=True) == 0
    text = out.getvalue()
    assert "0-0" in text
    assert "stalled" in text
    assert "model call on policy_model: streaming, upstream silent 8.0s (stalled)" in text
    board.finished = True
    path.write_bytes(orjson.dumps(board.document(11.0, 11.0)))
    assert watch(StatusSource(path=path), console=console, sleep=lambda _: None) == 0
    assert "FINISHED" in out.getvalue()
    assert describe_doing({"kind": "between_calls", "for_s": 75}) == (
        "between calls (agent or tool) for 1m15s"
    )


def test_nothing_to_read_once_is_a_failure(tmp_path: Path) -> None:
    console = rich.console.Console(file=io.StringIO())
    assert watch(StatusSource(path=tmp_path / "none.json"), console=console, once=True) == 1
