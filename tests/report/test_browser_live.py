"""The served view's live panel in a real headless Chromium: a run's status file that the
collector replaces while the page is open (``GET /api/live``)."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Request, expect

from rollcap._runtime.serving import serving_in_thread
from rollcap.report import create_view_app, find_run
from rollcap.status import StatusSource, status_path
from tests.report.conftest import Watched
from tests.report.test_view import finish, stalled_board, write_status


def test_the_live_panel_follows_the_status_file_until_the_run_finishes(
    watched: Watched, job_copy: Path, tmp_path: Path
) -> None:
    path = status_path(tmp_path / "rollouts.jsonl")
    app = create_view_app(find_run(job_copy), live=StatusSource(path=path))
    asked: list[str] = []
    with serving_in_thread(app) as url:
        watched.allowed.append(url + "/")
        page = watched.page

        def count(request: Request) -> None:
            if request.url.endswith("/api/live"):
                asked.append(request.url)

        page.on("request", count)
        watched.open(url + "/")
        panel = page.locator("#live-panel")
        # Above the overview; no status file yet: the panel says so, and goes on asking.
        expect(page.locator("#app > *").first).to_have_attribute("id", "live-panel")
        expect(panel.locator("#live-error")).to_contain_text("no status file (yet)")
        expect(panel.locator(".live-rollout")).to_have_count(0)
        expect(panel).to_have_attribute("data-polling", "1")

        board = stalled_board()
        write_status(path, board, 80.0)
        rows = panel.locator(".live-rollout")
        expect(rows).to_have_count(2)
        expect(panel.locator("#live-error")).to_have_count(0)
        run = panel.locator(".live-run")
        expect(run).to_have_attribute("data-finished", "0")
        expect(run.locator(".live-id")).to_have_text("rollouts.jsonl")
        expect(run.locator("[data-count='done']")).to_have_text("1/3 done")
        expect(run.locator("[data-count='running']")).to_have_text("2 running")
        expect(run.locator("[data-count='stalled']")).to_have_text("1 stalled")
        expect(run.locator("[data-count='stalled']")).to_have_class(re.compile(r"\bwarn\b"))
        expect(run.locator("[data-count='slow']")).to_have_text("0 slow")
        expect(run.locator(".live-eta")).to_contain_text("ETA")
        expect(run.locator(".live-server-down")).to_have_count(1)
        expect(run.locator(".live-server-down[data-server='judge']")).to_contain_text(
            "did not answer: timed out after 2 s"
        )
        # The stalled one first, with what it waits on; the other between calls.
        stalled = rows.nth(0)
        expect(stalled).to_have_attribute("data-rollout-id", "1-0")
        expect(stalled).to_have_attribute("data-state", "stalled")
        expect(stalled).to_have_class(re.compile(r"\bstate-stalled\b"))
        expect(stalled.locator(".live-doing")).to_have_text(
            "model call on policy: waiting_upstream, upstream silent 1 m 15 s, call stalled"
        )
        # 1-0 has a capture already: its id links to its page; 4-0 has none.
        expect(stalled.locator("a.rid")).to_have_attribute("href", "#/r/1-0")
        idle = rows.nth(1)
        expect(idle).to_have_attribute("data-rollout-id", "4-0")
        expect(idle).to_have_attribute("data-state", "active")
        expect(idle.locator("a")).to_have_count(0)
        expect(idle.locator("td").nth(1)).to_have_text("2")  # the attempt
        expect(idle.locator(".live-doing")).to_have_text("between calls (agent or tool) for 10.0 s")
        watched.shot("view-live-stalled")

        # A rollout's page has no panel; back on the overview, it is there again.
        stalled.locator("a.rid").click()
        page.wait_for_selector("#waterfall")
        expect(page.locator("#live-panel")).to_have_count(0)
        page.click("#home")
        expect(panel.locator(".live-rollout[data-state='stalled']")).to_have_count(1)

        finish(board)
        write_status(path, board, 95.0)
        expect(run).to_have_attribute("data-finished", "1")
        expect(run.locator(".live-finished")).to_have_text("finished")
        expect(run.locator("[data-count='done']")).to_have_text("3/3 done")
        expect(run.locator("[data-count='failed']")).to_have_text("1 failed")
        expect(rows).to_have_count(0)
        expect(panel).to_have_attribute("data-polling", "0")
        watched.shot("view-live-finished")
        # Every run finished: the page asks no more.
        before = len(asked)
        page.wait_for_timeout(2500)
        assert len(asked) == before
        assert before >= 3
        assert watched.errors == []
        assert watched.outside == []
