"""Reading a run's status from a file or a head server that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollcap.status import StatusSource, StatusUnavailable


def test_a_file_source_reads_one_document_and_says_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "out_status.json"
    with pytest.raises(StatusUnavailable, match="no status file"):
        StatusSource(path=path).fetch()
    path.write_bytes(b'{"run": {"id": "x"}}')
    assert StatusSource(path=path).fetch() == [{"run": {"id": "x"}}]
    path.write_bytes(b"[")
    with pytest.raises(StatusUnavailable, match="not a status document"):
        StatusSource(path=path).fetch()


def test_an_unreachable_head_server_is_a_clear_error() -> None:
    source = StatusSource(head_url="http://127.0.0.1:9/", timeout_s=2)
    assert str(source) == "http://127.0.0.1:9/status"
    with pytest.raises(StatusUnavailable, match=r"127\.0\.0\.1:9/status"):
        source.fetch()
    with pytest.raises(ValueError, match="not both"):
        StatusSource()
