"""A real evaluation to report on, and a headless Chromium to look at the report with."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, Route, sync_playwright

from tests.report._evaluation import run_evaluation
from tests.report._runs import calculator_run, variants_run

# Where the screenshots that the README links to are kept (``make screenshots``): each test's
# screenshots go to its tmp directory, and there too when this is set.
KEEP_SCREENSHOTS = "ROLLCAP_SCREENSHOTS"


@pytest.fixture(scope="session")
def evaluation_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``eval submit``-style job directory (see ``_evaluation``); tests must not change it."""
    job_dir = tmp_path_factory.mktemp("evaluation") / "job"
    run_evaluation(job_dir)
    return job_dir


@pytest.fixture(scope="session")
def calculator_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The calculator run of ``_runs``; tests must not change it."""
    job_dir = tmp_path_factory.mktemp("calculator") / "job"
    calculator_run(job_dir)
    return job_dir


@pytest.fixture(scope="session")
def variants_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The variants run of ``_runs``; tests must not change it."""
    job_dir = tmp_path_factory.mktemp("variants") / "job"
    variants_run(job_dir)
    return job_dir


@pytest.fixture
def job_copy(evaluation_dir: Path, tmp_path: Path) -> Path:
    """A copy of the evaluation's job directory that a test may change."""
    copy = tmp_path / "job"
    shutil.copytree(evaluation_dir, copy)
    return copy


# --- the browser -----------------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL_SCHEMES = ("file:", "data:", "blob:")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """Debian's Chromium, headless, with a fresh profile; never a downloaded browser.

    One per module: Playwright's synchronous API holds an event loop while it runs, and the
    asyncio tests of other modules need theirs.
    """
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's chromium package, "
            "which `make test` installs (apt-get install --no-install-recommends chromium)"
        )
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1300, "height": 900},
        )
        context.set_default_timeout(15_000)
        yield context
        context.close()


@dataclass
class Watched:
    """A page whose errors and requests are recorded. Requests that leave the page (anything
    but ``file:``, ``data:``, ``blob:`` and the ``allowed`` origins) are counted and refused."""

    page: Page
    shots: Path
    allowed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def _leaves(self, url: str) -> bool:
        return not url.startswith(LOCAL_SCHEMES) and not any(
            url.startswith(a) for a in self.allowed
        )

    def open(self, url: str) -> None:
        self.page.goto(url)
        self.page.wait_for_selector("html[data-ready='1']")

    def shot(self, name: str, *, keep: bool = False) -> None:
        """A full-page screenshot; ``keep``: also into ``$ROLLCAP_SCREENSHOTS`` when set."""
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        kept = os.environ.get(KEEP_SCREENSHOTS)
        if keep and kept:
            Path(kept).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(kept) / path.name)


@pytest.fixture
def watched(browser: BrowserContext, tmp_path: Path) -> Iterator[Watched]:
    page = browser.new_page()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    w = Watched(page, shots)
    page.on("pageerror", lambda error: w.errors.append(f"pageerror: {error}"))
    page.on(
        "console",
        lambda message: (
            w.errors.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )
    page.on(
        "request", lambda request: w.outside.append(request.url) if w._leaves(request.url) else None
    )

    def route(route: Route) -> None:
        if w._leaves(route.request.url):
            route.abort()
        else:
            route.continue_()

    page.route("**/*", route)
    yield w
    page.close()
