"""Rollout ids: build them from a run request, validate them, add the attempt suffix.

One rule makes every rollout id: ``_ng_rollout_id`` when given, else ``<task>-<rollout>``, then
``-a<n>`` for an attempt n > 0 (``with_attempt``). Two readings of it: ``rollout_id_from_run``
for the servers, which validate what they are sent, and ``record_rollout_id`` for the evidence
of a finished rollout, which takes a line as it is.

A rollout id becomes a file name in the capture directory and a URL path segment, so it is
validated against one grammar and refused (never sanitised) when it does not match: a sanitised
id could map two rollouts onto one file.

Both readings take the indices as NeMo Gym does, so that a run body and the line collected for
it name the same file whichever implementation built the id: the task and rollout indices are
written as they are given (``"3"`` and ``3`` both give ``3``), and the attempt index is whatever
``int()`` makes of it (``"2"``, ``2.0`` and ``2`` are all attempt 2, ``True`` is attempt 1).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ROLLOUT_ID_PATTERN",
    "attempt_of",
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


# NeMo Gym's wording for a malformed explicit id, which callers may match on.
_EXPLICIT_RULE = (
    "must be a string of letters, digits, dots, dashes or underscores starting with a letter or "
    "digit"
)


def _shown(value: object) -> str:
    """``repr(value)``, shortened when long: an id can be anything a client sent."""
    text = repr(value)
    return text if len(text) <= 220 else text[:217] + "..."


def validate_rollout_id(rollout_id: object) -> str:
    """Return ``rollout_id`` unchanged when it matches the grammar, else raise ``ValueError``.

    The message starts ``Invalid rollout id: <repr>``, NeMo Gym's wording, for callers that match
    on it.
    """
    if not isinstance(rollout_id, str):
        raise ValueError(
            f"Invalid rollout id: {_shown(rollout_id)}: must be a string matching {_RULE}",
        )
    if ROLLOUT_ID_PATTERN.match(rollout_id) is None:
        raise ValueError(
            f"Invalid rollout id: {_shown(rollout_id)} (length {len(rollout_id)}): "
            f"must match {_RULE}",
        )
    return rollout_id


def _attempt_number(value: Any) -> int:  # Any: whatever a client sent
    """The attempt index ``value`` stands for, as NeMo Gym reads it: ``int(value)``."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"invalid {ATTEMPT_INDEX_KEY} {_shown(value)}: must be an integer",
        ) from None


def _field(body: object, key: str) -> Any:
    """``body[key]`` of a mapping, else the attribute ``key`` of an object (a pydantic model).

    A pydantic model serves the keys it keeps as extras (``extra="allow"``) as attributes; a
    field declared under another name with ``key`` as its alias (NeMo Gym's run requests keep
    ``_ng_rollout_id`` so) is read by that name.
    """
    if isinstance(body, Mapping):
        return body.get(key)
    declared = getattr(type(body), "model_fields", None)
    if isinstance(declared, Mapping):
        for name, info in declared.items():
            if getattr(info, "alias", None) == key:
                return getattr(body, name, None)
    return getattr(body, key, None)


def with_attempt(base: str, attempt: int) -> str:
    """``base``, plus ``-a<n>`` for a resume attempt n > 0."""
    return f"{base}-a{attempt}" if attempt > 0 else base


_ATTEMPT_SUFFIX = re.compile(r"-a(\d+)\Z", re.ASCII)


def attempt_of(rollout_id: str) -> int:
    """The attempt ``with_attempt`` gave the id: its ``-a<n>`` suffix, else 0."""
    match = _ATTEMPT_SUFFIX.search(rollout_id)
    return int(match[1]) if match else 0


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

    ``body`` is a mapping (the JSON body) or an object whose attributes carry the keys: a pydantic
    request model (its extras, or a field aliased to the key) or any plain object.

    ``_ng_rollout_id`` wins when present; otherwise the id is ``<task>-<rollout>``, the indices
    written as they are given, and the attempt index (``int()`` of it) adds ``-a<n>`` when n > 0
    (for an explicit id too, so that a resumed attempt never appends to the earlier attempt's
    file). A present but malformed value is an error rather than ``None``: silently dropping it
    would leave the rollout uncaptured. So is an id that does not match the grammar.
    """
    explicit = _field(body, ROLLOUT_ID_KEY)
    if explicit is not None:
        if not isinstance(explicit, str) or ROLLOUT_ID_PATTERN.match(explicit) is None:
            raise ValueError(
                f"{ROLLOUT_ID_KEY} {_EXPLICIT_RULE}; got {_shown(explicit)} "
                f"(a rollout id matches {_RULE})",
            )
        base = explicit
    else:
        task = _field(body, TASK_INDEX_KEY)
        rollout = _field(body, ROLLOUT_INDEX_KEY)
        if task is None or rollout is None:
            return None  # an attempt index alone names no rollout
        base = f"{task}-{rollout}"
    attempt = _field(body, ATTEMPT_INDEX_KEY)
    return validate_rollout_id(
        with_attempt(base, 0 if attempt is None else _attempt_number(attempt))
    )


def record_rollout_id(record: Mapping[str, Any]) -> str | None:
    """The rollout id a rollout line (or its row) names, read as it is; ``None`` if it names none.

    The same rule as ``rollout_id_from_run``, without its checks, as finished rollouts' evidence
    is read: ``_ng_rollout_id`` as text when present, else ``<task>-<rollout>`` from the indices
    whatever their type, then ``-a<n>`` when the attempt index reads as an integer n > 0 (as
    ``rollout_id_from_run`` reads it, so both name the same file); one that does not adds nothing.
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
    if attempt is None:
        return base
    try:
        return with_attempt(base, _attempt_number(attempt))
    except ValueError:
        return base
