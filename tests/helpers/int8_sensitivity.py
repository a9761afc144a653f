"""Which matrices of a llama2.c checkpoint lose its greedy choices at int8 (by hand).

Teacher-forced over the fp32 model's own greedy text from BOS (as convert.py's
quality figure, mpllm.llama2c_weights.quality), the numpy reference of the
engine's numerics (mpllm.reference.forward, bit for bit the engine's) on the
checkpoint's weights with some matrix classes int8 (Q8_0, at a chosen group)
and the rest fp32, against the checkpoint's fp32 forward: the share of
positions whose greedy choice agrees and the mean |logit difference|.
"int8 weights, float activations" rows run the dequantized int8 weights as
fp32 matrices (no activation quantization: not an engine format).

    python tests/helpers/int8_sensitivity.py [CHECKPOINT] [--positions N]

On the shared stories260K.bin this is where convert.py's int8 went from one
group for w2's whole 172-column row (83.6 %) to groups of 32 (88.3 %).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from mpllm.formats.llama2c import read_checkpoint
from mpllm.formats.model import F32Matrix, Matrix, Weights
from mpllm.formats.rope import rope_table
from mpllm.llama2c_weights import quality_ids, to_weights
from mpllm.quantize import quantize_int8
from mpllm.reference.forward import Reference
from mpllm.reference.llama2c import Llama2c

#: the matrix classes: the embedding (and tied head) and each layer matrix
CLASSES = ("embed", "qkv", "attn_proj", "gate", "up", "down")
Spec = dict[str, Callable[[F32Matrix], Matrix]]


def q8(group: int | None = None) -> Callable[[F32Matrix], Matrix]:
    """int8 at `group` (None: quantize.int8_group, convert.py's)."""
    return lambda m: quantize_int8(m.w, group)


def q8_float_acts(group: int | None = None) -> Callable[[F32Matrix], Matrix]:
    return lambda m: F32Matrix(quantize_int8(m.w, group).dequantize())


def variant(fp32: Weights, spec: Spec) -> Weights:
    layers = [dataclasses.replace(ly, **{n: spec[n](getattr(ly, n)) for n in CLASSES[1:]
                                         if n in spec}) for ly in fp32.layers]
    emb = spec["embed"](fp32.tok_emb) if "embed" in spec else fp32.tok_emb  # type: ignore[arg-type]
    return dataclasses.replace(fp32, layers=layers, tok_emb=emb)


def rows(all8: Spec) -> list[tuple[str, Spec]]:
    out: list[tuple[str, Spec]] = [("fp32", {}), ("int8 (convert.py's groups)", all8)]
    out += [(f"int8, w2 group {g}", {**all8, "down": q8(g)}) for g in (172, 43, 16, 4)]
    out += [(f"only {c} int8, the rest fp32", {c: q8()}) for c in CLASSES]
    out += [(f"int8, {c} fp32", {k: v for k, v in all8.items() if k != c}) for c in CLASSES]
    out += [("int8 weights, float activations", dict.fromkeys(CLASSES, q8_float_acts()))]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", nargs="?", type=Path,
                    default=ROOT.parent / "shared" / "llama2c" / "stories260K.bin")
    ap.add_argument("--positions", type=int, default=256)
    args = ap.parse_args(argv)
    ck = read_checkpoint(args.checkpoint.read_bytes(), str(args.checkpoint))
    ids = quality_ids(ck, args.positions)
    ref = Llama2c(ck)
    cache = ref.new_cache(1)
    want = np.stack([ref.step([t], p, cache)[0] for p, t in enumerate(ids)])
    fp32 = to_weights(ck, weights="fp32")
    print(f"{args.checkpoint.name}: teacher-forced over {len(ids)} positions")
    print(f"{'variant':<40} {'agree':>7} {'mean|diff|':>10}")
    for name, spec in rows(dict.fromkeys(CLASSES, q8())):
        w = variant(fp32, spec)
        r = Reference(w, rope_table(w.config))
        got = np.stack([r.forward(t) for t in ids])
        agree = float((got.argmax(axis=1) == want.argmax(axis=1)).mean())
        diff = float(np.abs(got.astype(np.float64) - want).mean())
        print(f"{name:<40} {100 * agree:>6.1f}% {diff:>10.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
