"""Where a run's files are, and reading them tolerantly (the I/O shell of the report).

A run is a capture directory (``<rollout_id>.capture.jsonl`` files), optionally the rollouts
file that collection wrote (and its ``_failures.jsonl`` beside it), and optionally an RL staging
directory. ``eval submit``'s job directory holds ``rollouts.jsonl`` and ``model-calls/``: given
such a directory, both are found without being named.

Nothing here raises on damaged content: a line that does not parse is counted, a file that
cannot be read is a gap of its rollout, a file whose name is no rollout id is a note of the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from rollcap.ids import ROLLOUT_ID_PATTERN, validate_rollout_id
from rollcap.records import Gap
from rollcap.report._model import RolloutInput, RolloutLine, rollout_line_info, task_of
from rollcap.report._tokens import token_payload
from rollcap.staging import DirectoryStagingSink, LinearizeError, linearize, verify_record
from rollcap.store import CAPTURE_SUFFIX, CaptureStore

__all__ = [
    "JOB_CAPTURE_DIR",
    "JOB_ROLLOUTS_FILE",
    "NOTE_FILE_NAME_INVALID",
    "NOTE_ROLLOUTS_UNREADABLE",
    "RunFiles",
    "find_run",
    "read_rollout",
    "read_rollout_lines",
    "read_tokens",
    "rollout_order",
    "valid_ids",
]

JOB_ROLLOUTS_FILE = "rollouts.jsonl"
JOB_CAPTURE_DIR = "model-calls"
NOTE_ROLLOUTS_UNREADABLE = "rollouts_file_records_unreadable"
NOTE_FILE_NAME_INVALID = "capture_file_name_invalid"


@dataclass(frozen=True, slots=True)
class RunFiles:
    """The files of one run, as found."""

    capture_dir: Path
    rollouts_file: Path | None = None
    staging_dir: Path | None = None

    @property
    def failures_file(self) -> Path | None:
        # Here, not at the top: collection imports the evidence models (pydantic), which every
        # command would then load with the CLI, the model server's included.
        from rollcap.collect import failures_path

        return None if self.rollouts_file is None else failures_path(self.rollouts_file)

    def describe(self) -> dict[str, str | None]:
        return {
            "capture_dir": str(self.capture_dir),
            "rollouts_file": None if self.rollouts_file is None else str(self.rollouts_file),
            "staging_dir": None if self.staging_dir is None else str(self.staging_dir),
        }


def _holds_captures(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(entry.name.endswith(CAPTURE_SUFFIX) for entry in entries)
    except OSError:
        return False


def find_run(
    directory: str | os.PathLike[str],
    *,
    rollouts: str | os.PathLike[str] | None = None,
    staging: str | os.PathLike[str] | None = None,
) -> RunFiles:
    """The run's files. ``directory`` is a capture directory, or a job directory holding
    ``model-calls/`` (and, usually, ``rollouts.jsonl``), recognised when it holds no capture
    file itself. ``FileNotFoundError`` when a named path is missing."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    capture_dir = root
    job_captures = root / JOB_CAPTURE_DIR
    if job_captures.is_dir() and not _holds_captures(root):
        capture_dir = job_captures
        if rollouts is None and (root / JOB_ROLLOUTS_FILE).is_file():
            rollouts = root / JOB_ROLLOUTS_FILE
    rollouts_file = None if rollouts is None else Path(rollouts)
    if rollouts_file is not None and not rollouts_file.is_file():
        raise FileNotFoundError(f"{rollouts_file}: no such rollouts file")
    staging_dir = None if staging is None else Path(staging)
    if staging_dir is not None and not staging_dir.is_dir():
        raise FileNotFoundError(f"{staging_dir}: no such staging directory")
    return RunFiles(capture_dir, rollouts_file, staging_dir)


def _jsonl(path: Path) -> Iterator[dict[str, object] | None]:
    """Each line's object, or ``None`` for a line that is not one; a missing file has none."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                yield None
                continue
            yield value if isinstance(value, dict) else None


def read_rollout_lines(run: RunFiles) -> tuple[dict[str, RolloutLine], list[Gap]]:
    """What the rollouts file and its failures file say of each rollout, and the notes.

    A failure line whose rollout also finished (a later attempt under the same id) does not
    hide the finished line.
    """
    lines: dict[str, RolloutLine] = {}
    notes: list[Gap] = []
    for path, failures in ((run.failures_file, True), (run.rollouts_file, False)):
        if path is None:
            continue
        bad = 0
        for value in _jsonl(path):
            info = None if value is None else rollout_line_info(value)
            if info is None:
                bad += 1
                continue
            rollout_id, line = info
            if (failures and line.failure is None) or not ROLLOUT_ID_PATTERN.match(rollout_id):
                bad += 1
                continue
            lines[rollout_id] = line
        if bad:
            notes.append(Gap(NOTE_ROLLOUTS_UNREADABLE, f"{path}: count={bad}"))
    return lines, notes


def rollout_order(ids: set[str], lines: dict[str, RolloutLine]) -> list[str]:
    """Task, then rollout, then attempt, numerically; ids of another shape after, by name."""

    def key(rollout_id: str) -> tuple[int, int, int, int, str]:
        task, rollout, attempt = task_of(rollout_id, lines.get(rollout_id))
        if task is None:
            return (1, 0, 0, 0, rollout_id)
        return (0, task, -1 if rollout is None else rollout, attempt, rollout_id)

    return sorted(ids, key=key)


def valid_ids(names: list[str]) -> tuple[list[str], list[Gap]]:
    """The names that are rollout ids, and a note per name that is not."""
    good: list[str] = []
    notes: list[Gap] = []
    for name in names:
        try:
            good.append(validate_rollout_id(name))
        except ValueError as exc:
            notes.append(Gap(NOTE_FILE_NAME_INVALID, str(exc)))
    return good, notes


def read_rollout(store: CaptureStore, rollout_id: str, line: RolloutLine | None) -> RolloutInput:
    """One rollout's records as the tolerant reader finds them; never raises ``OSError``."""
    read_error: str | None = None
    records: list[tuple[int, dict[str, object]]] = []
    bad = 0
    try:
        available = store.read_available(rollout_id)
        records, bad = list(available.records), available.bad_lines
    except OSError as exc:
        read_error = f"{type(exc).__name__}: {exc.strerror or exc}"
    try:
        incomplete = store.is_incomplete(rollout_id)
    except OSError as exc:
        incomplete = False
        read_error = read_error or f"{type(exc).__name__}: {exc.strerror or exc}"
    return RolloutInput(rollout_id, records, bad, incomplete, read_error, line)


def read_tokens(staging_dir: Path, rollout_id: str) -> dict[str, object] | None:
    """The token view of one rollout's staged calls; ``None`` when it staged none."""
    if not (staging_dir / rollout_id).is_dir():
        return None
    source = DirectoryStagingSink(staging_dir)
    checks: dict[str, str | None] = {}
    try:
        records = source.read(rollout_id)
    except (OSError, ValueError) as exc:
        return token_payload([], {}, f"cannot read the staged calls: {exc}")
    for record in records:
        try:
            verify_record(record)
            checks[record.model_call_id] = None
        except LinearizeError as exc:
            checks[record.model_call_id] = str(exc)
    try:
        chains = linearize(source, rollout_id)
    except LinearizeError as exc:
        return token_payload([], checks, str(exc))
    return token_payload(chains, checks)
