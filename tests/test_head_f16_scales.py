"""The certified head's staged rows keep their one scale as the fp16 value it is
(native/engine/engine_open.c stage_rows_in_tile_order; widened back per scored
tile by head.c staged_rows), which must change no bit:

- the two conversions (native/engine/f32_bits.h) against numpy's IEEE binary16
  on every fp16 bit pattern and on f32 patterns that are and are not fp16
  values;
- the staged head takes 2 bytes a row less than rows x (codes + f32 scale), in
  Model.memory() and in _llm.plan alike, and the engine charges a scored row
  its codes + 2 bytes;
- stories (token ids and the sha256 of every logits row) equal, greedy,
  sampled and through verify passes, to those of the same weights converted
  without a certificate, whose head is the image's rows with their f32 scales
  (plain mode of the certified image reads the same fp16 copy as the default,
  so that image is the reference this change cannot touch): on the demo model,
  a release-shaped one, a llama2.c one and a head whose scales take every case
  of the widening (zero, subnormal, negative).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import cbuild
import engine_ext
import numpy as np
import pytest
import story_matrix
from conftest import ROOT
from mpllm.convert import convert
from mpllm.formats.esp32ai import read_model_bin, write_model_bin
from mpllm.formats.image import read_image
from mpllm.formats.model import QMatrix

_llm = engine_ext.load()

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "f32_bits.h"

/* argv[1]: out, every fp16 pattern's widening (u32 each, 0 for exponent 31);
 * argv[2]: in, f32 patterns; argv[3]: out, per pattern 0x10000 | fp16 bits
 * when llm_f32_bits_to_f16 takes it, else 0 */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    FILE *wide = fopen(argv[1], "wb"), *in = fopen(argv[2], "rb"), *narrow = fopen(argv[3], "wb");
    if (!wide || !in || !narrow) return 3;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint32_t bits = (h & 0x7C00u) == 0x7C00u ? 0u : llm_f16_to_f32_bits(h);
        fwrite(&bits, 4, 1, wide);
    }
    uint32_t bits;
    while (fread(&bits, 4, 1, in) == 1) {
        uint16_t h = 0;
        uint32_t out = llm_f32_bits_to_f16(bits, &h) ? 0x10000u | h : 0u;
        fwrite(&out, 4, 1, narrow);
    }
    return fclose(wide) | fclose(in) | fclose(narrow);
}
"""


def test_fp16_conversions_against_numpy(tmp_path: Path) -> None:
    src = tmp_path / "f16_driver.c"
    src.write_text(DRIVER)
    program = cbuild.build("f16_driver", [src], tmp_path)
    every = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    finite = (every & 0x7C00) != 0x7C00
    rng = np.random.default_rng(34)
    # every fp16 value widened (each is an f32 the encoder must take back), their
    # neighbours one f32 ulp off (none an fp16 value but zero's), random patterns,
    # and the edges: f32 subnormals, 2^-25, 65520 (rounds to inf), inf, NaN
    values = every[finite].view(np.float16).astype(np.float32).view(np.uint32)
    probes = np.concatenate([
        values, values + 1, values - 1, rng.integers(0, 2**32, 200_000, dtype=np.uint64),
        np.array([0x00000001, 0x807FFFFF, 0x33000000, 0x477FF000, 0x47800000, 0x7F800000,
                  0xFF800000, 0x7FC00000, 0x387FC000, 0x33800001], np.uint64),
    ]).astype(np.uint32)
    (tmp_path / "probes.bin").write_bytes(probes.tobytes())
    run = subprocess.run([str(program), str(tmp_path / "wide.bin"), str(tmp_path / "probes.bin"),
                          str(tmp_path / "narrow.bin")], capture_output=True, check=False)
    assert run.returncode == 0, run.stderr
    wide = np.frombuffer((tmp_path / "wide.bin").read_bytes(), np.uint32)
    want = every.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(wide[finite], want[finite])  # normals, subnormals, +-0, bit for bit
    narrow = np.frombuffer((tmp_path / "narrow.bin").read_bytes(), np.uint32)
    f = probes.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        half = f.astype(np.float16)
    back = half.astype(np.float32).view(np.uint32)
    takes = np.isfinite(f) & np.isfinite(half) & (back == probes)
    assert np.array_equal(narrow != 0, takes)
    assert np.array_equal((narrow[takes] & 0xFFFF).astype(np.uint16), half[takes].view(np.uint16))
    # every fp16 value taken back, none of its f32 neighbours (fp16 has 13 fewer bits)
    assert takes[:len(values)].all() and not takes[len(values):3 * len(values)].any()


def _row_bytes(image: Path) -> tuple[int, int]:
    cfg = read_image(image).config
    return cfg.vocab_out, -(-cfg.dim // 32) * 16


@pytest.fixture(scope="module")
def twins(test_model, llama2c_image, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
          ) -> dict[str, tuple[Path, Path]]:
    """name -> (a certified image, the same with its certificate emptied: the head
    staged in id order with the image's f32 scales, story_matrix.uncertified)."""
    d = tmp_path_factory.mktemp("f16")
    demo = ROOT / "models" / "demo"
    images = {"release": test_model("release").image, "llama2c": llama2c_image("untied"),
              "scales": _unusual_scales(test_model("small"), d), "demo": d / "demo.img"}
    convert(demo / "model.bin", demo / "tokenizer.json", images["demo"], progress=False)
    return {name: (img, story_matrix.uncertified(img, d / f"{name}-f32.img"))
            for name, img in images.items()}


def _unusual_scales(model, d: Path) -> Path:  # type: ignore[no-untyped-def]
    """The small test model (tied head) with some head rows' scales made zero,
    fp16 subnormals, negative or -0: tiles whose widening leaves the
    positive-normal loop for the general one (head.c staged_rows)."""
    w = read_model_bin(model.model_bin.read_bytes())
    s = w.tok_emb.scales.copy()
    edits = {3: 0.0, 5: 2.0**-24, 7: 3 * 2.0**-20, 11: -float(s[11, 0]), 13: -0.0,
             700: 2.0**-14 - 2.0**-24, 701: -(2.0**-17)}
    for row, value in edits.items():
        s[row] = value
    mb = d / "scales.bin"
    write_model_bin(dataclasses.replace(w, tok_emb=QMatrix(w.tok_emb.q, s, w.tok_emb.group)), mb)
    staged = read_model_bin(mb.read_bytes()).tok_emb.scales
    assert all(np.float32(staged[r, 0]).tobytes() == np.float32(v).tobytes()
               for r, v in edits.items())
    convert(mb, model.tokenizer_json, d / "scales.img", progress=False)
    return d / "scales.img"


@pytest.mark.parametrize("name", ["demo", "release", "scales", "llama2c"])
def test_staged_head_takes_two_bytes_a_row_less(twins, name: str) -> None:  # type: ignore[no-untyped-def]
    """The copy in tile order: rows x (codes + 2) in Model.memory() and _llm.plan,
    2 bytes a row under the image's rows x (codes + 4), which the same weights
    without a certificate still stage (id order, f32 scales)."""
    certified, reference = twins[name]
    rows, row_bytes = _row_bytes(certified)
    with _llm.Model(str(certified)) as m:
        where = {n: (r, b) for n, r, b in m.memory()}
    planned = {n: (r, b) for n, r, b in _llm.plan(certified.read_bytes())["blocks"]}
    assert "head_tiles" in where  # staged in tile order
    assert where["head"] == planned["head"] == ("bulk", rows * (row_bytes + 4) - 2 * rows)
    with _llm.Model(str(reference)) as m:
        where = {n: (r, b) for n, r, b in m.memory()}
    assert "head_tiles" not in where and where["head"][1] == rows * (row_bytes + 4)


@pytest.mark.parametrize("name", ["demo", "release", "scales", "llama2c"])
def test_stories_equal_the_f32_rows(twins, name: str) -> None:  # type: ignore[no-untyped-def]
    """Default (certified head, stepped and with verify passes) and plain mode on the
    fp16 copy give the stories of the image's own f32 rows."""
    certified, reference = twins[name]
    with _llm.Model(str(certified)) as m:
        vocab = m.config()["vocab_out"]
    n = 16 if name == "release" else 32
    samplers = story_matrix.SAMPLERS if name != "release" else story_matrix.SAMPLERS[:3]
    for prompt in story_matrix.prompts(vocab, 3):
        for sampler in samplers:
            assert story_matrix.check(_llm, str(certified), prompt, sampler, n, vocab,
                                      k_dots=(False,), reference=str(reference)) == [], \
                (name, prompt, sampler)
