"""The report file in a real headless Chromium: what a person sees, offline, with no error.

Screenshots are kept in each test's tmp directory (``screenshots/``).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rollcap.records import RawRecord, model_ref
from rollcap.report import find_run, write_report
from rollcap.staging import REASON_WORKER_CAPTURE_FAILED, FileLineageStore
from rollcap.store import CaptureStore
from tests.report._evaluation import (
    DIVERGE_AT,
    EXPECTED_CALLS,
    EXPECTED_ERRORS,
    STREAMED,
    WEIGHT_VERSION,
)
from tests.report.conftest import Watched

REASONING = "The request came to the fake upstream."
HOSTILE = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


@pytest.fixture(scope="module")
def report_url(evaluation_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("report") / "report.html"
    write_report(find_run(evaluation_dir, staging=evaluation_dir / "staging"), target)
    return target.as_uri()


def test_overview_and_rollout_list(watched: Watched, report_url: str) -> None:
    watched.open(report_url)
    page = watched.page
    rows = page.locator("#rollouts tbody tr")
    assert rows.count() == len(EXPECTED_CALLS)
    assert [rows.nth(i).get_attribute("data-rollout") for i in range(rows.count())] == list(
        EXPECTED_CALLS
    )
    assert page.locator("#run-errors .tag.err").count() == 3
    assert "records_unreadable" in page.locator("#run-gaps").inner_text()
    assert page.locator("#plot-calls rect.bin").count() >= 2
    watched.shot("overview")
    # Sorting and filtering.
    page.click("th[data-key='calls']")
    page.click("th[data-key='calls']")
    assert rows.first.get_attribute("data-rollout") == "0-1"  # most calls first
    page.select_option("#filter-kind", "errors")
    assert sorted(rows.nth(i).get_attribute("data-rollout") or "" for i in range(rows.count())) == [
        "1-0",
        "2-0",
    ]
    page.select_option("#filter-kind", "all")
    page.locator("#plot-calls rect.bin").first.click()  # the rollouts behind a bin
    assert page.locator("#rollouts tbody tr").count() < len(EXPECTED_CALLS)
    assert page.locator(".chip").count() == 1
    assert watched.errors == []
    assert watched.outside == []


def test_every_rollouts_waterfall_has_one_bar_per_call_and_ttft_on_streamed_calls(
    watched: Watched, report_url: str
) -> None:
    watched.open(report_url)
    page = watched.page
    page.click("tr[data-rollout='0-0']")
    page.wait_for_selector("#waterfall")
    for rollout_id, calls in EXPECTED_CALLS.items():
        page.goto(f"{report_url}#/r/{rollout_id}")
        page.wait_for_selector(f"#waterfall g.bar[data-call='{calls - 1}']")
        bars = page.locator("#waterfall g.bar")
        assert bars.count() == calls, rollout_id
        ttft = [bars.nth(i).locator("rect.ttft").count() for i in range(calls)]
        assert ttft == STREAMED[rollout_id], rollout_id
        errors = [bars.nth(i).locator("rect.call.error").count() for i in range(calls)]
        assert errors == [int(e is not None) for e in EXPECTED_ERRORS[rollout_id]], rollout_id
    watched.shot("waterfall-2-0")
    assert watched.errors == []
    assert watched.outside == []


def test_a_failed_call_shows_its_error_category(watched: Watched, report_url: str) -> None:
    watched.open(report_url)
    page = watched.page
    for rollout_id, categories in EXPECTED_ERRORS.items():
        for position, category in enumerate(categories):
            if category is None:
                continue
            page.goto(f"{report_url}#/r/{rollout_id}")
            page.click(f"#waterfall g.bar[data-call='{position}']")
            detail = page.locator(f"#call-detail[data-call='{position}']")
            assert detail.locator(".error-category").inner_text() == category
    page.goto(f"{report_url}#/r/1-0/1")
    page.wait_for_selector("#call-detail[data-call='1'] .error-body")
    assert "Rate limit" in page.locator(".error-body").inner_text()
    watched.shot("call-429")
    assert watched.errors == []
    assert watched.outside == []


def test_a_call_shows_its_tool_call_reasoning_and_only_its_new_messages(
    watched: Watched, report_url: str
) -> None:
    watched.open(report_url)
    page = watched.page
    page.goto(f"{report_url}#/r/0-0/0")
    detail = page.locator("#call-detail[data-call='0']")
    assert detail.locator("#answer .tool-call .name").inner_text() == "lookup_capital"
    assert '"country": "France"' in detail.locator("#answer .arguments").inner_text()
    page.goto(f"{report_url}#/r/0-0/1")
    detail = page.locator("#call-detail[data-call='1']")
    reasoning = detail.locator("#answer details.reasoning")
    reasoning.locator("summary").click()
    assert REASONING in reasoning.locator("pre").inner_text()
    # Call 1 adds the tool's result to call 0's request and answer.
    messages = detail.locator("#new-messages .msg")
    assert messages.count() == 1
    assert messages.first.locator(".role").inner_text().startswith("tool")
    page.check("#whole-request")
    assert detail.locator("#new-messages .msg").count() == 4  # system, user, call, result
    detail.locator("#raw summary").click()
    assert detail.locator("#raw pre").first.inner_text().startswith("data: ")
    watched.shot("call-reasoning")
    assert watched.errors == []
    assert watched.outside == []


def test_the_task_group_shows_where_two_rollouts_diverge(watched: Watched, report_url: str) -> None:
    watched.open(report_url)
    page = watched.page
    page.goto(f"{report_url}#/r/0-1")
    page.click("#group-link")
    divergence = page.locator("#divergence")
    divergence.wait_for()
    assert divergence.get_attribute("data-call") == str(DIVERGE_AT)
    assert divergence.get_attribute("data-kind") == "message"
    # system, user, tool call, its result, the answer: the follow-up is message #5.
    assert divergence.inner_text() == (
        f"they first differ at call #{DIVERGE_AT} of 0-0 and call #{DIVERGE_AT} of 0-1: "
        "message #5 (user / user)"
    )
    columns = page.locator("#diverging-calls .col")
    columns.nth(1).locator(".msg").first.wait_for()
    assert "Are you sure?" in columns.nth(0).inner_text()
    assert "Explain your answer." in columns.nth(1).inner_text()
    assert page.locator("#group-rollouts tbody tr").count() == 2
    watched.shot("task-group")
    assert watched.errors == []
    assert watched.outside == []


def test_the_token_view_of_a_staged_rollout(watched: Watched, report_url: str) -> None:
    watched.open(report_url)
    page = watched.page
    page.goto(f"{report_url}#/r/3-0/1")
    view = page.locator("#token-view")
    view.wait_for()
    verdict = view.locator("#token-verdict")
    assert verdict.locator(".tag.ok").inner_text() == "trainable"
    assert "terminal call #1 (heuristic" in verdict.inner_text()
    calls = view.locator(".token-calls .tag.ok")
    assert calls.count() == 2  # both staged calls verified
    assert f"#0 · verified · weights v{WEIGHT_VERSION}" in calls.first.inner_text()
    assert view.locator("#token-failures").count() == 0
    chain = view.locator("h4.chain")
    assert chain.count() == 1
    assert "Chain 1 (terminal)" in chain.inner_text()
    assert chain.locator(".tag.ok").inner_text() == "verified"
    cells = view.locator(".tokens span")
    generated = view.locator(".tokens span.gen").count()
    assert cells.count() > 50
    assert 0 < generated < cells.count()
    assert generated + view.locator(".tokens span.masked").count() == cells.count()
    cuts = view.locator(".tokens b.cut")
    assert cuts.count() == 2
    assert cuts.nth(1).inner_text().startswith(f"call #1 · weights v{WEIGHT_VERSION} · tokens ")
    assert "carried +" in cuts.nth(1).inner_text()
    watched.shot("tokens")
    assert watched.errors == []


def test_a_refused_rollout_shows_its_codes_and_failures(
    watched: Watched, job_copy: Path, tmp_path: Path
) -> None:
    record_path = next((job_copy / "staging" / "3-0").glob("*/record.json"))
    record = orjson.loads(record_path.read_bytes())
    record["token_ids_delta"][0] += 1
    record_path.write_bytes(orjson.dumps(record))
    FileLineageStore(job_copy / "model-calls").record_failure(
        "3-0", "f" * 32, REASON_WORKER_CAPTURE_FAILED
    )
    target = tmp_path / "report.html"
    write_report(find_run(job_copy, staging=job_copy / "staging"), target)
    watched.open(target.as_uri() + "#/r/3-0")
    view = watched.page.locator("#token-view")
    view.wait_for()
    verdict = view.locator("#token-verdict")
    assert verdict.locator(".tag.err").inner_text() == "refused"
    assert verdict.locator("code.refusal").inner_text() == "rollout_failed: worker_capture_failed"
    assert "worker_capture_failed" in view.locator("#token-failures .tag.err").inner_text()
    assert view.locator(".token-calls .tag.err").count() == 1
    assert "does not verify" in view.locator(".token-calls .tag.err").inner_text()
    assert view.locator("h4.chain .tag.err").inner_text() == "refused"
    refusal = view.locator("p.refusal").inner_text()
    assert refusal.startswith("refused: corrupt_digest: call ")
    assert "as staged, unverified" in refusal
    assert view.locator(".tokens span").count() > 50
    watched.shot("tokens-refused")
    assert watched.errors == []
    assert watched.outside == []


def test_the_page_cannot_reach_the_network(watched: Watched, report_url: str) -> None:
    # The watch sees a request that a page without the report's policy makes...
    watched.page.goto("data:text/html,<img src='http://127.0.0.1:9/pixel.png'>")
    watched.page.wait_for_load_state()
    assert watched.outside == ["http://127.0.0.1:9/pixel.png"]
    watched.outside.clear()
    watched.errors.clear()
    # ...and the report's own policy refuses one before it is made.
    watched.open(report_url)
    outcome = watched.page.evaluate(
        "fetch('http://127.0.0.1:9/x').then(() => 'reached', () => 'refused')"
    )
    assert outcome == "refused"
    assert watched.outside == []
    assert watched.errors
    assert all("Content Security Policy" in e for e in watched.errors)


def test_hostile_model_output_is_shown_as_text(watched: Watched, tmp_path: Path) -> None:
    capture = tmp_path / "calls"
    tool_call = {
        "id": "c1",
        "type": "function",
        "function": {"name": HOSTILE, "arguments": HOSTILE},
    }
    record = RawRecord(
        model_call_id="a" * 32,
        dialect="chat",
        model_ref=model_ref("policy_model"),
        started_at=1.0,
        completed_at=2.0,
        latency_ms=1000.0,
        latency_ttft_ms=None,
        status_code=200,
        error_category=None,
        request={"model": HOSTILE, "messages": [{"role": "user", "content": HOSTILE}]},
        response={
            "id": HOSTILE,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": HOSTILE,
                    "message": {
                        "role": "assistant",
                        "content": HOSTILE,
                        "reasoning_content": HOSTILE,
                        "tool_calls": [tool_call],
                    },
                }
            ],
        },
        gaps=[{"code": HOSTILE}],
    )
    CaptureStore(capture).append("0-0", record)
    target = tmp_path / "report.html"
    write_report(find_run(capture), target)
    assert "<img" not in target.read_text()
    watched.open(target.as_uri() + "#/r/0-0/0")
    page = watched.page
    page.locator("#call-detail").wait_for()
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#new-messages pre").first.inner_text() == HOSTILE
    assert page.locator("#answer .answer-text").inner_text() == HOSTILE
    assert page.locator("#answer .tool-call .name").inner_text() == HOSTILE
    watched.shot("hostile-call")
    page.goto(target.as_uri() + "#/")
    page.locator("#rollouts").wait_for()
    assert page.locator("img").count() == 0
    watched.shot("hostile-list")
    assert watched.errors == []
    assert watched.outside == []


def test_without_the_ledger_the_token_view_says_so(
    watched: Watched, job_copy: Path, tmp_path: Path
) -> None:
    (job_copy / "model-calls" / "3-0.lineage.jsonl").unlink()
    target = tmp_path / "report.html"
    write_report(find_run(job_copy, staging=job_copy / "staging"), target)
    watched.open(target.as_uri() + "#/r/3-0")
    view = watched.page.locator("#token-view")
    view.wait_for()
    assert view.locator("#token-verdict.marker").inner_text().startswith("No ledger at ")
    assert view.locator(".token-calls .tag.ok").count() == 2
    assert view.locator("h4.chain .tag.ok").inner_text() == "verified"
    assert view.locator("h4.chain .tag.gap").inner_text() == "records only"
    assert watched.errors == []
