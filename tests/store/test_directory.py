"""`capture compress` / `capture decompress` over a whole directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollcap.cli import main
from rollcap.store import CaptureStore, compress_directory, decompress_directory
from tests.store._helpers import numbered_record


def _directory(tmp_path: Path, rollouts: int = 4) -> dict[str, list[dict[str, object]]]:
    store = CaptureStore(tmp_path)
    for r in range(rollouts):
        for n in range(5):
            store.append(f"{r}-0", numbered_record(n, text="again " * 200))
    store.reset("empty-0")
    return {rollout: store.read(rollout) for rollout in store.rollout_ids()}


def test_compress_then_decompress_a_directory_is_idempotent_and_loses_nothing(
    tmp_path: Path,
) -> None:
    before = _directory(tmp_path)
    done = compress_directory(tmp_path, level=9)
    assert (done.changed, done.unchanged, done.failed) == (4, 1, [])
    assert done.bytes_after * 10 < done.bytes_before
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"{r}-0.capture.jsonl.zst" for r in range(4)] + ["empty-0.capture.jsonl"]
    )
    store = CaptureStore(tmp_path)
    assert {r: store.read(r) for r in store.rollout_ids()} == before
    again = compress_directory(tmp_path)
    assert (again.changed, again.unchanged) == (0, 1)
    back = decompress_directory(tmp_path)
    assert (back.changed, back.failed) == (4, [])
    assert all(name.endswith(".capture.jsonl") for name in os.listdir(tmp_path))
    assert {r: store.read(r) for r in store.rollout_ids()} == before


def test_a_temporary_left_by_a_killed_pass_is_removed_once_nothing_needs_it(
    tmp_path: Path,
) -> None:
    _directory(tmp_path, 1)
    orphan = tmp_path / ".9-0.capture.jsonl.zst.tmp"  # its plain file is gone
    orphan.write_bytes(b"half a frame")
    redo = tmp_path / ".0-0.capture.jsonl.zst.tmp"  # its plain file is there: rewritten
    redo.write_bytes(b"half a frame")
    compress_directory(tmp_path)
    assert not orphan.exists()
    assert not redo.exists()


def test_the_cli_says_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _directory(tmp_path, 2)
    assert main(["capture", "compress", str(tmp_path), "--level", "19"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compacted 2 files (")
    assert out.endswith("; 1 had nothing to do\n")
    assert main(["capture", "list", str(tmp_path)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in listing[1:]] == [
        ["0-0", "5"],
        ["1-0", "5"],
        ["empty-0", "0"],
    ]
    assert main(["capture", "decompress", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("expanded 2 files")
    with pytest.raises(SystemExit):
        main(["capture", "compress", str(tmp_path), "--level", "23"])
    assert "1 to 22" in capsys.readouterr().err
