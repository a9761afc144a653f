"""int4 group quantization of float matrices: the engine's weight format.

One rule for every float source (a model trained here, a llama2.c
checkpoint): per row, per group of `group` consecutive columns, the scale is
max|w| / 7 rounded to fp16 (the image stores it as that fp16 value, so the
scale the engine multiplies by is exactly the one the codes were made with),
and each code is round-half-even(w / scale) clamped to -7..7 (the esp32-ai
exporter's rule, which leaves -8 unused so the range is symmetric).
"""

from __future__ import annotations

import numpy as np

from .formats.model import Q8Matrix, QMatrix

# An all-zero group has max|w| = 0, and max|w|/7 would be a zero scale (the
# upstream exporter then divides by it and stores NaN). Any positive scale
# dequantizes such a group to exact zeros because every q is 0; we use the
# smallest *normal* fp16 (2**-14) so no reader or kernel ever meets a
# subnormal or a zero scale. A non-zero group whose max|w|/7 underflows fp16
# gets the same scale, which rounds its values to 0 (they are < 2**-14 * 7
# / 2**10 anyway, i.e. already below what fp16 scales can express).
TINY_SCALE = float(np.float16(2.0**-14))


def group_scales(w: np.ndarray, group: int) -> np.ndarray:
    """float32 [rows, n_groups] of fp16 values: max|w| / 7 per group (TINY_SCALE
    for a group whose scale would be 0). ValueError when a scale overflows fp16."""
    rows, cols = w.shape
    ng = -(-cols // group)
    a = np.zeros((rows, ng * group), np.float32)
    a[:, :cols] = np.abs(w)
    amax = a.reshape(rows, ng, group).max(axis=2)
    with np.errstate(over="ignore"):
        scale = (amax / np.float32(7.0)).astype(np.float16)
    if np.isinf(scale).any():
        raise ValueError(
            f"quantize: a group's max|w| ({float(amax.max()):.6g}) is too large for an "
            "fp16 scale (max|w|/7 must stay below 65504)")
    scale = scale.astype(np.float32)
    return np.where(scale > 0, scale, np.float32(TINY_SCALE)).astype(np.float32)


def quantize_int4(w: np.ndarray, group: int) -> QMatrix:
    """The int4 QMatrix of a float [rows, cols] matrix (see the module doc)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_matrix: expected a 2-D matrix, got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("quantize_matrix: matrix contains NaN or Inf")
    if group <= 0:
        raise ValueError(f"quantize_matrix: group must be positive, got {group}")
    scale = group_scales(w, group)
    wide = np.repeat(scale, group, axis=1)[:, : w.shape[1]]
    q = np.clip(np.rint(w / wide), -7, 7)
    return QMatrix(q.astype(np.int8), scale.astype(np.float16), group)


def int8_group(cols: int) -> int:
    """The int8 group a matrix of `cols` columns gets: 32 (llama2.c's runq.c
    scheme at the engine's block width), the last group holding what is left
    of the row where 32 does not divide it (stories260K's w2, 172 columns:
    five groups of 32 and one of 12, its padding to 192 zero on both sides);
    a row of at most 32 columns is one group. Groups never straddle a
    32-column block, so the kernels' 16-byte steps stay whole. One scale for a
    whole 172-wide input cost stories260K its 85 % greedy agreement with the
    fp32 forward (83.6 % against 88.3 % in groups of 32)."""
    return min(cols, 32)


def quantize_int8(w: np.ndarray, group: int | None = None) -> Q8Matrix:
    """The int8 Q8Matrix of a float [rows, cols] matrix: per row, per group, the
    scale is max|w| / 127 in float32 and each code round-half-even(w / scale)
    (|code| <= 127 by construction); an all-zero group keeps scale 0 (its codes
    are 0, so its values are exact)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2 or not np.isfinite(w).all():
        raise ValueError("quantize_int8: expected a finite 2-D matrix")
    rows, cols = w.shape
    group = int8_group(cols) if group is None else group
    ng = -(-cols // group)
    a = np.zeros((rows, ng * group), np.float32)
    a[:, :cols] = w
    g = a.reshape(rows, ng, group)
    scale = (np.abs(g).max(axis=2) / np.float32(127.0)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    q = np.clip(np.rint(g / safe[:, :, None]), -127, 127).astype(np.int8)
    return Q8Matrix(np.ascontiguousarray(q.reshape(rows, ng * group)[:, :cols]), scale, group)
