"""The report read as a person debugging rollouts reads it, in a real headless Chromium: a
rollout's transcript, divergences that explain themselves, search, moving between rollouts, a
reload, and charts whose labels tell their bars apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.sync_api import expect

from rollcap.report import find_run, write_report
from tests.report._evaluation import EXPECTED_CALLS
from tests.report._runs import ANSWERS, CALCULATOR_ROLLOUTS, FOLLOW_UP, QUESTION
from tests.report.conftest import Watched


def _report(run_dir: Path, target: Path, **names: Any) -> str:
    write_report(find_run(run_dir, **names), target)
    return target.as_uri()


@pytest.fixture(scope="module")
def calculator_url(calculator_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _report(
        calculator_dir / "model-calls", tmp_path_factory.mktemp("calc-report") / "report.html"
    )


@pytest.fixture(scope="module")
def variants_url(variants_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _report(variants_dir, tmp_path_factory.mktemp("variants-report") / "report.html")


@pytest.fixture(scope="module")
def evaluation_url(evaluation_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _report(evaluation_dir, tmp_path_factory.mktemp("eval-report") / "report.html")


def _line(calculator_dir: Path, rollout_id: str) -> dict[str, Any]:
    for raw in (calculator_dir / CALCULATOR_ROLLOUTS).read_bytes().splitlines():
        line: dict[str, Any] = orjson.loads(raw)
        if line["rollout_id"] == rollout_id:
            return line
    raise AssertionError(f"no line for {rollout_id}")


def test_the_transcript_of_a_three_turn_calculator_rollout(
    watched: Watched, calculator_url: str, calculator_dir: Path
) -> None:
    line = _line(calculator_dir, "0-0")
    outputs = line["response"]["output"]
    tool_calls = [item for item in outputs if item["type"] == "function_call"]
    final = next(
        part["text"]
        for item in reversed(outputs)
        if item["type"] == "message"
        for part in item["content"]
    )
    watched.open(calculator_url + "#/r/0-0")
    page = watched.page
    page.locator("#transcript").wait_for()
    header = page.locator("#rollout-header")
    assert "What is 17 + 25?" in header.locator("#task-input").inner_text()
    assert header.locator("#expected-answer").inner_text() == "42 (the line's expected_answer)"
    assert header.locator("#final-answer").inner_text() == final
    verifier = header.locator("#verifier")
    assert verifier.locator("[data-field='extracted_answer'] code").inner_text() == "null"
    assert verifier.locator("[data-field='resolved'] code").inner_text() == "false"
    assert header.locator("#reward").inner_text() == "0"
    turns = page.locator("#transcript .turn")
    assert turns.count() == 3
    assert [turns.nth(i).locator("h4 a").inner_text() for i in range(3)] == [
        "turn 1/3 · call #0",
        "turn 2/3 · call #1",
        "turn 3/3 · call #2",
    ]
    # Each tool call, with its id, beside its result and the tool's run.
    runs = {run["tool_call_id"]: run for run in line["ng_trajectory"]["tool_calls"]}
    for turn, call in enumerate(tool_calls):
        shown = turns.nth(turn).locator(f".tool-call.paired[data-tool-call='{call['call_id']}']")
        assert shown.locator(".name").inner_text() == call["name"]
        assert call["call_id"] in shown.locator(".call-id").inner_text()
        assert orjson.loads(shown.locator(".arguments").inner_text()) == orjson.loads(
            call["arguments"]
        )
        assert runs[call["call_id"]]["output"] in shown.locator(".tool-result").inner_text()
        assert shown.locator(".tool-duration").inner_text().startswith(" · ran ")
        assert "completed" in shown.locator(".tool-duration").inner_text()
    # The results are shown with their calls, not again as the next turn's new messages.
    assert page.locator("#transcript .added .msg.role-tool").count() == 0
    assert final in turns.nth(2).locator(".answer-text").inner_text()
    # The time axis draws the tool runs between the calls.
    assert page.locator("#waterfall g.tool-run").count() == len(tool_calls)
    assert page.locator("#waterfall g.bar").count() == 3
    watched.shot("transcript", keep=True)
    # The call detail is one click away, and back.
    turns.nth(1).locator("h4 a").click()
    page.locator("#call-detail[data-call='1']").wait_for()
    assert page.locator("#messages-heading").inner_text() == "New messages (1 of 3)"
    page.check("#whole-request")
    assert page.locator("#messages-heading").inner_text() == "The whole request (3 messages)"
    page.click("#back-to-transcript")
    page.locator("#transcript").wait_for()
    assert watched.errors == []
    assert watched.outside == []


def test_a_divergence_that_only_a_parameter_explains_names_it(
    watched: Watched, variants_url: str
) -> None:
    watched.open(variants_url + "#/t/0")
    page = watched.page
    divergence = page.locator("#divergence[data-kind]")
    divergence.wait_for()
    assert divergence.get_attribute("data-kind") == "params"
    assert divergence.inner_text() == (
        "they first differ at call #0 of 0-0 and call #0 of 0-1: the same messages, "
        "different request parameters: stream"
    )
    row = page.locator("#param-diff tr[data-param='stream'] td")
    assert [row.nth(i).inner_text() for i in range(3)] == ["stream", "(not sent)", "true"]
    # The failed call of 0-0 is named as a retry, not taken for a divergence.
    retry = page.locator("#divergence-notes .retry")
    assert retry.count() == 1
    assert retry.inner_text() == (
        "0-0 call #1 failed with HTTP 500 (upstream_error) and was retried with the same request "
        "as call #2; the comparison leaves the failed call out"
    )
    watched.shot("divergence", keep=True)
    # The other way round, the sides swap.
    page.select_option("#pick-a", "1")
    page.select_option("#pick-b", "0")
    page.locator("#param-diff").wait_for()
    row = page.locator("#param-diff tr[data-param='stream'] td")
    assert [row.nth(i).inner_text() for i in range(3)] == ["stream", "true", "(not sent)"]
    assert watched.errors == []


def test_a_retried_500_is_named(watched: Watched, variants_url: str) -> None:
    watched.open(variants_url + "#/r/0-0")
    page = watched.page
    failed = page.locator("#turn-1")
    failed.wait_for()
    assert failed.locator(".tag.err").first.inner_text() == "upstream_error"
    assert failed.locator(".retry").inner_text() == (
        "failed with HTTP 500 (upstream_error); retried with the same request as call #2"
    )
    assert "the same request as call #1, which failed" in page.locator("#turn-2").inner_text()
    assert FOLLOW_UP in failed.inner_text()
    page.goto(variants_url + "#/r/0-0/1")
    detail = page.locator("#call-detail[data-call='1']")
    detail.wait_for()
    assert "retried with the same request as call #2" in detail.locator(".retry").inner_text()
    assert detail.locator(".error-category").inner_text() == "upstream_error"
    watched.shot("failed-call", keep=True)
    assert watched.errors == []


def test_search_finds_a_rollout_by_a_word_of_its_answer(
    watched: Watched, variants_url: str, evaluation_url: str
) -> None:
    watched.open(variants_url)
    page = watched.page
    rows = page.locator("#rollouts tbody tr")
    page.fill("#search", "Olympus")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-rollout") == "0-0"
    page.fill("#search", "venus tallest")  # every word, any case
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-rollout", "0-1")
    assert ANSWERS["0-1"].startswith("The tallest")
    page.fill("#search", QUESTION.split()[3])  # a word of the prompt: both
    expect(rows).to_have_count(2)
    # In the evaluation: a word only one rollout's conversation holds (a follow-up question).
    watched.open(evaluation_url)
    page.fill("#search", "sure")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-rollout") == "0-0"
    assert page.locator("#list-count").inner_text() == f"1 of {len(EXPECTED_CALLS)} rollouts"
    assert watched.errors == []


def test_next_and_previous_move_through_the_filtered_list(
    watched: Watched, evaluation_url: str
) -> None:
    watched.open(evaluation_url + "#/?kind=errors")
    page = watched.page
    page.locator("#rollouts tbody tr").first.wait_for()
    assert page.locator("#filter-kind").input_value() == "errors"
    page.click("#rollouts tbody tr[data-rollout='1-0'] a.rid")
    page.locator("#rollout-nav").wait_for()
    assert page.locator("#nav-position").inner_text() == "1 of 2 filtered rollouts"
    assert page.locator("#prev-rollout").count() == 0
    assert page.locator("#next-rollout").inner_text() == "2-0 →"
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("#nav-position:text('2 of 2 filtered rollouts')")
    assert page.locator("h2").first.inner_text() == "Rollout 2-0"
    assert page.locator("#next-rollout").count() == 0
    page.keyboard.press("k")
    page.wait_for_selector("#nav-position:text('1 of 2 filtered rollouts')")
    assert page.locator("h2").first.inner_text() == "Rollout 1-0"
    page.click("#next-rollout")
    page.wait_for_selector("#nav-position:text('2 of 2 filtered rollouts')")
    # Only a rollout's page moves with the keys.
    page.goto(evaluation_url + "#/t/0")
    page.locator("#group-rollouts").wait_for()
    page.keyboard.press("ArrowLeft")  # 2-0's page, just left, had 1-0 before it
    page.locator("#group-rollouts").wait_for()
    assert page.evaluate("location.hash") == "#/t/0"
    assert watched.errors == []


def test_a_reload_keeps_the_filters_and_the_open_rollout(
    watched: Watched, evaluation_url: str
) -> None:
    watched.open(evaluation_url)
    page = watched.page
    rows = page.locator("#rollouts tbody tr")
    page.fill("#search", "sure")
    page.select_option("#filter-kind", "positive")
    expect(rows).to_have_count(1)
    page.click("th[data-key='calls']")
    assert page.evaluate("location.hash") == "#/?q=sure&kind=positive&sort=calls"
    page.click("#rollouts tbody tr a.rid")
    page.locator("#rollout-nav").wait_for()
    page.click("#waterfall g.bar[data-call='1']")
    page.locator("#call-detail[data-call='1']").wait_for()
    assert page.evaluate("location.hash") == "#/r/0-0/1?q=sure&kind=positive&sort=calls"
    page.reload()
    page.wait_for_selector("html[data-ready='1']")
    page.locator("#call-detail[data-call='1']").wait_for()
    assert page.locator("#nav-position").inner_text() == "1 of 1 filtered rollouts"
    page.click("#to-list")
    page.locator("#rollouts tbody tr").first.wait_for()
    assert page.locator("#search").input_value() == "sure"
    assert page.locator("#filter-kind").input_value() == "positive"
    assert page.locator("th.sorted").get_attribute("data-key") == "calls"
    assert page.locator("#rollouts tbody tr").count() == 1
    assert watched.errors == []


def test_charts_label_their_bars_and_ticks_apart(watched: Watched, evaluation_url: str) -> None:
    watched.open(evaluation_url)
    page = watched.page
    # Calls per rollout are whole numbers: one bar per value, its tooltip naming that value.
    bins = page.locator("#plot-calls rect.bin")
    values = sorted(set(EXPECTED_CALLS.values()))
    assert [bins.nth(i).get_attribute("data-from") for i in range(bins.count())] == [
        str(v) for v in values
    ]
    for i, value in enumerate(values):
        title = bins.nth(i).locator("title").text_content() or ""
        count = list(EXPECTED_CALLS.values()).count(value)
        assert title.startswith(f"Calls per rollout {value}: {count} ·"), title
        assert bins.nth(i).get_attribute("data-to") == str(value)
    # No two ticks of one axis read the same, the TTFT axis's sub-millisecond ones included.
    for plot in ("latency", "ttft", "tokens-in", "tokens-out", "calls"):
        ticks = page.locator(f"#plot-{plot} text.tick").all_text_contents()
        assert len(ticks) == len(set(ticks)), (plot, ticks)
        assert len(ticks) >= 2, (plot, ticks)  # one tick gives no scale
    watched.shot("overview", keep=True)
    # A Responses call shows its status; the task table's numbers sit under their headers.
    page.goto(evaluation_url + "#/r/1-0")
    first = page.locator("#turn-0 h4")
    first.wait_for()
    assert first.locator(".tag").first.inner_text() == "completed"
    page.goto(evaluation_url + "#/t/0")
    page.locator("#group-rollouts").wait_for()
    headers = page.locator("#group-rollouts th")
    cells = page.locator("#group-rollouts tbody tr").first.locator("td")
    for i in range(headers.count()):
        assert (headers.nth(i).get_attribute("class") or "") == (
            cells.nth(i).get_attribute("class") or ""
        ), i
    assert watched.errors == []


def test_a_single_value_histogram_is_one_bar_on_that_value(
    watched: Watched, calculator_url: str
) -> None:
    watched.open(calculator_url)
    page = watched.page
    bins = page.locator("#plot-calls rect.bin")
    assert bins.count() == 1  # every calculator rollout made 3 calls
    assert (bins.get_attribute("data-from"), bins.get_attribute("data-to")) == ("3", "3")
    assert page.locator("#plot-calls text.tick").all_text_contents() == ["3"]
    assert watched.errors == []
