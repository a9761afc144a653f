"""Reference forward pass: numpy float32 with the exact operation order of
the numerics contract (docs/ARCHITECTURE.md). This is the oracle the C engine
(native/engine/engine.c, `forward`) must equal bit for bit.

What may be vectorized and what may not: integer dot products are exact in
any order, and element-wise ops over independent rows, heads or positions do
not depend on order; only float reductions do. Those run sequentially through
`np.cumsum` (which accumulates strictly in order in float32) with the leading
0.f of the C loops made explicit, so even the sign of a zero sum agrees.

Per-token semantics match the engine: `forward_layers` runs one token through
every layer at the current position (what prefill does for all but the last
prompt token), `forward` also runs the final norm and the head.

Both families run here as in the engine: esp32-ai (PLE branch, n_kv_heads ==
n_heads) and llama2.c's Llama (no PLE; query head h reads kv head
h // (n_heads // n_kv_heads)); rmsnorm takes the config's epsilon.
"""

from __future__ import annotations

import os

import numpy as np

from ..formats.model import F32Matrix, Matrix, Weights
from .numerics import expf, gelu, matvec_of, rmsnorm, silu, sum_seq
from .sampler import Sampler, greedy

F32 = np.float32


def _dequant_row(m: Matrix, t: int) -> np.ndarray:
    """One row's values: q * scale (int4: exact in float32; int8: one rounding,
    as the engine's lookup), or the fp32 values."""
    if isinstance(m, F32Matrix):
        return m.w[t].astype(np.float32)
    sc = np.repeat(m.scales[t].astype(np.float32), m.group)[: m.cols]
    return m.q[t].astype(np.float32) * sc


def _seq_sum_last(a: np.ndarray) -> np.ndarray:
    """Sequential sum over the last axis starting from 0.f (see module doc)."""
    return sum_seq(a, axis=-1)


class Reference:
    """The model, one token at a time, on a float32 KV cache."""

    def __init__(self, weights: Weights, rope: np.ndarray) -> None:
        cfg = weights.config
        self.weights = weights
        self.config = cfg
        d, hd = cfg.dim, cfg.head_dim
        if cfg.dim % cfg.n_heads or hd % 2:
            raise ValueError(f"dim {d} / n_heads {cfg.n_heads} must give an even head_dim")
        rope = np.asarray(rope)
        if rope.shape != (cfg.seq_len, hd) or rope.dtype != np.float32:
            raise ValueError(f"rope table must be float32 [{cfg.seq_len}, {hd}], got "
                             f"{rope.dtype} {rope.shape}")
        if len(weights.layers) != cfg.n_layers:
            raise ValueError(f"{len(weights.layers)} layers, config says {cfg.n_layers}")
        self.rope = rope
        self.eps = cfg.norm_eps
        mats = ("qkv", "attn_proj", "gate", "up", "down")
        if cfg.has_ple:
            assert weights.ple_model_proj is not None
            self.ple_model_proj = matvec_of(weights.ple_model_proj)
            mats += ("ple_gate", "ple_proj")
        self.layers = [{name: matvec_of(getattr(lw, name)) for name in mats}
                       for lw in weights.layers]
        self.head = matvec_of(weights.output_head())
        # constants exactly as the engine precomputes them
        self.inv_sqrt_d = F32(1.0) / np.sqrt(F32(d))
        self.sqrt_p = np.sqrt(F32(cfg.ple_dim))
        self.inv_sqrt_hd = F32(1.0) / np.sqrt(F32(hd))
        self.k_cache = np.zeros((cfg.n_layers, cfg.seq_len, cfg.kv_dim), dtype=np.float32)
        self.v_cache = np.zeros((cfg.n_layers, cfg.seq_len, cfg.kv_dim), dtype=np.float32)
        self.pos = 0

    @classmethod
    def from_image(cls, path: str | os.PathLike[str] | bytes) -> Reference:
        from ..formats.image import read_image

        img = read_image(path)
        return cls(img.weights, img.rope)

    def reset(self) -> None:
        self.pos = 0
        self.k_cache[:] = 0
        self.v_cache[:] = 0

    # ---- pieces ------------------------------------------------------------

    def _ple_input(self, x: np.ndarray, token: int) -> np.ndarray:
        """ple [L, P] for this token (step 2 of the forward pass)."""
        cfg, w = self.config, self.weights
        assert w.ple_table is not None
        c = self.ple_model_proj(x) * self.inv_sqrt_d
        c = rmsnorm(c.reshape(cfg.n_layers, cfg.ple_dim), w.ple_proj_norm, self.eps)
        tbl = _dequant_row(w.ple_table, token).reshape(cfg.n_layers, cfg.ple_dim)
        return (c + tbl * self.sqrt_p) * F32(0.70710678)

    def _rope(self, v: np.ndarray, pos: int) -> np.ndarray:
        """Split-half rotation of every head of v ([heads*head_dim])."""
        hd = self.config.head_dim
        half = hd // 2
        c = self.rope[pos, :half]
        s = self.rope[pos, half:]
        h = v.reshape(-1, hd)
        a, b = h[:, :half], h[:, half:]
        out = np.empty_like(h)
        out[:, :half] = a * c - b * s
        out[:, half:] = b * c + a * s
        return out.reshape(-1)

    def _attention(self, layer: int, q: np.ndarray, pos: int) -> np.ndarray:
        cfg = self.config
        nh, nkv, hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        T = pos + 1
        qh = q.reshape(nh, 1, hd)
        # query head h reads kv head h // (nh // nkv): each kv head repeated
        kh = self.k_cache[layer, :T].reshape(T, nkv, hd).transpose(1, 0, 2)  # [nkv, T, hd]
        vh = self.v_cache[layer, :T].reshape(T, nkv, hd).transpose(1, 0, 2)
        kh, vh = np.repeat(kh, nh // nkv, axis=0), np.repeat(vh, nh // nkv, axis=0)
        scores = _seq_sum_last(qh * kh) * self.inv_sqrt_hd  # [nh, T]
        # maxs starts at -1e30f; any order gives the same maximum
        maxs = np.maximum(F32(-1e30), scores.max(axis=1))
        w = expf(scores - maxs[:, None])  # [nh, T]
        denom = _seq_sum_last(w)  # [nh]
        # ao[i] = 0.f; ao[i] += w_t * v_t[i] for t ascending; then ao[i] /= denom
        ao = sum_seq(w[:, :, None] * vh, axis=1)  # [nh, hd]
        ao = ao / denom[:, None]
        return ao.reshape(-1)

    # ---- forward -----------------------------------------------------------

    def _check_token(self, token: int, pos: int | None) -> int:
        cfg = self.config
        if pos is not None and pos != self.pos:
            raise ValueError(f"position {pos} requested but the cache is at {self.pos} "
                             "(tokens must be fed in order; reset() to start over)")
        if not 0 <= int(token) < cfg.vocab_in:
            raise ValueError(f"token {token} outside the embedding rows 0..{cfg.vocab_in - 1}")
        if self.pos >= cfg.seq_len:
            raise ValueError(f"context full: {cfg.seq_len} positions used")
        return int(token)

    def forward_layers(self, token: int, pos: int | None = None) -> np.ndarray:
        """Run one token through every layer at the current position; returns
        the residual x (before the final norm) and advances the position."""
        token = self._check_token(token, pos)
        cfg, w = self.config, self.weights
        d, kvd, eps = cfg.dim, cfg.kv_dim, self.eps
        p = self.pos
        x = _dequant_row(w.tok_emb, token)
        ple = self._ple_input(x, token) if cfg.has_ple else None
        for li, (lw, lq) in enumerate(zip(w.layers, self.layers, strict=True)):
            h = rmsnorm(x, lw.attn_norm, eps)
            qkv = lq["qkv"](h)
            q = self._rope(qkv[:d], p)
            self.k_cache[li, p] = self._rope(qkv[d : d + kvd], p)
            self.v_cache[li, p] = qkv[d + kvd :]
            ao = self._attention(li, q, p)
            x = x + lq["attn_proj"](ao)
            h = rmsnorm(x, lw.ffn_norm, eps)
            m = silu(lq["gate"](h)) * lq["up"](h)
            x = x + lq["down"](m)
            if ple is None:
                continue  # llama2.c: no PLE branch
            g = gelu(lq["ple_gate"](x)) * ple[li]
            x = x + rmsnorm(lq["ple_proj"](g), lw.ple_norm, eps)
        self.pos = p + 1
        return x

    def head_logits(self, x: np.ndarray) -> np.ndarray:
        """Final norm + head: float32 [vocab_out]."""
        return self.head(rmsnorm(x, self.weights.out_norm, self.eps))

    def forward(self, token: int, pos: int | None = None) -> np.ndarray:
        """One token through layers and head: logits float32 [vocab_out]."""
        return self.head_logits(self.forward_layers(token, pos))

    def prefill(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Layers for every token, head for the last only (as the engine)."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("prefill needs at least one token")
        for t in tokens[:-1]:
            self.forward_layers(t)
        return self.forward(tokens[-1])

    def generate(
        self,
        prompt_ids: list[int] | np.ndarray,
        n: int,
        sampler: Sampler | None = None,
        *,
        teacher: list[int] | np.ndarray | None = None,
    ) -> tuple[list[int], np.ndarray]:
        """From the current state: prefill the prompt, then n tokens.

        Returns (ids, logits_rows[n, vocab_out]); row k is the output whose pick
        is ids[k]. With `teacher`, token teacher[k] (not ids[k]) is fed after
        step k, so one disagreement cannot cascade (golden comparisons).
        """
        cfg = self.config
        prompt = [int(t) for t in prompt_ids]
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self.pos + len(prompt) + n - 1 > cfg.seq_len:
            raise ValueError(f"prompt ({len(prompt)}) + {n} tokens do not fit the "
                             f"{cfg.seq_len}-position context from position {self.pos}")
        if teacher is not None and len(teacher) < n - 1:
            raise ValueError(f"teacher has {len(teacher)} ids, need {n - 1}")
        pick = sampler.pick if sampler is not None else greedy
        rows = np.empty((n, cfg.vocab_out), dtype=np.float32)
        ids: list[int] = []
        logits = self.prefill(prompt)
        for k in range(n):
            if k:
                feed = ids[-1] if teacher is None else int(teacher[k - 1])
                logits = self.forward(feed)
            rows[k] = logits
            ids.append(pick(logits))
        return ids, rows


__all__ = ["Reference"]
