"""The report's data model, built from capture records and rollout lines (pure).

One ``RolloutInput`` per rollout (what the tolerant reader found, and the rollout's line from
the rollouts file) becomes a ``RolloutDigest``: a summary row, one compact row per call, the
calls' request signatures (for the task-group divergence) and, when asked for, the rollout's
payload (each call's delta and answer) and raw texts. ``build_summary`` assembles the digests
into the page's summary: columns rather than objects, so 80,000 calls stay a few megabytes.

Every figure follows the capture format's rule: unknown stays ``None``, never 0.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap.records import (
    GAP_INCOMPLETE,
    GAP_NO_RECORDS,
    GAP_RECORDS_UNREADABLE,
    GAP_UNREADABLE,
    Gap,
    ModelCallRecord,
    is_streamed,
)
from rollcap.report._delta import CanonicalCall, canonical_call, thread_calls
from rollcap.report._diverge import CallShape, align, divergence, shape_calls
from rollcap.report._facts import facts_text, line_facts, message_text

__all__ = [
    "CALL_COLUMNS",
    "DIVERGENCE_MAX_ROWS",
    "ROLLOUT_COLUMNS",
    "SUMMARY_SCHEMA",
    "RolloutDigest",
    "RolloutInput",
    "RolloutLine",
    "build_summary",
    "call_shapes",
    "digest_rollout",
    "matches_search",
    "rollout_line_info",
    "search_text",
    "task_of",
]

SUMMARY_SCHEMA = 2
SEARCH_TEXT_MAX = 8192
SEARCH_PIECE_MAX = 1024
# Groups larger than this get their divergence from the first rollout only: a full matrix
# grows with the square of the group.
DIVERGENCE_MAX_ROWS = 64

ROLLOUT_COLUMNS = (
    "id",
    "task",
    "rollout",
    "attempt",
    "reward",
    "failure",
    "calls",
    "t0",
    "wall_ms",
    "latency_ms",
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "cached_tokens",
    "ttft_p50",
    "errors",
    "gaps",
    "finish",
)
# Per call: start (ms after the rollout's first call started), latency, TTFT (streamed calls
# only), streamed, token counts, HTTP status, error category and finish reason (indexes into
# the summary's tables), tool calls made, gaps.
CALL_COLUMNS = (
    "start",
    "latency",
    "ttft",
    "stream",
    "tin",
    "tout",
    "treason",
    "cached",
    "status",
    "err",
    "finish",
    "tools",
    "gaps",
)

_ROLLOUT_ID = re.compile(r"(\d+)-(\d+)(?:-a(\d+))?\Z")


@dataclass(frozen=True, slots=True)
class RolloutLine:
    """What the rollouts file (or its failures file) says of one rollout."""

    task: int | None = None
    rollout: int | None = None
    attempt: int | None = None
    reward: float | None = None
    failure: str | None = None
    # ``_facts.line_facts`` as JSON: bytes, so that a line stays hashable and comparable.
    facts: bytes | None = None


def _index(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def rollout_line_info(line: Mapping[str, Any]) -> tuple[str, RolloutLine] | None:
    """The rollout id and facts of one rollouts-file or failures-file line; ``None`` without
    an id. A failure line's ``error`` becomes ``failure`` (``kind: message``)."""
    rollout_id = line.get("rollout_id")
    if not isinstance(rollout_id, str):
        return None
    reward = line.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        reward = None
    failure: str | None = None
    error = line.get("error")
    if isinstance(error, Mapping):
        kind, message = error.get("kind"), error.get("message")
        failure = ": ".join(str(part) for part in (kind, message) if part is not None) or "failed"
    return rollout_id, RolloutLine(
        task=_index(line.get("_ng_task_index")),
        rollout=_index(line.get("_ng_rollout_index")),
        attempt=_index(line.get("_ng_attempt_index")),
        reward=None if reward is None else float(reward),
        failure=failure,
        facts=None if failure is not None else orjson.dumps(line_facts(line)),
    )


def task_of(rollout_id: str, line: RolloutLine | None) -> tuple[int | None, int | None, int]:
    """Task, rollout and attempt index: from the line when known, else from an id of the form
    ``<task>-<rollout>[-a<n>]``."""
    match = _ROLLOUT_ID.match(rollout_id)
    task = rollout = None
    attempt = 0
    if match is not None:
        task, rollout = int(match[1]), int(match[2])
        attempt = int(match[3] or 0)
    if line is not None:
        task = line.task if line.task is not None else task
        rollout = line.rollout if line.rollout is not None else rollout
        attempt = line.attempt if line.attempt is not None else attempt
    return task, rollout, attempt


@dataclass(frozen=True, slots=True)
class RolloutInput:
    """One rollout as read: ``(line_index, raw record)`` pairs and what could not be read."""

    rollout_id: str
    records: Sequence[tuple[int, Mapping[str, Any]]] = ()
    bad_lines: int = 0
    incomplete: bool = False
    read_error: str | None = None
    line: RolloutLine | None = None


@dataclass(frozen=True, slots=True)
class RolloutDigest:
    """A rollout reduced to what the page needs; ``payload`` and ``raw`` only when asked."""

    rollout_id: str
    row: dict[str, Any]
    calls: list[tuple[Any, ...]]
    # (position, signature) of the calls the divergence aligns (retries left out).
    aligned: list[tuple[int, bytes]]
    text: str = ""
    payload: dict[str, Any] | None = None
    raw: dict[str, Any] | None = None
    shapes: list[CallShape] | None = None

    def lean(self) -> RolloutDigest:
        """This digest without its payload, raw texts and shapes (what a summary keeps)."""
        return RolloutDigest(self.rollout_id, self.row, self.calls, self.aligned, self.text)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _rollout_gaps(source: RolloutInput, has_records: bool) -> list[Gap]:
    gaps: list[Gap] = []
    if source.read_error is not None:
        gaps.append(Gap(GAP_UNREADABLE, source.read_error))
    elif source.bad_lines:
        gaps.append(Gap(GAP_RECORDS_UNREADABLE, f"count={source.bad_lines}"))
    if not has_records and source.read_error is None:
        gaps.append(Gap(GAP_NO_RECORDS))
    if source.incomplete:
        gaps.append(Gap(GAP_INCOMPLETE))
    return gaps


def _call_gaps(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    gaps = record.get("gaps")
    if not isinstance(gaps, list):
        return []
    return [g for g in gaps if isinstance(g, Mapping)]


def _read_calls(source: RolloutInput) -> tuple[list[ModelCallRecord], list[CanonicalCall]]:
    records = [ModelCallRecord.from_raw(raw, index) for index, raw in source.records]
    canon: list[CanonicalCall] = []
    for r in records:
        canon.append(
            canonical_call(r.dialect, r.request, r.response, previous=canon[-1] if canon else None)
        )
    return records, canon


def _shapes(records: Sequence[ModelCallRecord], canon: Sequence[CanonicalCall]) -> list[CallShape]:
    return shape_calls(canon, [(r.error_category, r.status_code) for r in records])


def call_shapes(source: RolloutInput) -> list[CallShape]:
    """What comparing the rollout with another needs of its calls (``_diverge``), alone."""
    return _shapes(*_read_calls(source))


def digest_rollout(source: RolloutInput, *, payload: bool = True) -> RolloutDigest:
    """Reduce one rollout; ``payload`` also builds its payload, raw texts and call shapes."""
    records, canon = _read_calls(source)
    raws = [raw for _, raw in source.records]
    threads = thread_calls(canon)
    shapes = _shapes(records, canon)
    kept, retries = align(shapes)
    facts = orjson.loads(source.line.facts) if source.line and source.line.facts else None
    rollout_gaps = _rollout_gaps(source, bool(records))
    t0 = min((r.started_at for r in records), default=None)
    end = max((r.completed_at for r in records), default=None)
    calls: list[tuple[Any, ...]] = []
    ttfts: list[float] = []
    gap_codes = [g.code for g in rollout_gaps]
    finishes: list[str] = []
    for record, raw in zip(records, raws, strict=True):
        stream = is_streamed(record.request, raw.get("transport"))
        ttft = record.latency_ttft_ms if stream else None
        if ttft is not None:
            ttfts.append(ttft)
        codes = [str(g.get("code")) for g in _call_gaps(raw)]
        gap_codes.extend(c for c in codes if c not in gap_codes)
        if record.finish_reason is not None and record.finish_reason not in finishes:
            finishes.append(record.finish_reason)
        calls.append(
            (
                _ms((record.started_at - t0) * 1000 if t0 is not None else None),
                _ms(record.latency_total_ms),
                _ms(ttft),
                1 if stream else 0,
                record.tokens_in,
                record.tokens_out,
                record.tokens_reasoning,
                record.cached_tokens,
                record.status_code,
                record.error_category,
                record.finish_reason,
                len(record.tool_calls),
                len(codes),
            )
        )
    task, rollout, attempt = task_of(source.rollout_id, source.line)
    line = source.line or RolloutLine()
    latencies = [r.latency_total_ms for r in records if r.latency_total_ms is not None]
    row: dict[str, Any] = {
        "id": source.rollout_id,
        "task": task,
        "rollout": rollout,
        "attempt": attempt,
        "reward": line.reward,
        "failure": line.failure,
        "calls": len(records),
        "t0": t0,
        "wall_ms": _ms((end - t0) * 1000) if t0 is not None and end is not None else None,
        "latency_ms": _ms(sum(latencies)) if latencies else None,
        "tokens_in": _sum(r.tokens_in for r in records),
        "tokens_out": _sum(r.tokens_out for r in records),
        "tokens_reasoning": _sum(r.tokens_reasoning for r in records),
        "cached_tokens": _sum(r.cached_tokens for r in records),
        "ttft_p50": _ms(statistics.median(ttfts)) if ttfts else None,
        "errors": sum(1 for r in records if r.error_category is not None),
        "gaps": gap_codes,
        "finish": finishes,
    }
    built: dict[str, Any] | None = None
    raw_texts: dict[str, Any] | None = None
    if payload:
        built = {
            "rollout_id": source.rollout_id,
            "gaps": [g.to_dict() for g in rollout_gaps],
            "facts": facts,
            "calls": _payload_calls(records, raws, canon, threads),
        }
        for retry in retries:
            built["calls"][retry.failed]["retry"] = retry.retry
            built["calls"][retry.retry]["retry_of"] = retry.failed
        raw_texts = {
            str(position): {
                key: getattr(record, key)
                for key in ("request_raw", "response_raw")
                if getattr(record, key) is not None
            }
            for position, record in enumerate(records)
            if record.request_raw is not None or record.response_raw is not None
        }
    return RolloutDigest(
        rollout_id=source.rollout_id,
        row=row,
        calls=calls,
        aligned=[(shape.position, shape.signature) for shape in kept],
        text=search_text(facts, canon, threads),
        payload=built,
        raw=raw_texts,
        shapes=shapes if payload else None,
    )


def _texts_of(message: Any) -> list[str]:
    out = [message_text(message)]
    if isinstance(message, Mapping):
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                out.append(f"{function.get('name')} {function.get('arguments')}")
    return out


def matches_search(text: str, query: str) -> bool:
    """Whether ``text`` (a ``search_text``) holds every whitespace-separated word of ``query``,
    ignoring case; an empty query matches."""
    return all(word in text for word in query.lower().split())


def search_text(
    facts: Mapping[str, Any] | None,
    canon: Sequence[CanonicalCall],
    threads: Sequence[Any],
) -> str:
    """What the page's search looks in, lowercased: the line's answer, expected answer,
    verifier fields and prompt, then each call's answer and the messages it added (tool
    results among them); at most ``SEARCH_TEXT_MAX`` characters, each piece at most
    ``SEARCH_PIECE_MAX``."""
    pieces: list[str] = list(facts_text(facts)) if facts else []
    for call, thread in zip(canon, threads, strict=True):
        for message in call.answer:
            pieces.extend(_texts_of(message))
        for message in thread.new:
            pieces.extend(_texts_of(message))
    out: list[str] = []
    size = 0
    for piece in pieces:
        if not piece:
            continue
        piece = piece[:SEARCH_PIECE_MAX].lower()
        out.append(piece)
        size += len(piece) + 1
        if size >= SEARCH_TEXT_MAX:
            break
    return "\n".join(out)[:SEARCH_TEXT_MAX]


_USAGE_KEYS = (
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "tokens_total",
    "cached_tokens",
    "cache_creation_tokens",
)


def _payload_calls(
    records: Sequence[ModelCallRecord],
    raws: Sequence[Mapping[str, Any]],
    canon: Sequence[Any],
    threads: Sequence[Any],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    stored: dict[str, dict[bytes, int]] = {}
    for position, (record, raw, call, thread) in enumerate(
        zip(records, raws, canon, threads, strict=True)
    ):
        item: dict[str, Any] = {
            "id": record.model_call_id,
            "line": record.call_index,
            "dialect": record.dialect,
            "model": record.model,
            "parent": thread.parent,
            "keep": thread.keep,
            "new": thread.new,
            "answer": call.answer,
            "reasoning": record.reasoning_content,
            "usage": {key: getattr(record, key) for key in _USAGE_KEYS},
            "finish_reason": record.finish_reason,
            "response_status": record.response_status,
            "response_id": record.response_id,
            "status_code": record.status_code,
            "error_category": record.error_category,
            "gaps": _call_gaps(raw),
            "session": record.client_session_id,
            "stream": is_streamed(record.request, raw.get("transport")),
            "raw": record.request_raw is not None or record.response_raw is not None,
        }
        # Times are in the summary's call columns; tool calls are in the answer's messages
        # unless the answer could not be read as messages.
        if record.tool_calls and not any(m.get("tool_calls") for m in call.answer):
            item["tool_calls"] = record.tool_calls
        # Parameters, and tool definitions above all, mostly repeat from call to call: each
        # distinct value is stored once, later calls name the call that holds it.
        params = dict(call.params)
        tools = params.pop("tools", None)
        for key, value in (("params", params), ("tools", tools)):
            if value is None:
                continue
            known = stored.setdefault(key, {})
            fingerprint = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
            if fingerprint in known:
                item[f"{key}_ref"] = known[fingerprint]
            else:
                known[fingerprint] = position
                item[key] = value
        if call.request_error is not None:
            item["request_error"] = call.request_error
            item["request"] = record.request
        if call.answer_error is not None and record.response is not None:
            item["answer_error"] = call.answer_error
        failed = record.error_category is not None or (record.status_code or 0) >= 400
        if record.response is not None and (failed or call.answer_error is not None):
            item["response"] = record.response
        out.append(item)
    return out


class _Table:
    """Strings stored once; the columns hold their indexes."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, value: str | None) -> int | None:
        if value is None:
            return None
        found = self._index.get(value)
        if found is None:
            found = self._index[value] = len(self.values)
            self.values.append(value)
        return found


def build_summary(
    digests: Sequence[RolloutDigest],
    *,
    source: Mapping[str, Any],
    notes: Sequence[Gap] = (),
    pairs: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The page's summary of a run: rollout and call columns, task groups, run totals.

    Rollouts keep the order given; their calls follow one another in the call columns, as many
    as each rollout's ``calls``. ``notes`` are problems of the run as a whole (an unreadable
    line of the rollouts file, a file name that is no rollout id). ``pairs`` are the task
    groups' explained divergences (``GroupPairs.pairs``, by task), kept in their groups.
    """
    errors, finishes = _Table(), _Table()
    rollouts: dict[str, list[Any]] = {name: [] for name in ROLLOUT_COLUMNS}
    calls: dict[str, list[Any]] = {name: [] for name in CALL_COLUMNS}
    error_counts: dict[str, int] = {}
    gap_counts: dict[str, int] = {}
    for digest in digests:
        for name in ROLLOUT_COLUMNS:
            rollouts[name].append(digest.row[name])
        for code in digest.row["gaps"]:
            gap_counts[code] = gap_counts.get(code, 0) + 1
        for call in digest.calls:
            values = dict(zip(CALL_COLUMNS, call, strict=True))
            category = values["err"]
            if category is not None:
                error_counts[category] = error_counts.get(category, 0) + 1
            values["err"] = errors(category)
            values["finish"] = finishes(values["finish"])
            for name in CALL_COLUMNS:
                calls[name].append(values[name])
    groups = _groups(digests, pairs or {})
    starts = [d.row["t0"] for d in digests if d.row["t0"] is not None]
    ends = [
        d.row["t0"] + d.row["wall_ms"] / 1000
        for d in digests
        if d.row["t0"] is not None and d.row["wall_ms"] is not None
    ]
    rewards = [d.row["reward"] for d in digests if d.row["reward"] is not None]
    run = {
        "rollouts": len(digests),
        "calls": len(calls["start"]),
        "tokens_in": _sum(d.row["tokens_in"] for d in digests),
        "tokens_out": _sum(d.row["tokens_out"] for d in digests),
        "tokens_reasoning": _sum(d.row["tokens_reasoning"] for d in digests),
        "cached_tokens": _sum(d.row["cached_tokens"] for d in digests),
        "errors": dict(sorted(error_counts.items())),
        "gaps": dict(sorted(gap_counts.items())),
        "failed_rollouts": sum(1 for d in digests if d.row["failure"] is not None),
        "mean_reward": round(statistics.fmean(rewards), 6) if rewards else None,
        "start": min(starts) if starts else None,
        "end": max(ends) if ends else None,
    }
    return {
        "schema": SUMMARY_SCHEMA,
        "source": dict(source),
        "run": run,
        "notes": [g.to_dict() for g in notes],
        "tables": {"err": errors.values, "finish": finishes.values},
        "rollouts": rollouts,
        "calls": calls,
        "groups": groups,
    }


def _positions(
    a: Sequence[tuple[int, bytes]], b: Sequence[tuple[int, bytes]]
) -> list[int | None] | None:
    """Where two aligned rollouts part, as each one's call position (``None``: it had ended)."""
    step = divergence([s for _, s in a], [s for _, s in b])
    if step is None:
        return None
    return [a[step][0] if step < len(a) else None, b[step][0] if step < len(b) else None]


def _groups(
    digests: Sequence[RolloutDigest], pairs: Mapping[int, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    by_task: dict[int, list[int]] = {}
    for row_index, digest in enumerate(digests):
        task = digest.row["task"]
        if task is not None:
            by_task.setdefault(task, []).append(row_index)
    out = []
    for task in sorted(by_task):
        rows = by_task[task]
        aligned = [digests[i].aligned for i in rows]
        group: dict[str, Any] = {
            "task": task,
            "rows": rows,
            "div": [
                [_positions(aligned[i], other) for other in aligned]
                for i in range(min(DIVERGENCE_MAX_ROWS, len(rows)))
            ],
        }
        if task in pairs:
            group["pairs"] = dict(pairs[task])
        out.append(group)
    return out
