"""The rollout attachment, ``ng_model_call_capture``: built here, and only here.

``build_attachment`` makes it from normalized records and gaps (pure). ``capture_attachment``
reads one rollout's capture through the store it is handed, tolerantly: whatever cannot be read
becomes a gap rather than an error, because the attachment is evidence about a rollout, and a
damaged capture must not lose the rollout's own result. This module imports no I/O; the reads
are the store's (``rollcap.store``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from rollcap.metrics import aggregate
from rollcap.records import (
    GAP_INCOMPLETE,
    GAP_NO_RECORDS,
    GAP_RECORDS_UNREADABLE,
    GAP_UNREADABLE,
    Gap,
    ModelCallRecord,
)

__all__ = ["CaptureSource", "build_attachment", "capture_attachment"]


class _Available(Protocol):
    @property
    def records(self) -> list[tuple[int, dict[str, Any]]]: ...

    @property
    def bad_lines(self) -> int: ...


class CaptureSource(Protocol):
    """What an attachment reads: ``CaptureStore`` is one. Both may raise ``OSError``."""

    def read_available(self, rollout_id: str) -> _Available: ...

    def is_incomplete(self, rollout_id: str) -> bool: ...


def build_attachment(
    rollout_id: str,
    records: Sequence[ModelCallRecord],
    gaps: Iterable[Gap] = (),
    *,
    payloads: bool = True,
) -> dict[str, Any]:
    """The ``ng_model_call_capture`` object of one rollout; ``gaps`` is omitted when empty."""
    out: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate(records),
        "calls": [record.to_dict(payloads=payloads) for record in records],
    }
    gap_list = [gap.to_dict() for gap in gaps]
    if gap_list:
        out["gaps"] = gap_list
    return out


def capture_attachment(
    store: CaptureSource, rollout_id: str, *, payloads: bool = True
) -> dict[str, Any]:
    """The ``ng_model_call_capture`` object for one rollout, reading tolerantly.

    Bad lines, a missing or empty capture, the incomplete marker and a file that cannot be read
    at all each become a gap (``rollcap.records.GAP_*``); only an invalid id raises.
    """
    gaps: list[Gap] = []
    records: list[ModelCallRecord] = []
    try:
        available = store.read_available(rollout_id)
    except OSError as exc:
        gaps.append(_unreadable(exc))
    else:
        records = [ModelCallRecord.from_raw(raw, index) for index, raw in available.records]
        if available.bad_lines:
            gaps.append(Gap(GAP_RECORDS_UNREADABLE, f"count={available.bad_lines}"))
        if not records:
            gaps.append(Gap(GAP_NO_RECORDS))
    try:
        if store.is_incomplete(rollout_id):
            gaps.append(Gap(GAP_INCOMPLETE))
    except OSError as exc:
        gaps.append(_unreadable(exc))
    return build_attachment(rollout_id, records, gaps, payloads=payloads)


def _unreadable(exc: OSError) -> Gap:
    return Gap(GAP_UNREADABLE, f"{type(exc).__name__}: {exc.strerror or exc}")
