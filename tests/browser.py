"""Headless Chromium for the page tests, driven by Playwright.

Playwright's own browser download needs the network, so the tests drive the
Debian `chromium` that `.ci/run` installs (or any Chromium named by
MPLLM_CHROMIUM). The flags keep it off the network: without them Chromium
tries Google's hosts at start, and this machine refuses each one.

    with chromium() as browser:
        page = browser.new_page()
        errors = console_errors(page)
        page.goto(url)
        ...
        assert errors == []
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "test-artifacts"

_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The Chromium to drive; the test fails (it is not skipped) when there is
    none, because CI installs it."""
    path = os.environ.get("MPLLM_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    if not path:
        pytest.fail("no Chromium: install Debian's chromium (as .ci/run does) "
                    "or set MPLLM_CHROMIUM to a Chromium binary")
    return path


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium (a Playwright Browser); Playwright gives it a
    fresh profile of its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=_FLAGS)
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
