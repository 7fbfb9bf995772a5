"""Screenshots of two ``--report`` pages (issue 34), kept in ``benchmarks/results/``:

- Llama 3.1 70B from its Hugging Face config on 256 H100s, batch 512 of 8192 tokens, with
  torchtitan's recipe compared (the one ``benchmarks/training.py`` compares);
- Mixtral-8x7B (built in) on 64 H100s, batch 256 of 4096 tokens, with a Megatron-style
  recipe (tp 2, pp 4, ep 8) compared.

Needs Chromium (``apt-get install chromium``) and Playwright for Python (``pip install
playwright``; it drives that Chromium, nothing is downloaded). Run from the repository root:
``python3 benchmarks/reports.py`` (about a minute).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results")

#: (file name, pase flags)
REPORTS = [
    ("report-llama-3.1-70b-256xh100", ["-g", "hf:examples/hf/llama-3.1-70b.json", "-p", "256", "-b", "512", "-m",
                                       "8192", "--machine", "h100-sxm", "--top", "5", "--compare",
                                       "dp=32,tp=8,zero=3,recompute=full,microbatch=16"]),
    ("report-mixtral-8x7b-64xh100", ["-g", "mixtral-8x7b", "-p", "64", "-b", "256", "--machine", "h100-sxm",
                                     "--top", "5", "--compare", "tp=2,pp=4,ep=8"]),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]


def main() -> int:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        for name, flags in REPORTS:
            page_file = os.path.join(tmp, name + ".html")
            subprocess.run([sys.executable, "scheduler.py", *flags, "--report", page_file], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            page = browser.new_page(viewport={"width": 1150, "height": 900})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto("file://" + page_file)
            if errors:
                raise SystemExit(f"{name}: console errors: {errors}")
            shot = os.path.join(OUT, name + ".png")
            page.screenshot(path=shot, full_page=True)
            print(f"{shot}: pase {' '.join(flags)} --report {name}.html")
            page.close()
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
