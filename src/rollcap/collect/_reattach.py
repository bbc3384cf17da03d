"""``rollcap capture attach``: a rollouts file's evidence, rebuilt from a capture directory.

For rollouts collected without rollcap, or by a run that died before it attached its
evidence: each line goes through ``rollcap.evidence.attach`` as its own row and answer, as
collection would have sent it, so the four evidence keys come out as collection makes them.
A line's existing evidence is read as the agent's: its ``ng_agent_observations`` are joined
again (a join is idempotent), its ``ng_trajectory`` is the producer's (a trajectory built by
collection rebuilds to itself), ``ng_model_call_capture`` is read afresh, and the run's
wall-clock is kept from its ``ng_perf.total_latency_ms``.

The file is read and written one line at a time. A line that is not a JSON object is copied
as it is and counted; so is a line that names no rollout (no ``_ng_rollout_id``, no indices).
A rollouts file named ``*.zst`` is read as Zstandard frames (strictly: a frame that does not
decode raises ``CompressedFileError`` and nothing is written), and an output named ``*.zst`` is
written as frames of about a MiB of lines each.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollcap.evidence import PERF_KEY, attach
from rollcap.ids import record_rollout_id
from rollcap.store import LineBatches, is_compressed, iter_lines

__all__ = ["ReattachSummary", "reattach", "reattach_line"]


@dataclass(frozen=True, slots=True)
class ReattachSummary:
    """How many lines got their evidence again, and how many were copied as they were."""

    output_path: Path
    attached: int
    not_objects: int
    without_rollout: int


def reattach_line(
    line: Mapping[str, Any], capture_dirs: Sequence[str | os.PathLike[str]]
) -> dict[str, Any]:
    """``line`` with its evidence rebuilt from ``capture_dirs`` (see the module docstring)."""
    perf = line.get(PERF_KEY)
    latency = perf.get("total_latency_ms") if isinstance(perf, Mapping) else None
    if isinstance(latency, bool) or not isinstance(latency, int | float):
        latency = None
    return attach(
        line,
        line,
        capture_dirs=capture_dirs,
        observability_enabled=True,
        rollout_latency_ms=latency,
    )


def reattach(
    rollouts_path: str | os.PathLike[str],
    capture_dirs: Sequence[str | os.PathLike[str]],
    output_path: str | os.PathLike[str] | None = None,
) -> ReattachSummary:
    """Rebuild the evidence of every line of ``rollouts_path`` into ``output_path``.

    Without ``output_path`` the file is replaced in place, atomically: a run that fails leaves
    it as it was. ``capture_dirs`` must exist, so that a mistyped directory is not read as
    rollouts without calls; so must the rollouts file and the output's directory. Each missing
    one is a ``FileNotFoundError`` naming it, raised before anything is written.
    """
    for directory in capture_dirs:
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"capture directory {directory} does not exist")
    source = Path(rollouts_path)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such rollouts file")
    target = Path(output_path) if output_path is not None else source
    if not target.parent.is_dir():
        # Said here: the open below would name the temporary file instead.
        raise FileNotFoundError(f"{target.parent}: no such directory for the output")
    tmp = target.with_name(f".{target.name}.attaching")
    attached = not_objects = without_rollout = 0
    try:
        with iter_lines(source) as lines, open(tmp, "wb") as handle:
            out = LineBatches(handle, compressed=is_compressed(target.name))
            for raw in lines:
                if not raw.strip():
                    out.write(raw)
                    continue
                try:
                    line = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    line = None
                if not isinstance(line, dict):
                    not_objects += 1
                    out.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    continue
                if record_rollout_id(line) is None:
                    without_rollout += 1
                    out.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    continue
                out.write(
                    orjson.dumps(
                        reattach_line(line, capture_dirs), option=orjson.OPT_APPEND_NEWLINE
                    )
                )
                attached += 1
            out.flush()
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return ReattachSummary(target, attached, not_objects, without_rollout)
