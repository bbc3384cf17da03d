"""``rollcap compare``'s printed form of a comparison document (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FLIPS_SHOWN", "format_comparison"]

FLIPS_SHOWN = 10
_ROWS = (
    ("reward", "reward", 3),
    ("tokens", "tokens/rollout", 0),
    ("calls", "calls/rollout", 2),
    ("latency_ms", "latency ms", 0),
    ("error", "error rate", 3),
    ("gap", "gap rate", 3),
)
_TESTS = {"mcnemar_exact": "McNemar's exact test", "paired_bootstrap": "paired bootstrap"}


def _num(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _signed(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:+,.{digits}f}"


def _mean(figure: Mapping[str, Any] | None, digits: int) -> str:
    if figure is None:
        return "-"
    text = _num(figure["mean"], digits)
    if figure["ci"] is not None:
        text += f" [{_num(figure['ci'][0], digits)}, {_num(figure['ci'][1], digits)}]"
    return text


def _diff(figure: Mapping[str, Any] | None, digits: int) -> str:
    if figure is None:
        return "-"
    text = _signed(figure["mean"], digits)
    if figure["se"] is not None:
        text += f" (se {_num(figure['se'], max(digits, 1) + 1)})"
    if figure["ci"] is not None:
        text += f" [{_signed(figure['ci'][0], digits)}, {_signed(figure['ci'][1], digits)}]"
    if figure["clusters"] is not None:
        text += f" {figure['clusters']} clusters"
    return text


def _table(section: Mapping[str, Any]) -> list[str]:
    rows = [("", "A (95% CI)", "B (95% CI)", "B - A (se) [95% CI]", "tasks")]
    for metric, title, digits in _ROWS:
        figure = section["metrics"][metric]
        if figure is None:
            rows.append((title, "-", "-", "-", "0"))
            continue
        rows.append(
            (
                title,
                _mean(figure["a"], digits),
                _mean(figure["b"], digits),
                _diff(figure["diff"], digits),
                str(figure["tasks"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _test_line(test: Mapping[str, Any] | None) -> str:
    if test is None:
        return "  paired test: no task with a reward in both runs"
    name = _TESTS.get(test["name"], test["name"])
    if test["name"] == "mcnemar_exact":
        counted = f"{test['a_only']} tasks solved by A only, {test['b_only']} by B only"
    else:
        counted = f"{test['resamples']:,} resamples, seed {test['seed']}"
    return f"  paired test: {name} ({counted}): p = {test['p_value']:.4g}"


def _flip_lines(section: Mapping[str, Any]) -> list[str]:
    flips = section["flips"]
    lines = [f"  flips: {flips['better']} tasks better in B, {flips['worse']} worse"]
    changes = [c for c in section["changes"] if c["change"]]
    worse = [c for c in changes if c["change"] < 0][:FLIPS_SHOWN]
    better = [c for c in reversed(changes) if c["change"] > 0][:FLIPS_SHOWN]
    for title, shown, total in (
        ("worse", worse, flips["worse"]),
        ("better", better, flips["better"]),
    ):
        for change in shown:
            index = change["task_index"]["a"]
            where = f"task {index}" if index is not None else change["id"]
            lines.append(
                f"    {title}: {where} {_num(change['a'], 2)} -> {_num(change['b'], 2)}  "
                f"{change['label']}"
            )
        if total > len(shown):
            lines.append(f"    ... {total - len(shown)} more {title} (--json lists them all)")
    return lines


def _power_line(section: Mapping[str, Any]) -> str:
    power = section["power"]
    if power["tasks_needed"] is None:
        return "  power: unknown (needs two tasks with a reward in both runs)"
    return (
        f"  power: {power['tasks_needed']:,} tasks would detect a reward difference of "
        f"{power['delta']:g} with {power['power']:.0%} power (per-task difference sd "
        f"{power['sd']:.3f}; {section['metrics']['reward']['tasks']} matched here)"
    )


def _section_lines(section: Mapping[str, Any]) -> list[str]:
    tasks = section["tasks"]
    head = (
        f"{section['name']}: {tasks['matched']} tasks matched, {tasks['only_a']} only in A, "
        f"{tasks['only_b']} only in B"
    )
    lines = [head]
    if tasks["matched"]:
        lines += _table(section)
        lines.append(_test_line(section["test"]))
        lines += _flip_lines(section)
        lines.append(_power_line(section))
    return lines


def _side_line(title: str, side: Mapping[str, Any]) -> str:
    return f"{title}: {side['source']} ({side['rollouts']} rollouts, {side['failed']} failed)"


def format_comparison(doc: Mapping[str, Any]) -> str:
    """The comparison for a terminal: each benchmark (when more than one), overall, verdict."""
    key = doc["key"] or "the task's input (responses_create_params.input)"
    lines = [_side_line("A", doc["a"]), _side_line("B", doc["b"]), f"tasks matched by {key}"]
    if doc["cluster"] is not None:
        lines.append(f"standard errors clustered by {doc['cluster']}")
    unmatched = doc["benchmarks_unmatched"]
    if unmatched["a"] or unmatched["b"]:
        lines.append(
            f"benchmarks not in both runs: A only {', '.join(unmatched['a']) or '-'}, "
            f"B only {', '.join(unmatched['b']) or '-'}"
        )
    sections = list(doc["benchmarks"])
    if len(sections) != 1:
        sections.append(doc["overall"])
    for section in sections:
        lines.append("")
        lines += _section_lines(section)
    if doc["overall"]["tasks"]["matched"] == 0:
        lines.append("no task is in both runs: name the field that identifies a task with --key")
    verdict = doc["verdict"]
    if verdict is not None:
        lines.append("")
        margin = verdict["fail_if_worse"]
        if verdict["failed"] is None:
            lines.append("verdict: FAIL: no interval of the reward difference to gate on")
        else:
            word = "FAIL" if verdict["failed"] else "PASS"
            relation = "is below" if verdict["failed"] else "is not below"
            lines.append(
                f"verdict: {word}: the 95% interval's upper bound of B - A, "
                f"{_signed(verdict['upper'], 4)}, {relation} -{margin:g}"
            )
    return "\n".join(lines)
