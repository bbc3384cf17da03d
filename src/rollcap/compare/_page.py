"""``rollcap capture report A --compare B``: a comparison as one self-contained HTML page (I/O
shell).

The page is the run report's page (``report.js``) in its compare mode. It embeds the comparison
document and, for each side, the rollouts of the matched tasks as the report digests them
(``digest_rollout``): their rows and call columns in the report's summary form
(``build_summary``), and under the payload budget their payloads (each call's delta and
answer) and, with what is left, their raw texts. Tasks are read worst change first (the
document's order), A's rollouts of a task then B's, so that when the budget runs out the tasks a
reader opens first keep their transcripts; the page names every payload left out. One rollout
is read at a time and only its lean digest is kept, as ``build_report`` does.

A benchmark read without a capture directory (``Benchmark.capture_dir`` is ``None``) has its
rollouts' figures from the rollouts file only: the page shows them and says that no capture was
found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from rollcap.compare._compare import paired_benchmarks, task_pairs
from rollcap.compare._model import Benchmark, Side, Task
from rollcap.compare._runs import run_files
from rollcap.ids import ROLLOUT_ID_PATTERN
from rollcap.records import Gap
from rollcap.report._budget import DEFAULT_PAYLOAD_BUDGET, Budget
from rollcap.report._embed import REPORT_CSP, pack
from rollcap.report._model import RolloutDigest, RolloutLine, build_summary, digest_rollout
from rollcap.report._report import PageAssets, load_assets, write_page
from rollcap.report._source import RunFiles, read_rollout, read_rollout_lines
from rollcap.store import CaptureStore

__all__ = [
    "PAGE_MODE",
    "SIDES",
    "CompareReportStats",
    "Compared",
    "build_compare_report",
    "write_compare_report",
]

PAGE_MODE = "compare"
SIDES = ("a", "b")
# Why a rollout of a matched task has no digest on the page (its ``unread``).
UNREAD_NO_CAPTURE = "no_capture_dir"
UNREAD_NO_ID = "no_rollout_id"


@dataclass(frozen=True, slots=True)
class CompareReportStats:
    """What a compare page holds, over the matched tasks' rollouts of both sides."""

    tasks: int
    rollouts: int
    calls: int
    size: int
    payloads_embedded: int
    payloads_left_out: int
    raw_left_out: int
    no_capture: int  # rollouts of a benchmark read without a capture directory


class Compared(Protocol):
    """What the page reads of a ``Comparison`` (named so: the package imports this module)."""

    @property
    def a(self) -> Side: ...
    @property
    def b(self) -> Side: ...
    @property
    def data(self) -> dict[str, Any]: ...


TaskSide = tuple[Benchmark, Task]


def _matched_tasks(comparison: Compared) -> dict[str, tuple[TaskSide, TaskSide]]:
    """Each matched task's two sides, by the document's task id, paired as the comparison
    paired them."""
    out: dict[str, tuple[TaskSide, TaskSide]] = {}
    paired, _, _ = paired_benchmarks(comparison.a, comparison.b)
    for _, x, y in paired:
        for ta, tb in task_pairs(x, y):
            out[ta.id] = ((x, ta), (y, tb))
    return out


class _Captures:
    """One side's capture directories, each opened (with its rollouts file's lines) when first
    read from; ``close`` closes them all."""

    def __init__(self) -> None:
        self._open: dict[RunFiles, tuple[CaptureStore, dict[str, RolloutLine]]] = {}
        self.notes: list[Gap] = []

    def digest(self, run: RunFiles, rollout_id: str) -> RolloutDigest:
        opened = self._open.get(run)
        if opened is None:
            lines, notes = read_rollout_lines(run)
            self.notes.extend(notes)
            opened = self._open[run] = (CaptureStore(run.capture_dir), lines)
        store, lines = opened
        return digest_rollout(read_rollout(store, rollout_id, lines.get(rollout_id)))

    def close(self) -> None:
        for store, _ in self._open.values():
            store.close()


class _Blobs:
    """The packed payloads and raw texts of both sides under one budget, and what it left out."""

    def __init__(self, total: int) -> None:
        self.budget = Budget(total)
        self.kept: dict[str, dict[str, dict[str, str]]] = {
            side: {"payloads": {}, "raw": {}} for side in SIDES
        }
        self.left_out: dict[str, list[str]] = {side: [] for side in SIDES}  # payloads' slots
        self.raw_left_out = 0

    def offer(self, side: str, slot: str, digest: RolloutDigest) -> None:
        wanted = (("payloads", digest.payload, False), ("raw", digest.raw or None, True))
        for kind, value, optional in wanted:
            if value is None:
                continue
            packed = pack(value)
            # The budget's keys are pairs: the side rides in the second, before the slot.
            if self.budget.take((kind, f"{side}/{slot}"), len(packed), optional=optional):
                self.kept[side][kind][slot] = packed
            else:
                self._leave_out(kind, side, slot)
            for dropped_kind, dropped in self.budget.evicted():
                dropped_side, _, dropped_slot = dropped.partition("/")
                del self.kept[dropped_side][dropped_kind][dropped_slot]
                self._leave_out(dropped_kind, dropped_side, dropped_slot)

    def _leave_out(self, kind: str, side: str, slot: str) -> None:
        if kind == "payloads":
            self.left_out[side].append(slot)
        else:
            self.raw_left_out += 1


def build_compare_report(
    comparison: Compared,
    *,
    payload_budget: int = DEFAULT_PAYLOAD_BUDGET,
    assets: PageAssets | None = None,
) -> tuple[str, CompareReportStats]:
    """The compare page of ``comparison`` (module doc) and what it holds.

    Each side's ``rollouts`` maps a matched task's id to its rollouts there, in the rollouts
    file's order: ``slot`` (``<task id>/<n>``, the key of its blobs: rollout ids repeat between
    the sides and between benchmarks), ``id``, ``benchmark``, ``figures`` and ``failed`` (the
    rollouts file's), ``capture`` (the capture directory, or ``None``), ``row`` (its index in the
    side's ``summary``, or ``None`` when it was not read: ``unread`` says why)."""
    doc = comparison.data
    matched = _matched_tasks(comparison)
    blobs = _Blobs(payload_budget)
    captures = {side: _Captures() for side in SIDES}
    digests: dict[str, list[RolloutDigest]] = {side: [] for side in SIDES}
    rollouts: dict[str, dict[str, list[dict[str, Any]]]] = {side: {} for side in SIDES}
    no_capture = 0
    try:
        for change in doc["overall"]["changes"]:
            task_id = change["id"]
            for side, (bench, task) in zip(SIDES, matched[task_id], strict=True):
                run = run_files(bench)
                entries = rollouts[side][task_id] = []
                for n, figures in enumerate(task.rollouts):
                    slot = f"{task_id}/{n}"
                    entry: dict[str, Any] = {
                        "slot": slot,
                        "id": figures.rollout_id,
                        "benchmark": bench.name,
                        "figures": figures.figures,
                        "failed": figures.failed,
                        "capture": bench.capture_dir,
                        "row": None,
                    }
                    entries.append(entry)
                    rollout_id = figures.rollout_id
                    if run is None:
                        entry["unread"] = UNREAD_NO_CAPTURE
                        no_capture += 1
                        continue
                    if rollout_id is None or not ROLLOUT_ID_PATTERN.match(rollout_id):
                        entry["unread"] = UNREAD_NO_ID
                        continue
                    full = captures[side].digest(run, rollout_id)
                    entry["row"] = len(digests[side])
                    digests[side].append(full.lean())  # the summary keeps no payload
                    blobs.offer(side, slot, full)
    finally:
        for reader in captures.values():
            reader.close()
    sides: dict[str, Any] = {}
    calls = 0
    for side, read in zip(SIDES, (comparison.a, comparison.b), strict=True):
        source = {"source": read.source, "capture_dirs": [b.capture_dir for b in read.benchmarks]}
        summary = build_summary(digests[side], source=source, notes=captures[side].notes)
        calls += summary["run"]["calls"]
        sides[side] = {
            "summary": pack(summary),
            "rollouts": pack(rollouts[side]),
            **blobs.kept[side],
        }
    data = {
        "mode": PAGE_MODE,
        "comparison": pack(doc),
        "sides": sides,
        "budget": {
            "total": payload_budget,
            "left_out": blobs.left_out,
            "raw_left_out": blobs.raw_left_out,
        },
    }
    title = f"rollcap compare: {comparison.a.source} vs {comparison.b.source}"
    page = (assets or load_assets()).page(data, csp=REPORT_CSP, title=title)
    stats = CompareReportStats(
        tasks=len(doc["overall"]["changes"]),
        rollouts=sum(len(e) for side in SIDES for e in rollouts[side].values()),
        calls=calls,
        size=len(page.encode()),
        payloads_embedded=sum(len(blobs.kept[side]["payloads"]) for side in SIDES),
        payloads_left_out=sum(len(blobs.left_out[side]) for side in SIDES),
        raw_left_out=blobs.raw_left_out,
        no_capture=no_capture,
    )
    return page, stats


def write_compare_report(
    comparison: Compared,
    output: str | os.PathLike[str],
    *,
    payload_budget: int = DEFAULT_PAYLOAD_BUDGET,
) -> CompareReportStats:
    """Build the compare page and write it to ``output`` whole, mode 0600 (``write_page``)."""
    page, stats = build_compare_report(comparison, payload_budget=payload_budget)
    write_page(page, output)
    return stats
