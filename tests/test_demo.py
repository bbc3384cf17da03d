from __future__ import annotations

from pathlib import Path

import pytest

from rollcap import CaptureStore, read_model_call_records
from rollcap.demo import main


def test_demo_captures_real_calls_in_every_dialect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main() == 0
    out = capsys.readouterr().out
    store = CaptureStore(tmp_path / "results" / "demo-model-calls")
    assert store.rollout_ids() == ["0-0", "1-0"]
    calls = read_model_call_records(store, "0-0")
    assert [c.dialect for c in calls] == ["responses", "chat", "messages"]
    assert [c.error_category for c in calls] == [None, None, None]
    assert calls[1].tool_calls[0]["name"] == "answer"
    assert calls[2].reasoning_content
    assert [c.error_category for c in read_model_call_records(store, "1-0")] == [
        "stream_truncated",
        "rate_limit",
    ]
    assert "uncorrelated=1" in out
    assert str(store.path_for("0-0")) in out
    # Running it again starts from clean rollouts rather than appending to the last run's.
    assert main() == 0
    assert len(read_model_call_records(store, "0-0")) == 3
