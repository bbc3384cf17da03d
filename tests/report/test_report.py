"""``build_report``/``write_report``: one self-contained page, bounded by the payload budget."""

from __future__ import annotations

import re
import stat
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from rollcap.records import GAP_RECORDS_UNREADABLE
from rollcap.report import REPORT_CSP, build_report, find_run, unpack, write_report
from rollcap.report._report import load_assets
from tests.report._evaluation import DIVERGE_AT, EXPECTED_CALLS, EXPECTED_ERRORS, STREAMED

DATA = re.compile(r'<script type="application/json" id="rollcap-data">(.*?)</script>', re.S)


def page_data(page: str) -> dict[str, Any]:
    match = DATA.search(page)
    assert match is not None
    data: dict[str, Any] = orjson.loads(match.group(1))
    return data


def test_the_report_holds_the_whole_evaluation(evaluation_dir: Path) -> None:
    run = find_run(evaluation_dir, staging=evaluation_dir / "staging")
    page, stats = build_report(run)
    assert f'<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">' in page
    assert (stats.rollouts, stats.calls) == (len(EXPECTED_CALLS), sum(EXPECTED_CALLS.values()))
    assert stats.size == len(page.encode())
    data = page_data(page)
    assert data["mode"] == "file"
    summary = unpack(data["summary"])
    rollouts = summary["rollouts"]
    assert rollouts["id"] == list(EXPECTED_CALLS)
    assert rollouts["calls"] == list(EXPECTED_CALLS.values())
    errors = [None if e is None else summary["tables"]["err"][e] for e in summary["calls"]["err"]]
    assert errors == [e for calls in EXPECTED_ERRORS.values() for e in calls]
    assert summary["calls"]["stream"] == [s for calls in STREAMED.values() for s in calls]
    assert rollouts["gaps"][rollouts["id"].index("1-0")] == [GAP_RECORDS_UNREADABLE]
    assert rollouts["reward"] == [1.0, 0.0, 1.0, None, 0.5]
    assert rollouts["failure"][3] == "agent_error: the model stream broke off </b>"
    group = summary["groups"][0]
    assert (group["rows"], group["div"]) == ([0, 1], [[None, [2, 2]], [[2, 2], None]])
    # The follow-up question differs: the last message of call 2's request, a user message.
    why = group["pairs"]["0-1"]
    assert (why["kind"], why["a"], why["b"], why["role_a"], why["role_b"]) == (
        "message",
        DIVERGE_AT,
        DIVERGE_AT,
        "user",
        "user",
    )
    assert set(data["payloads"]) == set(EXPECTED_CALLS)
    assert set(data["tokens"]) == {"3-0"}
    tokens = unpack(data["tokens"]["3-0"])
    assert tokens["verdict"]["trainable"]
    assert [c["refusal"] for c in tokens["chains"]] == [None]
    assert set(data["raw"]) == {rid for rid, s in STREAMED.items() if any(s)}
    payload = unpack(data["payloads"]["0-0"])
    assert payload["facts"]["input"] == [
        {"role": "user", "content": "What is the capital of France?"}
    ]
    assert payload["facts"]["answer"] == "Paris"
    assert "paris" in unpack(data["search"])[0]
    assert [c["id"] for c in payload["calls"]] == [
        r["model_call_id"]
        for r in map(
            orjson.loads, (run.capture_dir / "0-0.capture.jsonl").read_bytes().splitlines()
        )
    ]
    assert stats.payloads_left_out == stats.raw_left_out == 0


def test_past_the_budget_payloads_are_left_to_the_served_view(evaluation_dir: Path) -> None:
    run = find_run(evaluation_dir)
    page, stats = build_report(run, payload_budget=0)
    data = page_data(page)
    assert data["payloads"] == {}
    assert data["raw"] == {}
    assert data["budget"] == {
        "total": 0,
        "left_out": {
            "payloads": len(EXPECTED_CALLS),
            "tokens": 0,
            "raw": sum(1 for streamed in STREAMED.values() if any(streamed)),
        },
    }
    assert (stats.payloads_embedded, stats.payloads_left_out) == (0, len(EXPECTED_CALLS))
    assert unpack(data["summary"])["run"]["calls"] == stats.calls  # the summary always fits


def test_raw_texts_are_the_first_to_make_room(evaluation_dir: Path) -> None:
    run = find_run(evaluation_dir)
    full = page_data(build_report(run)[0])
    payloads = sum(len(v) for v in full["payloads"].values())
    data = page_data(build_report(run, payload_budget=payloads)[0])
    assert set(data["payloads"]) == set(full["payloads"])
    assert data["raw"] == {}


def test_write_report_writes_a_private_file_whole(evaluation_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    stats = write_report(find_run(evaluation_dir), target)
    assert target.stat().st_size == stats.size
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    assert "</script><img" not in target.read_text()


def test_the_page_is_small_hand_written_and_writes_no_markup() -> None:
    folder = resources.files("rollcap.report").joinpath("assets")
    sizes = {
        name: len(folder.joinpath(name).read_bytes())
        for name in ("report.html", "report.css", "report.js")
    }
    assert sum(sizes.values()) < 100_000, sizes
    js = load_assets().js
    # Captured text reaches the page only through text nodes.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js
    assert "fetch(" in js
    assert "DecompressionStream" in js


def test_the_command_reads_the_ledger_from_the_directory_it_is_given(
    job_copy: Path, tmp_path: Path
) -> None:
    from rollcap.cli import main

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (job_copy / "model-calls" / "3-0.lineage.jsonl").rename(ledger / "3-0.lineage.jsonl")
    out = tmp_path / "report.html"
    common = ["capture", "report", str(job_copy), "--staging", str(job_copy / "staging")]
    assert main([*common, "--ledger", str(ledger), "-o", str(out)]) == 0
    tokens = unpack(page_data(out.read_text())["tokens"]["3-0"])
    assert tokens["verdict"]["trainable"]
    # Without it, the ledger is looked for in the capture directory, where it no longer is.
    assert main([*common, "-o", str(out)]) == 0
    assert not unpack(page_data(out.read_text())["tokens"]["3-0"])["verdict"]
    assert main([*common, "--ledger", str(tmp_path / "absent"), "-o", str(out)]) == 1
