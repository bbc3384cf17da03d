"""Where a run's files are, and reading them tolerantly (the I/O shell of the report).

A run is a capture directory (``<rollout_id>.capture.jsonl`` files, or compacted
``.capture.jsonl.zst`` ones), optionally the rollouts file that collection wrote (plain or
``.jsonl.zst``, and its ``_failures.jsonl`` beside it), and optionally an RL staging
directory (``DirectoryStagingSink``'s) with the staging gate's ledger (``FileLineageStore``'s
``<rollout_id>.lineage.jsonl`` files: in the capture directory, the gate's default place, unless
another ledger directory is named). ``eval submit``'s job directory holds ``rollouts.jsonl`` and
``model-calls/``: given such a directory, both are found without being named.

Nothing here raises on damaged content: a line that does not parse is counted, a file that
cannot be read is a gap of its rollout, a file whose name is no rollout id is a note of the run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from rollcap.ids import ROLLOUT_ID_PATTERN, validate_rollout_id
from rollcap.records import Gap
from rollcap.report._model import RolloutInput, RolloutLine, rollout_line_info, task_of
from rollcap.store import (
    CAPTURE_SUFFIX,
    COMPRESSED_CAPTURE_SUFFIX,
    CaptureStore,
    CompressedFileError,
    iter_lines,
    plain_name,
)

if TYPE_CHECKING:
    # Imported where they are used: staging's wire models are pydantic's, which every command
    # would otherwise load with the CLI (and the model server with it).
    from rollcap.report._tokens import StagedRead
    from rollcap.staging import DirectoryStagingSink, RolloutManifest, StagedCallBaseSnapshot

__all__ = [
    "JOB_CAPTURE_DIR",
    "JOB_ROLLOUTS_FILE",
    "NOTE_FILE_NAME_INVALID",
    "NOTE_ROLLOUTS_UNREADABLE",
    "RunFiles",
    "find_run",
    "jsonl_objects",
    "read_manifest",
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
    ledger_dir: Path | None = None  # None: the capture directory
    # How the rollouts file was found when none was named, or why none was used.
    rollouts_note: str | None = None

    @property
    def ledger_root(self) -> Path:
        """Where the staging gate's ledger files are looked for."""
        return self.capture_dir if self.ledger_dir is None else self.ledger_dir

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
            "ledger_dir": None if self.staging_dir is None else str(self.ledger_root),
        }


def _holds_captures(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(
                entry.name.endswith((CAPTURE_SUFFIX, COMPRESSED_CAPTURE_SUFFIX))
                for entry in entries
            )
    except OSError:
        return False


def find_run(
    directory: str | os.PathLike[str],
    *,
    rollouts: str | os.PathLike[str] | None = None,
    staging: str | os.PathLike[str] | None = None,
    ledger: str | os.PathLike[str] | None = None,
) -> RunFiles:
    """The run's files. ``directory`` is a capture directory, or a job directory holding
    ``model-calls/`` (and, usually, ``rollouts.jsonl``), recognised when it holds no capture
    file itself. ``ledger`` is the staging gate's ledger directory (``token_id_capture.dir``)
    when it is not the capture directory. ``FileNotFoundError`` when a named path is missing."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    capture_dir = root
    job_captures = root / JOB_CAPTURE_DIR
    if job_captures.is_dir() and not _holds_captures(root):
        capture_dir = job_captures
        if rollouts is None and (root / JOB_ROLLOUTS_FILE).is_file():
            rollouts = root / JOB_ROLLOUTS_FILE
    note = None
    if rollouts is None:
        rollouts, note = _rollouts_near(capture_dir)
    rollouts_file = None if rollouts is None else Path(rollouts)
    if rollouts_file is not None and not rollouts_file.is_file():
        raise FileNotFoundError(f"{rollouts_file}: no such rollouts file")
    staging_dir = None if staging is None else Path(staging)
    if staging_dir is not None and not staging_dir.is_dir():
        raise FileNotFoundError(f"{staging_dir}: no such staging directory")
    ledger_dir = None if ledger is None else Path(ledger)
    if ledger_dir is not None and not ledger_dir.is_dir():
        raise FileNotFoundError(f"{ledger_dir}: no such ledger directory")
    return RunFiles(capture_dir, rollouts_file, staging_dir, ledger_dir, note)


def _rollouts_near(capture_dir: Path) -> tuple[Path | None, str]:
    """The rollouts file beside the capture directory (``rollouts.jsonl`` or
    ``*_rollouts.jsonl``, as ``eval run --output`` names them, or either compressed, ``.zst``)
    or in it, and how it was found.

    Exactly one candidate in the first place that has any is taken; several there are not
    guessed between.
    """
    for place, where in ((capture_dir.parent, "beside"), (capture_dir, "in")):
        try:
            found = sorted(
                path
                for path in place.iterdir()
                if path.is_file() and _is_rollouts_name(plain_name(path.name))
            )
        except OSError:
            continue
        if len(found) == 1:
            return found[0], f"rollouts: {found[0]} (found {where} the capture directory)"
        if found:
            names = ", ".join(path.name for path in found)
            return None, (
                f"rollouts: none used: {len(found)} rollouts files {where} the capture directory "
                f"({names}); name one with --rollouts"
            )
    return None, "rollouts: none found beside the capture directory (name one with --rollouts)"


def _is_rollouts_name(name: str) -> bool:
    return name == JOB_ROLLOUTS_FILE or name.endswith("_" + JOB_ROLLOUTS_FILE)


def jsonl_objects(path: Path) -> Iterator[dict[str, object] | None]:
    """Each line's object, or ``None`` for a line that is not one; a missing file has none.

    A compressed file (``.zst``) is read frame by frame; a frame that does not decode ends the
    read with one ``None`` more (the lines behind it cannot be reached), never an error.
    """
    try:
        with iter_lines(path) as lines:
            for line in lines:
                if not line.strip():
                    continue
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError:
                    yield None
                    continue
                yield value if isinstance(value, dict) else None
    except FileNotFoundError:
        return
    except CompressedFileError:
        yield None


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
        for value in jsonl_objects(path):
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


# DirectoryStagingSink's layout (its module doc): an id of this form is its own file name.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}\Z")


def _stored_values(staging_dir: Path, key: str) -> StagedCallBaseSnapshot | None:
    """The base snapshot of a record that does not parse, its values as stored and unchecked,
    for the rebuild to refuse with its code (``corrupt_digest``, ``wrong_<field>`` ...); ``None``
    when the file is no JSON object with every base field, or its path is not a plain one."""
    from rollcap.staging import StagedCallBaseSnapshot

    rollout_id, _, call_id = key.partition("/")
    if not (_PLAIN_NAME.match(rollout_id) and _PLAIN_NAME.match(call_id)):
        return None
    try:
        raw = orjson.loads((staging_dir / rollout_id / call_id / "record.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    fields = StagedCallBaseSnapshot.model_fields
    if not isinstance(raw, dict) or not all(name in raw for name in fields):
        return None
    return StagedCallBaseSnapshot.model_construct(**{name: raw[name] for name in fields})


def _read_staged(sink: DirectoryStagingSink, key: str) -> StagedRead:
    from rollcap.report._tokens import StagedRead
    from rollcap.staging import StagedRecordError

    try:
        (record,) = sink.fetch_records([key])
    except KeyError:
        return StagedRead(key, None, f"no staged record for key {key}")
    except StagedRecordError as exc:
        return StagedRead(key, _stored_values(sink.root, key), str(exc))
    except OSError as exc:
        return StagedRead(key, None, f"{type(exc).__name__}: {exc.strerror or exc}")
    return StagedRead(key, record.base())


def read_manifest(
    ledger_dir: Path, rollout_id: str
) -> tuple[RolloutManifest | None, dict[str, Any]]:
    """The rollout's manifest from the gate's ledger (``None`` when it has no ledger file or
    the file cannot be read), and where it was looked for: ``path``, ``found``, ``error``."""
    from rollcap.staging import FileLineageStore

    store = FileLineageStore(ledger_dir, max_cached_rollouts=0)
    try:
        path = store.path(rollout_id)
    except ValueError as exc:
        return None, {"path": str(ledger_dir), "found": False, "error": str(exc)}
    info: dict[str, Any] = {"path": str(path), "found": path.is_file(), "error": None}
    if not info["found"]:
        return None, info
    try:
        return store.manifest(rollout_id), info
    except (OSError, ValueError) as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        return None, info


def read_tokens(
    staging_dir: Path, rollout_id: str, *, ledger_dir: Path | None = None
) -> dict[str, Any] | None:
    """The token view of one rollout (``_tokens``): its staged calls in ``staging_dir`` and,
    when ``ledger_dir`` holds the rollout's ledger, its manifest; ``None`` when it staged no
    call and the ledger lists none. Never raises for damaged content."""
    from rollcap.report._tokens import token_payload
    from rollcap.staging import DirectoryStagingSink

    manifest, ledger = (None, None) if ledger_dir is None else read_manifest(ledger_dir, rollout_id)
    sink = DirectoryStagingSink(staging_dir)
    try:
        keys = sink.rollout_keys(rollout_id)
    except OSError as exc:
        reason = f"cannot read the staged calls: {type(exc).__name__}: {exc.strerror or exc}"
        return token_payload(rollout_id, [], manifest, ledger=ledger, error=reason)
    listed = [] if manifest is None else [row.staging_key for row in manifest.records]
    if not keys and not listed and (manifest is None or not manifest.failures):
        return None
    wanted = [*keys, *(key for key in dict.fromkeys(listed) if key not in keys)]
    reads = [_read_staged(sink, key) for key in wanted]
    return token_payload(rollout_id, reads, manifest, ledger=ledger)
