"""Figures the README and docs/ quote from the code or a tool, read from the code or the tool
and held equal to the number parsed from the Markdown, so the text cannot drift from what the
tools print (cheap tools only: constants, pinned sizes, the cost model's analytic report, the
golden sets recomputed). A figure measured by a long run (a load test, a drafter's stories, a
PC's timings) is not here: the text says how it was measured."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from mpllm import convert as convert_mod
from mpllm.board import firmware_pins as pins
from mpllm.board import flash
from mpllm.web.server import Limits

ROOT = Path(__file__).resolve().parent.parent


def doc(name: str) -> str:
    """README.md, or docs/<name>, with its lines joined: a figure may be wrapped."""
    path = ROOT / name if name == "README.md" else ROOT / "docs" / name
    return re.sub(r"\s*\n\s*", " ", path.read_text())


def quoted(text: str, pattern: str) -> list[str]:
    """What `pattern`'s group captures in `text`, every time; at least once."""
    found = re.findall(pattern, text)
    assert found, f"no {pattern!r} in the text"
    return found


def number(s: str) -> float:
    return float(s.replace(",", ""))


# ---- pins and thresholds that live in code ---------------------------------

def test_firmware_versions_are_the_pinned_ones() -> None:
    """What flash.py builds is what firmware_pins.py pins; another ESP-IDF release in the
    text is said to be another than the pinned one."""
    for name in ("README.md", "using.md"):
        mp, idf = quoted(doc(name), r"builds MicroPython (v[\d.]+) \+ ESP-IDF (v[\d.]+) firmware")[0]
        assert (mp, idf) == (pins.MICROPYTHON_TAG, pins.ESP_IDF_VERSION), name
    for name in ("README.md", "using.md", "performance.md", "llama2c.md"):
        text = doc(name)
        for m in re.finditer(r"ESP-IDF (v\d+\.\d+\.\d+)", text):
            if m.group(1) != pins.ESP_IDF_VERSION:
                assert f"than the {pins.ESP_IDF_VERSION}" in text[m.end():m.end() + 120], (
                    f"{name}: ESP-IDF {m.group(1)} is not the pinned {pins.ESP_IDF_VERSION}")
        for tag in re.findall(r"MicroPython (v\d+\.\d+\.\d+)", text):
            assert tag == pins.MICROPYTHON_TAG, name


def test_the_n8_refusal_quotes_flash_pys_sizes() -> None:
    """flash.py refuses the release model on the N8 before any download: the floor it
    computes from models/release.json, against the N8's model partition."""
    weights, partition = quoted(doc("using.md"), r"the release model's weights alone are "
                                                 r"([\d,]+) bytes, the N8's model partition ([\d,]+)")[0]
    assert number(weights) == flash.pinned_image_floor(ROOT / "models" / "release.json")
    assert number(partition) == pins.BOARDS["n8"].model_bytes


def test_auto_weights_threshold() -> None:
    for name in ("README.md", "llama2c.md"):
        pct = quoted(doc(name), r"greedy agreement [^.]*?reaches (\d+) %")[0]
        assert number(pct) / 100 == convert_mod.AUTO_AGREEMENT, name


def test_web_chat_limits() -> None:
    text, lim = doc("using.md"), Limits()
    assert number(quoted(text, r"at most ([\d,]+) \(`--max-queue`\)")[0]) == lim.max_queue
    assert number(quoted(text, r"Lines are at most (\d+) characters")[0]) == lim.max_line_chars
    assert number(quoted(text, r"for the rest: ([\d,]+) bytes\)")[0]) == lim.max_message_bytes
    assert number(quoted(text, r"(\d+) messages a second per connection")[0]) == lim.messages_per_s
    assert number(quoted(text, r"is closed after (\d+) s")[0]) == lim.pending_timeout_s
    assert number(quoted(text, r"at most (\d+) such are kept")[0]) == lim.max_pending


# ---- the golden sets, recomputed --------------------------------------------

def test_golden_max_diff(golden_sets) -> None:  # type: ignore[no-untyped-def]
    """"the logits differ by at most X": our reference against esp32-ai's runtime on
    every golden set, teacher-forced, at the precision the text gives."""
    from mpllm.formats.esp32ai import read_model_bin
    from mpllm.formats.rope import rope_table
    from mpllm.reference.forward import Reference

    worst = 0.0
    for g in golden_sets.values():
        w = read_model_bin(Path(g.model_bin))
        rows = Reference(w, rope_table(w.config)).generate(
            g.prompt_ids, len(g.generated_ids), teacher=g.generated_ids)[1]
        worst = max(worst, float(np.abs(rows.astype(np.float64) - g.logits).max()))
    said = quoted(doc("README.md"), r"the logits differ by at most (\d\.\de-\d+)")[0]
    assert said == f"{worst:.1e}".replace("e-0", "e-")
