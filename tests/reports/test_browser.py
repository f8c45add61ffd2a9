"""The report in a real browser: Debian's chromium driven by Playwright, never a downloaded one."""

from __future__ import annotations

import os

import pytest

from ddp_profile.reports.html import write_report
from tests.browser import ARTIFACTS, launch, needs_chromium

pytestmark = [
    pytest.mark.browser,
    needs_chromium,
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def _open(browser, path: str):
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    # Registered before the page loads, so an alert() fired while parsing is caught too.
    page.on("dialog", lambda dialog: (errors.append("dialog: " + dialog.message),
                                      dialog.dismiss()))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    page.goto("file://" + os.path.abspath(path))
    page.wait_for_load_state("load")
    return page, errors, requests


def _rendered(page) -> tuple[int, int]:
    charts = page.locator(".chart")
    total = charts.count()
    drawn = page.locator(".chart .main-svg").evaluate_all(
        "els => new Set(els.map(e => e.closest('.chart'))).size")
    return total, drawn


def test_report_renders_offline_and_sorts(browser, sweep_run, tmp_path):
    path = write_report(sweep_run, str(tmp_path / "report.html"))
    page, errors, requests = _open(browser, path)

    assert errors == []
    file_url = "file://" + os.path.abspath(path)
    assert [u for u in requests if u != file_url and not u.startswith(("data:", "blob:"))] == []

    total, drawn = _rendered(page)
    assert total >= 8 and drawn == total
    recommended = page.locator("#recommended-settings")
    assert recommended.is_visible()
    assert "num_workers=" in recommended.inner_text()
    assert page.locator("#probe-charts .chart[data-name=gpu_util] .main-svg").count() >= 1

    column = page.locator("#probe-table thead th", has_text="samples/s")
    index = page.locator("#probe-table thead th").all_inner_texts().index(column.inner_text())

    def values() -> list[float]:
        cells = page.locator(f"#probe-table tbody tr td:nth-child({index + 1})")
        return [float(v) for v in cells.evaluate_all(
            "els => els.map(e => e.getAttribute('data-sort')).filter(v => v !== null)")]

    column.click()
    assert values() == sorted(values())
    column.click()
    assert values() == sorted(values(), reverse=True)
    assert column.get_attribute("aria-sort") == "descending"

    # Switching probe redraws the per-probe charts.
    select = page.locator("#probe-select")
    other = select.locator("option").nth(2).get_attribute("value")
    select.select_option(other)
    total, drawn = _rendered(page)
    assert drawn == total
    assert errors == []

    select.select_option(index=0)
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, "report.png"), full_page=True)
    page.close()


def test_hostile_names_stay_inert_in_browser(browser, tmp_path_factory, tmp_path):
    from tests.reports import fixtures
    from tests.reports.conftest import make_run

    scenario = fixtures.Scenario(script='x"><img src=x onerror=alert(1)>.py',
                                 error_message="boom </script><script>alert(2)</script>",
                                 finding_title="<b onmouseover=alert(3)>t</b>",
                                 hostname="<svg onload=alert(4)>", failed_probe=True)
    run = make_run(tmp_path_factory, scenario, "hostile")
    path = write_report(run, str(tmp_path / "report.html"))
    page, errors, requests = _open(browser, path)
    page.locator("#failed").hover()
    page.wait_for_timeout(200)
    assert errors == []
    assert page.locator("img").count() == 0
    assert 'x"><img src=x onerror=alert(1)>.py' in page.locator("header.top h1").inner_text()
    page.close()
