"""Generated llama2.c-shaped models for the engine tests: random weights of the
stories260K shape (dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512)
written straight through mpllm.formats.image.write_image, with a 512-token
sentencepiece vocabulary in llama2.c's tokenizer.bin form (synthetic_vocab)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
from mpllm.formats import llama2c
from mpllm.formats.image import write_image
from mpllm.formats.llama2c import Llama2cCheckpoint, Llama2cConfig
from mpllm.formats.model import Config, F32Matrix, Matrix, Weights
from mpllm.formats.rope import rope_table
from mpllm.formats.tokenizer import tokenizer_section
from mpllm.quantize import quantize_int8
from mpllm.training.generate import make_weights

#: llama2.c's own stories260K checkpoint, beside the checkout (../shared/llama2c): read
#: there when present, never copied; the tests that need it skip without it
STORIES260K_BIN = Path(__file__).resolve().parents[3] / "shared" / "llama2c" / "stories260K.bin"


def random_checkpoint(shared: bool = True, seed: int = 0) -> Llama2cCheckpoint:
    """A small llama2.c checkpoint of random weights (grouped-query attention,
    a shared or own classifier), as llama2c.read_checkpoint returns one."""
    cfg = Llama2cConfig(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2,
                        vocab_size=96, seq_len=40, shared_classifier=shared)
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.2, shape).astype(np.float32)

    layers = {name: w(cfg.n_layers, *cfg.matrix_shape(name)) for name in llama2c.LAYER_MATRICES}
    return Llama2cCheckpoint(0, cfg, w(96, 32), 1 + w(2, 32), 1 + w(2, 32), 1 + w(32), layers,
                             None if shared else w(96, 32))


def synthetic_vocab(n: int = 512, seed: int = 5) -> tuple[list[bytes], list[float]]:
    """A llama2.c-shaped vocabulary: <unk>, BOS, EOS, the 256 byte pieces, then
    pieces built from pairs of earlier ones, with deliberately tied scores."""
    rng = random.Random(seed)
    texts = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    chars = [c.encode() for c in " abcdefghijklmnop.,'\néü日😀"]
    texts += chars
    known = set(texts)
    while len(texts) < n:
        t = rng.choice(texts[259:]) + rng.choice(texts[259:])
        if t not in known and len(t) <= 16:
            texts.append(t)
            known.add(t)
    scores = [0.0] * 259 + [-1e9] * len(chars) + [-float(rng.randint(0, 60))
                                                   for _ in range(len(texts) - 259 - len(chars))]
    return texts, scores


STORIES260K = Config(vocab_in=512, vocab_out=512, dim=64, n_layers=5, n_heads=8, ffn=172,
                     ple_dim=0, seq_len=512, group=64, tied_head=False, family="llama2c",
                     n_kv_heads=4, norm_eps=1e-5)

# name -> (config, seed): the stories260K shape with its untied head and tied;
# "long" has llama2.c's longest context here (1024) and 32-column scale groups
# (several per row: V cached as floats, the head scored densely).
LLAMA2C_SHAPES: dict[str, tuple[Config, int]] = {
    "untied": (STORIES260K, 201),
    "tied": (dataclasses.replace(STORIES260K, tied_head=True), 202),
    "long": (dataclasses.replace(STORIES260K, tied_head=True, seq_len=1024, group=32), 203),
    # the same shape in the other weight formats, per tensor (the norms stay f32):
    # every matrix int8 (head and embedding too: groups of 32, the 172-column
    # down rows one group each); every matrix fp32 with the head tied; and a mix
    # (qkv int8, attn_proj fp32, gate int4, up int8, down fp32, the embedding and
    # the certified head int4)
    "int8": (STORIES260K, 204),
    "fp32": (dataclasses.replace(STORIES260K, tied_head=True), 205),
    "mixed": (STORIES260K, 206),
}

#: the weight format of each matrix of the format variants above (a name
#: missing here keeps make_weights' int4)
FORMATS: dict[str, dict[str, str]] = {
    "int8": dict.fromkeys(("embed", "head", "qkv", "attn_proj", "gate", "up", "down"), "int8"),
    "fp32": dict.fromkeys(("embed", "qkv", "attn_proj", "gate", "up", "down"), "fp32"),
    "mixed": {"qkv": "int8", "attn_proj": "fp32", "up": "int8", "down": "fp32"},
}


def _as(m: Matrix, fmt: str | None) -> Matrix:
    """m (int4) in format fmt: its values quantized to int8, or as fp32 (exact)."""
    if fmt is None:
        return m
    return quantize_int8(m.dequantize()) if fmt == "int8" else F32Matrix(m.dequantize())


def llama2c_weights(name: str) -> Weights:
    """The weights of generated model `name` (LLAMA2C_SHAPES), in its formats."""
    cfg, seed = LLAMA2C_SHAPES[name]
    w = make_weights(cfg, seed)
    fmts = FORMATS.get(name, {})
    for layer in w.layers:
        for f in ("qkv", "attn_proj", "gate", "up", "down"):
            setattr(layer, f, _as(getattr(layer, f), fmts.get(f)))
    w.tok_emb = _as(w.tok_emb, fmts.get("embed"))
    if w.head is not None:
        w.head = _as(w.head, fmts.get("head"))
    return w


def write_llama2c_image(path: Path, name: str) -> Config:
    """The image of generated model `name` (LLAMA2C_SHAPES) at path; its config."""
    cfg, _seed = LLAMA2C_SHAPES[name]
    tables = llama2c.tokenizer_tables(*synthetic_vocab(cfg.vocab_out))
    write_image(path, llama2c_weights(name), tokenizer_section=tokenizer_section(tables),
                rope=rope_table(cfg), source_sha256=bytes(32), eot_id=tables.eot_id)
    return cfg
