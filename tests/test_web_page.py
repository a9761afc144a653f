"""The web chat's page in a real browser: headless Chromium (tests/helpers/browser.py)
opens it against `serve.py --board host` on the demo model, types two lines
as a person would, and the story it streams is chat.py's for the same seed.
The screenshot is kept as build/test-artifacts/web-chat.png."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import llm_chat
import pytest
from browser import chromium, console_errors, save_screenshot
from mpllm.board import hostboard
from mpllm.web.engines import Pool, host_argvs
from web_client import Running

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "tools" / "chat.py"
LINES = ["Once upon a time there was a girl named Mia", "Mia found a tiny cat in the garden"]
SEED = 7


@pytest.fixture(scope="module")
def demo_served() -> Iterator[tuple[Running, str]]:
    image = str(hostboard.ensure_image(*hostboard.demo_sources()))
    r = Running(Pool(host_argvs(image, 1)))
    yield r, image
    r.stop()


def chat_py_replies(image: str, lines: list[str], seed: int) -> list[str]:
    """The replies `chat.py --seed` prints for these lines, piped."""
    out = subprocess.run([sys.executable, str(CHAT), "--board", "host", "--image", image,
                          "--seed", str(seed)], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "firmware" / "modules")})
    body = out.stdout[len(llm_chat.HELP):]
    replies = re.split(r"(?:^|\n)> ", body)[1:]
    return replies[:len(lines)]


def test_the_page_streams_chat_pys_story(demo_served) -> None:  # type: ignore[no-untyped-def]
    served, image = demo_served
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        errors = console_errors(page)
        page.goto(f"{served.url}/?seed={SEED}")
        page.wait_for_selector("body[data-state=idle]", timeout=30_000)
        assert f"seed {SEED}" in page.inner_text("#where")

        # line 1 pasted and sent at once: nothing was written ahead
        page.fill("#line", LINES[0])
        page.press("#line", "Enter")
        page.wait_for_selector("body[data-state=idle]", timeout=60_000)
        first = page.evaluate("window.mpllm")
        # line 2 typed key by key, then a pause: the reply is written ahead
        page.click("#line")
        page.keyboard.type(LINES[1], delay=40)
        page.wait_for_timeout(900)
        page.keyboard.press("Enter")
        page.wait_for_selector("body[data-state=idle]", timeout=60_000)
        second = page.evaluate("window.mpllm")
        replies = page.eval_on_selector_all("#story .model", "els => els.map(e => e.textContent)")
        lines = page.eval_on_selector_all("#story .you", "els => els.map(e => e.textContent)")
        story = page.inner_text("#story")
        shown = {k: page.inner_text(k) for k in ("#engine-speed", "#roundtrip", "#ttfc",
                                                  "#speculated")}
        bars = page.eval_on_selector_all("#stages span", "els => els.map(e => e.style.width)")
        legend = page.eval_on_selector_all("#stage-legend li", "els => els.map(e => e.textContent)")
        stage_words = {k: page.inner_text(k) for k in ("#stage-title", "#stage-total")}
        save_screenshot(page, "web-chat.png")
        # "New story": the last reply's figures go with the old story
        page.click("#new")
        page.wait_for_function("document.querySelector('#status').textContent === "
                               "'A new story.'", timeout=60_000)
        cleared = {k: page.inner_text(k) for k in ("#engine-speed", "#roundtrip", "#ttfc",
                                                    "#speculated", "#queue", "#stage-total")}
        cleared_bar = page.eval_on_selector_all("#stages span, #stage-legend li",
                                                "els => els.length")
        after_new = page.evaluate("window.mpllm")
        new_story = page.inner_text("#story")
        print(f"\nEnter to the first character in the browser: {first['ttfcMs']:.1f} ms "
              f"(written after Enter), {second['ttfcMs']:.1f} ms (written while typing)")

    assert errors == [], errors
    assert replies == chat_py_replies(image, LINES, SEED)
    assert lines == [LINES[0], " " + LINES[1]]
    assert story.replace("\n", "") == "".join(
        a + b for a, b in zip(lines, replies)).replace("\n", "")
    assert first["stats"]["speculated"] is False and second["stats"]["speculated"] is True
    assert first["ttfcMs"] > 0 and second["ttfcMs"] > 0
    assert first["roundTripTokPerS"] > 0 and second["stats"]["tokens"] > 0
    assert float(shown["#engine-speed"]) > 0 and float(shown["#roundtrip"]) > 0
    assert shown["#speculated"].startswith("yes")
    assert len(bars) == 6 and sum(float(w.rstrip("%")) for w in bars) == pytest.approx(100, 0.01)
    # the stage bar is the whole reply's time, and says so: each stage's ms is
    # the reply's stage_ms, they add up to the total shown, nothing per token
    stage_ms = second["stats"]["stage_ms"]
    shown_ms = {}
    for item in legend:
        m = re.fullmatch(r"(\w+) (\d+\.\d\d) ms \((\d+)%\)", item)
        assert m, item
        shown_ms[m[1]] = float(m[2])
    assert shown_ms.keys() == stage_ms.keys()
    assert all(shown_ms[k] == pytest.approx(v, abs=0.0051) for k, v in stage_ms.items())
    assert "whole reply" in stage_words["#stage-title"]
    assert "not per token" in stage_words["#stage-title"]
    total = re.match(r"(\d+\.\d\d) ms in all for this reply: (\d+) tokens? read, (\d+) written",
                     stage_words["#stage-total"])
    assert total, stage_words["#stage-total"]
    assert float(total[1]) == pytest.approx(sum(stage_ms.values()), abs=0.01)
    assert (int(total[2]), int(total[3])) == (second["stats"]["prefilled"],
                                              second["stats"]["tokens"])
    assert cleared == dict.fromkeys(cleared, "–") and cleared_bar == 0 and new_story == ""
    assert (after_new["stats"], after_new["ttfcMs"], after_new["roundTripTokPerS"]) == \
        (None, None, None)


def test_a_story_the_model_ends_at_once_says_so(demo_served) -> None:  # type: ignore[no-untyped-def]
    """A line after which the model writes <|endoftext|> first gets no reply
    text: the page says why (as chat.py does), instead of nothing."""
    served, image = demo_served
    line = "They all went home and lived happily ever after. The end."
    # the demo model ends its story right after this line at seed 0 (chat.py too)
    assert chat_py_replies(image, [line], 0) == [llm_chat.ENDED_AT_ONCE]
    with chromium() as browser:
        page = browser.new_page()
        errors = console_errors(page)
        page.goto(f"{served.url}/?seed=0")
        page.wait_for_selector("body[data-state=idle]", timeout=30_000)
        page.fill("#line", line)
        page.press("#line", "Enter")
        page.wait_for_selector("body[data-state=idle]", timeout=60_000)
        done = page.evaluate("window.mpllm.stats")
        replies = page.eval_on_selector_all("#story .model", "els => els.map(e => e.textContent)")
        status = page.inner_text("#status")
    assert errors == [], errors
    assert (done["stop"], done["tokens"]) == ("eot", 0)
    assert replies == [""]
    assert status.startswith("The model ends the story here")
