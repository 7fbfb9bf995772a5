"""``--sweep ... --report``'s page in a real headless browser (issue 43), as ``--report``'s page is
(``test_report_browser.py``: Chromium, driven by Playwright where it is installed, else by its
own ``--dump-dom``): no console error, its charts and marks shown, a screenshot taken. Skipped
without Chromium."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cli_runner import run  # noqa: E402
from test_report_browser import CHROMIUM, in_chromium, in_playwright  # noqa: E402

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


def _read_sweep(page):
    counts = (page.locator("svg.chart").count(), page.locator("svg .mark").count(),
              page.locator("svg .chosen").count(), page.locator("table.sweep tbody tr").count())
    return counts, page.evaluate("document.documentElement.scrollWidth")


def _with_playwright(path, shot):
    errors, (counts, wide) = in_playwright(path, shot, _read_sweep)
    return errors, counts, wide


def _with_chromium(path, shot):
    errors, html = in_chromium(path, shot)
    counts = (html.count('class="chart"'), html.count('class="mark'), html.count("mark chosen"),
              html.count('<tr class="count"') + html.count('<tr class="chosen"'))
    return errors, counts, None


def test_sweep_report_in_a_browser(tmp_path):
    # GPT-2 small, batch 16, on 2, 4 and 8 H100s; 1e9 tokens within 0.01 days: 4 and 8 devices
    # (0.015, 0.0082 and 0.0047 days: tests/data/golden/training-sweep).
    path = tmp_path / "sweep.html"
    status, _, err = run("-g", "gpt2-small", "-b", "16", "--machine", "h100-sxm", "--sweep", "2,4,8", "--tokens", "1e9",
                         "--device-hour-price", "2.5", "--days", "0.01", "--report", path)
    assert status == 0, err
    shot = tmp_path / "sweep.png"
    try:
        import playwright  # noqa: F401
        driver = _with_playwright
    except ImportError:
        driver = _with_chromium
    errors, (charts, marks, chosen, rows), wide = driver(path, shot)
    assert errors == []
    assert charts == 3  # tokens/s per device, step time, memory per device against the count
    assert marks == 9 and chosen == 6  # a mark per count on each chart, stars on the two within the deadline
    assert rows == 3
    assert wide is None or wide <= 1150  # the table fits the page: no sideways scrolling
    assert shot.exists() and shot.stat().st_size > 20_000
