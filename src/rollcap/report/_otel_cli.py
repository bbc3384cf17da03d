"""``rollcap capture export-otel``: its arguments, and what it prints.

Exit codes as for every command: 0 when every chunk arrived, 1 when any was lost (the counts are
printed), 2 for bad usage, a missing ``otel`` extra included.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence

from rollcap.report._otel_export import GIVE_UP_AFTER, OtelExportResult, export_otel
from rollcap.report._otel_map import DEFAULT_MAX_CONTENT_BYTES, ContentMode

__all__ = ["add_export_otel_command", "format_export", "run_export_otel"]

_LISTED = 5


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_export_otel_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "export-otel",
        help="send the rollouts as OpenTelemetry GenAI traces over OTLP/HTTP",
        description=(
            "One trace per rollout attempt: an invoke_agent span and one chat span per call. "
            "Endpoint, headers, timeout and compression come from the standard "
            "OTEL_EXPORTER_OTLP_* variables (default http://localhost:4318)."
        ),
    )
    parser.add_argument("directory", help="the capture directory (model_call_capture_dir)")
    parser.add_argument(
        "--rollouts",
        metavar="R.jsonl",
        help="collection's output: adds task, attempt, reward, agent and failures to the traces",
    )
    parser.add_argument(
        "--content",
        choices=[mode.value for mode in ContentMode],
        default=ContentMode.NONE.value,
        help="none (default): no messages; full: messages, answers and tool definitions; "
        "ref: the capture file and line that hold them",
    )
    parser.add_argument(
        "--max-content-bytes",
        type=_at_least_one,
        default=DEFAULT_MAX_CONTENT_BYTES,
        metavar="N",
        help=f"with --content full, the cap per attribute (default {DEFAULT_MAX_CONTENT_BYTES})",
    )
    parser.add_argument(
        "--run-key",
        metavar="K",
        help="derive ids from K instead of the directory's stored key (.rollcap-run-key)",
    )


def _time(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_LISTED])
    return shown + (f" and {len(ids) - _LISTED} more" if len(ids) > _LISTED else "")


def format_export(result: OtelExportResult) -> tuple[list[str], list[str]]:
    """The lines for stdout and for stderr."""
    out: list[str] = []
    err: list[str] = []
    total = result.spans_sent + result.spans_lost
    traces = f"{result.traces} trace" + ("" if result.traces == 1 else "s")
    out.append(f"sent {result.spans_sent} of {total} spans ({traces}) to {result.endpoint}")
    if result.spans_sent and result.first_start_ns is not None and result.last_end_ns is not None:
        out.append(
            f"spans from {_time(result.first_start_ns)} to {_time(result.last_end_ns)}: "
            "widen your viewer's time range to see them"
        )
    if result.unplaced:
        err.append(
            f"not exported, no call has a time: {len(result.unplaced)} rollouts "
            f"({_ids(result.unplaced)})"
        )
    if result.uncaptured:
        err.append(
            f"in the rollouts file but without a capture file: {len(result.uncaptured)} "
            f"rollouts ({_ids(result.uncaptured)})"
        )
    if result.rollout_lines_unreadable:
        err.append(f"unreadable lines in the rollouts files: {result.rollout_lines_unreadable}")
    if not result.ok:
        chunks = result.chunks_sent + result.chunks_failed + result.chunks_unsent
        unsent = (
            f", {result.chunks_unsent} more not sent after {GIVE_UP_AFTER} failures in a row"
            if result.chunks_unsent
            else ""
        )
        err.append(
            f"rollcap: error: {result.chunks_failed} of {chunks} chunks failed{unsent}: "
            f"{result.spans_lost} spans lost"
        )
    return out, err


def run_export_otel(args: argparse.Namespace) -> int:
    result = export_otel(
        args.directory,
        rollouts=args.rollouts,
        content=ContentMode(args.content),
        max_content_bytes=args.max_content_bytes,
        run_key=args.run_key,
    )
    if result.traces == 0 and result.spans_lost == 0:
        print(f"no rollouts with captured calls in {args.directory}: nothing sent", file=sys.stderr)
    out, err = format_export(result)
    for line in out if result.traces else ():
        print(line)
    for line in err:
        print(line, file=sys.stderr)
    return 0 if result.ok else 1
