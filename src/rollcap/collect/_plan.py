"""Which rollouts a collection runs, and which of them an earlier run already finished (pure).

The input is read as an iterator of lines and never held whole: a task is one JSON object per
line, blank lines are skipped and do not count, and the task index is the position among the
kept lines. Each task becomes ``num_repeats`` rollouts; ``RequestParams`` sets what the run
says about each rollout's ``responses_create_params`` (sampling overrides, a per-rollout seed).

Resume bookkeeping counts attempts. A (task, rollout) pair is finished once the output holds a
line for it. Every other pair runs again with attempt index = attempts so far, where an attempt
counts once it was dispatched: a line in the dispatch journal (``_journal``: written and synced
before the attempt runs, the authority), a line in the failures file, or a capture file (plain
or compacted, or an incomplete marker) under the pair's attempt id (what a run without a
journal left; the collector creates the file, empty, right before dispatch). So even a rollout
that was in flight without any model call when a run was killed counts; otherwise the killed
run's agent, possibly still running, could append to the file of the rollout's next attempt. A
listing of the capture directory that another host sees stale can only miss attempts the
journal has. Without capture there is no journal and nothing that could mix: a rollout that was
in flight then runs again under its old attempt index.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from rollcap.ids import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    build_rollout_id,
)
from rollcap.store._frames import plain_name

__all__ = [
    "PARAMS_KEY",
    "InputError",
    "RequestParams",
    "ResumeState",
    "Rollout",
    "aggregate_metrics_path",
    "count_tasks",
    "failures_path",
    "iter_tasks",
    "plan_rollouts",
    "planned_count",
    "rollout_line_ids",
]

PARAMS_KEY = "responses_create_params"
# A capture file, plain or compacted (``.capture.jsonl.zst``), or an incomplete marker.
_CAPTURE_NAME = re.compile(
    r"(\d+)-(\d+)(?:-a(\d+))?\.capture\.(?:jsonl(?:\.zst)?|incomplete)\Z", re.ASCII
)


class InputError(ValueError):
    """An input line that is not a JSON object; ``line_number`` counts from 1, blank lines too."""

    def __init__(self, line_number: int, reason: str) -> None:
        super().__init__(f"input line {line_number}: {reason}")
        self.line_number = line_number


@dataclass(frozen=True, slots=True)
class RequestParams:
    """What a run sets in each rollout's ``responses_create_params`` (the task's Responses
    request), over what the task says.

    ``overrides`` are merged over the task's own parameters, key by key at the top level (a
    key given replaces the task's value whole), as NeMo Gym's
    ``+responses_create_params.<key>=...`` does. ``rollout_seed``, when set, gives rollout
    ``r`` of every task ``seed: rollout_seed + r``, over both: the repeats of one task then
    sample differently, while a rerun, and every attempt of one rollout, send the same seed.
    A task without a ``responses_create_params`` object is dispatched as it is (its agent
    reads other fields, which a run's Responses parameters do not describe).
    """

    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    rollout_seed: int | None = None

    def __post_init__(self) -> None:
        seed = self.rollout_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"rollout_seed must be an integer >= 0, not {seed!r}")
        # A copy: the caller's mapping may change later, the plan's parameters must not.
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))

    @property
    def empty(self) -> bool:
        """True when it changes no task."""
        return not self.overrides and self.rollout_seed is None

    def apply(self, task: Mapping[str, Any], rollout_index: int) -> Mapping[str, Any]:
        """The task as rollout ``rollout_index`` is dispatched: ``task`` itself when nothing
        changes, else a copy with new parameters (``task`` is never mutated)."""
        params = task.get(PARAMS_KEY)
        if self.empty or not isinstance(params, Mapping):
            return task
        merged = {**params, **self.overrides}
        if self.rollout_seed is not None:
            merged["seed"] = self.rollout_seed + rollout_index
        return {**task, PARAMS_KEY: merged}


@dataclass(frozen=True, slots=True)
class Rollout:
    """One rollout to dispatch. ``task`` is the line as dispatched: the input's task, shared by
    its repeats, unless ``RequestParams`` changed it; never mutated."""

    task_index: int
    rollout_index: int
    attempt_index: int
    task: Mapping[str, Any]

    @property
    def rollout_id(self) -> str:
        return build_rollout_id(self.task_index, self.rollout_index, self.attempt_index)

    @property
    def key(self) -> tuple[int, int]:
        return (self.task_index, self.rollout_index)

    def run_body(self) -> dict[str, Any]:
        """The agent's ``/run`` body: the task's fields plus the three indices."""
        body = dict(self.task)
        body[TASK_INDEX_KEY] = self.task_index
        body[ROLLOUT_INDEX_KEY] = self.rollout_index
        body[ATTEMPT_INDEX_KEY] = self.attempt_index
        return body


def _parse_task(line: bytes | str, line_number: int) -> dict[str, Any]:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InputError(line_number, f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InputError(line_number, f"not a JSON object (a {type(value).__name__})")
    return value


def _is_blank(line: bytes | str) -> bool:
    return not line.strip()


def iter_tasks(lines: Iterable[bytes | str], limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The tasks of the first ``limit`` non-blank lines (all when ``None``), parsed one by one."""
    if limit is not None and limit <= 0:
        return
    kept = 0
    for number, line in enumerate(lines, start=1):
        if _is_blank(line):
            continue
        yield _parse_task(line, number)
        kept += 1
        if limit is not None and kept >= limit:
            return


def count_tasks(lines: Iterable[bytes | str], limit: int | None = None) -> int:
    """How many tasks ``iter_tasks`` yields; validates every line, so bad input fails early."""
    return sum(1 for _ in iter_tasks(lines, limit))


@dataclass(slots=True)
class ResumeState:
    """What earlier runs left: finished pairs and, per unfinished pair, attempts so far."""

    finished: set[tuple[int, int]] = field(default_factory=set)
    attempts: dict[tuple[int, int], int] = field(default_factory=dict)
    bad_output_lines: int = 0

    @classmethod
    def from_files(
        cls,
        output_lines: Iterable[bytes],
        failure_lines: Iterable[bytes] = (),
        capture_names: Iterable[str] = (),
        dispatched_lines: Iterable[bytes] = (),
    ) -> ResumeState:
        """Read the output file, the failures file, the capture directory's file names and the
        dispatch journal.

        A line that does not parse (the torn last line of a killed run) finishes nothing.
        """
        state = cls()
        for line in output_lines:
            if _is_blank(line):
                continue
            ids = rollout_line_ids(line)
            if ids is None:
                state.bad_output_lines += 1
            else:
                state.finished.add(ids[:2])
        for lines in (failure_lines, dispatched_lines):
            for line in lines:
                ids = None if _is_blank(line) else rollout_line_ids(line)
                if ids is not None:
                    state._saw_attempt(ids[:2], ids[2])
        for name in capture_names:
            match = _CAPTURE_NAME.match(name)
            if match is not None:
                task, rollout, attempt = match.groups()
                state._saw_attempt((int(task), int(rollout)), int(attempt or 0))
        for key in state.finished:
            state.attempts.pop(key, None)
        return state

    def _saw_attempt(self, key: tuple[int, int], attempt: int) -> None:
        if attempt + 1 > self.attempts.get(key, 0):
            self.attempts[key] = attempt + 1

    def next_attempt(self, key: tuple[int, int]) -> int:
        return self.attempts.get(key, 0)


def _index(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def rollout_line_ids(line: bytes) -> tuple[int, int, int] | None:
    """``(task, rollout, attempt)`` of an output line, or None when it is not a rollout line."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    task = _index(obj, TASK_INDEX_KEY)
    rollout = _index(obj, ROLLOUT_INDEX_KEY)
    attempt = _index(obj, ATTEMPT_INDEX_KEY)
    if task is None or rollout is None:
        return None
    return (task, rollout, attempt or 0)


def plan_rollouts(
    tasks: Iterable[Mapping[str, Any]],
    num_repeats: int = 1,
    resume: ResumeState | None = None,
    params: RequestParams | None = None,
) -> Iterator[Rollout]:
    """Each task's ``num_repeats`` rollouts in input order, minus the finished ones, each task
    as ``params`` make it (``RequestParams.apply``)."""
    if num_repeats < 1:
        raise ValueError(f"num_repeats must be at least 1, not {num_repeats}")
    for task_index, task in enumerate(tasks):
        for rollout_index in range(num_repeats):
            key = (task_index, rollout_index)
            if resume is not None and key in resume.finished:
                continue
            attempt = 0 if resume is None else resume.next_attempt(key)
            sent = task if params is None else params.apply(task, rollout_index)
            yield Rollout(task_index, rollout_index, attempt, sent)


def planned_count(
    num_tasks: int, num_repeats: int, resume: ResumeState | None = None
) -> tuple[int, int]:
    """``(to_run, already_finished)`` among the ``num_tasks * num_repeats`` planned rollouts."""
    total = num_tasks * num_repeats
    if resume is None:
        return total, 0
    done = sum(1 for t, r in resume.finished if t < num_tasks and r < num_repeats)
    return total - done, done


def failures_path(output_path: str | os.PathLike[str]) -> Path:
    """``<output stem>_failures.jsonl`` beside the output file (plain, also for a compressed
    output: ``X.jsonl.zst`` has ``X_failures.jsonl``, as ``X.jsonl`` does)."""
    output = Path(plain_name(os.fspath(output_path)))
    return output.with_name(f"{output.stem}_failures.jsonl")


def aggregate_metrics_path(output_path: str | os.PathLike[str]) -> Path:
    """``<output stem>_aggregate_metrics.json`` beside the output file (the stem of its plain
    name, as for ``failures_path``)."""
    output = Path(plain_name(os.fspath(output_path)))
    return output.with_name(f"{output.stem}_aggregate_metrics.json")
