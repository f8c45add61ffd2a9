"""Debian's chromium for the report's browser tests (never a downloaded browser)."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test-artifacts")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is absent (apt-get install chromium; `make browser`)")


def launch(playwright):
    """Chromium through Playwright, with the flags this closed network needs."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
