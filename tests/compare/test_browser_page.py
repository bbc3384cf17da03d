"""The compare page read in a real headless Chromium: the summary's figures are the document's,
the tasks come worst first and filter, a flipped task shows both runs' transcripts side by side,
and what the page could not hold (payloads over the budget, a run without captures) says so."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.sync_api import expect

from rollcap.compare import Comparison, compare_runs, write_compare_report
from tests.compare.conftest import BENCHMARK, RUN_MODELS
from tests.report.conftest import Watched


@pytest.fixture(scope="module")
def compare_url(comparison: Comparison, tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("compare-page") / "compare.html"
    write_compare_report(comparison, target)
    return target.as_uri()


def _mean(figure: dict[str, Any], digits: int) -> str:
    low, high = figure["ci"]
    return f"{figure['mean']:,.{digits}f} [{low:,.{digits}f}, {high:,.{digits}f}]"


def _diff(figure: dict[str, Any], digits: int) -> str:
    low, high = figure["ci"]
    se = f"{figure['se']:,.{digits + 1}f}"
    return f"{figure['mean']:+,.{digits}f} (se {se}) [{low:+,.{digits}f}, {high:+,.{digits}f}]"


def _answers(job_dir: Path) -> dict[str, str]:
    out = {}
    for raw in (job_dir / "rollouts.jsonl").read_bytes().splitlines():
        line = orjson.loads(raw)
        [message] = line["response"]["output"]
        out[line["rollout_id"]] = message["content"][0]["text"]
    return out


def test_the_summary_and_a_flipped_task_side_by_side(
    watched: Watched, compare_url: str, comparison: Comparison, choice_runs: tuple[Path, Path]
) -> None:
    doc = comparison.data
    [section] = doc["benchmarks"]  # one benchmark a side: no separate overall
    watched.open(compare_url + "#/")
    page = watched.page
    assert page.locator("#side-a").inner_text() == f"{doc['a']['source']} (27 rollouts, 0 failed)"
    assert page.locator("#side-b").inner_text() == f"{doc['b']['source']} (27 rollouts, 0 failed)"
    assert section["name"] == BENCHMARK
    shown = page.locator(f".cmp-section[data-section='{BENCHMARK}']")
    counts = shown.locator(".cmp-tasks").inner_text()
    assert counts == "27 tasks matched · 0 only in A · 0 only in B"
    reward = section["metrics"]["reward"]
    row = shown.locator("tr[data-metric='reward']")
    assert row.locator("td.a").inner_text() == _mean(reward["a"], 3)
    assert row.locator("td.b").inner_text() == _mean(reward["b"], 3)
    assert row.locator("td.diff").inner_text() == _diff(reward["diff"], 3)
    test = section["test"]
    assert test["name"] == "mcnemar_exact"  # every reward is 0 or 1
    tested = shown.locator(".cmp-test").inner_text()
    assert tested.startswith(
        f"McNemar's exact test ({test['a_only']} tasks solved by A only, "
        f"{test['b_only']} by B only): p = "
    )
    assert float(shown.locator(".p-value").inner_text()) == pytest.approx(test["p_value"], 1e-3)
    flips = section["flips"]
    assert shown.locator(".cmp-flips").inner_text() == (
        f"{flips['better']} tasks better in B, {flips['worse']} worse"
    )
    power = section["power"]
    assert shown.locator(".cmp-power").inner_text() == (
        f"{power['tasks_needed']:,} tasks would detect a reward difference of 0.05 with 80% "
        f"power (per-task difference sd {power['sd']:.3f}; 27 matched here)"
    )
    # Every matched task, worst change first; the filter keeps the worse ones.
    changes = doc["overall"]["changes"]
    tasks = page.locator("#tasks tbody tr")
    expect(tasks).to_have_count(len(changes))
    assert [tasks.nth(i).get_attribute("data-task") for i in range(len(changes))] == [
        c["id"] for c in changes
    ]
    worse = [c for c in changes if c["change"] < 0]
    assert flips["worse"] == len(worse) > 0
    watched.shot("compare", keep=True)
    page.select_option("#task-filter", "worse")
    expect(tasks).to_have_count(len(worse))
    assert page.url.endswith("#/?show=worse")
    assert {tasks.nth(i).get_attribute("data-kind") for i in range(len(worse))} == {"worse"}
    # The worst task: A solved it, B did not; both rollouts with their transcripts.
    flipped = worse[0]
    assert (flipped["a"], flipped["b"]) == (1.0, 0.0)
    tasks.first.locator("a").click()
    expect(page.locator("#task-label")).to_have_text(flipped["label"])
    assert page.locator("#task-change").inner_text() == "-1.000"
    assert "Answer with the letter" in page.locator("#task-input").inner_text()
    answers = [_answers(job_dir) for job_dir in choice_runs]
    for side, reward_text, side_answers in zip(("a", "b"), ("1", "0"), answers, strict=True):
        column = page.locator(f".cmp-side[data-side='{side}']")
        [rollout_id] = flipped["rollouts"][side]
        rollout = column.locator(f".cmp-rollout[data-rollout='{rollout_id}']")
        expect(rollout.locator(".transcript .turn")).to_have_count(1)
        assert rollout.locator(".cmp-reward").inner_text() == f"reward {reward_text}"
        assert rollout.locator(".reward").inner_text() == reward_text
        answer = side_answers[rollout_id]
        assert rollout.locator(".final-answer").inner_text() == answer
        assert rollout.locator(".transcript .answer-text").inner_text() == answer
    assert answers[0][flipped["rollouts"]["a"][0]] != answers[1][flipped["rollouts"]["b"][0]]
    # A's column is on the left.
    a_box = page.locator(".cmp-side[data-side='a']").bounding_box()
    b_box = page.locator(".cmp-side[data-side='b']").bounding_box()
    assert a_box is not None
    assert b_box is not None
    assert a_box["x"] < b_box["x"]
    # B's call, in the report's call detail, and back.
    page.locator(".cmp-side[data-side='b'] .transcript .open-call").click()
    detail = page.locator("#call-detail[data-call='0']")
    expect(detail).to_be_visible()
    assert RUN_MODELS[1] in detail.locator(".kv").first.inner_text()
    page.click("#back-to-transcript")
    expect(page.locator(".cmp-side[data-side='b'] .transcript")).to_be_visible()
    assert "show=worse" in page.url
    page.click("#to-tasks")
    expect(tasks).to_have_count(len(worse))
    assert watched.errors == []
    assert watched.outside == []


def test_what_the_page_could_not_hold_it_names(
    watched: Watched,
    comparison: Comparison,
    choice_runs: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    changes = comparison.data["overall"]["changes"]
    # No payload fits: every rollout is listed as left out, and its task says so.
    target = tmp_path / "tight.html"
    write_compare_report(comparison, target, payload_budget=0)
    watched.open(target.as_uri() + "#/")
    page = watched.page
    summary = page.locator("#left-out summary")
    assert summary.inner_text().startswith(
        f"{2 * len(changes)} rollouts of {len(changes)} tasks without a transcript: "
        "their payloads did not fit in this page's payload budget (0 bytes)"
    )
    summary.click()  # a long list starts folded
    left_out = page.locator("#left-out li")
    expect(left_out).to_have_count(len(changes))
    assert [left_out.nth(i).get_attribute("data-task") for i in range(len(changes))] == [
        c["id"] for c in changes
    ]
    first = left_out.first
    [a_id], [b_id] = changes[0]["rollouts"]["a"], changes[0]["rollouts"]["b"]
    assert first.inner_text() == f"{changes[0]['label']}: A {a_id}, B {b_id}"
    first.locator("a").click()
    expect(page.locator("#task-label")).to_have_text(changes[0]["label"])
    for side in ("a", "b"):
        rollout = page.locator(f".cmp-side[data-side='{side}'] .cmp-rollout")
        expect(rollout.locator(".left-out")).to_contain_text("did not fit")
        assert rollout.locator(".transcript").count() == 0
    # A run without its captures: its figures, and why there is nothing more.
    lines_only = tmp_path / "b"
    lines_only.mkdir()
    shutil.copyfile(choice_runs[1] / "rollouts.jsonl", lines_only / "rollouts.jsonl")
    target = tmp_path / "no-capture.html"
    write_compare_report(compare_runs(choice_runs[0], lines_only), target)
    watched.open(target.as_uri() + f"#/t/{changes[0]['id']}")
    b = page.locator(".cmp-side[data-side='b'] .cmp-rollout")
    expect(b.locator(".no-capture")).to_contain_text("the capture was not found")
    assert b.locator(".cmp-reward").inner_text() == "reward 0"
    assert b.locator(".transcript").count() == 0
    expect(page.locator(".cmp-side[data-side='a'] .transcript .turn")).to_have_count(1)
    assert watched.errors == []
    assert watched.outside == []
