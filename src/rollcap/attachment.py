"""The rollout attachment, ``ng_model_call_capture``: built here, and only here.

``build_attachment`` makes it from normalized records and gaps (pure). ``capture_attachment``
reads one rollout's capture through the store it is handed, tolerantly: whatever cannot be read
becomes a gap rather than an error, because the attachment is evidence about a rollout, and a
damaged capture must not lose the rollout's own result. This module imports no I/O; the reads
are the store's (``rollcap.store``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rollcap.ids import validate_rollout_id
from rollcap.metrics import aggregate
from rollcap.records import (
    GAP_INCOMPLETE,
    GAP_NO_RECORDS,
    GAP_RECORDS_UNREADABLE,
    GAP_UNREADABLE,
    Gap,
    ModelCallRecord,
)

__all__ = [
    "CaptureRead",
    "CaptureSource",
    "build_attachment",
    "capture_attachment",
    "read_capture",
]


class _Available(Protocol):
    @property
    def records(self) -> list[tuple[int, dict[str, Any]]]: ...

    @property
    def bad_lines(self) -> int: ...


class CaptureSource(Protocol):
    """What an attachment reads: ``CaptureStore`` is one. Each may raise ``OSError``."""

    def has_capture(self, rollout_id: str) -> bool: ...

    def read_available(self, rollout_id: str) -> _Available: ...

    def is_incomplete(self, rollout_id: str) -> bool: ...


def build_attachment(
    rollout_id: str,
    records: Sequence[ModelCallRecord],
    gaps: Iterable[Gap] = (),
    *,
    payloads: bool = True,
    rounded: bool = True,
) -> dict[str, Any]:
    """The ``ng_model_call_capture`` object of one rollout; ``gaps`` is omitted when empty.

    ``rounded=False`` leaves the latency sum unrounded, as a rollout line carries it.
    """
    out: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate(records, rounded=rounded),
        "calls": [record.to_dict(payloads=payloads) for record in records],
    }
    gap_list = [gap.to_dict() for gap in gaps]
    if gap_list:
        out["gaps"] = gap_list
    return out


@dataclass(frozen=True, slots=True)
class CaptureRead:
    """What a tolerant read of one rollout's capture found.

    ``store_found``: the capture file or its incomplete marker exists. ``read_failed``: reading
    it raised. ``bad_lines``: lines that are not a JSON object or do not make a call record.
    ``incomplete``: the marker exists. ``calls``: the records that were read, in capture order.
    """

    store_found: bool
    read_failed: bool = False
    bad_lines: int = 0
    incomplete: bool = False
    calls: Sequence[ModelCallRecord] = ()

    def gaps(self) -> list[Gap]:
        """The capture's gaps, in their fixed order.

        No store (neither the file nor the incomplete marker) is ``no_records`` alone.
        Otherwise: ``unreadable`` when reading raised (nothing else was read, so neither bad
        lines nor ``no_records`` follow); ``records_unreadable`` with ``count=N`` for N bad
        lines; ``incomplete`` when the marker exists; and ``no_records`` only when there is no
        marker, no call and no bad line, so a marker-only capture is ``[incomplete]`` and a file
        of bad lines is ``[records_unreadable]``.
        """
        if not self.store_found:
            return [Gap(GAP_NO_RECORDS)]
        gaps: list[Gap] = []
        if self.read_failed:
            gaps.append(Gap(GAP_UNREADABLE))
        elif self.bad_lines > 0:
            gaps.append(Gap(GAP_RECORDS_UNREADABLE, f"count={self.bad_lines}"))
        if self.incomplete:
            gaps.append(Gap(GAP_INCOMPLETE))
        elif not self.read_failed and not self.calls and self.bad_lines == 0:
            gaps.append(Gap(GAP_NO_RECORDS))
        return gaps


def read_capture(store: CaptureSource, rollout_id: str) -> CaptureRead:
    """Read one rollout's capture tolerantly: never raises for what it finds (only an invalid
    id raises). A read that fails is ``read_failed``; a line that makes no call record is a bad
    line.

    The file is read once and the marker looked at once; whether the capture exists at all
    (``has_capture``) is asked only when neither answered it: no line and no marker.
    """
    validate_rollout_id(rollout_id)
    try:
        available: _Available | None = store.read_available(rollout_id)
    except Exception:
        available = None
    incomplete = marker_failed = False
    try:
        incomplete = store.is_incomplete(rollout_id)
    except OSError:
        marker_failed = True
    lines = available is not None and bool(available.records or available.bad_lines)
    if not (lines or incomplete) and not store.has_capture(rollout_id):
        return CaptureRead(store_found=False)
    if available is None or marker_failed:
        return CaptureRead(store_found=True, read_failed=True, incomplete=incomplete)
    calls: list[ModelCallRecord] = []
    bad_lines = available.bad_lines
    for index, raw in available.records:
        try:
            calls.append(ModelCallRecord.from_raw(raw, index))
        except Exception:
            bad_lines += 1
    return CaptureRead(True, False, bad_lines, incomplete, tuple(calls))


def capture_attachment(
    store: CaptureSource, rollout_id: str, *, payloads: bool = True
) -> dict[str, Any]:
    """The ``ng_model_call_capture`` object for one rollout, reading tolerantly.

    Bad lines, a missing or empty capture, the incomplete marker and a file that cannot be read
    at all each become a gap (``CaptureRead.gaps``); only an invalid id raises.
    """
    read = read_capture(store, rollout_id)
    return build_attachment(rollout_id, read.calls, read.gaps(), payloads=payloads)
