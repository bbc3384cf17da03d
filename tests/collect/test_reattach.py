"""``rollcap capture attach``: a rollouts file's evidence rebuilt as collection built it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.cli import EXIT_FAILURE, EXIT_OK, main
from rollcap.collect import collect, reattach, reattach_line
from rollcap.gym import example_data_path
from rollcap.store import CompressedFileError
from rollcap.store._frames import encode_frame
from tests.collect.conftest import StubAgent, read_frame_lines, read_lines, write_input
from tests.gym.conftest import calculator_stack

EVIDENCE = ("ng_agent_observations", "ng_model_call_capture", "ng_trajectory", "ng_perf")
COLLECTED_ONLY = ("ng_model_call_capture", "ng_trajectory", "ng_perf")


def _evidence(line: dict[str, Any]) -> dict[str, Any]:
    return {key: line[key] for key in EVIDENCE if key in line}


async def test_capture_attach_gives_the_evidence_collection_gave(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "model-calls"
    tasks = example_data_path("calculator").read_bytes().splitlines()[:3]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(tasks) + b"\n")
    async with calculator_stack(capture) as stack, asyncio.timeout(60):
        output = tmp_path / "out.jsonl"
        summary = await collect(stack.agent_url, source, output, capture_dir=capture)
    collected = read_lines(summary.output_path)
    assert all(set(EVIDENCE) <= set(line) for line in collected)

    attached = tmp_path / "attached.jsonl"
    args = ["capture", "attach", str(summary.output_path), "--capture-dir", str(capture)]
    assert main([*args, "-o", str(attached)]) == EXIT_OK
    assert f"attached the evidence of 3 rollouts to {attached}" in capsys.readouterr().out
    again = read_lines(attached)
    assert [_evidence(line) for line in again] == [_evidence(line) for line in collected]
    assert again == collected  # the rest of each line too, key order included

    # In place, without -o: the same file, the same lines.
    before = summary.output_path.read_bytes()
    assert main(args) == EXIT_OK
    assert summary.output_path.read_bytes() == before


async def test_a_file_collected_without_capture_gets_the_evidence_it_lacked(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    tasks = [{"calls": 2, "observe": True}, {"calls": 1}, {"calls": 0}]
    source = write_input(tmp_path / "in.jsonl", tasks)
    async with asyncio.timeout(60):
        summary = await collect(agent.url, source, tmp_path / "out.jsonl", capture_dir=capture_dir)
    collected = read_lines(summary.output_path)
    # What a harness that collected without rollcap has: its own answer, no collection evidence.
    bare = [{k: v for k, v in line.items() if k not in COLLECTED_ONLY} for line in collected]
    rebuilt = [reattach_line(line, [capture_dir]) for line in bare]
    for line, again in zip(collected, rebuilt, strict=True):
        if "ng_perf" in line:
            del line["ng_perf"]["total_latency_ms"]  # the collector's own clock: not in the file
        assert _evidence(again) == _evidence(line)


async def test_a_compressed_rollouts_file_is_attached_and_a_zst_output_written_compressed(
    agent: StubAgent, tmp_path: Path, capture_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", [{"calls": 2, "observe": True}, {"calls": 1}])
    packed = tmp_path / "out.jsonl.zst"
    async with asyncio.timeout(60):
        await collect(agent.url, source, packed, capture_dir=capture_dir)
    collected = read_frame_lines(packed)
    assert len(collected) == 2
    plain = tmp_path / "attached.jsonl"
    assert reattach(packed, [capture_dir], plain).attached == 2
    assert read_lines(plain) == collected
    # Written compressed when the output's name says so, from a plain file and in place.
    again = tmp_path / "again.jsonl.zst"
    assert reattach(plain, [capture_dir], again).output_path == again
    assert read_frame_lines(again) == collected
    reattach(packed, [capture_dir])
    assert read_frame_lines(packed) == collected
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".")) == []


def test_a_compressed_rollouts_file_that_does_not_decode_changes_nothing(tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    capture.mkdir()
    packed = tmp_path / "r.jsonl.zst"
    good = encode_frame(b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    packed.write_bytes(good + good[: len(good) // 2])  # the last frame cut short
    with pytest.raises(CompressedFileError, match=f"byte {len(good)}: the last frame is cut"):
        reattach(packed, [capture])
    assert packed.read_bytes() == good + good[: len(good) // 2]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["calls", "r.jsonl.zst"]


def test_lines_that_are_no_rollout_are_copied_as_they_are(tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    capture.mkdir()
    rollouts = tmp_path / "r.jsonl"
    rollout = b'{"_ng_task_index": 0, "_ng_rollout_index": 0}'
    rollouts.write_bytes(rollout + b'\n[1, 2]\n\n{"x": 1}\nnot json')
    summary = reattach(rollouts, [capture])
    assert (summary.attached, summary.not_objects, summary.without_rollout) == (1, 2, 1)
    lines = rollouts.read_bytes().split(b"\n")
    assert orjson.loads(lines[0])["ng_model_call_capture"]["gaps"] == [
        {"code": "model_call_capture_no_records"}
    ]
    assert lines[1:] == [b"[1, 2]", b"", b'{"x": 1}', b"not json", b""]


def test_a_missing_capture_directory_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_bytes(b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    code = main(["capture", "attach", str(rollouts), "--capture-dir", str(tmp_path / "nope")])
    assert code == EXIT_FAILURE
    assert "capture directory" in capsys.readouterr().err
    assert rollouts.read_bytes() == b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_a_missing_rollouts_file_or_output_directory_is_named_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    capture = tmp_path / "model-calls"
    capture.mkdir()
    with pytest.raises(FileNotFoundError, match=r"absent\.jsonl: no such rollouts file"):
        reattach(tmp_path / "absent.jsonl", [capture])
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_bytes(b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    elsewhere = tmp_path / "absent" / "out.jsonl"
    with pytest.raises(FileNotFoundError, match=r"absent: no such directory for the output"):
        reattach(rollouts, [capture], elsewhere)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-calls", "r.jsonl"]
