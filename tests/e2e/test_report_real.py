"""The report of a real sweep in a real browser, and `report` re-rendering without running.

One real 2-rank sweep of the built-in workload (num_workers 0 and 2, the other axes pinned so
the search tries nothing else, then the ceiling probe; no DDP counterfactuals or claim
alternation: their launches are other tests' subject, this one's is the page),
its report.html opened in Debian's chromium through Playwright (never a downloaded browser).
30 measured steps, so each probe lasts beyond the host sampler's 0.5 s interval and the CPU
charts have data (with 10 steps of ~20 ms they show "no host samples").
The screenshot lands in test-artifacts/report-real.png.
"""

from __future__ import annotations

import os

import pytest

from tests.browser import ARTIFACTS, launch, needs_chromium
from tests.conftest import DEMO, run_cli

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    needs_chromium,
]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("report-real") / "run")
    result = run_cli(["run", DEMO, "--out", out, "--num-workers", "0,2", "--prefetch-factor", "2",
                      "--pin-memory", "false", "--batch-size", "8", "--no-comm", "--pairs", "0",
                      "--steps", "30",
                      "--warmup", "3", "--quiet", "--", "--load-ms", "2", "--batch-size", "8"],
                     out=out)
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(os.path.join(out, "report.html"))
    return out


def _probe_dirs(run_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(run_dir, "probes")))


def test_real_report_renders_in_chromium(real_run):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            errors: list[str] = []
            page.on("dialog", lambda dialog: (errors.append("dialog: " + dialog.message),
                                              dialog.dismiss()))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto("file://" + os.path.abspath(os.path.join(real_run, "report.html")))
            page.wait_for_load_state("load")

            charts = page.locator(".chart")
            total = charts.count()
            drawn = page.locator(".chart .main-svg").evaluate_all(
                "els => new Set(els.map(e => e.closest('.chart'))).size")
            assert total >= 4 and drawn == total, (total, drawn)
            recommended = page.locator("#recommended-settings")
            assert recommended.is_visible()
            assert "num_workers=" in recommended.inner_text(), recommended.inner_text()
            rows = page.locator("#probe-table tbody tr")
            assert rows.count() >= 3  # w=0, w=2, the ceiling (and any probe measured again)
            assert page.locator("#gpu-unavailable").is_visible()  # a CPU-only machine
            assert errors == []
            os.makedirs(ARTIFACTS, exist_ok=True)
            page.screenshot(path=os.path.join(ARTIFACTS, "report-real.png"), full_page=True)
            page.close()
        finally:
            browser.close()


def test_report_command_rerenders_without_running(real_run, tmp_path):
    before = _probe_dirs(real_run)
    with open(os.path.join(real_run, "ledger.jsonl"), encoding="utf-8") as handle:
        ledger = handle.read()
    other = str(tmp_path / "other.html")
    result = run_cli(["report", real_run, "-o", other], out=real_run)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == other
    assert os.path.getsize(other) > 100_000  # plotly.js inlined: a self-contained file
    with open(other, encoding="utf-8") as handle:
        assert 'src="https://' not in handle.read()
    assert _probe_dirs(real_run) == before  # no probe ran
    with open(os.path.join(real_run, "ledger.jsonl"), encoding="utf-8") as handle:
        assert handle.read() == ledger


def test_the_readme_picture_is_made_from_a_real_report(real_run, tmp_path):
    import struct
    import subprocess
    import sys

    png = str(tmp_path / "report.png")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "screenshot.py")
    result = subprocess.run([sys.executable, script, "--run", real_run, "--png", png],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    with open(png, "rb") as handle:
        header = handle.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1360, 1100)
    assert os.path.getsize(png) > 50_000  # the page drawn, not a blank one
    missing = subprocess.run([sys.executable, script, "--run", str(tmp_path), "--png", png],
                             capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0 and "no report.html" in missing.stderr
