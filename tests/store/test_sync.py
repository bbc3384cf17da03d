from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rollcap.store import _sync
from rollcap.store._mounts import Mount
from rollcap.store._sync import resolve_sync, syncfs


def _mount(fs_type: str) -> Mount:
    return Mount("/data", fs_type, "/dev/sdb1", frozenset({"rw"}))


@pytest.mark.parametrize(
    ("fs_type", "chosen"),
    [("ext4", "syncfs"), ("xfs", "syncfs"), ("nfs4", "fsync"), ("fuse.s3fs", "fsync"),
     ("tmpfs", "fsync"), ("btrfs", "fsync"), ("overlay", "fsync")],
)  # fmt: skip
def test_auto_takes_syncfs_only_where_it_commits_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs_type: str, chosen: str
) -> None:
    monkeypatch.setattr(_sync, "mount_of", lambda path: _mount(fs_type))
    assert resolve_sync("auto", tmp_path) == chosen
    # Asked for by name, each is taken wherever it exists.
    assert resolve_sync("fsync", tmp_path) == "fsync"
    assert resolve_sync("syncfs", tmp_path) == "syncfs"


def test_auto_is_fsync_where_the_mount_cannot_be_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sync, "mount_of", lambda path: None)
    assert resolve_sync("auto", tmp_path) == "fsync"


def test_auto_looks_at_the_nearest_existing_parent_of_a_directory_not_made_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path] = []

    def mount_of(path: Path) -> Mount:
        seen.append(path)
        return _mount("ext4")

    monkeypatch.setattr(_sync, "mount_of", mount_of)
    assert resolve_sync("auto", tmp_path / "not" / "yet") == "syncfs"
    assert seen == [tmp_path]


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one of auto, fsync, syncfs, got 'dsync'"):
        resolve_sync("dsync", tmp_path)


def test_syncfs_where_the_system_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sync, "_SYNCFS", None)
    assert resolve_sync("auto", tmp_path) == "fsync"
    with pytest.raises(ValueError, match="syncfs"):
        resolve_sync("syncfs", tmp_path)
    with pytest.raises(OSError, match="not available"):
        syncfs(0)


def test_syncfs_syncs_and_reports_a_bad_descriptor(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x")
        syncfs(fd)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor") as failed:
        syncfs(fd)  # closed now
    assert failed.value.errno == errno.EBADF
