"""``export_otel``: a capture directory's rollouts as OpenTelemetry GenAI traces, over OTLP/HTTP.

The I/O shell around ``_otel_map``: it reads the capture files with the tolerant reader (damaged
lines become ``rollcap.gap`` events, never a crash) and, when given, collection's rollouts file
and the failures file beside it; it keeps the directory's run key; it sends the spans rollout by
rollout in bounded chunks and counts what each chunk's result says. Memory holds one rollout's
records and one chunk of spans at a time, whatever the directory's size.

The run key is a UUID kept in ``<directory>/.rollcap-run-key``, written once (the first export
creates it) so that every later export of the directory, from any process, derives the same ids.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rollcap.records import GAP_INCOMPLETE, GAP_RECORDS_UNREADABLE, GAP_UNREADABLE, Gap
from rollcap.report._otel_map import (
    DEFAULT_MAX_CONTENT_BYTES,
    MAX_CHUNK_BYTES,
    MAX_SPANS_PER_CHUNK,
    ContentMode,
    ExportOptions,
    RolloutInfo,
    SpanData,
    chunked,
    rollout_spans,
)
from rollcap.report._source import jsonl_objects
from rollcap.store import CaptureStore

__all__ = [
    "GIVE_UP_AFTER",
    "OTEL_INSTALL_HINT",
    "RUN_KEY_FILE",
    "OtelExportResult",
    "OtelUnavailable",
    "export_otel",
    "read_rollout_infos",
    "run_key_of",
]

OTEL_INSTALL_HINT = "pip install 'rollcap[otel]'"
RUN_KEY_FILE = ".rollcap-run-key"
# Each failed chunk has already had the exporter's retries (up to its timeout, 10 s by default);
# a receiver that failed this many in a row is down or refusing, and would take as long again
# for every remaining chunk.
GIVE_UP_AFTER = 3


class OtelUnavailable(ValueError):
    """The ``otel`` extra is not installed. A ``ValueError``, so the CLI reports a usage error."""


class _Sender(Protocol):
    def send(self, spans: list[SpanData]) -> bool: ...

    def close(self) -> None: ...


def _sender() -> tuple[_Sender, str]:
    try:
        from rollcap.report._otel_sdk import SpanSender, traces_endpoint
    except ImportError as exc:
        raise OtelUnavailable(
            f"capture export-otel needs the OpenTelemetry SDK and OTLP exporter ({exc}); "
            f"install them with: {OTEL_INSTALL_HINT}"
        ) from None
    return SpanSender(), traces_endpoint()


@dataclass(frozen=True, slots=True)
class OtelExportResult:
    """What an export did.

    ``first_start_ns``/``last_end_ns`` bound the spans exported, sent or lost (``None`` when
    there were none); ``unplaced`` are rollouts none of whose calls has a time, ``uncaptured``
    rollouts of the rollouts file that have no capture file. ``chunks_unsent`` were not tried:
    the receiver had failed ``GIVE_UP_AFTER`` chunks in a row.
    """

    endpoint: str
    traces: int = 0
    spans_sent: int = 0
    spans_lost: int = 0
    chunks_sent: int = 0
    chunks_failed: int = 0
    chunks_unsent: int = 0
    first_start_ns: int | None = None
    last_end_ns: int | None = None
    unplaced: tuple[str, ...] = ()
    uncaptured: tuple[str, ...] = ()
    rollout_lines_unreadable: int = 0

    @property
    def ok(self) -> bool:
        return self.chunks_failed == 0 and self.chunks_unsent == 0


def run_key_of(directory: str | os.PathLike[str]) -> str:
    """The directory's run key, made and stored on first use.

    A concurrent first export cannot store a second key: the file appears whole, by a hard link,
    or not at all, and whoever loses the race reads the winner's.
    """
    path = Path(directory) / RUN_KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read_run_key(path)
    temporary = path.with_name(f"{RUN_KEY_FILE}.{uuid.uuid4().hex}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{uuid.uuid4()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    except PermissionError as exc:
        raise PermissionError(
            exc.errno, f"cannot store the run key in {directory} ({exc.strerror}); pass --run-key"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return _read_run_key(path)


def _read_run_key(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise ValueError(
            f"{path} does not hold a run key (a UUID): {text[:40]!r}; "
            "remove it, or pass --run-key to export with another key"
        ) from None


def read_rollout_infos(rollouts_path: str | os.PathLike[str]) -> tuple[dict[str, RolloutInfo], int]:
    """Each rollout attempt's ids, reward, agent and failure, from collection's rollouts file
    and, when it exists, the failures file beside it; and how many lines could not be read.

    A later line about the same rollout id wins. Only the few fields needed are kept, so the
    memory held is small per rollout even when the lines carry whole attachments.
    """
    # Here, not at the top: collection imports the HTTP stack, which no other command needs.
    from rollcap.collect import failures_path

    infos: dict[str, RolloutInfo] = {}
    unreadable = 0
    for path, required in ((Path(rollouts_path), True), (failures_path(rollouts_path), False)):
        if required and not path.is_file():
            raise FileNotFoundError(f"{path}: no such rollouts file")
        for obj in jsonl_objects(path):
            info = RolloutInfo.from_line(obj) if obj is not None else None
            if info is None:
                unreadable += 1
            else:
                infos[info.rollout_id] = info
    return infos, unreadable


@dataclass
class _Tally:
    traces: int = 0
    first_start_ns: int | None = None
    last_end_ns: int | None = None
    unplaced: list[str] = field(default_factory=list)


def _rollout_gaps(store: CaptureStore, rollout_id: str, bad_lines: int) -> list[Gap]:
    gaps = []
    if bad_lines:
        gaps.append(Gap(GAP_RECORDS_UNREADABLE, f"count={bad_lines}"))
    try:
        if store.is_incomplete(rollout_id):
            gaps.append(Gap(GAP_INCOMPLETE))
    except OSError as exc:
        gaps.append(Gap(GAP_UNREADABLE, f"{type(exc).__name__}: {exc.strerror or exc}"))
    return gaps


def _spans(
    store: CaptureStore,
    rollout_ids: list[str],
    options: ExportOptions,
    infos: dict[str, RolloutInfo],
    tally: _Tally,
) -> Iterator[SpanData]:
    for rollout_id in rollout_ids:
        available = store.read_available(rollout_id)
        capture_file = str(store.file_for(rollout_id).resolve())
        spans = rollout_spans(
            rollout_id,
            available.records,
            options,
            info=infos.get(rollout_id),
            gaps=_rollout_gaps(store, rollout_id, available.bad_lines),
            capture_file=capture_file,
        )
        if not spans:
            tally.unplaced.append(rollout_id)
            continue
        root = spans[0]
        tally.traces += 1
        if tally.first_start_ns is None or root.start_ns < tally.first_start_ns:
            tally.first_start_ns = root.start_ns
        if tally.last_end_ns is None or root.end_ns > tally.last_end_ns:
            tally.last_end_ns = root.end_ns
        yield from spans


def export_otel(
    directory: str | os.PathLike[str],
    *,
    rollouts: str | os.PathLike[str] | None = None,
    content: ContentMode = ContentMode.NONE,
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
    run_key: str | None = None,
    max_spans_per_chunk: int = MAX_SPANS_PER_CHUNK,
) -> OtelExportResult:
    """Export every rollout of the capture directory and say what arrived.

    ``run_key`` replaces the directory's stored key (nothing is written then). Raises
    ``OtelUnavailable`` without the ``otel`` extra, ``FileNotFoundError`` for a missing
    directory or rollouts file, before anything is sent.
    """
    sender, endpoint = _sender()
    try:
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"no capture directory {directory}")
        store = CaptureStore(directory)
        rollout_ids = store.rollout_ids()
        infos, unreadable = read_rollout_infos(rollouts) if rollouts is not None else ({}, 0)
        uncaptured = tuple(sorted(set(infos) - set(rollout_ids)))
        if not rollout_ids:
            return OtelExportResult(
                endpoint, uncaptured=uncaptured, rollout_lines_unreadable=unreadable
            )
        options = ExportOptions(
            run_key if run_key is not None else run_key_of(directory), content, max_content_bytes
        )
        tally = _Tally()
        sent = lost = chunks_sent = chunks_failed = chunks_unsent = failed_in_a_row = 0
        for chunk in chunked(
            _spans(store, rollout_ids, options, infos, tally), max_spans_per_chunk, MAX_CHUNK_BYTES
        ):
            if failed_in_a_row >= GIVE_UP_AFTER:
                lost += len(chunk)
                chunks_unsent += 1
            elif sender.send(chunk):
                sent += len(chunk)
                chunks_sent += 1
                failed_in_a_row = 0
            else:
                lost += len(chunk)
                chunks_failed += 1
                failed_in_a_row += 1
    finally:
        sender.close()
    return OtelExportResult(
        endpoint=endpoint,
        traces=tally.traces,
        spans_sent=sent,
        spans_lost=lost,
        chunks_sent=chunks_sent,
        chunks_failed=chunks_failed,
        chunks_unsent=chunks_unsent,
        first_start_ns=tally.first_start_ns,
        last_end_ns=tally.last_end_ns,
        unplaced=tuple(tally.unplaced),
        uncaptured=uncaptured,
        rollout_lines_unreadable=unreadable,
    )
