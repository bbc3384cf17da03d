from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from rollcap.store import LOCK_PROBE_NAME, CaptureDirError, check_capture_dir, try_lock
from rollcap.store._shared import on_shared_filesystem

NFS_NOLOCK = "40 27 0:50 / {point} rw - nfs fs1:/export rw,vers=3,nolock,soft\n"
EXT4 = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"


def _mountinfo(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(text)
    return str(path)


def test_a_local_directory_passes_with_a_real_second_process(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    assert check_capture_dir(calls) == []  # the child process was refused the lock
    assert list(calls.iterdir()) == []  # the probe's file is gone
    assert (calls.stat().st_mode & 0o777) == 0o700


def test_a_flock_that_never_excludes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process's flock does nothing (as on a mount where locks never leave the client):
    # the child process is granted the lock this one thinks it holds.
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: None)
    with pytest.raises(CaptureDirError, match="does not keep another process out"):
        check_capture_dir(tmp_path)


def test_the_probe_asks_the_other_process_it_is_given(tmp_path: Path) -> None:
    asked: list[bool] = []

    def other(path: str) -> bool:
        assert os.path.basename(path).startswith(LOCK_PROBE_NAME)
        # Another process would be refused now: this one holds the lock.
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        asked.append(True)
        return try_lock(path)

    check_capture_dir(tmp_path, other=other)
    assert asked == [True]
    with pytest.raises(CaptureDirError):
        check_capture_dir(tmp_path, other=lambda path: True)


def test_try_lock_is_refused_while_another_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.touch()
    assert try_lock(str(path))
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        # Another open file description, as another process has: refused.
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(try_lock(str(path))))
        thread.start()
        thread.join()
        assert result == [False]
    finally:
        os.close(fd)


def test_a_host_local_lock_mount_is_refused_only_when_shared(tmp_path: Path) -> None:
    info = _mountinfo(tmp_path, EXT4 + NFS_NOLOCK.format(point=tmp_path))
    with pytest.raises(CaptureDirError, match="nolock: flock is local to each host"):
        check_capture_dir(tmp_path / "calls", shared=True, mountinfo=info)
    # One host: the lock works between its processes, which the probe checks.
    (warning,) = check_capture_dir(tmp_path / "calls", shared=False, mountinfo=info)
    assert "soft mount" in warning


def test_a_local_disk_shared_by_a_cluster_is_warned_about(tmp_path: Path) -> None:
    info = _mountinfo(tmp_path, EXT4)
    (warning,) = check_capture_dir(tmp_path, shared=True, mountinfo=info)
    assert "every node must run on this host" in warning
    assert check_capture_dir(tmp_path, shared=False, mountinfo=info) == []


def test_no_mountinfo_still_probes(tmp_path: Path) -> None:
    assert check_capture_dir(tmp_path, shared=True, mountinfo=str(tmp_path / "none")) == []


def test_which_filesystems_other_hosts_mount(tmp_path: Path) -> None:
    nfs = _mountinfo(tmp_path, EXT4 + NFS_NOLOCK.format(point=tmp_path / "shared"))
    assert on_shared_filesystem(tmp_path / "shared" / "calls", mountinfo=nfs)
    assert not on_shared_filesystem(tmp_path / "local", mountinfo=nfs)
    assert not on_shared_filesystem(tmp_path, mountinfo=str(tmp_path / "none"))
