"""V, and with set_k_dots(True) K, cached as exact integer dots (engine.c
store_kv, cached_k): the same stories as plain mode, which caches both as
floats, bit for bit.

A cached k is rebuilt from its int16 dots with the kernel's operations and
RoPE's (the ones attention_block runs in plain mode), so every score, token
and logits row must be plain mode's. Here a few prompts x the six samplers
on the demo, a release-shaped and a llama2.c-shaped image, stepped and with
speculative decoding, K as floats and as dots; the full matrix (20 prompts)
runs by hand: `python tests/helpers/story_matrix.py IMAGE ...`. Also the
engine built with the PIE kernels (through the S3's instruction model)
against plain mode.
"""

from __future__ import annotations

import re

import cbuild
import engine_ext
import pytest
import story_matrix

_llm = engine_ext.load()


@pytest.mark.parametrize("name", ["demo", "release", "llama2c_untied"])
def test_stories_equal_plain_mode(request: pytest.FixtureRequest, engine_image,  # type: ignore[no-untyped-def]
                                  name: str) -> None:
    image = str(request.getfixturevalue("demo_image") if name == "demo"
                else engine_image(name))
    with _llm.Model(image) as m:
        vocab = m.config()["vocab_out"]
    n = 40 if name == "release" else 64
    for prompt in story_matrix.prompts(vocab, 3):
        for sampler in story_matrix.SAMPLERS:
            assert story_matrix.check(_llm, image, prompt, sampler, n, vocab) == [], \
                (prompt, sampler)


def test_k_dots_reads_k_as_dots(small_model) -> None:  # type: ignore[no-untyped-def]
    """The comparison above is not vacuous: with K as dots every cached k is
    rebuilt (its RoPE row is read from flash, which K as floats never does)
    and no row is kept as floats; the KV bytes read are K's dots instead of
    its floats."""
    stats = {}
    for k_dots in (False, True):
        with _llm.Model(str(small_model.image)) as m:
            cfg = m.config()
            m.set_k_dots(k_dots)
            assert m.k_dots() is k_dots
            t = m.prefill([5, 6, 7])
            for _ in range(20):
                t = m.step(t)
            stats[k_dots] = m.stats()
    floats, dots = stats[False], stats[True]
    assert floats["k_wide"] == floats["v_wide"] == dots["k_wide"] == dots["v_wide"] == 0
    # rows read: the prompt's 3 once for its pass, then 0..pos at positions 3..22;
    # rows written: 23 a layer
    rows_read = cfg["n_layers"] * (3 + sum(p + 1 for p in range(3, 23)))
    rows = rows_read + cfg["n_layers"] * 23
    kvd = cfg["n_kv_heads"] * cfg["head_dim"]
    assert dots["bytes"]["flash"] - floats["bytes"]["flash"] == rows_read * cfg["head_dim"] * 4
    assert floats["bytes"]["bulk"] - dots["bytes"]["bulk"] == rows * 2 * kvd


@pytest.mark.parametrize(("name", "sampler"), [("small", ("0.8", "40", "7")),
                                               ("llama2c_untied", ("1.0", "0", "3"))])
def test_pie_engine_equals_plain_mode(engine_image, name: str,  # type: ignore[no-untyped-def]
                                      sampler: tuple[str, str, str]) -> None:
    """The engine with the PIE kernels with K and V as dots against the
    reference-kernel engine in plain mode: the same ids and logits hash."""
    image = engine_image(name)
    pie = cbuild.run(cbuild.engine_run(pie=True), str(image), "48", *sampler, "k_dots", timeout=600)
    plain = cbuild.run(cbuild.engine_run(pie=False), str(image), "48", *sampler, "plain", timeout=600)
    assert pie.returncode == 0 and plain.returncode == 0, pie.stdout + plain.stdout
    assert "kernels=pie-emu" in pie.stdout and re.search(r"^ids \d", pie.stdout, re.MULTILINE)
    assert cbuild.ids_and_hash(pie.stdout) == cbuild.ids_and_hash(plain.stdout)


def test_story_matrix_cli(tiny_model, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert story_matrix.main([str(tiny_model.image), "--prompts", "2", "--tokens", "12"]) == 0
    assert "12 of 12 (prompt, sampler, image) stories equal plain mode's, stepped and " \
        "speculative, K as floats and as dots" in \
        capsys.readouterr().out
