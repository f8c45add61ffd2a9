"""What a person reads of a real run: the console summary and the report's first screen.

One real sweep of the built-in workload as one process (``--launcher none``: the script runs
as itself, no process group, as a single-GPU script does), data-bound (2 ms of sleep per
sample), workers 0 and 2: a loader recommendation. Its console summary is read from the real
CLI's stdout (at most ~15 lines of at most 100 characters, the verdict first), ``--verbose``
from the same run finished again (``--resume``: nothing is measured twice), and its
report.html in Debian's chromium at 1400 x 900: the first screen holds the cause, the snippet,
the speedup with its interval and what is not established; no ``null``, no "rank -1"
anywhere, and no loader recommendation beside "Findings (0)". The first screen's picture lands
in test-artifacts/verdict-first-screen.png.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.browser import ARTIFACTS, launch, needs_chromium
from tests.conftest import DEMO, ONE_THREAD, run_cli

pytestmark = [pytest.mark.e2e]

WIDTH, SCREEN = 1400, 900
ARGS = ["--launcher", "none", "--num-workers", "0,2", "--batch-size", "8", "--pin-memory",
        "false", "--prefetch-factor", "2", "--no-comm", "--steps", "20", "--warmup", "3"]
SCRIPT_ARGS = ["--", "--load-ms", "2", "--batch-size", "8", "--hidden", "64", "--device", "cpu"]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("verdict-real") / "run")
    # one intra-op thread, as the suite's other one-rank runs: with torch's default threads
    # beside 2 workers it ran a threads check too, 6 launches no assertion reads
    result = run_cli(["run", DEMO, "--out", out, *ARGS, *SCRIPT_ARGS], out=out, timeout=420,
                     env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_the_console_summary_reads_in_ten_seconds(one_process_run):
    out, stdout = one_process_run
    lines = stdout.rstrip("\n").splitlines()
    assert len(lines) <= 15, stdout
    assert max(len(line) for line in lines) <= 100, stdout
    # the verdict first: what to change, how much, how sure, then the snippet
    assert re.match(r"Change num_workers 0 -> 2: \d+\.\d\dx as fast \[\d+\.\d\d-\d+\.\d\d\]$",
                    lines[1]), stdout
    assert lines[2].strip().startswith("DataLoader(dataset, batch_size=8, num_workers=2")
    assert lines[4].startswith("Cause: ")
    assert "measured from" not in stdout and "p000" not in stdout  # the method: --verbose

    again = run_cli(["run", "--resume", "--out", out, "--verbose"], out=out, env=ONE_THREAD)
    assert again.returncode == 0, again.stderr
    detail = again.stdout.rstrip("\n").splitlines()
    assert detail[:len(lines) - 1] == lines[:-1]  # the same verdict first
    assert "Detail:" in detail and max(len(line) for line in detail) <= 100, again.stdout
    joined = " ".join(line.strip() for line in detail)
    assert "measured from the script's settings and the recommendation alternated" in joined
    assert re.search(r"baseline +w=0 pin=false bs=8: [\d,.]+ samples/s", joined), joined

    other = os.path.join(os.path.dirname(out), "again.html")  # `report` prints it on asking
    rendered = run_cli(["report", out, "-o", other, "--verbose"], out=out)
    assert rendered.returncode == 0, rendered.stderr
    printed = rendered.stdout.rstrip("\n").splitlines()
    assert printed[-1] == other and printed[:-1] == detail


@needs_chromium
@pytest.mark.browser
def test_the_first_screen_is_the_verdict(one_process_run):
    sync_api = pytest.importorskip("playwright.sync_api")
    out, _ = one_process_run
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": SCREEN})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto("file://" + os.path.abspath(os.path.join(out, "report.html")))
            page.wait_for_load_state("load")
            page.wait_for_function("document.querySelectorAll('.chart .main-svg').length > 0")
            assert errors == []

            def on_first_screen(selector: str) -> str:
                element = page.locator(selector)
                box = element.bounding_box()
                assert box is not None and element.is_visible(), selector
                assert box["y"] + box["height"] <= SCREEN, (selector, box)
                return element.inner_text()

            cause = on_first_screen("#verdict-cause")
            assert "Training waits on the DataLoader" in cause, cause
            assert "%" in cause and not re.search(r"\bp\d{3}\b", cause)
            assert "num_workers 0 → 2" in on_first_screen("#verdict-change")
            snippet = on_first_screen("#snippet")
            assert snippet.startswith("DataLoader(dataset, batch_size=8, num_workers=2")
            speedup = on_first_screen("#expected-speedup")
            assert re.fullmatch(r"\d+\.\d\d×", speedup.strip()), speedup
            interval = on_first_screen("#speedup-interval")
            assert re.fullmatch(r"interval \d+\.\d\d–\d+\.\d\d×", interval.strip()), interval
            assert "alternated with the script's settings" in on_first_screen("#speedup-check")
            assert "not established" in on_first_screen("#unsettled").lower()
            warnings = page.locator("#warnings")
            if warnings.count():  # below the verdict, never before it
                assert warnings.bounding_box()["y"] > page.locator("#summary").bounding_box()["y"]

            # everything a reader sees, the charts' own text included (the per-probe charts
            # of the default probe: the recommended one, drawn at load)
            seen = page.evaluate("() => document.body.innerText + '\\n' + Array.from("
                                 "document.querySelectorAll('svg text')).map(t => "
                                 "t.textContent).join('\\n')")
            assert not re.search(r"\bnull\b", seen)
            assert "rank -1" not in seen and "the process" in seen
            findings = page.locator("#findings .finding").count()
            assert findings >= 1 and "Findings (0)" not in seen
            assert f"Findings ({findings})" in seen
            os.makedirs(ARTIFACTS, exist_ok=True)
            page.screenshot(path=os.path.join(ARTIFACTS, "verdict-first-screen.png"))
            page.close()
        finally:
            browser.close()
