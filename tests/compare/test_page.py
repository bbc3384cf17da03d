"""``build_compare_report``/``write_compare_report``: the comparison and both runs' rollouts in one
self-contained page, the payloads under the budget, worst change first."""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path
from typing import Any

import orjson

from rollcap.compare import Comparison, build_compare_report, compare_runs, write_compare_report
from rollcap.report import REPORT_CSP, unpack
from tests.compare.conftest import RUN_MODELS

DATA = re.compile(r'<script type="application/json" id="rollcap-data">(.*?)</script>', re.S)


def page_data(page: str) -> dict[str, Any]:
    match = DATA.search(page)
    assert match is not None
    data: dict[str, Any] = orjson.loads(match.group(1))
    return data


def _answers(job_dir: Path) -> dict[str, str]:
    """Each rollout's answer, from its line in the rollouts file."""
    out = {}
    for raw in (job_dir / "rollouts.jsonl").read_bytes().splitlines():
        line = orjson.loads(raw)
        [message] = line["response"]["output"]
        out[line["rollout_id"]] = message["content"][0]["text"]
    return out


def _slots(data: dict[str, Any], changes: list[dict[str, Any]]) -> list[str]:
    """Every rollout's slot in the page's reading order: task by task, A's then B's."""
    sides = {side: unpack(data["sides"][side]["rollouts"]) for side in ("a", "b")}
    return [
        f"{side}/{entry['slot']}"
        for change in changes
        for side in ("a", "b")
        for entry in sides[side][change["id"]]
    ]


def test_the_page_embeds_the_comparison_and_both_runs(
    comparison: Comparison, choice_runs: tuple[Path, Path]
) -> None:
    page, stats = build_compare_report(comparison)
    assert f'<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">' in page
    data = page_data(page)
    assert data["mode"] == "compare"
    assert unpack(data["comparison"]) == comparison.data
    changes = comparison.data["overall"]["changes"]
    assert [c["change"] for c in changes] == sorted(c["change"] for c in changes)
    assert changes[0]["change"] < 0 < changes[-1]["change"]  # the models disagree both ways
    for side, model, job_dir in zip(("a", "b"), RUN_MODELS, choice_runs, strict=True):
        packed = data["sides"][side]
        rollouts = unpack(packed["rollouts"])
        assert list(rollouts) == [c["id"] for c in changes]
        summary = unpack(packed["summary"])
        answers = _answers(job_dir)
        for change in changes:
            entries = rollouts[change["id"]]
            assert [e["id"] for e in entries] == change["rollouts"][side]
            for entry in entries:
                assert entry["capture"] == str(job_dir / "model-calls")
                # Its row in the summary, and its payload: the call its model answered.
                assert summary["rollouts"]["id"][entry["row"]] == entry["id"]
                assert summary["rollouts"]["reward"][entry["row"]] == entry["figures"]["reward"]
                payload = unpack(packed["payloads"][entry["slot"]])
                assert payload["rollout_id"] == entry["id"]
                [call] = payload["calls"]
                assert call["model"] == model
                assert call["answer"] == [{"role": "assistant", "content": answers[entry["id"]]}]
                assert payload["facts"]["answer"] == answers[entry["id"]]
    assert data["budget"]["left_out"] == {"a": [], "b": []}
    count = 2 * len(changes)  # one a task in each run, and one call a rollout
    assert (stats.tasks, stats.rollouts, stats.calls) == (len(changes), count, count)
    assert (stats.payloads_embedded, stats.payloads_left_out, stats.no_capture) == (count, 0, 0)
    assert stats.size == len(page.encode())


def test_the_budget_keeps_the_worst_tasks_first_and_lists_the_rest(
    comparison: Comparison,
) -> None:
    full = page_data(build_compare_report(comparison)[0])
    changes = comparison.data["overall"]["changes"]
    order = _slots(full, changes)
    size = {
        key: len(full["sides"][key[0]]["payloads"][key[2:]])
        for key in order  # "a/<task>/<n>"
    }
    # Exactly the worst task's two payloads: nothing after them fits in what is left.
    budget = size[order[0]] + size[order[1]]
    page, stats = build_compare_report(comparison, payload_budget=budget)
    data = page_data(page)
    kept = [key for key in order if key[2:] in data["sides"][key[0]]["payloads"]]
    assert kept == order[:2]
    left_out = data["budget"]["left_out"]
    assert [f"a/{slot}" for slot in left_out["a"]] == [k for k in order[2:] if k[0] == "a"]
    assert [f"b/{slot}" for slot in left_out["b"]] == [k for k in order[2:] if k[0] == "b"]
    assert data["budget"]["total"] == budget
    assert (stats.payloads_embedded, stats.payloads_left_out) == (2, len(order) - 2)
    # The rows are there all the same: the page lists every rollout, only the transcripts go.
    for side in ("a", "b"):
        summary = unpack(data["sides"][side]["summary"])
        assert len(summary["rollouts"]["id"]) == len(changes)


def test_a_side_without_a_capture_directory_keeps_its_figures(
    comparison: Comparison, choice_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    lines_only = tmp_path / "b"
    lines_only.mkdir()
    shutil.copyfile(choice_runs[1] / "rollouts.jsonl", lines_only / "rollouts.jsonl")
    compared = compare_runs(choice_runs[0], lines_only)
    assert compared.data["overall"]["changes"] == comparison.data["overall"]["changes"]
    page, stats = build_compare_report(compared)
    data = page_data(page)
    b = data["sides"]["b"]
    assert b["payloads"] == {}
    assert unpack(b["summary"])["rollouts"]["id"] == []
    by_id = {c["id"]: c for c in compared.data["overall"]["changes"]}
    for task_id, entries in unpack(b["rollouts"]).items():
        for entry in entries:
            read = (entry["capture"], entry["row"], entry["unread"])
            assert read == (None, None, "no_capture_dir")
            assert entry["figures"]["reward"] == by_id[task_id]["b"]
            assert entry["id"] in by_id[task_id]["rollouts"]["b"]
    assert len(data["sides"]["a"]["payloads"]) == len(by_id)
    assert (stats.no_capture, stats.payloads_embedded) == (len(by_id), len(by_id))


def test_write_compare_report_writes_a_private_file_whole(
    comparison: Comparison, tmp_path: Path
) -> None:
    target = tmp_path / "compare.html"
    target.write_text("an older page")
    target.chmod(0o644)
    stats = write_compare_report(comparison, target, payload_budget=0)
    assert target.stat().st_size == stats.size
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["compare.html"]
    page = target.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert page_data(page)["budget"]["total"] == 0
    assert stats.payloads_embedded == 0
