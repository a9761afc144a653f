"""RoPE cos/sin table, computed once on the host and stored in the model image.

The engine never calls libm at run time (glibc and newlib differ in the last
ulp), so the converter bakes this table into the image's "rope" section:
    table[p, i]          = cos(p * freq_i)
    table[p, Dh/2 + i]   = sin(p * freq_i)        for i < Dh/2.

It mirrors upstream's float32 recipe as closely as a portable computation can:
    e      = -2.f * i / Dh          float32 arithmetic (as C evaluates it)
    freq_i = powf(theta, e)         correctly rounded float32 result
    angle  = (float)pos * freq_i    a float32 product
    cos/sin of that float32 angle   evaluated in float64, rounded to float32.
Upstream's glibc powf/cosf/sinf are correctly rounded for these arguments in
practice, so the table equals what upstream computes per position except in
rare last-ulp cases (measured against the golden logits in tests/test_golden.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class _RopeConfig(Protocol):
    seq_len: int
    rope_theta: float

    @property
    def head_dim(self) -> int: ...


def rope_freqs(head_dim: int, theta: float) -> np.ndarray:
    """float32 [head_dim/2]: freq_i = powf(theta, -2.f*i/head_dim)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"RoPE needs a positive even head_dim, got {head_dim}")
    theta32 = np.float32(theta)
    if not np.isfinite(theta32) or theta32 <= 0:
        raise ValueError(f"RoPE theta must be a positive finite float32, got {theta!r}")
    half = head_dim // 2
    i = np.arange(half, dtype=np.float32)
    # C: -2.f * i / Dh  ->  ((-2.f) * (float)i) / (float)Dh, each step float32.
    expo = (np.float32(-2.0) * i) / np.float32(head_dim)
    assert expo.dtype == np.float32
    # float64 pow of the exact float32 inputs, rounded once to float32.
    return np.power(np.float64(theta32), expo.astype(np.float64)).astype(np.float32)


def rope_table_raw(seq_len: int, head_dim: int, theta: float) -> np.ndarray:
    """float32 [seq_len, head_dim] table (cos half, then sin half)."""
    if seq_len <= 0:
        raise ValueError(f"RoPE needs a positive seq_len, got {seq_len}")
    freqs = rope_freqs(head_dim, theta)
    pos = np.arange(seq_len, dtype=np.float32)[:, None]
    angle = pos * freqs[None, :]  # float32 product, as upstream's pos*freq
    assert angle.dtype == np.float32
    a64 = angle.astype(np.float64)
    table = np.empty((seq_len, head_dim), dtype=np.float32)
    half = head_dim // 2
    table[:, :half] = np.cos(a64).astype(np.float32)
    table[:, half:] = np.sin(a64).astype(np.float32)
    return table


def rope_table(config: _RopeConfig) -> np.ndarray:
    """The image's "rope" section for `config` (an mpllm.formats.model.Config)."""
    return rope_table_raw(int(config.seq_len), int(config.head_dim), float(config.rope_theta))
