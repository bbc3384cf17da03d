"""``rollcap capture view`` in a real headless Chromium: the page over real sockets, and a
rollout that lands while it is open."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from rollcap._runtime.serving import serving_in_thread
from rollcap.report import create_view_app, find_run
from tests.report._evaluation import EXPECTED_CALLS, evaluation_servers
from tests.report.conftest import Watched


def test_the_served_page_shows_a_rollout_that_lands_while_it_is_open(
    watched: Watched, job_copy: Path
) -> None:
    app = create_view_app(find_run(job_copy, staging=job_copy / "staging"))
    with serving_in_thread(app) as url:
        watched.allowed.append(url + "/")
        watched.open(url + "/")
        page = watched.page
        assert page.locator("#rollouts tbody tr").count() == len(EXPECTED_CALLS)
        with evaluation_servers(job_copy) as run:
            run.chat_rollout(2, ["Once more."], 1.0)
        # The page polls its summary: the new rollout's row appears without a reload.
        page.wait_for_selector("tr[data-rollout='0-2']")
        assert page.locator("#rollouts tbody tr").count() == len(EXPECTED_CALLS) + 1
        watched.shot("view-new-rollout")
        page.click("tr[data-rollout='0-2']")
        page.wait_for_selector("#waterfall g.bar[data-call='2']")
        assert page.locator("#waterfall g.bar").count() == 3
        page.click("#waterfall g.bar[data-call='1']")
        detail = page.locator("#call-detail[data-call='1']")
        detail.locator("#raw summary").click()
        assert detail.locator("#raw pre").first.inner_text().startswith("data: ")
        page.goto(url + "/#/t/0")
        page.select_option("#pick-b", "2")
        # Explained by the server: the follow-up question is what differs.
        page.wait_for_selector("#divergence[data-call='2'][data-kind='message']")
        # The search asks the server, which has the new rollout's texts too.
        page.goto(url + "/#/?q=once%20more%20lookup_capital")
        expect(page.locator("#rollouts tbody tr")).to_have_count(1)
        assert page.locator("#rollouts tbody tr").get_attribute("data-rollout") == "0-2"
        assert page.locator("#search").input_value() == "once more lookup_capital"
        page.goto(url + "/#/r/3-0")
        page.locator("#token-view .tokens span").first.wait_for()
        assert page.locator("#token-verdict .tag.ok").inner_text() == "trainable"
        assert page.locator("#token-view .tokens span.gen").count() > 0
        watched.shot("view-tokens")
        # Checked while the server still answers the page's polls.
        assert watched.errors == []
        assert watched.outside == []
