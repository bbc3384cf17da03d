"""``rollcap status``: a run's live status as a table in the terminal, redrawn until it ends.

``render`` turns status documents into a rich renderable (no I/O); ``watch`` reads a
``StatusSource`` about once a second and redraws, until every run shown has finished (or the
head server that served them went away, which it does when the run that started it ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import rich.box
import rich.console
import rich.live
import rich.table
import rich.text

from rollcap.status._source import StatusSource, StatusUnavailable

__all__ = ["describe_doing", "render", "watch"]

_STATE_STYLES = {
    "stalled": "bold red",
    "cancelled": "magenta",
    "retrying": "yellow",
    "slow": "yellow",
    "active": "green",
}


def _seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def describe_doing(doing: Any) -> str:
    """What a running rollout is doing, in words (a document's ``rollouts[].doing``)."""
    if not isinstance(doing, dict):
        return "-"
    kind = doing.get("kind")
    if kind == "model_call":
        text = (
            f"model call on {doing.get('server')}: {doing.get('phase')}, "
            f"upstream silent {_seconds(doing.get('upstream_silence_s'))}"
        )
        state = doing.get("state")
        if state not in (None, "active"):
            text += f" ({state})"
        return text
    if kind == "between_calls":
        return f"between calls (agent or tool) for {_seconds(doing.get('for_s'))}"
    return "-"


def _header(document: dict[str, Any]) -> rich.text.Text:
    run = document.get("run") or {}
    counts = document.get("counts") or {}
    states = document.get("states") or {}
    finished = bool(run.get("finished"))
    eta = document.get("eta_s")
    text = rich.text.Text()
    text.append(f"{run.get('id')}", style="bold")
    text.append(f"  agent {run.get('agent')}  ")
    text.append("FINISHED  " if finished else "", style="bold green")
    text.append(
        f"{counts.get('done', 0)}/{counts.get('planned', 0)} done, "
        f"{counts.get('failed', 0)} failed, {counts.get('running', 0)} running, "
    )
    stalled = int(states.get("stalled", 0))
    text.append(f"{stalled} stalled", style="bold red" if stalled else "")
    text.append(f", {states.get('slow', 0)} slow, {states.get('retrying', 0)} retrying")
    if counts.get("retried"):
        text.append(f" ({counts['retried']} dispatched again)")
    text.append(f"; {document.get('rate_per_s', 0)}/s")
    if not finished:
        text.append(f", ETA {_seconds(eta)}")
    text.append(f", elapsed {_seconds(run.get('elapsed_s'))}")
    return text


def _table(document: dict[str, Any]) -> rich.table.Table:
    table = rich.table.Table(box=rich.box.SIMPLE_HEAD, expand=False, pad_edge=False)
    for column, justify in (
        ("rollout", "left"),
        ("attempt", "right"),
        ("state", "left"),
        ("elapsed", "right"),
        ("calls", "right"),
        ("doing", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for rollout in document.get("rollouts") or ():
        state = str(rollout.get("state"))
        table.add_row(
            str(rollout.get("rollout_id")),
            str(rollout.get("attempt")),
            rich.text.Text(state, style=_STATE_STYLES.get(state, "")),
            _seconds(rollout.get("elapsed_s")),
            str(rollout.get("calls")),
            describe_doing(rollout.get("doing")),
        )
    return table


def render(
    runs: Sequence[dict[str, Any]], source: str, error: str | None = None
) -> rich.console.Group:
    """The status of ``runs`` as read from ``source`` (``error``: why nothing new could be)."""
    parts: list[rich.console.RenderableType] = []
    if error is not None:
        parts.append(rich.text.Text(f"{source}: {error}", style="yellow"))
    if not runs and error is None:
        parts.append(rich.text.Text(f"{source}: no collection has reported yet"))
    for document in runs:
        parts.append(_header(document))
        for server in document.get("servers") or ():
            if not server.get("ok"):
                parts.append(
                    rich.text.Text(
                        f"  model server {server.get('name')} ({server.get('url')}) did not "
                        f"answer: {server.get('error')}",
                        style="yellow",
                    )
                )
        counts = document.get("counts") or {}
        if document.get("rollouts"):
            parts.append(_table(document))
            listed = len(document["rollouts"])
            if counts.get("running", 0) > listed:
                parts.append(rich.text.Text(f"  ... and {counts['running'] - listed} more"))
        parts.append(rich.text.Text(""))
    return rich.console.Group(*parts)


def _all_finished(runs: Sequence[dict[str, Any]]) -> bool:
    return bool(runs) and all((r.get("run") or {}).get("finished") for r in runs)


def watch(
    source: StatusSource,
    *,
    console: rich.console.Console,
    interval_s: float = 1.0,
    once: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show ``source``'s runs until they have all finished; ``once``: show them once.

    Returns 0 when the runs finished (or their head server went away after they were seen),
    1 when nothing could be read at all with ``once``.
    """
    runs: list[dict[str, Any]] = []
    if once:
        try:
            runs = source.fetch()
        except StatusUnavailable as exc:
            console.print(f"rollcap status: {exc}", style="red")
            return 1
        console.print(render(runs, str(source)))
        return 0
    with rich.live.Live(
        render(runs, str(source)), console=console, auto_refresh=False, transient=False
    ) as live:
        while True:
            error: str | None = None
            try:
                runs = source.fetch()
            except StatusUnavailable as exc:
                error = str(exc)
                if runs and source.head_url is not None:
                    # The head server of an `eval run` stops with it: the run is over.
                    live.update(render(runs, str(source), "went away: the run has ended"))
                    live.refresh()
                    return 0
            live.update(render(runs, str(source), error))
            live.refresh()
            if _all_finished(runs):
                return 0
            sleep(interval_s)
