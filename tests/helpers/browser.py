"""Headless Chromium for the page tests, driven by Playwright.

The Chromium is the one `python tools/setup_dev.py` finds or installs
(Debian's `chromium`, Playwright's own, or any named by MPLLM_CHROMIUM); when
there is none the test is skipped, and fails under CI=true (conftest's
missing_tool). The flags keep it off the network: without them Chromium tries
Google's hosts at start.

    with chromium() as browser:
        page = browser.new_page()
        errors = console_errors(page)
        page.goto(url)
        ...
        assert errors == []
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import setup_dev
from conftest import need_tool

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"


def chromium_path() -> str:
    """The Chromium to drive (skip, or fail under CI=true, when there is none)."""
    return need_tool(setup_dev.chromium_path)


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium (a Playwright Browser); Playwright gives it a
    fresh profile of its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(),
                                    args=setup_dev.CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def console_errors(page: object) -> list[str]:
    """A list that fills with the page's console errors and uncaught
    exceptions from now on."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def save_screenshot(page: object, name: str) -> Path:
    """Keep a screenshot under build/test-artifacts/ (kept after the run)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
