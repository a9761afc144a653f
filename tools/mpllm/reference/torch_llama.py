"""PyTorch model of llama2.c's Llama (its `model.py` architecture), trainable on CPU.

`LlamaModel(cfg)` is the network llama2.c's run.c evaluates: token
embedding; per layer RMSNorm, attention with RoPE on consecutive pairs (dims
2i and 2i+1 of each head rotate together, theta 10000) and n_kv_heads <=
n_heads key/value heads shared by groups of query heads, RMSNorm, SwiGLU
(w2(silu(w1 x) * w3 x)); a final RMSNorm and the classifier (tied to the
embedding when cfg.shared_classifier). RMSNorm's epsilon is llama2.c's 1e-5.
`to_checkpoint()` gives the weights as a `Llama2cCheckpoint`, which
mpllm.formats.llama2c writes in any of llama2.c's file versions.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..formats.llama2c import LAYER_MATRICES, Llama2cCheckpoint, Llama2cConfig

__all__ = ["RMS_EPS", "LlamaModel"]

RMS_EPS = 1e-5
ROPE_THETA = 10000.0


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS))


class LlamaModel(nn.Module):
    def __init__(self, cfg: Llama2cConfig) -> None:
        super().__init__()
        self.cfg = cfg
        L, d = cfg.n_layers, cfg.dim
        self.tok_embeddings = nn.Parameter(torch.empty(cfg.vocab_size, d))
        self.attention_norm = nn.Parameter(torch.ones(L, d))
        self.ffn_norm = nn.Parameter(torch.ones(L, d))
        self.norm = nn.Parameter(torch.ones(d))
        self.mats = nn.ParameterDict({name: nn.Parameter(torch.empty(L, *cfg.matrix_shape(name)))
                                      for name in LAYER_MATRICES})
        self.classifier = (None if cfg.shared_classifier
                           else nn.Parameter(torch.empty(cfg.vocab_size, d)))
        hs = cfg.head_dim
        freqs = 1.0 / ROPE_THETA ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        ang = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float64), freqs)
        self.register_buffer("cos", ang.cos().float(), persistent=False)  # [seq_len, hs/2]
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def reset_parameters(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.tok_embeddings.normal_(0.0, 0.02, generator=g)
            if self.classifier is not None:
                self.classifier.normal_(0.0, 0.02, generator=g)
            for name, p in self.mats.items():
                # GPT-2's rule: the projections back into the residual stream
                # are scaled down by the depth
                std = 0.02 / (2 * self.cfg.n_layers) ** 0.5 if name in ("wo", "w2") else 0.02
                p.normal_(0.0, std, generator=g)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, heads, hs]: rotate each pair (2i, 2i+1) by position."""
        t = x.shape[1]
        xr = x.float().reshape(*x.shape[:-1], -1, 2)
        a, b = xr[..., 0], xr[..., 1]
        c, s = self.cos[:t, None, :], self.sin[:t, None, :]
        return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> logits [B, T, vocab]."""
        cfg = self.cfg
        B, T = ids.shape
        hs, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        x = self.tok_embeddings[ids]
        m = self.mats
        for layer in range(cfg.n_layers):
            h = _rms(x, self.attention_norm[layer])
            q = self._rope((h @ m["wq"][layer].T).view(B, T, nh, hs))
            k = self._rope((h @ m["wk"][layer].T).view(B, T, nkv, hs))
            v = (h @ m["wv"][layer].T).view(B, T, nkv, hs)
            k = k.repeat_interleave(nh // nkv, dim=2)
            v = v.repeat_interleave(nh // nkv, dim=2)
            att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), is_causal=True)
            x = x + att.transpose(1, 2).reshape(B, T, cfg.dim) @ m["wo"][layer].T
            h = _rms(x, self.ffn_norm[layer])
            x = x + (F.silu(h @ m["w1"][layer].T) * (h @ m["w3"][layer].T)) @ m["w2"][layer].T
        x = _rms(x, self.norm)
        out = self.tok_embeddings if self.classifier is None else self.classifier
        return x @ out.T

    @torch.no_grad()
    def to_checkpoint(self) -> Llama2cCheckpoint:
        def f(p: torch.Tensor) -> np.ndarray:
            return p.detach().float().numpy().copy()

        return Llama2cCheckpoint(
            version=0, config=self.cfg, tok_embeddings=f(self.tok_embeddings),
            attention_norm=f(self.attention_norm), ffn_norm=f(self.ffn_norm), norm=f(self.norm),
            layers={name: f(p) for name, p in self.mats.items()},
            classifier=None if self.classifier is None else f(self.classifier))

    @classmethod
    def from_checkpoint(cls, ck: Llama2cCheckpoint) -> LlamaModel:
        model = cls(ck.config)
        with torch.no_grad():
            model.tok_embeddings.copy_(torch.from_numpy(ck.tok_embeddings))
            model.attention_norm.copy_(torch.from_numpy(ck.attention_norm))
            model.ffn_norm.copy_(torch.from_numpy(ck.ffn_norm))
            model.norm.copy_(torch.from_numpy(ck.norm))
            for name in LAYER_MATRICES:
                model.mats[name].copy_(torch.from_numpy(ck.layers[name]))
            if model.classifier is not None and ck.classifier is not None:
                model.classifier.copy_(torch.from_numpy(ck.classifier))
        return model
