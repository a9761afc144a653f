"""Seeded random esp32-ai models of any shape, for tests and the golden sets.

The weights imitate what the golden generator produced (and what keeps a
random 6-layer model's activations well conditioned): int4 values uniform in
-7..7 (the exporter's symmetric range, so code 0 never occurs), fp16 group
scales uniform in [0.002, 0.05], norm weights uniform in [0.5, 1.5].

    python -m mpllm.training.generate --dims 300 280 32 2 2 24 32 64 --seed 1 -o DIR
writes DIR/model.bin and DIR/tokenizer.json (a byte-level BPE of exactly
vocab_out entries from mpllm.formats.tokenizer).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes
from ..formats.esp32ai import validate_config, write_model_bin
from ..formats.model import LAYER_FIELDS, Config, LayerWeights, QMatrix, Weights, layer_fields

SCALE_LOW, SCALE_HIGH = 0.002, 0.05
NORM_LOW, NORM_HIGH = 0.5, 1.5


def _qmatrix(rng: np.random.Generator, rows: int, cols: int, group: int) -> QMatrix:
    q = rng.integers(-7, 8, size=(rows, cols), dtype=np.int8)
    ng = -(-cols // group)
    scales = rng.uniform(SCALE_LOW, SCALE_HIGH, size=(rows, ng)).astype(np.float16)
    return QMatrix(q, scales, group)


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(NORM_LOW, NORM_HIGH, size=n).astype(np.float32)


def make_weights(config: Config, seed: int) -> Weights:
    """Random weights for `config`; the same (config, seed) always gives the same bytes."""
    validate_config(config)
    rng = np.random.default_rng(seed)
    c, g = config, config.group
    d, lp = c.dim, c.n_layers * c.ple_dim
    tok_emb = _qmatrix(rng, c.vocab_in, d, g)
    if c.has_ple:
        ple_model_proj = _qmatrix(rng, lp, d, g)
        ple_proj_norm = _norm(rng, c.ple_dim)
        ple_table = _qmatrix(rng, c.vocab_in, lp, g)
    else:
        ple_model_proj = ple_proj_norm = ple_table = None
    shapes = {"qkv": (d + 2 * c.kv_dim, d), "attn_proj": (d, d), "gate": (c.ffn, d),
              "up": (c.ffn, d), "down": (d, c.ffn), "ple_gate": (c.ple_dim, d),
              "ple_proj": (d, c.ple_dim)}
    layers = []
    for _ in range(c.n_layers):
        parts: dict[str, object] = dict.fromkeys(LAYER_FIELDS)
        for f in layer_fields(c):
            if f in shapes:
                parts[f] = _qmatrix(rng, *shapes[f], g)
            else:
                parts[f] = _norm(rng, d)
        layers.append(LayerWeights(**parts))
    out_norm = _norm(rng, d)
    head = None if c.tied_head else _qmatrix(rng, c.vocab_out, d, g)
    return Weights(config=c, tok_emb=tok_emb, ple_model_proj=ple_model_proj,
                   ple_proj_norm=ple_proj_norm, ple_table=ple_table, layers=layers,
                   out_norm=out_norm, head=head)


def config_from_dims(dims: list[int] | tuple[int, ...], *, group: int = 128,
                     rope_theta: float = 10000.0, tied_head: bool = True) -> Config:
    """Config from the golden generator's argument order: vin vout D L H F P S."""
    vin, vout, d, n_layers, n_heads, ffn, ple_dim, seq_len = (int(x) for x in dims)
    return Config(vocab_in=vin, vocab_out=vout, dim=d, n_layers=n_layers, n_heads=n_heads,
                  ffn=ffn, ple_dim=ple_dim, seq_len=seq_len, group=group,
                  rope_theta=rope_theta, tied_head=tied_head)


def write_test_model(
    out_dir: str | os.PathLike[str],
    config: Config,
    seed: int,
    tokenizer: str | None = None,
    *,
    legacy: bool = False,
) -> tuple[Path, Path]:
    """Write out_dir/model.bin and out_dir/tokenizer.json; returns their paths.

    tokenizer is the tokenizer.json text to use; by default a synthetic byte-level BPE
    of exactly config.vocab_out entries, seeded by `seed`."""
    from .tokenizers import synthetic_tokenizer_json

    weights = make_weights(config, seed)  # validates the shape before anything is created
    text = synthetic_tokenizer_json(config.vocab_out, seed) if tokenizer is None else tokenizer
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_path, tok_path = out / "model.bin", out / "tokenizer.json"
    write_model_bin(weights, model_path, legacy=legacy)
    atomic_write_bytes(tok_path, text.encode("utf-8"))
    return model_path, tok_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpllm.training.generate",
        description="Write a seeded random esp32-ai model.bin and a matching synthetic "
                    "byte-level BPE tokenizer.json (for tests; any shape).")
    ap.add_argument("--dims", nargs=8, type=int, required=True,
                    metavar=("VIN", "VOUT", "D", "L", "H", "F", "P", "S"),
                    help="input vocab, output vocab (= tokenizer size), d_model, layers, "
                         "heads, ffn, PLE width, context length")
    ap.add_argument("--seed", type=int, required=True, help="random seed")
    ap.add_argument("--group", type=int, default=128, help="quantization group (default 128)")
    ap.add_argument("--theta", type=float, default=10000.0, help="RoPE theta (default 10000)")
    ap.add_argument("--untied", action="store_true", help="write a separate output head")
    ap.add_argument("--legacy", action="store_true",
                    help="write the legacy 40-byte 'PLE1' header")
    ap.add_argument("-o", "--out", required=True, type=Path, help="output directory")
    args = ap.parse_args(argv)
    try:
        cfg = config_from_dims(args.dims, group=args.group, rope_theta=args.theta,
                               tied_head=not args.untied)
        model_path, tok_path = write_test_model(args.out, cfg, args.seed, legacy=args.legacy)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {model_path} ({model_path.stat().st_size} bytes) and {tok_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
