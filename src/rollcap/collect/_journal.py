"""The dispatch journal: each rollout attempt, written down and synced before it runs.

``<output stem>_dispatched.jsonl`` beside the output file holds one line per dispatched
rollout attempt (``_ng_task_index``, ``_ng_rollout_index``, ``_ng_attempt_index``,
``rollout_id``), appended and fsynced before the attempt's capture file is reset and its agent
called. A resumed run reads it to number the next attempt (see ``_plan``): the attempt ids it
holds are never given out again, so an agent of an earlier run that is still going (a node
declared dead that is not) appends only to its own attempt's file.

It is resume's authority rather than the capture directory's listing, which another host may
see stale for a while (NFS caches directory attributes and negative lookups); a listing can
only add attempts to what the journal says.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import orjson

from rollcap.collect._plan import Rollout
from rollcap.ids import ATTEMPT_INDEX_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from rollcap.store import plain_name

__all__ = ["DispatchJournal", "dispatched_path"]


def dispatched_path(output_path: str | os.PathLike[str]) -> Path:
    """``<output stem>_dispatched.jsonl`` beside the output file (plain; the stem of a
    compressed output's plain name: ``X.jsonl.zst`` has ``X_dispatched.jsonl``)."""
    output = Path(plain_name(os.fspath(output_path)))
    return output.with_name(f"{output.stem}_dispatched.jsonl")


def _line(rollout: Rollout) -> bytes:
    return orjson.dumps(
        {
            TASK_INDEX_KEY: rollout.task_index,
            ROLLOUT_INDEX_KEY: rollout.rollout_index,
            ATTEMPT_INDEX_KEY: rollout.attempt_index,
            "rollout_id": rollout.rollout_id,
        },
        option=orjson.OPT_APPEND_NEWLINE,
    )


class DispatchJournal:
    """Appends to the journal: ``record`` returns once its lines are synced. Blocking."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = -1

    def __enter__(self) -> DispatchJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open(self) -> int:
        if self._fd < 0:
            existed = self.path.exists()
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self._fd = os.open(self.path, flags, 0o600)
            if not existed:  # the new file's directory entry must be durable too
                directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        return self._fd

    def record(self, rollouts: Sequence[Rollout]) -> None:
        """Append one line per rollout attempt with one write, then fsync."""
        if not rollouts:
            return
        fd = self._open()
        data = memoryview(b"".join(_line(rollout) for rollout in rollouts))
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
