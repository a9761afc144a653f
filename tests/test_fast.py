"""Fast mode (opt-in, lossy): its rules, its own exactness (verify == steps,
drafting changes nothing, the same seed the same story) and the quality gate
against exact mode."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import engine_ext
import pytest
from conftest import ROOT
from mpllm.board import bench_cli, hostboard, quality

_llm = engine_ext.load()


@pytest.fixture(scope="module")
def demo(demo_image: Path) -> Path:
    return demo_image


def test_fast_mode_rules(small_model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="exclude each other"):
        _llm.Model(str(small_model.image), plain=True, fast=True)
    with _llm.Model(str(small_model.image), fast=True) as m:
        assert m.fast() and not m.plain()
        with pytest.raises(ValueError, match="cannot be plain"):
            m.set_plain(True)
        m.prefill([5, 6, 7])
        with pytest.raises(_llm.Error, match="bad state: fast mode is chosen at position 0"):
            m.set_fast(False)
        m.reset()
        assert m.fast()  # reset keeps the mode
        m.set_fast(False)
        assert not m.fast()
        m.set_plain(True)
        with pytest.raises(_llm.Error, match="plain mode is the exact reference"):
            m.set_fast(True)


def _logits(m: object) -> bytes:
    return m.logits()  # type: ignore[attr-defined]


# an esp32-ai model and llama2.c's stories260K shape (4 kv heads for 8 query heads)
MODELS = ["small", "llama2c_untied", "llama2c_tied"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("sampler", [(0.0, 0, 0), (0.8, 40, 11), (1.0, 0, 3)])
def test_fast_verify_is_fast_steps(engine_image, model, sampler) -> None:  # type: ignore[no-untyped-def]
    """Speculative decoding stays exact within fast mode: a verify pass gives
    the tokens and logits bits of the same steps."""
    image = str(engine_image(model))
    with _llm.Model(image, fast=True) as a, _llm.Model(image, fast=True) as b:
        for m in (a, b):
            m.sampler(*sampler)
        assert a.prefill([5, 6, 7, 8]) == b.prefill([5, 6, 7, 8])
        feed = [9, 10, 11, 12, 13, 14, 15, 16]
        got = a.verify(feed)
        want = []
        for t in feed:
            want.append(b.step(t))
        assert got == want and _logits(a) == _logits(b)
        a.rewind(a.pos() - 3)
        b.rewind(b.pos() - 3)
        assert a.step(1) == b.step(1) and _logits(a) == _logits(b)


@pytest.mark.parametrize("model", MODELS)
def test_fast_differs_from_exact_but_little(engine_image, model) -> None:  # type: ignore[no-untyped-def]
    image = str(engine_image(model))
    with _llm.Model(image) as e, _llm.Model(image, fast=True) as f:
        e.prefill([5, 6, 7, 8, 9, 10])
        f.prefill([5, 6, 7, 8, 9, 10])
        le = struct.unpack(f"<{len(_logits(e)) // 4}f", _logits(e))
        lf = struct.unpack(f"<{len(_logits(f)) // 4}f", _logits(f))
        assert le != lf  # lossy: not the exact bits
        assert max(abs(x - y) for x, y in zip(le, lf, strict=True)) < 0.1 * max(map(abs, le))


def test_fast_stories_with_drafts_equal_fast_steps(demo: Path) -> None:
    llm = hostboard.import_llm()
    llm.load(str(demo), fast=True)
    try:
        assert llm.mode() == "fast"
        for prompt in ("Once upon a time", "Tom and his dog", "The sun was"):
            for options in ({"temperature": 0}, {"seed": 1}, {"seed": 2}):
                steps = "".join(llm.generate(prompt, draft=None, **options))
                spec = "".join(llm.generate(prompt, draft="ngram", **options))
                assert llm.stats()["passes"] > 0
                assert spec == steps
                again = "".join(llm.generate(prompt, draft="ngram", **options))
                assert again == spec  # reproducible
        llm.load(fast=False)
        assert llm.mode() == "exact"
        with pytest.raises(ValueError, match="exclude each other"):
            llm.load(plain=True, fast=True)
    finally:
        llm.unload()


def test_quality_gate_on_the_demo(demo: Path) -> None:
    q = quality.measure(demo, ROOT / "models/demo/train_report.json", n_tokens=2000,
                        llm_module=_llm)
    assert q.tokens == 2000 and q.passed, q.line()
    assert 0.0 < q.exact_nats < 2.0 and q.agreement > 0.98
    assert "PASS" in q.line()


def test_bench_reports_mode_and_drafting(demo: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "b.json"
    assert bench_cli.main(["--board", "host", "--image", str(demo), "--tokens", "40", "--no-plot",
                       "--quiet", "--json", str(out)], llm_module=_llm) == 0
    r = json.loads(out.read_text())["results"][0]
    assert r["mode"] == "exact" and r["drafter"] == "ngram"
    assert r["tokens_per_pass"] >= 1.0 and 0.0 <= r["draft_accept_rate"] <= 1.0
    assert "mode: exact; drafter ngram" in capsys.readouterr().out
    assert bench_cli.main(["--board", "host", "--image", str(demo), "--tokens", "40", "--no-plot",
                       "--quiet", "--fast", "--draft", "none", "--json", str(out)],
                      llm_module=_llm) == 0
    r = json.loads(out.read_text())["results"][0]
    assert r["mode"] == "fast" and r["drafter"] is None and r["tokens_per_pass"] == 1.0
    assert r["draft_accept_rate"] is None
    q = tmp_path / "q.json"
    assert bench_cli.main(["--board", "host", "--image", str(demo), "--fast", "--quality",
                       "--json", str(q)], llm_module=_llm) == 0
    assert json.loads(q.read_text())["quality"]["passed"] is True
    assert bench_cli.main(["--board", "host", "--quality"], llm_module=_llm) == 2
