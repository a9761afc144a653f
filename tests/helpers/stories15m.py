"""A stories15M-shaped llama2.c checkpoint with random weights, for the tests of
stories15M on the N16R8 (issue 33): llama2.c's published stories15M has dim
288, hidden 768, 6 layers, 6 heads, 6 kv heads, vocab 32,000, seq_len 256 and
a shared classifier (the embedding is the head). Random weights are enough for
memory, placement, speed and exactness (the same bits on every route); the
real file's quality needs the published weights (`flash.py --model stories15m`
downloads them on a user's machine).

The checkpoint is written as llama2.c's export.py writes the published one
(legacy v0, float32), so its size is the published file's: 60,816,028 bytes.
The vocabulary is synthetic, in tokenizer.bin form: 32,000 pieces like the
Llama 2 tokenizer stories15M uses (vocab_pieces)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from mpllm.formats import llama2c

#: llama2.c's stories15M (karpathy/llama2.c README, model.py ModelArgs)
STORIES15M = llama2c.Llama2cConfig(dim=288, hidden_dim=768, n_layers=6, n_heads=6, n_kv_heads=6,
                                   vocab_size=32000, seq_len=256, shared_classifier=True)
#: the published stories15M.bin's size (models/stories15m.json pins it)
PUBLISHED_BYTES = 60_816_028


def stories15m_checkpoint(seed: int = 15) -> llama2c.Llama2cCheckpoint:
    """Random float32 weights of the stories15M shape. The spreads are a
    trained model's order of magnitude (rows of norm ~1, norms' weights near
    1), so the activations stay in the ranges the int4 / int8 paths see."""
    cfg = STORIES15M
    rng = np.random.default_rng(seed)

    def w(std: float, *shape: int) -> np.ndarray:
        return rng.normal(0.0, std, shape).astype(np.float32)

    layers = {name: w(1.0 / np.sqrt(cfg.matrix_shape(name)[1]), cfg.n_layers,
                      *cfg.matrix_shape(name))
              for name in llama2c.LAYER_MATRICES}
    return llama2c.Llama2cCheckpoint(
        0, cfg, w(0.1, cfg.vocab_size, cfg.dim), 1 + w(0.1, cfg.n_layers, cfg.dim),
        1 + w(0.1, cfg.n_layers, cfg.dim), 1 + w(0.1, cfg.dim), layers, None)


def vocab_pieces(n: int) -> tuple[list[bytes], list[float]]:
    """A llama2.c-shaped vocabulary of n pieces: <unk>, BOS, EOS, the 256 byte
    pieces, the letters and a few marks, then every string of 2, 3, 4, ...
    letters (with and without a leading space) in order until there are n,
    each a merge of two shorter ones, scored so that longer merges rank
    lower. (llama2c_models.synthetic_vocab's random pairs take minutes at
    32,000 pieces.)"""
    letters = [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz"]
    texts = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    singles = [*letters, *(bytes([c]) for c in b" .,'\n")]
    texts += singles
    merged: list[bytes] = []
    for length in range(2, 6):
        for word in itertools.product(letters, repeat=length - 1):
            stem = b"".join(word)
            merged += [stem + x for x in letters]
            merged += [b" " + stem]
            if len(texts) + len(merged) >= n:
                break
        if len(texts) + len(merged) >= n:
            break
    texts += merged[:n - len(texts)]
    scores = [0.0] * 259 + [-1e9] * len(singles) + [-float(k) for k in
                                                    range(len(texts) - 259 - len(singles))]
    return texts, scores


def write_stories15m(folder: Path, seed: int = 15) -> tuple[Path, Path]:
    """stories15M.bin (legacy v0, as published) and its tokenizer.bin in
    `folder`; returns (model, tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    model, tok = folder / "stories15M.bin", folder / "tokenizer.bin"
    data = llama2c.checkpoint_bytes(stories15m_checkpoint(seed), 0)
    if len(data) != PUBLISHED_BYTES:  # the shape is the published one, or this is no stand-in
        raise AssertionError(f"stories15M-shaped checkpoint is {len(data)} bytes, the published "
                             f"one {PUBLISHED_BYTES}")
    model.write_bytes(data)
    texts, scores = vocab_pieces(STORIES15M.vocab_size)
    tok.write_bytes(llama2c.tokenizer_bin_bytes(texts, scores))
    return model, tok
