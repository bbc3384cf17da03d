"""``attach``: a finished rollout's line with its evidence, reading the capture (I/O).

The one function of the evidence package that touches files: it finds the rollout's capture
among the capture directories, reads it tolerantly, and hands what it found to the pure parts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.attachment import CaptureRead
from rollcap.attachment import read_capture as read_store
from rollcap.evidence._capture import (
    merge_model_call_capture,
    payloads_redacted,
)
from rollcap.evidence._codes import CAPTURE_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY
from rollcap.evidence._models import AgentObservationBundle, TrajectoryRecord
from rollcap.evidence._perf import attach_ng_perf
from rollcap.evidence._trajectory import attach_trajectory
from rollcap.ids import ROLLOUT_ID_PATTERN, record_rollout_id
from rollcap.store import CaptureStore

__all__ = ["IDENTITY_KEYS", "OPTIONAL_IDENTITY_KEYS", "CaptureDir", "attach", "read_capture"]

# Copied from the dispatched row onto the line: always, and only when the row has them.
IDENTITY_KEYS = ("_ng_task_index", "_ng_rollout_index")
OPTIONAL_IDENTITY_KEYS = (
    "agent_ref",
    "_ng_attempt_index",
    "_ng_rollout_id",
    "_ng_environment_server",
)
_EVIDENCE_KEYS = (CAPTURE_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY)


CaptureDir = str | os.PathLike[str] | CaptureStore
"""A capture directory, or the ``CaptureStore`` of one (read through as it is)."""


def read_capture(capture_dirs: Sequence[CaptureDir], rollout_id: str) -> CaptureRead:
    """What a tolerant read of ``rollout_id``'s capture finds in the first directory that has
    its file or its incomplete marker (``rollcap.attachment.read_capture``)."""
    for directory in capture_dirs:
        # Only read: the identity check a store may make (it reads the mount table) is for
        # appends.
        store = (
            directory
            if isinstance(directory, CaptureStore)
            else CaptureStore(directory, check_identity=False)
        )
        read = read_store(store, rollout_id)
        if read.store_found:
            return read
    return CaptureRead(store_found=False)


def attach(
    row: Mapping[str, Any],
    answer: Mapping[str, Any],
    *,
    capture_dirs: Sequence[CaptureDir] = (),
    observability_enabled: bool = False,
    rollout_latency_ms: float | None = None,
) -> dict[str, Any]:
    """The rollout line of a finished rollout: the agent's ``answer`` with the evidence keys.

    In order (EVIDENCE.md section 1): the row's identity keys copied on; with observability on
    and capture directories given, ``ng_model_call_capture`` from the rollout's capture and the
    agent's ``ng_agent_observations`` joined with it; ``ng_trajectory`` whenever the line has
    an evidence key; ``ng_perf`` with observability on and a trajectory to read it from.
    ``rollout_latency_ms`` is the collector's own wall-clock of the agent's run.

    ``capture_dirs``: directories, or the ``CaptureStore`` of one (a caller that holds one
    reads through it). ``answer`` is not changed, and neither are its ``response`` and
    ``reward`` on the line.
    Damaged evidence never raises: each failure is a gap on the line. A row whose rollout id
    cannot name a capture file gets no capture attachment.
    """
    result = dict(answer)
    for key in IDENTITY_KEYS:
        if key in row:
            result[key] = row[key]
    for key in OPTIONAL_IDENTITY_KEYS:
        if key in row:
            result[key] = row[key]
    joined: AgentObservationBundle | None = None
    trajectory: TrajectoryRecord | None = None
    if observability_enabled and capture_dirs:
        rollout_id = record_rollout_id(result)
        if rollout_id is not None and ROLLOUT_ID_PATTERN.match(rollout_id):
            joined = merge_model_call_capture(
                result,
                rollout_id,
                read_capture(capture_dirs, rollout_id),
                include_payloads=not payloads_redacted(answer),
            )
    # Each step hands the next the models it built, so that only the agent's own evidence is
    # validated, never what the pipeline made of it.
    if any(key in result for key in _EVIDENCE_KEYS):
        trajectory = attach_trajectory(row, result, joined=joined)
    attach_ng_perf(result, observability_enabled, rollout_latency_ms, trajectory=trajectory)
    return result
