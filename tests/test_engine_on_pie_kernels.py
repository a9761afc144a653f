"""The whole engine built with the PIE kernels (run through the exact host model
of the ESP32-S3 vector unit) computes the same logits bits as the engine built
with the reference kernels (one forward pass; kernels change, bits
do not), and token healing's llm_best_of, from a few ids' rows alone, makes
the choice a scan of each logits vector makes with both. Also reports the PIE instructions the engine executes per token.

The emulated head costs ~1 s per evaluation at the release shape, so the
release check runs a short script; the small shapes run to 64+ positions.
Both families: the esp32-ai shapes and llama2.c's stories260K shape (no PLE,
grouped-query attention, untied and tied head), its matrices int4, int8, fp32
or a mix of the three.
"""

from __future__ import annotations

import re
from pathlib import Path

import cbuild
import pytest


def _run(program: Path, image: Path, steps: int) -> str:
    result = cbuild.run(program, str(image), str(steps), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize(("name", "steps"), [("tiny", 60), ("tiny_untied", 44),
                                             ("small", 64), ("release", 3),
                                             ("llama2c_untied", 64), ("llama2c_tied", 64),
                                             ("llama2c_int8", 64), ("llama2c_fp32", 64),
                                             ("llama2c_mixed", 64)])
def test_pie_engine_equals_ref_engine(engine_image, name: str, steps: int) -> None:  # type: ignore[no-untyped-def]
    image = engine_image(name)
    ref_out = _run(cbuild.engine_run(pie=False), image, steps)
    pie_out = _run(cbuild.engine_run(pie=True), image, steps)
    assert "kernels=ref" in ref_out and "kernels=pie-emu" in pie_out, (ref_out, pie_out)
    assert cbuild.ids_and_hash(pie_out) == cbuild.ids_and_hash(ref_out)
    for out in (ref_out, pie_out):  # token healing's rows alone: the dense head's choice
        assert re.search(r"^best_of_mismatches 0 over [1-9]\d* *$", out, re.MULTILINE), out
    counts = re.search(r"^pie_instructions (\d+) for (\d+) tokens and (\d+) heads$", pie_out,
                       re.MULTILINE)
    # fp32 matrices run on the scalar FPU and an fp32 head has no certificate
    assert counts and (int(counts.group(1)) > 0) == (name != "llama2c_fp32"), pie_out
    print(f"\n{name}: PIE == ref over {cbuild.ids_and_hash(ref_out)[1]}; "
          f"{int(counts.group(1)):,} PIE instructions for {counts.group(2)} tokens, "
          f"{counts.group(3)} heads")


@pytest.mark.parametrize("name", ["llama2c_int8", "llama2c_fp32", "llama2c_mixed"])
@pytest.mark.parametrize("mode", [("0.8", "40", "7"), ("0.8", "40", "7", "plain"),
                                  ("0", "0", "0", "plain")])
def test_pie_engine_equals_ref_engine_per_format(engine_image, name: str,  # type: ignore[no-untyped-def]
                                                 mode: tuple[str, ...]) -> None:
    """The int8, fp32 and mixed-format images, sampled and in plain mode too:
    the PIE-kernel engine writes the reference-kernel engine's ids and logits."""
    image = engine_image(name)
    ref = cbuild.run(cbuild.engine_run(pie=False), str(image), "40", *mode, timeout=600)
    pie = cbuild.run(cbuild.engine_run(pie=True), str(image), "40", *mode, timeout=600)
    assert ref.returncode == 0 and pie.returncode == 0, ref.stderr + pie.stderr
    assert cbuild.ids_and_hash(pie.stdout) == cbuild.ids_and_hash(ref.stdout)
    for out in (ref.stdout, pie.stdout):
        assert re.search(r"^best_of_mismatches 0 over [1-9]", out, re.MULTILINE), out


@pytest.mark.parametrize("mode", [(), ("0.8", "40", "7"), ("1.0", "0", "3"),
                                  ("0.8", "40", "7", "plain"), ("0", "0", "0", "k_dots")])
@pytest.mark.parametrize(("name", "steps"), [("tiny", 60), ("small", 64), ("release", 3),
                                             ("llama2c_tied", 64), ("llama2c_int8", 64),
                                             ("llama2c_fp32", 64), ("llama2c_mixed", 64),
                                             ("stories260k_fp32", 300),
                                             ("stories260k_int8", 300),
                                             ("stories260k_int4", 300)])
def test_vector_engine_equals_scalar_engine(request: pytest.FixtureRequest, name: str,
                                            steps: int, mode: tuple[str, ...]) -> None:
    """The host's vector code (simd.h: softmax's exp, attention over float
    K/V rows, SiLU, the fp32 and int8 matvecs) against the same engine built
    with LLM_NO_SIMD, the board's scalar loops: the same ids and the same bits
    of every logits vector, greedy, sampled, plain and with K as dots; the
    stories260K images over 300 positions."""
    if name.startswith("stories260k_"):
        image = request.getfixturevalue("stories260k_images")[name.removeprefix("stories260k_")]
    else:
        image = request.getfixturevalue("engine_image")(name)
    vec = cbuild.run(cbuild.engine_run(pie=False), str(image), str(steps), *mode, timeout=600)
    scalar = cbuild.run(cbuild.engine_run(pie=False, simd=False), str(image), str(steps), *mode,
                        timeout=600)
    assert vec.returncode == 0 and scalar.returncode == 0, vec.stderr + scalar.stderr
    assert cbuild.ids_and_hash(vec.stdout) == cbuild.ids_and_hash(scalar.stdout)
