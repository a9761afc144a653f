"""PyTorch twin of the PLE TinyStories architecture (tools/mpllm/reference/forward.py),
and of the llama2.c family the same forward pass runs (Config.family "llama2c": no
PLE, n_kv_heads key/value heads shared by groups of query heads, rmsnorm epsilon
from the config).

Two uses:
  * `PLEModel` is a trainable fp32 `nn.Module` (tools/train.py trains the demo
    model with it). It optionally fake-quantizes every int4 matrix with a
    straight-through estimator, so training sees the weights the board runs.
  * `TorchTwin.from_weights(weights)` loads the dequantized int4 weights of a
    `Weights` and runs fp32 activations. It differs from the device numerics
    (mpllm.reference.forward) only by the per-matvec int8 activation quantization and
    by float summation order, so it is the training-side check of a converted
    model. Measured (tests/test_torch_twin.py): with the reference's int8 step
    switched off the logits agree to 2e-5 of max|logit|; with it, to ~5 % on
    random generated models and ~1 % on the trained demo model.

`to_weights(module)` exports a module to `Weights` with the upstream exporter's
quantization rule: per group, scale = max|w| / 7 rounded to fp16 first, then
q = clamp(round(w / scale), -7, 7). Norm weights stay fp32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..formats.model import LAYER_FIELDS, Config, LayerWeights, QMatrix, Weights, layer_fields
from ..quantize import TINY_SCALE, quantize_int4

__all__ = [
    "TINY_SCALE",
    "PLEModel",
    "TorchTwin",
    "fake_quant",
    "quantize_matrix",
    "to_weights",
]

RMS_EPS = 1e-6  # the esp32-ai model's; a Config carries its own (norm_eps)
PLE_MIX = 0.70710678  # the literal upstream multiplies (c + tbl*sqrt(P)) by

# Matrices stored as int4 in model.bin (everything except the norm vectors).
_Q_LAYER = ("qkv", "attn_proj", "gate", "up", "down", "ple_gate", "ple_proj")
_F_LAYER = ("attn_norm", "ffn_norm", "ple_norm")


# --------------------------------------------------------------------------- #
# quantization


def _group_scales(w: torch.Tensor, group: int) -> torch.Tensor:
    """fp16-rounded scales [rows, n_groups] as float32 (max|w|/7 per group)."""
    rows, cols = w.shape
    ng = -(-cols // group)
    pad = ng * group - cols
    a = w.detach().abs()
    if pad:
        a = F.pad(a, (0, pad))
    amax = a.reshape(rows, ng, group).amax(dim=2)
    scale = (amax / 7.0).to(torch.float16)
    if torch.isinf(scale).any():
        raise ValueError(
            f"quantize: a group's max|w| ({float(amax.max()):.6g}) is too large for an "
            "fp16 scale (max|w|/7 must stay below 65504)")
    scale = scale.to(torch.float32)
    return torch.where(scale > 0, scale, torch.full_like(scale, TINY_SCALE))


def _expand(scale: torch.Tensor, group: int, cols: int) -> torch.Tensor:
    return scale.repeat_interleave(group, dim=1)[:, :cols]


def quantize_matrix(w: torch.Tensor | np.ndarray, group: int = 128) -> QMatrix:
    """int4 QMatrix of a float [rows, cols] matrix with the upstream exporter's rule
    (mpllm.quantize, which fake_quant's forward value equals)."""
    a = w if isinstance(w, np.ndarray) else w.detach().to(torch.float32).cpu().numpy()
    return quantize_int4(a, group)


def fake_quant(w: torch.Tensor, group: int = 128) -> torch.Tensor:
    """Dequantized int4 value of `w` in the forward pass, identity gradient backward."""
    scale = _group_scales(w, group)
    s = _expand(scale, group, w.shape[1])
    wq = torch.clamp(torch.round(w.detach() / s), -7, 7) * s
    # (w - w.detach()) is exactly 0 forward, so the value is exactly wq (what
    # the exported model holds) while the gradient still reaches w.
    return wq + (w - w.detach())


# --------------------------------------------------------------------------- #
# the module


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (w * x) * inv


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x * PLE_MIX))


class _Layer(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d, f, p = cfg.dim, cfg.ffn, cfg.ple_dim
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.qkv = nn.Parameter(torch.empty(d + 2 * cfg.kv_dim, d))
        self.attn_proj = nn.Parameter(torch.empty(d, d))
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.gate = nn.Parameter(torch.empty(f, d))
        self.up = nn.Parameter(torch.empty(f, d))
        self.down = nn.Parameter(torch.empty(d, f))
        if cfg.has_ple:
            self.ple_gate = nn.Parameter(torch.empty(p, d))
            self.ple_proj = nn.Parameter(torch.empty(d, p))
            self.ple_norm = nn.Parameter(torch.ones(d))


class PLEModel(nn.Module):
    """fp32 model; `forward(tokens[B, T]) -> logits[B, T, vocab_out]` at positions 0..T-1."""

    def __init__(self, cfg: Config, *, fake_quant: bool = False) -> None:
        super().__init__()
        if cfg.dim % cfg.n_heads or cfg.head_dim % 2:
            raise ValueError(f"dim {cfg.dim} / heads {cfg.n_heads} needs an even head dim")
        if cfg.vocab_out > cfg.vocab_in:
            raise ValueError(f"vocab_out {cfg.vocab_out} exceeds vocab_in {cfg.vocab_in}")
        self.cfg = cfg
        self.fake_quant = fake_quant
        d, lp = cfg.dim, cfg.n_layers * cfg.ple_dim
        self.tok_emb = nn.Parameter(torch.empty(cfg.vocab_in, d))
        if cfg.has_ple:
            self.ple_model_proj = nn.Parameter(torch.empty(lp, d))
            self.ple_proj_norm = nn.Parameter(torch.ones(cfg.ple_dim))
            self.ple_table = nn.Parameter(torch.empty(cfg.vocab_in, lp))
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.n_layers))
        self.out_norm = nn.Parameter(torch.ones(d))
        self.head = None if cfg.tied_head else nn.Parameter(torch.empty(cfg.vocab_out, d))
        half = cfg.head_dim // 2
        i = torch.arange(half, dtype=torch.float64)
        self.register_buffer(
            "rope_freq", (cfg.rope_theta ** (-2.0 * i / cfg.head_dim)).float(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self, seed: int | None = None) -> None:
        """GPT-style init: N(0, 0.02), residual outputs scaled by 1/sqrt(2L), norms 1."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        std = 0.02
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim == 1:
                    p.fill_(1.0)
                elif name.endswith(("attn_proj", "down")):
                    p.normal_(0.0, out_std, generator=g)
                else:
                    p.normal_(0.0, std, generator=g)

    def _w(self, w: torch.Tensor) -> torch.Tensor:
        return fake_quant(w, self.cfg.group) if self.fake_quant else w

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        bsz, t = tokens.shape
        if t > cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds the context of {cfg.seq_len}")
        d, nh, hd, p, nl = cfg.dim, cfg.n_heads, cfg.head_dim, cfg.ple_dim, cfg.n_layers
        nkv, kvd, eps = cfg.kv_heads, cfg.kv_dim, cfg.norm_eps
        emb = self._w(self.tok_emb)
        x = F.embedding(tokens, emb)
        ple = None
        if cfg.has_ple:
            # Per-layer inputs, computed once per token from the embedding.
            c = F.linear(x, self._w(self.ple_model_proj)) * (1.0 / math.sqrt(d))
            c = _rmsnorm(c.view(bsz, t, nl, p), self.ple_proj_norm, eps)
            tbl = F.embedding(tokens, self._w(self.ple_table)).view(bsz, t, nl, p)
            ple = (c + tbl * math.sqrt(p)) * PLE_MIX

        pos = torch.arange(t, dtype=torch.float32, device=tokens.device)
        ang = pos[:, None] * self.rope_freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        for li, layer in enumerate(self.layers):
            h = _rmsnorm(x, layer.attn_norm, eps)
            qkv = F.linear(h, self._w(layer.qkv))
            q = qkv[..., :d].view(bsz, t, nh, hd).transpose(1, 2)  # [B, H, T, hd]
            k, v = (qkv[..., d + j * kvd:d + (j + 1) * kvd].view(bsz, t, nkv, hd)
                    .transpose(1, 2).repeat_interleave(nh // nkv, dim=1)  # kv head h // group
                    for j in range(2))
            q = self._rope(q, cos, sin)
            k = self._rope(k, cos, sin)
            ao = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            ao = ao.transpose(1, 2).reshape(bsz, t, d)
            x = x + F.linear(ao, self._w(layer.attn_proj))
            h = _rmsnorm(x, layer.ffn_norm, eps)
            ff = F.silu(F.linear(h, self._w(layer.gate))) * F.linear(h, self._w(layer.up))
            x = x + F.linear(ff, self._w(layer.down))
            if ple is None:
                continue  # llama2.c: no PLE branch
            g = _gelu_erf(F.linear(x, self._w(layer.ple_gate))) * ple[:, :, li]
            x = x + _rmsnorm(F.linear(g, self._w(layer.ple_proj)), layer.ple_norm, eps)
        x = _rmsnorm(x, self.out_norm, eps)
        head = emb[: cfg.vocab_out] if self.head is None else self._w(self.head)
        return F.linear(x, head)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# --------------------------------------------------------------------------- #
# export / import


def to_weights(module: PLEModel, group: int | None = None, vocab_out: int | None = None) -> Weights:
    """Quantize `module` into `Weights` (int4 matrices, fp16 scales, fp32 norms).

    `vocab_out` overrides the module's output vocabulary (e.g. the tokenizer
    size, when the model was built with spare input rows).
    """
    cfg = module.cfg
    group = cfg.group if group is None else group
    vout = cfg.vocab_out if vocab_out is None else vocab_out
    if not 0 < vout <= cfg.vocab_in:
        raise ValueError(f"to_weights: vocab_out {vout} must be in 1..vocab_in {cfg.vocab_in}")
    if not cfg.tied_head and vout != cfg.vocab_out:
        raise ValueError("to_weights: vocab_out cannot change for an untied head")
    out_cfg = Config(
        vocab_in=cfg.vocab_in, vocab_out=vout, dim=cfg.dim, n_layers=cfg.n_layers,
        n_heads=cfg.n_heads, ffn=cfg.ffn, ple_dim=cfg.ple_dim, seq_len=cfg.seq_len,
        group=group, rope_theta=cfg.rope_theta, tied_head=cfg.tied_head, family=cfg.family,
        n_kv_heads=cfg.n_kv_heads, norm_eps=cfg.norm_eps)

    def q(t: torch.Tensor) -> QMatrix:
        return quantize_matrix(t, group)

    def f(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(torch.float32).cpu().numpy().copy()

    fields = layer_fields(cfg)
    layers = []
    for layer in module.layers:
        kw: dict[str, object] = dict.fromkeys(LAYER_FIELDS)
        kw.update({name: q(getattr(layer, name)) for name in _Q_LAYER if name in fields})
        kw.update({name: f(getattr(layer, name)) for name in _F_LAYER if name in fields})
        layers.append(LayerWeights(**kw))
    ple = cfg.has_ple
    return Weights(
        config=out_cfg,
        tok_emb=q(module.tok_emb),
        ple_model_proj=q(module.ple_model_proj) if ple else None,
        ple_proj_norm=f(module.ple_proj_norm) if ple else None,
        ple_table=q(module.ple_table) if ple else None,
        layers=layers,
        out_norm=f(module.out_norm),
        head=None if module.head is None else q(module.head),
    )


def _load(param: torch.Tensor, value: np.ndarray, name: str) -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(f"{name}: shape {tuple(value.shape)}, model expects {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(torch.from_numpy(np.ascontiguousarray(value, np.float32)))


class TorchTwin:
    """fp32-activation forward pass over the dequantized int4 weights of a `Weights`."""

    def __init__(self, module: PLEModel) -> None:
        self.module = module.eval()
        self.config = module.cfg

    @classmethod
    def from_weights(cls, weights: Weights) -> TorchTwin:
        cfg = weights.config
        if len(weights.layers) != cfg.n_layers:
            raise ValueError(f"weights have {len(weights.layers)} layers, config says "
                             f"{cfg.n_layers}")
        m = PLEModel(cfg)
        _load(m.tok_emb, weights.tok_emb.dequantize(), "tok_emb")
        if cfg.has_ple:
            assert weights.ple_model_proj is not None and weights.ple_table is not None
            assert weights.ple_proj_norm is not None
            _load(m.ple_model_proj, weights.ple_model_proj.dequantize(), "ple_model_proj")
            _load(m.ple_proj_norm, weights.ple_proj_norm, "ple_proj_norm")
            _load(m.ple_table, weights.ple_table.dequantize(), "ple_table")
        for i, (layer, lw) in enumerate(zip(m.layers, weights.layers)):
            for name in layer_fields(cfg):
                v = getattr(lw, name)
                v = v.dequantize() if isinstance(v, QMatrix) else v
                _load(getattr(layer, name), v, f"layers[{i}].{name}")
        _load(m.out_norm, weights.out_norm, "out_norm")
        if not cfg.tied_head:
            if weights.head is None:
                raise ValueError("config says the head is untied but weights.head is None")
            _load(m.head, weights.head.dequantize(), "head")
        return cls(m)

    @torch.no_grad()
    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """float32 [len(tokens), vocab_out]: row i is the output after tokens[:i+1]."""
        ids = list(tokens)
        if not ids:
            raise ValueError("logits: empty token sequence")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_in]
        if bad:
            raise ValueError(f"logits: token ids {bad[:5]} outside 0..{self.config.vocab_in - 1}")
        x = torch.tensor([ids], dtype=torch.long)
        return self.module(x)[0].numpy()

    @torch.no_grad()
    def generate(self, prompt: Sequence[int], max_new: int, eot: int | None = 0) -> list[int]:
        """Greedy continuation (ties to the lowest id); stops after `eot` or at the context."""
        ids = list(prompt)
        out: list[int] = []
        for _ in range(max_new):
            if len(ids) >= self.config.seq_len:
                break
            nxt = int(np.argmax(self.logits(ids)[-1]))  # argmax returns the first max
            out.append(nxt)
            ids.append(nxt)
            if eot is not None and nxt == eot:
                break
        return out
