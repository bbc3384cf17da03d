"""Seeing a run: the one-file HTML report and the same page served live.

``build_report``/``write_report`` turn a capture directory (or an ``eval submit`` job
directory, found by ``find_run``) into one self-contained HTML file that opens offline;
``create_view_app`` serves the same page over a small JSON API that reads the files lazily.
The data model underneath (summary columns, per-call deltas, task-group divergence) is pure:
``digest_rollout``, ``build_summary``, ``thread_calls``, ``divergence``.
"""

from rollcap.report._budget import DEFAULT_PAYLOAD_BUDGET, Budget, parse_size
from rollcap.report._delta import (
    CallThread,
    CanonicalCall,
    canonical_call,
    divergence,
    thread_calls,
)
from rollcap.report._embed import REPORT_CSP, VIEW_CSP, pack, script_json, unpack
from rollcap.report._model import (
    RolloutDigest,
    RolloutInput,
    RolloutLine,
    build_summary,
    digest_rollout,
)
from rollcap.report._report import ReportStats, build_report, write_report
from rollcap.report._source import RunFiles, find_run
from rollcap.report._view import create_view_app

__all__ = [
    "DEFAULT_PAYLOAD_BUDGET",
    "REPORT_CSP",
    "VIEW_CSP",
    "Budget",
    "CallThread",
    "CanonicalCall",
    "ReportStats",
    "RolloutDigest",
    "RolloutInput",
    "RolloutLine",
    "RunFiles",
    "build_report",
    "build_summary",
    "canonical_call",
    "create_view_app",
    "digest_rollout",
    "divergence",
    "find_run",
    "pack",
    "parse_size",
    "script_json",
    "thread_calls",
    "unpack",
    "write_report",
]
