"""Aggregate per-call metrics (pure).

Aggregates follow one rule: sum the values that are known; a total no call reports is ``None``
(unknown), never 0, so a dialect that reports no reasoning tokens does not look like "zero
reasoning".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rollcap.dialects import DIALECT_NAMES, Usage, get_dialect
from rollcap.records import ModelCallRecord, infer_dialect, round_ms

__all__ = [
    "METRIC_KEYS",
    "aggregate",
    "aggregate_raw",
]

_SUMMED = (
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "tokens_total",
    "cached_tokens",
    "latency_total_ms",
)
METRIC_KEYS = (*_SUMMED, "num_calls")


def aggregate(records: Iterable[ModelCallRecord], *, rounded: bool = True) -> dict[str, Any]:
    """``tokens_*``, ``cached_tokens``, ``latency_total_ms`` sums and ``num_calls``.

    ``num_calls`` counts every call, failed ones included. ``rounded=False`` leaves the
    latency sum as the float additions give it, as ``ng_model_call_capture`` writes it.
    """
    rows = (tuple(getattr(r, key) for key in _SUMMED) for r in records)
    return _aggregate_rows(rows, rounded=rounded)


def aggregate_raw(raws: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``aggregate`` straight from raw records, reading only usage and latency.

    Equal to ``aggregate`` of the normalized records by construction (both read the same
    dialect ``usage``), at a fraction of the cost: no tool-call arguments are parsed.
    """
    return _aggregate_rows(_raw_row(raw) for raw in raws)


def _raw_row(raw: Mapping[str, Any]) -> tuple[Any, ...]:
    usage = Usage()
    response = raw.get("response")
    dialect = raw.get("dialect")
    if not (isinstance(dialect, str) and dialect in DIALECT_NAMES):
        dialect = infer_dialect(response)  # as ModelCallRecord.from_raw reads it
    if isinstance(response, dict) and dialect is not None:
        usage = get_dialect(dialect).usage(response)
    latency = raw.get("latency_ms")
    if isinstance(latency, bool) or not isinstance(latency, int | float):
        latency = None
    else:
        latency = round_ms(latency)
    return (
        usage.tokens_in,
        usage.tokens_out,
        usage.tokens_reasoning,
        usage.tokens_total,
        usage.cached_tokens,
        latency,
    )


def _aggregate_rows(rows: Iterable[tuple[Any, ...]], *, rounded: bool = True) -> dict[str, Any]:
    totals: list[Any] = [None] * len(_SUMMED)
    count = 0
    for row in rows:
        count += 1
        for i, value in enumerate(row):
            if value is not None:
                totals[i] = value if totals[i] is None else totals[i] + value
    out = dict(zip(_SUMMED, totals, strict=True))
    if rounded and out["latency_total_ms"] is not None:
        # Float sums drift (0.1 + 0.2); latencies are kept at 2 decimals everywhere.
        out["latency_total_ms"] = round(out["latency_total_ms"], 2)
    out["num_calls"] = count
    return out
