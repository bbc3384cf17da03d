"""WorkerSettings validation and the staging directory check."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rollcap.worker import WorkerSettings
from rollcap.worker._settings import prepare_staging_dir


def test_settings(tmp_path: Path) -> None:
    settings = WorkerSettings("http://127.0.0.1:8000/v1", str(tmp_path), api_key="sk-not-shown")  # type: ignore[arg-type]
    assert settings.staging_dir == tmp_path
    assert "sk-not-shown" not in repr(settings)


def test_the_worker_keeps_nothing_per_rollout_to_bound() -> None:
    # The capture keeps no state per rollout or call: there is no cap to configure.
    assert not any("rollout" in name for name in WorkerSettings.__dataclass_fields__)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"upstream_url": "127.0.0.1:8000"}, "must start with http:// or https://"),
        ({"upstream_url": "http://"}, "has no host"),
        ({"upstream_url": "http://u:p@host/v1"}, "must not carry credentials"),
        ({"upstream_url": "http://host/v1?x=1"}, "no query or fragment"),
        ({"staging_dir": Path("rel/dir")}, "must be an absolute path, got 'rel/dir'"),
        ({"weight_version": -1}, "weight version"),
        ({"weight_version": True}, "weight version"),
        ({"read_timeout_s": 0}, "read_timeout_s"),
    ],
)
def test_bad_settings(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"upstream_url": "http://h:1", "staging_dir": tmp_path, **changes}
    with pytest.raises(ValueError, match=re.escape(message)):
        WorkerSettings(**values)  # type: ignore[arg-type]


def test_prepare_staging_dir_creates_it(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    prepare_staging_dir(target)
    prepare_staging_dir(target)
    assert target.is_dir()
    assert target.stat().st_mode & 0o777 == 0o700


def test_an_unusable_staging_dir_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        prepare_staging_dir(a_file)
    with pytest.raises(ValueError, match="cannot be created"):
        prepare_staging_dir(a_file / "below")


def test_a_staging_dir_no_file_can_be_made_in_is_refused() -> None:
    # No process, root included, makes files in /proc: the check holds whoever runs it.
    with pytest.raises(ValueError, match="is not writable"):
        prepare_staging_dir(Path("/proc"))


def test_a_read_only_staging_dir_is_refused_unless_run_by_root(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        if os.geteuid() == 0:  # root writes there despite the bits, so calls can be staged
            prepare_staging_dir(tmp_path)
            assert list(tmp_path.iterdir()) == []  # the probe is gone
        else:
            with pytest.raises(ValueError, match="is not writable"):
                prepare_staging_dir(tmp_path)
    finally:
        tmp_path.chmod(0o700)
