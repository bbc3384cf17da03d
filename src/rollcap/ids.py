"""Rollout ids: build them from a run request, validate them, add the attempt suffix.

One rule makes every rollout id: ``_ng_rollout_id`` when given, else ``<task>-<rollout>``, then
``-a<n>`` for an attempt n > 0 (``with_attempt``). Two readings of it: ``rollout_id_from_run``
for the servers, which validate what they are sent, and ``record_rollout_id`` for the evidence
of a finished rollout, which takes a line as it is.

A rollout id becomes a file name in the capture directory and a URL path segment, so it is
validated against one grammar and refused (never sanitised) when it does not match: a sanitised
id could map two rollouts onto one file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ROLLOUT_ID_PATTERN",
    "build_rollout_id",
    "record_rollout_id",
    "rollout_id_from_run",
    "validate_rollout_id",
    "with_attempt",
]

# The grammar, as error messages show it. The pattern matches with \Z rather than $: `$` also
# matches before a trailing newline, which would let "a\n" through.
_RULE = "^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
ROLLOUT_ID_PATTERN = re.compile(_RULE[1:-1] + r"\Z", re.ASCII)

TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
ATTEMPT_INDEX_KEY = "_ng_attempt_index"
ROLLOUT_ID_KEY = "_ng_rollout_id"


def validate_rollout_id(rollout_id: object) -> str:
    """Return ``rollout_id`` unchanged when it matches the grammar, else raise ``ValueError``."""
    if not isinstance(rollout_id, str):
        raise ValueError(
            f"invalid rollout id {rollout_id!r}: must be a string matching {_RULE}",
        )
    if ROLLOUT_ID_PATTERN.match(rollout_id) is None:
        shown = rollout_id if len(rollout_id) <= 60 else rollout_id[:57] + "..."
        raise ValueError(
            f"invalid rollout id {shown!r} (length {len(rollout_id)}): must match {_RULE}",
        )
    return rollout_id


def _index(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int subclass; True as a task index is a caller bug, not index 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"invalid {key} {value!r}: must be an integer >= 0")
    return value


def with_attempt(base: str, attempt: int) -> str:
    """``base``, plus ``-a<n>`` for a resume attempt n > 0."""
    return f"{base}-a{attempt}" if attempt > 0 else base


def build_rollout_id(task_index: int, rollout_index: int, attempt_index: int = 0) -> str:
    """``<task>-<rollout>``, plus ``-a<n>`` for a resume attempt n > 0."""
    for key, value in (
        (TASK_INDEX_KEY, task_index),
        (ROLLOUT_INDEX_KEY, rollout_index),
        (ATTEMPT_INDEX_KEY, attempt_index),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"invalid {key} {value!r}: must be an integer >= 0")
    return with_attempt(f"{task_index}-{rollout_index}", attempt_index)


def rollout_id_from_run(body: object) -> str | None:
    """The rollout id a run request body carries, or ``None`` when it carries none.

    ``_ng_rollout_id`` wins when present; otherwise the id is built from the task and rollout
    indices, and the attempt index adds ``-a<n>`` when n > 0 (for an explicit id too, so that a
    resumed attempt never appends to the earlier attempt's file). A present but malformed value is
    an error rather than ``None``: silently dropping it would leave the rollout uncaptured.
    """
    if not isinstance(body, Mapping):
        return None
    attempt = _index(body, ATTEMPT_INDEX_KEY) or 0
    explicit = body.get(ROLLOUT_ID_KEY)
    if explicit is not None:
        return validate_rollout_id(with_attempt(validate_rollout_id(explicit), attempt))
    task = _index(body, TASK_INDEX_KEY)
    rollout = _index(body, ROLLOUT_INDEX_KEY)
    if task is None or rollout is None:
        return None
    return validate_rollout_id(build_rollout_id(task, rollout, attempt))


def record_rollout_id(record: Mapping[str, Any]) -> str | None:
    """The rollout id a rollout line (or its row) names, read as it is; ``None`` if it names none.

    The same rule as ``rollout_id_from_run``, without its checks, as finished rollouts' evidence
    is read: ``_ng_rollout_id`` as text when present, else ``<task>-<rollout>`` from the indices
    whatever their type, then ``-a<n>`` when the attempt index is an int n > 0 (a bool is not).
    Whether the id can name a capture file is the store's business.
    """
    explicit = record.get(ROLLOUT_ID_KEY)
    if explicit is not None:
        base = str(explicit)
    else:
        task = record.get(TASK_INDEX_KEY)
        rollout = record.get(ROLLOUT_INDEX_KEY)
        if task is None or rollout is None:
            return None
        base = f"{task}-{rollout}"
    attempt = record.get(ATTEMPT_INDEX_KEY)
    if isinstance(attempt, int) and not isinstance(attempt, bool):
        return with_attempt(base, attempt)
    return base
