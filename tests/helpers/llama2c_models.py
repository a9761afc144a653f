"""Generated llama2.c-shaped models for the engine tests: random weights of the
stories260K shape (dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512)
written straight through mpllm.formats.image.write_image, with a 512-token
sentencepiece vocabulary in llama2.c's tokenizer.bin form (synthetic_vocab)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from mpllm.formats import llama2c
from mpllm.formats.image import write_image
from mpllm.formats.model import Config
from mpllm.formats.rope import rope_table
from mpllm.formats.tokenizer import tokenizer_section
from mpllm.training.generate import make_weights


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
}


def write_llama2c_image(path: Path, name: str) -> Config:
    """The image of generated model `name` (LLAMA2C_SHAPES) at path; its config."""
    cfg, seed = LLAMA2C_SHAPES[name]
    tables = llama2c.tokenizer_tables(*synthetic_vocab(cfg.vocab_out))
    write_image(path, make_weights(cfg, seed), tokenizer_section=tokenizer_section(tables),
                rope=rope_table(cfg), source_sha256=bytes(32), eot_id=tables.eot_id)
    return cfg
