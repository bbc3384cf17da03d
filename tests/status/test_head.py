"""What the head server keeps of the runs that report to it, and its metrics."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollcap.status import HeadStatus, LiveStatusSettings, RunBoard, StatusRefused


def _document(run_id: str, finished: bool = False) -> bytes:
    board = RunBoard(
        LiveStatusSettings(), run_id=run_id, agent="a", planned=2, skipped=0,
        started=0.0, started_at=0.0,
    )  # fmt: skip
    board.start("0-0", task_index=0, rollout_index=0, attempt=0, redispatched=False, now=0.0)
    board.finished = finished
    return orjson.dumps(board.document(1.0, 1.0))


def test_the_latest_document_of_each_run_newest_first_and_metrics() -> None:
    head = HeadStatus()
    head.put(_document("/a"))
    head.put(_document("/b", finished=True))
    head.put(_document("/a"))
    runs = orjson.loads(head.body())["runs"]
    assert [r["run"]["id"] for r in runs] == ["/a", "/b"]
    families = {f.name: f for f in text_string_to_metric_families(head.exposition().decode())}
    counts = {s.labels["count"]: s.value for s in families["rollcap_collection_rollouts"].samples}
    assert (counts["planned"], counts["running"]) == (4.0, 2.0)
    states = {
        s.labels["state"]: s.value for s in families["rollcap_collection_running_rollouts"].samples
    }
    assert states["active"] == 2.0


@pytest.mark.parametrize(
    ("data", "why"), [(b"{", "not JSON"), (b"{}", "no run.id"), (b'{"run":{"id":"x"}}', "schema")]
)
def test_a_bad_document_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(StatusRefused, match=why):
        HeadStatus().put(data)
