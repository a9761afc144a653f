"""Figures the README and docs/ quote from the code or a tool, read from the code or the tool
and held equal to the number parsed from the Markdown, so the text cannot drift from what the
tools print (cheap tools only: constants, pinned sizes, the cost model's analytic report, the
golden sets recomputed). A figure measured by a long run (a load test, a drafter's stories, a
PC's timings) is not here: the text says how it was measured."""

from __future__ import annotations

import re
from pathlib import Path

import engine_ext
import numpy as np
import pytest
from mpllm import convert as convert_mod
from mpllm import costmodel as cm
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


def speed_row_as_printed(printed: str, said: str, text: str, row: str) -> None:
    """A doc's table row (context, then low / middle / high tok/s: `row`'s groups)
    is what the report says (`said`'s groups: context, middle tok/s, (low-high))."""
    ctx, mid, lo, hi = quoted(printed, said)[0]
    assert quoted(text, row)[0] == (ctx, lo, mid, hi)


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


# ---- the S3 cost model, as `bench.py --model-s3` prints it -------------------

@pytest.fixture(scope="module")
def s3_report(demo_image: Path) -> cm.Report:
    """What `bench.py --model-s3` reports for the exact builds: the analytic counts, the
    published greedy rows fraction scaled by the demo model's measured top-40/greedy ratio
    (bench_cli's own steps; the speculative builds, which need the drafter's stories
    measured, are left out)."""
    llm = engine_ext.load()
    fractions = cm.measure_fractions(str(demo_image), None, llm_module=llm, n_steps=200)
    fractions.greedy = cm.RELEASE_GREEDY_FRACTION
    return cm.report(None, fractions)


def band(rep: cm.Report, name: str, digits: int) -> list[str]:
    b = rep.builds[name]["band"]
    return [f"{b[k]:.{digits}f}" for k in ("low", "mid", "high")]


def test_exact_builds_bands(s3_report: cm.Report) -> None:
    readme = doc("README.md")
    assert list(quoted(readme, r"exact greedy \*\*([\d.]+) / ([\d.]+) / ([\d.]+)\*\*")[0]) == \
        band(s3_report, "mpllm-exact-greedy", 1)
    assert list(quoted(readme, r"exact sampled \(T 0\.8, top-40\) \*\*([\d.]+) / ([\d.]+) / "
                               r"([\d.]+)\*\*")[0]) == band(s3_report, "mpllm-exact-sampled", 1)
    perf = doc("performance.md")
    for name, label in (("mpllm-exact-greedy", r"mpllm exact, greedy\*\* \(([\d.]+) % of head rows\)"),
                        ("mpllm-exact-sampled", r"mpllm exact, sampled T 0\.8 top-40\*\* \(([\d.]+) %\)")):
        b = s3_report.builds[name]
        rows, *cells = quoted(perf, r"\| \*\*" + label + r" \|" + r" ([\d.]+) \|" * 8
                              + r" \*\*([\d.]+) / ([\d.]+) / ([\d.]+)\*\* \|")[0]
        assert rows == f"{100 * b['rows_fraction']:.1f}", name
        assert cells[:7] == [f"{b['stages'][s]:.2f}" for s in
                             ("embed", "attn", "ffn", "ple", "head", "sample", "python")], name
        assert cells[8:] == band(s3_report, name, 1), name


def test_anchors_as_modeled(s3_report: cm.Report) -> None:
    """The anchors table's modeled column, every anchor once."""
    table = (ROOT / "docs" / "performance.md").read_text().split("| anchor |", 1)[1].split("\n\n")[0]
    modeled = [x for row in table.splitlines()[2:] for x in row.split("|")[3].split("/")]
    assert sorted(float(x) for x in modeled) == sorted(
        round(a["predicted_ms"], 2) for a in s3_report.anchors)


def test_what_each_charge_adds(s3_report: cm.Report) -> None:
    said = quoted(doc("performance.md"), r"the engine alone ([\d.]+) ms; \+ the semaphore hand-off "
                  r"([\d.]+) \(7 a token\); \+ the measured placement ([\d.]+); \+ the instruction "
                  r"cache ([\d.]+); \+ the MicroPython loop ([\d.]+)")[0]
    assert list(said) == [f"{c['total_ms']:.2f}" for c in s3_report.charges["mpllm-exact-sampled"]]


def test_why_in_bytes(s3_report: cm.Report) -> None:
    """The sampled target's bus figures: what the tool prints under its target line."""
    printed = s3_report.target_line("mpllm-exact-sampled")
    kib, bus_ms = quoted(printed, r"line fills \((\d+) KiB from PSRAM\) and flash reads ([\d.]+) ms")[0]
    other, hidden = quoted(printed, r"compute, loop and hand-offs ([\d.]+) ms: (\d+) % hidden")[0]
    text = doc("performance.md")
    assert quoted(text, r"an exact sampled token reads (\d+) KiB from PSRAM")[0] == kib
    assert quoted(text, r"those fills take ([\d.]+) ms")[0] == bus_ms
    assert quoted(text, r"hand-offs take ([\d.]+) ms more")[0] == other
    assert quoted(text, r"hides (\d+) % of them")[0] == hidden


def test_convert_size_table(demo_image: Path) -> None:
    """docs/using.md's size table is convert.py's for the demo model: every section row
    whose bytes do not depend on how many stories the drafter was built from (the
    fixture's image has a 20-story drafter, convert's default 200)."""
    from mpllm.convert import format_size_table
    from mpllm.formats.image import read_image

    text = (ROOT / "docs" / "using.md").read_text()
    shown = text.split("    section            kind", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    img = read_image(demo_image)
    printed = {ln.split()[0]: ln.split()[1:4] for ln in
               format_size_table(img.sections, demo_image.stat().st_size).splitlines()[1:-2]}
    rows = [ln.split() for ln in shown if ln.strip() not in ("...",)]
    rows = [r for r in rows if r[0] not in ("drafts", "header+table+pad", "total")]
    assert rows, "no section rows in docs/using.md's size table"
    for name, kind, count, size, _share in rows:
        assert printed[name] == [kind, count, size], name
    assert set(printed) - {"drafts"} >= {r[0] for r in rows}
    assert "weights" in {r[0] for r in rows}  # the table ends as convert's does


# ---- llama2.c's stories260K on the two boards (bench.py --model-s3 --shape stories260k) --

@pytest.fixture(scope="module")
def s260_printed() -> str:
    import contextlib
    import io

    from mpllm.board import bench_cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench_cli.main(["--model-s3", "--shape", "stories260k", "--no-plot"]) == 0
    return out.getvalue()


def test_stories260k_on_the_n8(s260_printed: str) -> None:
    text, printed = doc("performance.md"), s260_printed
    # llm.load()'s default: int4 group 64, dense head (the converter leaves the certified
    # head out at int4), the fastest context
    ctx, toks = quoted(printed, r"group 64, dense head, sampled, as the engine places it: "
                                r"context (\d+) \(by default, the fastest\) (\d+) tok/s")[0]
    said_ctx, said_toks = quoted(text, r"(\d+) by the model \(256 do not open there: below\)\. "
                                       r"There the model gives (\d+) tok/s sampled")[0]
    assert (said_ctx, said_toks) == (ctx, toks)
    # the certified head's row of the table, at its own default context
    speed_row_as_printed(printed, r"group 64, certified head, sampled, as the engine places it: "
                                  r"context (\d+) \(by default, the fastest\) (\d+) tok/s "
                                  r"\((\d+)-(\d+)\)",
                         text, r"certified, context (\d+) by the model [^|]*\| [\d.]+ \| [\d.]+ "
                               r"\| [\d.]+ / [\d.]+ / [\d.]+ \| (\d+) / (\d+) / (\d+) \|")
    # the longest context that opens, asked for
    longest, toks = quoted(printed, r"group 64, dense head, sampled, as the engine places it: "
                                    r"context \d+ \(by default, the fastest\) \d+ tok/s \(\d+-\d+\); "
                                    r"context (\d+) \(the longest, asked for\) (\d+) tok/s")[0]
    assert quoted(text, r"\((\d+) by the model now, which counts free bytes") == [longest]
    assert quoted(text, r"read in place from flash \((\d+) tok/s\)") == [toks]
    # wholly in internal SRAM, group 64, dense head
    needs = quoted(printed, r"group 64 \(int4, --weights int4 at convert\.py's default group"
                            r"[^\n]*dense head: does NOT open[^\n]*\n"
                            r"  wholly in internal SRAM [^\n]*needs ([\d,]+) B at context 128, "
                            r"([\d,]+) B at context 256, ([\d,]+) B at context 512")[0]
    assert quoted(text, r"needs ([\d,]+) / ([\d,]+) / ([\d,]+) B at contexts 128 / 256 / 512 "
                        r"\(group 64\)")[0] == needs


def test_stories260k_at_convert_pys_default_format(s260_printed: str) -> None:
    """performance.md's int8 rows (convert.py's choice for stories260K), its fp32
    rows and their what-ifs, as `bench.py --model-s3 --shape stories260k` prints
    them."""
    text, printed = doc("performance.md"), s260_printed
    for fmt, label in (("int8 in groups of 32", r"int8 Q8_0 \(the default\)"), ("fp32", "fp32")):
        speed_row_as_printed(printed, rf"N8 \(no PSRAM\), {fmt}, dense head, sampled, as the "
                                      r"engine places it: context (\d+) \(by default\) (\d+) "
                                      r"tok/s \((\d+)-(\d+)\)",
                             text, rf"\| {label} \| N8 at its default context, (\d+) \| "
                                   r"[^|]*\| (\d+) / (\d+) / (\d+) \|")
    placed, everything, ms = quoted(printed, r"what-if, int8 on the N16R8[^\n]*as placed (\d+) "
                                             r"tok/s; [^\n]*; core, KV cache and head in internal "
                                             r"SRAM (\d+) tok/s; its matvecs alone ([\d.]+) ms")[0]
    row = quoted(text, r"\| int8 Q8_0 \(the default\) \| N16R8, context 512 \| [^|]*\| "
                       r"\d+ / (\d+) / \d+ \|")
    assert row == [placed]
    assert quoted(text, r"int8's matvecs alone cost ([\d.]+) ms; it would\s+give (\d+) tok/s") \
        == [(f"{float(ms):.2f}", everything)]
    core, everything, ms = quoted(printed, r"what-if, fp32 on the N16R8[^\n]*core in internal "
                                           r"SRAM (\d+) tok/s; core, KV cache and head in "
                                           r"internal SRAM (\d+) tok/s; its matvecs alone "
                                           r"([\d.]+) ms")[0]
    assert quoted(text, r"with the core in internal SRAM the model gives (\d+)") == [core]
    assert quoted(text, r"with core, KV cache and head there (\d+)") == [everything]
    assert quoted(text, r"fp32's matvecs alone cost ([\d.]+) ms") == [f"{float(ms):.1f}"]


def test_model_file_sizes() -> None:
    """The release model's pinned sizes and the demo model's, in MB as the README gives them."""
    import json

    readme = doc("README.md")
    pinned = {f["name"]: f["size"] for f in
              json.loads((ROOT / "models" / "release.json").read_text())["files"]}
    model_mb, tok_mb = quoted(readme, r"model\.bin ([\d.]+) MB and tokenizer\.json ([\d.]+) MB")[0]
    assert model_mb == f"{pinned['model.bin'] / 1e6:.1f}"
    assert tok_mb == f"{pinned['tokenizer.json'] / 1e6:.1f}"
    demo_mb = quoted(readme, r"\(`models/demo/`, ([\d.]+) MB")[0]
    assert demo_mb == f"{(ROOT / 'models' / 'demo' / 'model.bin').stat().st_size / 1e6:.1f}"


def test_a_plain_steps_price() -> None:
    """The plain step the drafter's prices are relative to: costmodel.prices.pass_ms's
    one-position pass, release shape."""
    from mpllm.costmodel.prices import pass_ms

    sampled = f"{pass_ms(build='mpllm-spec-sampled')[0]:.2f}"
    greedy = f"{pass_ms(build='mpllm-spec-greedy')[0]:.2f}"
    assert quoted(doc("performance.md"), r"models it \(([\d.]+) ms sampled, ([\d.]+) ms greedy, "
                                         r"mid\)") == [(sampled, greedy)]
    assert quoted(doc("speculative-decoding.md"), r"A plain step is ([\d.]+) ms sampled and "
                                                  r"([\d.]+) ms greedy here") == [(sampled, greedy)]


def test_fuzz_target_count() -> None:
    """"N libFuzzer targets": tests/fuzz/fuzzrun.py's list."""
    import importlib
    import sys

    fuzz_dir = str(ROOT / "tests" / "fuzz")  # imported by name, as test_fuzz.py does
    if fuzz_dir not in sys.path:
        sys.path.insert(0, fuzz_dir)
    fuzzrun = importlib.import_module("fuzzrun")
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
             "eleven", "twelve"]
    for name in ("README.md", "ARCHITECTURE.md"):
        said = quoted(doc(name), r"(\w+) libFuzzer targets")
        assert said == [words[len(fuzzrun.TARGETS) - 1]], name


def test_the_chats_budgets() -> None:
    """The chat's reply budget and its run to the sentence's end (llm_chat), the story
    budget and the sampler's defaults (llm), as docs/using.md gives them."""
    import llm
    import llm_chat

    text = doc("using.md")
    turn, finish = quoted(text, r"\(`--max-tokens`, (\d+) tokens in the chat\) to the end of its "
                                r"sentence, (\d+) tokens more at most")[0]
    assert (int(turn), int(finish)) == (llm_chat.TURN_TOKENS, llm_chat.FINISH_TOKENS)
    t, k = quoted(text, r"sampled like upstream's firmware \(temperature ([\d.]+), top-k (\d+)\)")[0]
    assert (float(t), int(k)) == (llm.TEMPERATURE, llm.TOP_K)
    assert quoted(text, r"`--max-tokens (\d+)`") == [str(llm.MAX_TOKENS)]
