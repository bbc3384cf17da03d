"""``rollcap capture report``: one self-contained HTML file from a run's files (I/O shell).

Rollouts are read one at a time, reduced by the pure model (``_model``) and packed
(``_embed``); only the summary columns and the packed blobs that fit the payload budget are
kept, so memory is bounded by the budget, not by the run. Payloads (each call's delta and
answer) and token views come first; raw streams take what is left and are the first to make
room. Whatever does not fit is left to the served view, and the page says so.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rollcap.report._budget import DEFAULT_PAYLOAD_BUDGET, Budget
from rollcap.report._diverge import GroupPairs
from rollcap.report._embed import REPORT_CSP, pack, render_page
from rollcap.report._model import RolloutDigest, build_summary, digest_rollout
from rollcap.report._source import (
    RunFiles,
    read_rollout,
    read_rollout_lines,
    read_tokens,
    rollout_order,
    valid_ids,
)
from rollcap.store import CaptureStore

__all__ = [
    "PageAssets",
    "ReportStats",
    "build_report",
    "load_assets",
    "write_page",
    "write_report",
]

_ASSET_FILES = {"html": "report.html", "css": "report.css", "js": "report.js"}


@dataclass(frozen=True, slots=True)
class PageAssets:
    """The page's hand-written HTML template, CSS and JavaScript (package data)."""

    html: str
    css: str
    js: str

    def page(self, data: Any, *, csp: str, title: str) -> str:
        return render_page(self.html, {"css": self.css, "js": self.js}, data, csp=csp, title=title)


def load_assets() -> PageAssets:
    folder = resources.files("rollcap.report").joinpath("assets")
    texts = {key: folder.joinpath(name).read_text("utf-8") for key, name in _ASSET_FILES.items()}
    return PageAssets(**texts)


@dataclass(frozen=True, slots=True)
class ReportStats:
    """What a report holds: counts, and the blobs left to the served view."""

    rollouts: int
    calls: int
    size: int
    payloads_embedded: int
    payloads_left_out: int
    raw_left_out: int
    tokens_embedded: int


def build_report(
    run: RunFiles,
    *,
    payload_budget: int = DEFAULT_PAYLOAD_BUDGET,
    assets: PageAssets | None = None,
) -> tuple[str, ReportStats]:
    """The report page of ``run`` and what it holds."""
    lines, notes = read_rollout_lines(run)
    store = CaptureStore(run.capture_dir)
    ids, bad_names = valid_ids(store.rollout_ids())
    notes.extend(bad_names)
    budget = Budget(payload_budget)
    digests: list[RolloutDigest] = []
    blobs: dict[str, dict[str, str]] = {"payloads": {}, "tokens": {}, "raw": {}}
    left_out = {"payloads": 0, "tokens": 0, "raw": 0}
    # A task's rollouts come one after another: each is compared as it comes with the ones of
    # its task that GroupPairs keeps, so memory holds a few rollouts' calls, not a group's.
    pairs: dict[int, dict[str, Any]] = {}
    task: int | None = None
    group = GroupPairs()
    for rollout_id in rollout_order(set(ids) | set(lines), lines):
        full = digest_rollout(read_rollout(store, rollout_id, lines.get(rollout_id)))
        digests.append(full.lean())  # the summary keeps no payload
        if full.row["task"] is not None:
            if full.row["task"] != task:
                task, group = full.row["task"], GroupPairs()
                pairs[task] = group.pairs
            group.add(full.shapes or [])
        wanted: list[tuple[str, Any, bool]] = [("payloads", full.payload, False)]
        if run.staging_dir is not None:
            tokens = read_tokens(run.staging_dir, rollout_id, ledger_dir=run.ledger_root)
            wanted.append(("tokens", tokens, False))
        if full.raw:
            wanted.append(("raw", full.raw, True))
        for kind, value, optional in wanted:
            if value is None:
                continue
            packed = pack(value)
            if budget.take((kind, rollout_id), len(packed), optional=optional):
                blobs[kind][rollout_id] = packed
            else:
                left_out[kind] += 1
            for dropped_kind, dropped_id in budget.evicted():
                del blobs[dropped_kind][dropped_id]
                left_out[dropped_kind] += 1
    store.close()
    summary = build_summary(digests, source=run.describe(), notes=notes, pairs=pairs)
    data = {
        "mode": "file",
        "summary": pack(summary),
        # The search's texts, one per rollout in the summary's order: apart from the summary,
        # so that the page is ready before they are decoded.
        "search": pack([d.text for d in digests]),
        **blobs,
        "budget": {"total": payload_budget, "left_out": left_out},
    }
    title = f"rollcap report: {run.capture_dir}"
    page = (assets or load_assets()).page(data, csp=REPORT_CSP, title=title)
    stats = ReportStats(
        rollouts=len(digests),
        calls=summary["run"]["calls"],
        size=len(page.encode()),
        payloads_embedded=len(blobs["payloads"]),
        payloads_left_out=left_out["payloads"],
        raw_left_out=left_out["raw"],
        tokens_embedded=len(blobs["tokens"]),
    )
    return page, stats


def write_report(
    run: RunFiles,
    output: str | os.PathLike[str],
    *,
    payload_budget: int = DEFAULT_PAYLOAD_BUDGET,
) -> ReportStats:
    """Build the report and write it to ``output`` whole (a reader never sees half a file)."""
    page, stats = build_report(run, payload_budget=payload_budget)
    write_page(page, output)
    return stats


def write_page(page: str, output: str | os.PathLike[str]) -> None:
    """Write ``page`` to ``output`` whole, mode 0600: a temporary file beside it, renamed over
    it, so that a reader never sees half a page and a failed write leaves no temporary."""
    target = Path(output)
    # Private (mkstemp's 0600) like the capture files: a page holds their prompts and answers.
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(page.encode())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
