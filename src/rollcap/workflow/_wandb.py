"""``eval run --wandb-project``: a finished run's rollouts and metrics, logged to W&B.

Once collection is over (the files are written; nothing here can hold it up or break it), one
W&B run gets, from the output file and the metrics file:

- ``rollouts``: a table with one row per rollout, from its export view
  (``rollcap.evidence.rollout_for_export``: no ``ng_trajectory``, no call payloads): its ids and
  reward, the view itself as JSON, its captured calls' token and latency totals and its
  ``ng_perf``;
- ``calls``: a table with one row per captured call: its rollout, index, ids, status, error
  category, token counts and latencies;
- ``aggregate_metrics``: a table with one row per number of the metrics file (environment
  server, group, name, value), ``perf_summary`` included; the same numbers go to the run's
  summary as ``<group>/<name>``.

A logged table holds at most ``wandb.Table.MAX_ROWS`` rows: the rollouts (and calls) past it
are left out, and the summary says how many. The output file is read one line at a time (a
compressed one, ``.jsonl.zst``, one frame at a time).
``WANDB_MODE=offline`` logs to the run directory alone; ``WANDB_DIR`` says where it goes.

The W&B client is the optional extra ``rollcap[wandb]``; ``require_wandb`` says so in one line
when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from rollcap.config import ConfigError
from rollcap.evidence import CAPTURE_KEY, PERF_KEY, rollout_for_export
from rollcap.store import iter_lines, plain_name

__all__ = [
    "CALL_COLUMNS",
    "INSTALL_HINT",
    "ROLLOUT_COLUMNS",
    "call_rows",
    "log_to_wandb",
    "metric_rows",
    "require_wandb",
    "rollout_row",
]

INSTALL_HINT = "--wandb-project needs the W&B client: pip install 'rollcap[wandb]'"

_IDS = ("_ng_task_index", "_ng_rollout_index", "_ng_attempt_index", "rollout_id")
_CAPTURE_METRICS = (
    "num_calls",
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "cached_tokens",
    "latency_total_ms",
)
_PERF = ("num_turns", "num_tool_calls", "token_observability_coverage", "total_latency_ms")
ROLLOUT_COLUMNS = (
    *_IDS,
    "reward",
    *_CAPTURE_METRICS,
    *(f"perf_{key}" for key in _PERF),
    "rollout",
)
_CALL_FIELDS = (
    "call_index",
    "model_call_id",
    "response_id",
    "model",
    "dialect",
    "status_code",
    "error_category",
    "response_source",
    "tokens_in",
    "tokens_out",
    "tokens_reasoning",
    "tokens_total",
    "cached_tokens",
    "latency_total_ms",
    "latency_ttft_ms",
)
CALL_COLUMNS = ("rollout_id", *_CALL_FIELDS)
_METRIC_GROUPS = ("agent_metrics", "key_metrics", "perf_summary")


def require_wandb() -> Any:
    """The ``wandb`` module; ``ConfigError`` saying how to install it when it is missing."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return wandb


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def rollout_row(line: Mapping[str, Any]) -> list[Any]:
    """One rollout's row of the ``rollouts`` table (``ROLLOUT_COLUMNS``)."""
    view = rollout_for_export(line)
    metrics = _mapping(_mapping(view.get(CAPTURE_KEY)).get("metrics"))
    perf = _mapping(view.get(PERF_KEY))
    reward = view.get("reward")
    return [
        *(view.get(key) for key in _IDS),
        reward if _number(reward) else None,
        *(metrics.get(key) if _number(metrics.get(key)) else None for key in _CAPTURE_METRICS),
        *(perf.get(key) if _number(perf.get(key)) else None for key in _PERF),
        orjson.dumps(view).decode(),
    ]


def call_rows(line: Mapping[str, Any]) -> list[list[Any]]:
    """The rollout's captured calls, one row each of the ``calls`` table (``CALL_COLUMNS``)."""
    capture = _mapping(line.get(CAPTURE_KEY))
    calls = capture.get("calls")
    rollout_id = capture.get("rollout_id", line.get("rollout_id"))
    return [
        [rollout_id, *(call.get(key) for key in _CALL_FIELDS)]
        for call in (calls if isinstance(calls, list) else ())
        if isinstance(call, Mapping)
    ]


def metric_rows(entries: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """``[environment server, group, name, value]`` for each number of the metrics file."""
    rows: list[list[Any]] = []
    for entry in entries:
        server = entry.get("_ng_environment_server")
        label = server
        if server is not None and not isinstance(server, str):
            label = orjson.dumps(server).decode()
        for group in _METRIC_GROUPS:
            for name, value in _mapping(entry.get(group)).items():
                if _number(value):
                    rows.append([label, group, name, value])
    return rows


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The output's JSON objects, plain or compressed; a frame that does not decode raises
    (``CompressedFileError``), as a missing file does."""
    with iter_lines(path) as source:
        for raw in source:
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(line, dict):
                yield line


def log_to_wandb(
    output_path: str | os.PathLike[str],
    entries: Sequence[Mapping[str, Any]],
    *,
    project: str,
    entity: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> str:
    """Log one finished run to W&B (see the module docstring); the W&B run's directory.

    Blocking: an event loop runs it in a thread.
    """
    wandb = require_wandb()
    limit = int(wandb.Table.MAX_ROWS)
    rollouts: list[list[Any]] = []
    calls: list[list[Any]] = []
    seen = calls_seen = 0
    for line in _lines(Path(output_path)):
        seen += 1
        if len(rollouts) < limit:
            rollouts.append(rollout_row(line))
        for row in call_rows(line):
            calls_seen += 1
            if len(calls) < limit:
                calls.append(row)
    metrics = metric_rows(entries)
    run = wandb.init(
        project=project,
        entity=entity,
        name=Path(plain_name(os.fspath(output_path))).stem,
        job_type="eval",
        config=dict(config or {}),
        settings=wandb.Settings(silent=True),
    )
    try:
        run.log(
            {
                "rollouts": wandb.Table(columns=list(ROLLOUT_COLUMNS), data=rollouts),
                "calls": wandb.Table(columns=list(CALL_COLUMNS), data=calls),
                "aggregate_metrics": wandb.Table(
                    columns=["environment_server", "group", "name", "value"], data=metrics
                ),
            }
        )
        prefix = len({row[0] for row in metrics}) > 1
        for server, group, name, value in metrics:
            run.summary[f"{server}/{group}/{name}" if prefix else f"{group}/{name}"] = value
        run.summary["rollouts_left_out"] = seen - len(rollouts)
        run.summary["calls_left_out"] = calls_seen - len(calls)
        directory = str(run.dir)
    finally:
        run.finish()
    return directory
