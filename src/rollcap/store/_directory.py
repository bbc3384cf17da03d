"""A whole capture directory compacted or expanded, rollout by rollout (``capture compress``).

Each rollout goes through ``CaptureStore.compact`` or ``expand``, which are atomic and keep the
original until the new file is verified and durable, so a run of either can be killed at any
point and run again: what is done stays done, the rest is done next time. A rollout that fails
(a conflict, a corrupt frame, a full disk) is reported and left as it was; the others go on.
Leftover temporaries of a killed run whose rollout has no file to redo them from are removed.

Everything here blocks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollcap.store._files import CAPTURE_SUFFIX, INCOMPLETE_SUFFIX, CaptureStore
from rollcap.store._forms import TMP_SUFFIX
from rollcap.store._frames import DEFAULT_LEVEL, ZSTD_SUFFIX

__all__ = ["DirectoryPass", "compress_directory", "decompress_directory"]


@dataclass(slots=True)
class DirectoryPass:
    """What one pass over a directory did: rollouts changed, rollouts that had nothing to do,
    bytes before and after (of the files changed), and each failure as ``(rollout_id, why)``."""

    changed: int = 0
    unchanged: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: DirectoryPass) -> None:
        """Count ``other``'s work in with this one's."""
        self.changed += other.changed
        self.unchanged += other.unchanged
        self.bytes_before += other.bytes_before
        self.bytes_after += other.bytes_after
        self.failed.extend(other.failed)


def compress_directory(
    directory: str | os.PathLike[str],
    *,
    level: int = DEFAULT_LEVEL,
    suffix: str = CAPTURE_SUFFIX,
    marker_suffix: str = INCOMPLETE_SUFFIX,
) -> DirectoryPass:
    """Compact every plain capture file of ``directory`` (see ``CaptureStore.compact``); with
    ``suffix`` and ``marker_suffix``, the per-rollout files of that kind (the token ledger)."""
    store = CaptureStore(directory, suffix=suffix, marker_suffix=marker_suffix)
    plain = store.rollout_ids(compressed=False)
    return _each(store, plain, lambda rollout_id: store.compact(rollout_id, level=level), suffix)


def decompress_directory(
    directory: str | os.PathLike[str],
    *,
    suffix: str = CAPTURE_SUFFIX,
    marker_suffix: str = INCOMPLETE_SUFFIX,
) -> DirectoryPass:
    """Expand every compressed capture file of ``directory`` (see ``CaptureStore.expand``),
    or of the kind ``suffix`` names."""
    store = CaptureStore(directory, suffix=suffix, marker_suffix=marker_suffix)
    return _each(store, store.rollout_ids(compressed=True), store.expand, suffix)


def _each(
    store: CaptureStore, ids: list[str], change: Callable[[str], bool], suffix: str
) -> DirectoryPass:
    done = DirectoryPass()
    with store:
        for rollout_id in ids:
            before = _size(store, rollout_id)
            try:
                changed = change(rollout_id)
            except (OSError, ValueError) as exc:  # a conflict, a bad frame, a full disk
                done.failed.append((rollout_id, str(exc)))
                continue
            if changed:
                done.changed += 1
                done.bytes_before += before
                done.bytes_after += _size(store, rollout_id)
            else:
                done.unchanged += 1
    _remove_orphans(store.directory, suffix)
    return done


def _size(store: CaptureStore, rollout_id: str) -> int:
    try:
        return store.file_for(rollout_id).stat().st_size
    except FileNotFoundError:
        return 0


def _remove_orphans(directory: Path, suffix: str) -> None:
    """Remove temporaries (``.<name>.tmp``) a killed pass left whose source is gone: with the
    source there, the next pass over that rollout rewrites them."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
                continue
            target = name[1 : -len(TMP_SUFFIX)]
            if target.endswith(suffix + ZSTD_SUFFIX):
                source = target[: -len(ZSTD_SUFFIX)]
            elif target.endswith(suffix):
                source = target + ZSTD_SUFFIX
            else:
                continue
            if not (directory / source).exists():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
