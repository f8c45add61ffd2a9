"""Regenerate the README's picture of the report from a real run, in headless Chromium.

    python docs/screenshot.py                  # a fresh `ddp-profile demo` run, then its picture
    python docs/screenshot.py --run RUN_DIR    # the picture of an existing run's report.html

Writes ``docs/report.png`` (``--png``): the top of the report (the recommendation, the
findings and the first charts) at 1360 x 1100 CSS pixels. With a fresh run it also prints the
console lines the run printed, for the README's excerpt. Debian's chromium, driven by
Playwright with its executable path (never a downloaded browser).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def fresh_run(out: str) -> str:
    """Run the built-in workload with its defaults; its console output (progress included)."""
    result = subprocess.run([sys.executable, "-m", "ddp_profile", "demo", "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            check=False)
    if result.returncode != 0:
        sys.exit(f"screenshot: the demo run failed ({result.returncode}): "
                 f"{result.stdout.strip().splitlines()[-1:] or ''}")
    return result.stdout


def picture(report: str, png: str, width: int = 1360, height: int = 1100) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto("file://" + os.path.abspath(report))
            page.wait_for_load_state("load")
            page.wait_for_function("document.querySelectorAll('.chart .main-svg').length > 0")
            page.screenshot(path=png, full_page=False)
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="an existing run directory (default: a fresh demo run)")
    parser.add_argument("--png", default=os.path.join(HERE, "report.png"))
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        sys.exit(f"screenshot: {CHROMIUM} is absent (apt-get install chromium; `make browser`)")
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run
        if run_dir is None:
            run_dir = os.path.join(scratch, "demo")
            print(fresh_run(run_dir), end="")
        report = os.path.join(run_dir, "report.html")
        if not os.path.isfile(report):
            sys.exit(f"screenshot: no report.html in {run_dir}")
        picture(report, args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
