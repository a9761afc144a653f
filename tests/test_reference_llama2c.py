"""mpllm.reference.llama2c: llama2.c's Llama in numpy, by token ids.

A tiny random checkpoint is checked against run.c's forward pass written out
loop by loop (one head, one pair, one row at a time); the real checkpoint in
../shared/llama2c (never copied into the repository) against its known facts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from mpllm.formats.llama2c import CheckpointError
from mpllm.reference import llama2c as L

SHARED = ROOT.parent / "shared" / "llama2c" / "stories260K.bin"


def _write_checkpoint(path: Path, cfg: tuple[int, ...], shared: bool, seed: int) -> None:
    dim, hidden, layers, heads, kv_heads, vocab, seq = cfg
    hs = dim // heads
    kv = hs * kv_heads
    rng = np.random.default_rng(seed)
    sizes = [vocab * dim, layers * dim, layers * dim * dim, layers * kv * dim,
             layers * kv * dim, layers * dim * dim, layers * dim, layers * hidden * dim,
             layers * dim * hidden, layers * hidden * dim, dim, seq * hs]
    if not shared:
        sizes.append(vocab * dim)
    head = np.array([dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq],
                    "<i4")
    body = (rng.standard_normal(sum(sizes)) * 0.3).astype("<f4")
    path.write_bytes(head.tobytes() + body.tobytes())


def _run_c(m: L.Llama2c, tokens: list[int]) -> list[np.ndarray]:
    """run.c's forward(), loop for loop, in float64 (only the order of
    operations is run.c's; the sums are exact enough to compare)."""
    c, w = m.cfg, m.w
    hs, kv_mul = c.head_dim, c.n_heads // c.n_kv_heads
    kcache = np.zeros((c.n_layers, c.seq_len, c.kv_dim))
    vcache = np.zeros((c.n_layers, c.seq_len, c.kv_dim))

    def rmsnorm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        ss = sum(v * v for v in x) / len(x) + 1e-5
        return np.array([g[j] * (x[j] / math.sqrt(ss)) for j in range(len(x))])

    def matmul(wm: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.array([sum(wm[i, j] * x[j] for j in range(len(x))) for i in range(len(wm))])

    out = []
    for pos, tok in enumerate(tokens):
        x = w["emb"][tok].astype(float)
        for layer in range(c.n_layers):
            xb = rmsnorm(x, w["rms_att"][layer])
            q, k, v = (matmul(w[n][layer], xb) for n in ("wq", "wk", "wv"))
            for i in range(0, c.dim, 2):
                freq = 1.0 / 10000.0 ** ((i % hs) / hs)
                fcr, fci = math.cos(pos * freq), math.sin(pos * freq)
                for vec in ((q, k) if i < c.kv_dim else (q,)):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            kcache[layer, pos], vcache[layer, pos] = k, v
            att_out = np.zeros(c.dim)
            for h in range(c.n_heads):
                kv0 = (h // kv_mul) * hs
                qh = q[h * hs:(h + 1) * hs]
                sc = [sum(qh * kcache[layer, t, kv0:kv0 + hs]) / math.sqrt(hs)
                      for t in range(pos + 1)]
                e = [math.exp(s - max(sc)) for s in sc]
                for t in range(pos + 1):
                    att_out[h * hs:(h + 1) * hs] += e[t] / sum(e) * vcache[layer, t, kv0:kv0 + hs]
            x = x + matmul(w["wo"][layer], att_out)
            xb = rmsnorm(x, w["rms_ffn"][layer])
            h1, h3 = matmul(w["w1"][layer], xb), matmul(w["w3"][layer], xb)
            x = x + matmul(w["w2"][layer], h1 / (1 + np.exp(-h1)) * h3)
        out.append(matmul(m.wcls, rmsnorm(x, w["rms_final"])))
    return out


@pytest.mark.parametrize("shared,kv_heads", [(True, 2), (False, 4), (True, 1)])
def test_forward_is_run_c_on_a_tiny_checkpoint(tmp_path: Path, shared: bool,
                                                kv_heads: int) -> None:
    p = tmp_path / "tiny.bin"
    _write_checkpoint(p, (16, 24, 2, 4, kv_heads, 32, 8), shared, seed=kv_heads)
    m = L.Llama2c(p)
    assert m.cfg.n_kv_heads == kv_heads and m.cfg.shared_classifier == shared
    tokens = [1, 5, 31, 7, 7, 0]
    want = _run_c(m, tokens)
    cache = m.new_cache(2)
    for pos, t in enumerate(tokens):
        got = m.step([t, (t + 3) % 32], pos, cache)  # row 1: another sequence beside it
        np.testing.assert_allclose(got[0], want[pos], rtol=1e-4, atol=1e-4)


def test_bad_files_are_refused_in_one_line(tmp_path: Path) -> None:
    p = tmp_path / "cut.bin"
    _write_checkpoint(p, (16, 24, 2, 4, 2, 32, 8), True, seed=0)
    p.write_bytes(p.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=r"cut.bin: truncated in the RoPE tables"):
        L.Llama2c(p)
    p.write_bytes(np.array([16, 24, 2, 3, 2, 32, 8], "<i4").tobytes())
    with pytest.raises(CheckpointError, match="n_heads 3 does not split dim 16 into heads"):
        L.Llama2c(p)
    p.write_bytes(b"\0" * 8)
    with pytest.raises(CheckpointError, match="too short"):
        L.Llama2c(p)


@pytest.fixture(scope="module")
def stories260k() -> L.Llama2c:
    if not SHARED.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED} is missing: CI has ../shared/llama2c beside the checkout")
        pytest.skip("../shared/llama2c/stories260K.bin is not beside this checkout")
    return L.Llama2c(SHARED)


def test_stories260k_facts(stories260k: L.Llama2c) -> None:
    m = stories260k
    assert (m.cfg.dim, m.cfg.hidden_dim, m.cfg.n_layers, m.cfg.n_heads, m.cfg.n_kv_heads,
            m.cfg.vocab_size, m.cfg.seq_len, m.cfg.shared_classifier) == (
        64, 172, 5, 8, 4, 512, 512, True)
    # ../shared/llama2c/README.md: greedy from BOS, a newline (<0x0A>, id 13) after 19 tokens
    greedy = m.generate([[L.BOS]], 24)[0]
    assert greedy.index(13) == 19
    assert m.generate([[L.BOS]], 24) == [greedy]  # deterministic
    # a model as uncertain as real text: nats per token at T 1 on its own stories
    rng = np.random.default_rng(0)
    cache, cur, h = m.new_cache(32), np.full(32, L.BOS), []
    for pos in range(64):
        logits = m.step(cur, pos, cache)
        h.append(L.entropy(logits).mean())
        cur = L.sample(logits, 1.0, 0, rng)
    assert 2.2 < float(np.mean(h)) < 3.0
