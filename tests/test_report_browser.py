"""``--report``'s page in a real headless browser: Chromium from the distribution's packages
(``.ci/run`` installs it), driven by Playwright for Python when it is installed, else by
Chromium's own ``--headless --dump-dom`` and ``--screenshot``. The page must load with no
console error, show its charts, and a screenshot is taken. Skipped without Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and os.path.exists(p)), None)
#: Flags for a headless run that reaches no network and starts nothing in the background.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def page_path(tmp_path_factory):
    """A pipelined plan's page: gpt2-small on 8 H100s, batch 64, two interleaved stages of 16 micro-batches, three
    alternatives, data parallelism compared."""
    path = tmp_path_factory.mktemp("report") / "plan.html"
    status, _, err = run("-g", "gpt2-small", "-p", "8", "-b", "64", "--machine", "h100-sxm", "--recipe",
                         "pp=2,schedule=interleaved,microbatch=1", "--compare", "dp=8", "--top", "3", "--report", path)
    assert status == 0, err
    return path


def in_playwright(path, shot, read):
    """``(errors, read(page))`` of the page at ``path`` in Chromium driven by Playwright (console
    errors and uncaught exceptions collected), and its full-page screenshot at ``shot``."""
    from playwright.sync_api import sync_playwright

    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1150, "height": 900})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.as_uri())
            read_back = read(page)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return errors, read_back


def in_chromium(path, shot):
    """``(errors, html)`` of the page at ``path`` as headless Chromium renders it (its logged
    errors, its DOM), and its screenshot at ``shot``: where Playwright is not installed."""
    dom = subprocess.run([CHROMIUM, *FLAGS, "--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    errors = [line for line in dom.stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line and "rror" in line]
    subprocess.run([CHROMIUM, *FLAGS, "--hide-scrollbars", "--window-size=1150,3000", f"--screenshot={shot}",
                    path.as_uri()], capture_output=True, timeout=120)
    return errors, dom.stdout


def _read_plan(page):
    counts = (page.locator("svg.chart").count(), page.locator("svg .mark").count(),
              page.locator("table.alts tbody tr").count())
    page.locator("table.alts th").nth(2).click()  # the page's script sorts the table
    return counts


def _with_playwright(path, shot):
    errors, (charts, marks, rows) = in_playwright(path, shot, _read_plan)
    return errors, charts, marks, rows


def _with_chromium(path, shot):
    errors, html = in_chromium(path, shot)
    return errors, html.count('class="chart"'), html.count('class="mark"'), html.count("<tr class=")


def test_report_in_a_browser(page_path, tmp_path):
    shot = tmp_path / "plan.png"
    try:
        import playwright  # noqa: F401
        driver = _with_playwright
    except ImportError:
        driver = _with_chromium
    errors, charts, marks, rows = driver(page_path, shot)
    assert errors == []
    # Step by cause, memory, the pipeline schedule, both scatters; the warm-up zoom needs more
    # than 2 pp micro-batches (16 here: shown).
    assert charts == 6
    # In each scatter: the plan, two alternatives, the compared recipe.
    assert marks == 8
    assert rows == 4  # three alternatives and the compared recipe
    assert shot.exists() and shot.stat().st_size > 20_000
