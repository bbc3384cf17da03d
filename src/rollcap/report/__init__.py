"""Seeing a run: the one-file HTML report, the same page served live, and OpenTelemetry export.

``build_report``/``write_report`` turn a capture directory (or an ``eval submit`` job
directory, found by ``find_run``) into one self-contained HTML file that opens offline;
``create_view_app`` serves the same page over a small JSON API that reads the files lazily.
The data model underneath (summary columns, per-call deltas, task-group divergence) is pure:
``digest_rollout``, ``build_summary``, ``thread_calls``, ``divergence``, and ``explain``, which
names what first differs between two rollouts of a task.

``export_otel(directory, rollouts=..., content=...)`` sends one trace per rollout attempt over
OTLP/HTTP (the ``otel`` extra: ``pip install 'rollcap[otel]'``; without it ``OtelUnavailable``)
and returns an ``OtelExportResult``. The mapping it uses is pure and needs no extra:
``rollout_spans`` turns one rollout's raw records into ``SpanData`` values, with ids derived from
the directory's run key (``run_key_of``) so that exporting twice gives the same ids.
"""

from rollcap.report._budget import DEFAULT_PAYLOAD_BUDGET, Budget, parse_size
from rollcap.report._delta import (
    CallThread,
    CanonicalCall,
    canonical_call,
    thread_calls,
)
from rollcap.report._diverge import divergence, explain
from rollcap.report._embed import REPORT_CSP, VIEW_CSP, pack, script_json, unpack
from rollcap.report._model import (
    RolloutDigest,
    RolloutInput,
    RolloutLine,
    build_summary,
    digest_rollout,
)
from rollcap.report._otel_export import (
    OTEL_INSTALL_HINT,
    RUN_KEY_FILE,
    OtelExportResult,
    OtelUnavailable,
    export_otel,
    read_rollout_infos,
    run_key_of,
)
from rollcap.report._otel_map import (
    ContentMode,
    ExportOptions,
    RolloutInfo,
    SpanData,
    SpanEventData,
    rollout_spans,
)
from rollcap.report._report import ReportStats, build_report, write_report
from rollcap.report._source import RunFiles, find_run
from rollcap.report._view import create_view_app

__all__ = [
    "DEFAULT_PAYLOAD_BUDGET",
    "OTEL_INSTALL_HINT",
    "REPORT_CSP",
    "RUN_KEY_FILE",
    "VIEW_CSP",
    "Budget",
    "CallThread",
    "CanonicalCall",
    "ContentMode",
    "ExportOptions",
    "OtelExportResult",
    "OtelUnavailable",
    "ReportStats",
    "RolloutDigest",
    "RolloutInfo",
    "RolloutInput",
    "RolloutLine",
    "RunFiles",
    "SpanData",
    "SpanEventData",
    "build_report",
    "build_summary",
    "canonical_call",
    "create_view_app",
    "digest_rollout",
    "divergence",
    "explain",
    "export_otel",
    "find_run",
    "pack",
    "parse_size",
    "read_rollout_infos",
    "rollout_spans",
    "run_key_of",
    "script_json",
    "thread_calls",
    "unpack",
    "write_report",
]
