from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollcap.attachment import CaptureRead, build_attachment, capture_attachment, read_capture
from rollcap.records import (
    GAP_INCOMPLETE,
    GAP_NO_RECORDS,
    GAP_UNREADABLE,
    Gap,
    ModelCallRecord,
)
from rollcap.store import AvailableRecords, CaptureStore
from tests.test_records import SPEC_RECORD


def _messages_record(index: int, **usage: Any) -> ModelCallRecord:
    raw = {
        "model_call_id": f"id{index}",
        "dialect": "messages",
        "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "latency_ms": 0.1,
        "status_code": 200,
        "response": {"id": f"msg_{index}", "type": "message", "usage": usage},
    }
    return ModelCallRecord.from_raw(raw, index)


def _record(n: int) -> dict[str, object]:
    return {**SPEC_RECORD, "model_call_id": f"{n:032x}"}


def test_attachment_shape_and_gap_omission() -> None:
    records = [_messages_record(0, input_tokens=1, output_tokens=1)]
    attachment = build_attachment("0-0", records)
    assert list(attachment) == ["rollout_id", "metrics", "calls"]
    assert attachment["calls"][0]["call_index"] == 0
    assert "request" in attachment["calls"][0]
    with_gap = build_attachment(
        "0-0",
        records,
        [Gap("model_call_capture_incomplete"), Gap("x", "count=2")],
        payloads=False,
    )
    assert with_gap["gaps"] == [
        {"code": "model_call_capture_incomplete"},
        {"code": "x", "detail": "count=2"},
    ]
    assert "request" not in with_gap["calls"][0]


def test_capture_attachment_gaps(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    assert capture_attachment(store, "0-0")["gaps"] == [{"code": "model_call_capture_no_records"}]

    store.append("0-1", _record(0))
    attachment = capture_attachment(store, "0-1")
    assert "gaps" not in attachment
    assert attachment["metrics"]["num_calls"] == 1

    with store.path_for("0-1").open("ab") as handle:
        handle.write(b'{"torn')
    store.mark_incomplete("0-1")
    assert capture_attachment(store, "0-1", payloads=False)["gaps"] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=1"},
        {"code": "model_call_capture_incomplete"},
    ]

    store.path_for("0-2").mkdir()  # cannot be read as a file
    assert capture_attachment(store, "0-2")["gaps"] == [{"code": "model_call_capture_unreadable"}]

    # A marker alone is an incomplete capture, not a capture without records.
    store.mark_incomplete("0-3")
    assert capture_attachment(store, "0-3")["gaps"] == [{"code": "model_call_capture_incomplete"}]
    # Only bad lines: they are what is wrong, not a lack of records.
    store.path_for("0-4").write_bytes(b"{bad\n[]\n")
    assert capture_attachment(store, "0-4")["gaps"] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"}
    ]
    # An empty file: dispatched, nothing recorded.
    store.reset("0-5")
    assert capture_attachment(store, "0-5")["gaps"] == [{"code": "model_call_capture_no_records"}]


@dataclass
class _Source:
    """A capture that fails the way a broken disk does, where asked to."""

    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    read_error: OSError | None = None
    marker_error: OSError | None = None
    incomplete: bool = False

    def has_capture(self, rollout_id: str) -> bool:
        return True

    def read_available(self, rollout_id: str) -> AvailableRecords:
        if self.read_error is not None:
            raise self.read_error
        return AvailableRecords(self.records, 0)

    def is_incomplete(self, rollout_id: str) -> bool:
        if self.marker_error is not None:
            raise self.marker_error
        return self.incomplete


def test_a_read_failure_is_one_gap_without_detail_and_no_call() -> None:
    eio = OSError(errno.EIO, "Input/output error")
    # A marker that cannot be looked at makes the capture unreadable: what was read is not
    # trusted alone (EVIDENCE.md 3.2).
    marker_failed = capture_attachment(_Source(records=[(3, _record(0))], marker_error=eio), "0-0")
    assert marker_failed["calls"] == []
    assert marker_failed["gaps"] == [{"code": GAP_UNREADABLE}]

    both = capture_attachment(_Source(read_error=eio, incomplete=True), "0-0")
    assert both["calls"] == []
    assert [gap["code"] for gap in both["gaps"]] == [GAP_UNREADABLE, GAP_INCOMPLETE]

    empty = capture_attachment(_Source(), "0-0")
    assert [gap["code"] for gap in empty["gaps"]] == [GAP_NO_RECORDS]


@pytest.mark.parametrize(
    ("found", "failed", "bad", "marker", "calls", "expected"),
    [
        # EVIDENCE.md section 3.2, row by row, then the combinations it spells out.
        (False, False, 0, False, 0, [("model_call_capture_no_records", None)]),
        (True, True, 0, False, 0, [("model_call_capture_unreadable", None)]),
        (True, False, 3, False, 2, [("model_call_capture_records_unreadable", "count=3")]),
        (True, False, 0, True, 1, [("model_call_capture_incomplete", None)]),
        (True, False, 0, False, 0, [("model_call_capture_no_records", None)]),
        (True, False, 0, True, 0, [("model_call_capture_incomplete", None)]),
        (True, False, 2, False, 0, [("model_call_capture_records_unreadable", "count=2")]),
        (
            True,
            False,
            1,
            True,
            0,
            [
                ("model_call_capture_records_unreadable", "count=1"),
                ("model_call_capture_incomplete", None),
            ],
        ),
        (
            True,
            True,
            0,
            True,
            0,
            [("model_call_capture_unreadable", None), ("model_call_capture_incomplete", None)],
        ),
        (True, False, 0, False, 4, []),
    ],
)
def test_capture_gaps_precedence(
    found: bool,
    failed: bool,
    bad: int,
    marker: bool,
    calls: int,
    expected: list[tuple[str, str | None]],
) -> None:
    records = tuple(ModelCallRecord.from_raw(SPEC_RECORD, index) for index in range(calls))
    gaps = CaptureRead(found, failed, bad, marker, records).gaps()
    assert [(g.code, g.detail) for g in gaps] == expected


@dataclass
class _Counted:
    """A capture on disk whose every look is counted, by the store method that made it."""

    store: CaptureStore
    asked: dict[str, int] = field(default_factory=dict)

    def _count(self, name: str) -> None:
        self.asked[name] = self.asked.get(name, 0) + 1

    def has_capture(self, rollout_id: str) -> bool:
        self._count("has_capture")
        return self.store.has_capture(rollout_id)

    def read_available(self, rollout_id: str) -> AvailableRecords:
        self._count("read_available")
        return self.store.read_available(rollout_id)

    def is_incomplete(self, rollout_id: str) -> bool:
        self._count("is_incomplete")
        return self.store.is_incomplete(rollout_id)


def test_a_capture_with_lines_is_read_once_and_its_marker_looked_at_once(
    tmp_path: Path,
) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", _record(0))
    store.mark_incomplete("0-0")
    source = _Counted(store)
    read = read_capture(source, "0-0")
    assert (read.store_found, read.incomplete, len(read.calls)) == (True, True, 1)
    assert source.asked == {"read_available": 1, "is_incomplete": 1}


@pytest.mark.parametrize(
    ("setup", "found"),
    [("nothing", False), ("empty file", True), ("marker only", True)],
)
def test_whether_a_capture_exists_is_asked_only_when_nothing_told(
    tmp_path: Path, setup: str, found: bool
) -> None:
    store = CaptureStore(tmp_path)
    if setup == "empty file":
        store.reset("0-0")
    elif setup == "marker only":
        store.mark_incomplete("0-0")
    source = _Counted(store)
    assert read_capture(source, "0-0").store_found is found
    # A marker answers it; an empty file or none at all leaves it to be asked.
    expected_asks = 0 if setup == "marker only" else 1
    assert source.asked == {
        "read_available": 1,
        "is_incomplete": 1,
        **({"has_capture": 1} if expected_asks else {}),
    }


def test_an_invalid_id_raises_before_anything_is_read(tmp_path: Path) -> None:
    source = _Counted(CaptureStore(tmp_path))
    with pytest.raises(ValueError, match="Invalid rollout id"):
        read_capture(source, "../etc")
    assert source.asked == {}


def test_a_read_that_fails_on_a_missing_capture_is_no_capture() -> None:
    # As when the directory cannot be listed: nothing says there is a capture at all.
    missing = _Source(read_error=OSError(errno.EACCES, "Permission denied"))
    missing.has_capture = lambda rollout_id: False  # type: ignore[method-assign]
    assert read_capture(missing, "0-0") == CaptureRead(store_found=False)
