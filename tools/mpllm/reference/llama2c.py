"""A float32 numpy forward pass of llama2.c's Llama (karpathy/llama2.c `run.c`),
by token ids: enough to let a real trained llama2.c checkpoint write stories
on this PC, so the drafter's tokens per pass can be measured on a model as
unpredictable as real text (mpllm.costmodel.drafting_study --llama2c).

The checkpoint is read by mpllm.formats.llama2c (any of llama2.c's file
versions). The model is run.c's: RMSNorm (eps 1e-5), RoPE
rotating adjacent pairs (i, i + 1) of q and k with theta 10000, grouped-query
attention (n_kv_heads <= n_heads), SwiGLU, a final RMSNorm and the
classifier (the embedding when shared).

`Llama2c.step` runs a batch of sequences at one position (the sequences are
independent; a batch only shares the numpy calls), so many stories are
written at the cost of few. Not the engine's numerics: only the tokens'
statistics matter here, not bits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..formats.llama2c import BOS_ID, Llama2cCheckpoint, read_checkpoint

F32 = np.float32
#: llama2.c's BOS id (sentencepiece <s>); every story starts from it
BOS = BOS_ID
EPS = F32(1e-5)
ROPE_THETA = 10000.0


class Llama2c:
    """The weights of one checkpoint and run.c's forward pass over a batch."""

    def __init__(self, source: str | os.PathLike[str] | Llama2cCheckpoint) -> None:
        """source: a checkpoint file of any llama2.c version (read by
        mpllm.formats.llama2c, which refuses a malformed one with
        CheckpointError) or a checkpoint already read."""
        ck = (source if isinstance(source, Llama2cCheckpoint)
              else read_checkpoint(open(source, "rb").read(), os.fspath(source)))  # noqa: SIM115
        self.cfg = c = ck.config
        self.w = {"emb": ck.tok_embeddings, "rms_att": ck.attention_norm,
                  "rms_ffn": ck.ffn_norm, "rms_final": ck.norm, **ck.layers}
        self.wcls = ck.output
        # run.c: freq = 1 / theta^((i % head_size) / head_size) for even i
        hs = c.head_dim
        pair = np.arange(0, hs, 2, dtype=F32)
        self._freq = (1.0 / np.power(F32(ROPE_THETA), pair / F32(hs))).astype(F32)

    def new_cache(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V per layer, sequence, position and kv head (positions are
        contiguous per sequence, so attention reads views, not copies)."""
        c = self.cfg
        shape = (c.n_layers, batch, c.seq_len, c.n_kv_heads, c.head_dim)
        return np.zeros(shape, F32), np.zeros(shape, F32)

    @staticmethod
    def _rmsnorm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        ss = (x * x).mean(axis=-1, keepdims=True, dtype=F32) + EPS
        return (x / np.sqrt(ss)).astype(F32) * g

    def _rope(self, v: np.ndarray, pos: int) -> np.ndarray:
        """Rotate pairs (2i, 2i+1) of every head by pos * freq[i]."""
        b, n = v.shape
        pairs = v.reshape(b, n // self.cfg.head_dim, self.cfg.head_dim // 2, 2)
        ang = F32(pos) * self._freq
        cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
        v0, v1 = pairs[..., 0], pairs[..., 1]
        out = np.stack((v0 * cos - v1 * sin, v0 * sin + v1 * cos), axis=-1)
        return out.reshape(b, n).astype(F32)

    def step(self, tokens: Sequence[int] | np.ndarray, pos: int,
             cache: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Logits (batch, vocab) after feeding tokens[b] at position pos of
        sequence b; the caches gain that position."""
        c, w = self.cfg, self.w
        hs, kv_mul = c.head_dim, c.n_heads // c.n_kv_heads
        kc, vc = cache
        x = w["emb"][np.asarray(tokens)].astype(F32)
        b = x.shape[0]
        for layer in range(c.n_layers):
            xb = self._rmsnorm(x, w["rms_att"][layer])
            q = self._rope(xb @ w["wq"][layer].T, pos)
            kc[layer, :, pos] = self._rope(xb @ w["wk"][layer].T, pos).reshape(b, -1, hs)
            vc[layer, :, pos] = (xb @ w["wv"][layer].T).reshape(b, -1, hs)
            # head h reads kv head h // kv_mul (run.c), so q's heads group by kv head
            qh = q.reshape(b, c.n_kv_heads, kv_mul, hs)
            k = kc[layer, :, :pos + 1].transpose(0, 2, 3, 1)  # b, kv head, hs, t
            v = vc[layer, :, :pos + 1].transpose(0, 2, 1, 3)  # b, kv head, t, hs
            att = (qh @ k) / F32(np.sqrt(hs))
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            o = (att.astype(F32) @ v).reshape(b, c.dim)
            x = x + o @ w["wo"][layer].T
            xb = self._rmsnorm(x, w["rms_ffn"][layer])
            h1, h3 = xb @ w["w1"][layer].T, xb @ w["w3"][layer].T
            x = x + (h1 / (F32(1) + np.exp(-h1)) * h3).astype(F32) @ w["w2"][layer].T
        return (self._rmsnorm(x, w["rms_final"]) @ self.wcls.T).astype(F32)

    def generate(self, prompts: Sequence[Sequence[int]], n_tokens: int, *,
                 temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                 stop: int | None = None) -> list[list[int]]:
        """Each prompt's continuation (the prompt not included), decoded
        greedily (temperature 0) or sampled at temperature from the top_k most
        likely (0: all), n_tokens at most, stopping before `stop` (the prompts
        are fed in one batch, so they must be of one length). Seeded: the same
        arguments give the same stories."""
        c = self.cfg
        if not prompts or len({len(p) for p in prompts}) != 1 or not prompts[0]:
            raise ValueError("prompts: one or more, all of the same length >= 1")
        plen = len(prompts[0])
        n_tokens = min(n_tokens, c.seq_len - plen)
        rng = np.random.default_rng(seed)
        cache = self.new_cache(len(prompts))
        toks = np.asarray(prompts, dtype=np.int64)
        for pos in range(plen - 1):
            self.step(toks[:, pos], pos, cache)
        cur, out = toks[:, -1], np.zeros((len(prompts), n_tokens), np.int64)
        for i in range(n_tokens):
            logits = self.step(cur, plen - 1 + i, cache)
            cur = sample(logits, temperature, top_k, rng)
            out[:, i] = cur
        stories = []
        for row in out.tolist():
            if stop is not None and stop in row:
                row = row[:row.index(stop)]
            stories.append(row)
        return stories


def sample(logits: np.ndarray, temperature: float, top_k: int,
           rng: np.random.Generator) -> np.ndarray:
    """One token per row: argmax at temperature 0, else a draw from
    softmax(logits / temperature) over the top_k largest (0: all)."""
    if temperature <= 0:
        return logits.argmax(axis=-1)
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    u = rng.random((z.shape[0], 1))
    return np.minimum((p.cumsum(axis=-1) < u).sum(axis=-1), z.shape[-1] - 1)


def entropy(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Nats per row of softmax(logits / temperature)."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=-1)
