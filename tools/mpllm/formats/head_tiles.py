"""The certified head's row order and tile boxes (image section "head_tiles").

native/engine/image_format.h specifies the payload, native/engine/head.c
proves why a tile whose bound is below the current k-th best logit can be
skipped without changing the chosen token. This module builds the payload the
converter stores and reads it back; the engine re-checks it at open (every
weight inside its tile's box), so a mistake here makes the engine refuse the
image, never answer differently.

Row order: rows sorted by the L2 norm of their weights, largest first (ties:
lower id first). A row with a large norm can score high, and grouping such rows
lets a tile's box stay narrow while its bound is high: the first tiles scored
set a floor that prunes most of the low-norm tiles.

Boxes: for tile t and column j, [lo_j, hi_j] = the range of the weights
(code - 8) * scale over the tile's rows; sigma_t is the smallest power of two
with max |lo|, |hi| <= 126 * sigma_t; mid_j = round((lo_j + hi_j) / (2 sigma_t)),
half_j = ceil(max(hi_j / sigma_t - mid_j, mid_j - lo_j / sigma_t)). All of this
is exact in float64 (f32 values scaled by powers of two), and is checked.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from .align import align_up
from .model import Matrix, QMatrix

#: Rows per tile (the release head's 25,353 rows make 199 tiles).
TILE_ROWS = 128
#: Per-format limits (image_format.h: LLM_IMAGE_TILES_MAX_ROWS / _MAX_COLS;
#: tests/test_image_format_agrees.py checks they agree).
MAX_TILE_ROWS = 1024
MAX_COLS = 512
#: The u16 order needs rows <= 65536.
MAX_ROWS = 65536
#: mid and half stay within int8 while |weight| / sigma <= 126.
BOX_UNITS = 126

TILES_HEADER = struct.Struct("<4I")  # rows, tile_rows, n_tiles, cols_padded


class HeadTilesError(ValueError):
    """A head_tiles payload that does not describe its head."""


@dataclass
class HeadTiles:
    rows: int
    tile_rows: int
    cols_padded: int
    order: np.ndarray  # uint16 [rows], or empty when there is no certificate
    scales: np.ndarray  # float32 [n_tiles], powers of two
    boxes: np.ndarray  # int8 [n_tiles, 2 * cols_padded]: mid then half

    @property
    def n_tiles(self) -> int:
        return int(self.scales.shape[0])


def cols_padded(cols: int) -> int:
    return align_up(cols, 32)


def _weights(head: QMatrix) -> np.ndarray:
    """float64 [rows, cols] of (code - 8) * scale (exact: f16 scale x 4-bit value)."""
    return head.dequantize().astype(np.float64)


def certifiable(head: Matrix) -> str | None:
    """None when a certificate can be built, else why not."""
    if not isinstance(head, QMatrix):
        return "an int8/fp32 head (the certificate bounds int4 codes)"
    if head.n_groups != 1:
        return f"{head.n_groups} scale groups per row (the certificate needs one)"
    if head.rows > MAX_ROWS:
        return f"{head.rows} rows (the u16 order holds at most {MAX_ROWS})"
    if cols_padded(head.cols) > MAX_COLS:
        return f"{head.cols} columns (bounds stay exact up to {MAX_COLS})"
    return None


def _sigma(amax: float) -> float:
    """Smallest power of two with amax <= BOX_UNITS * sigma, kept a normal f32."""
    if amax <= 0.0:
        return 1.0
    e = math.frexp(amax / BOX_UNITS)[1]  # amax/126 < 2^e
    while e > -126 and amax <= BOX_UNITS * 2.0 ** (e - 1):
        e -= 1
    while amax > BOX_UNITS * 2.0 ** e:
        e += 1
    return 2.0 ** max(-126, min(127, e))


def norm_order(head: QMatrix) -> np.ndarray:
    """Row ids by descending L2 norm, lower id first on ties."""
    w = _weights(head)
    norms = np.sqrt((w * w).sum(axis=1))
    return np.lexsort((np.arange(head.rows), -norms)).astype(np.int64)


def build(head: QMatrix, tile_rows: int = TILE_ROWS) -> HeadTiles:
    """Order and boxes for `head`; no certificate (n_tiles 0) when tile_rows is 0
    or the head cannot have one (see `certifiable`)."""
    cp = cols_padded(head.cols)
    empty = HeadTiles(head.rows, 0, cp, np.zeros(0, np.uint16), np.zeros(0, np.float32),
                      np.zeros((0, 2 * cp), np.int8))
    if tile_rows == 0 or certifiable(head) is not None:
        return empty
    if not 1 <= tile_rows <= MAX_TILE_ROWS:
        raise ValueError(f"tile_rows {tile_rows} outside 1..{MAX_TILE_ROWS} (0: no certificate)")
    order = norm_order(head)
    w = _weights(head)[order]
    n_tiles = -(-head.rows // tile_rows)
    scales = np.zeros(n_tiles, np.float32)
    boxes = np.zeros((n_tiles, 2 * cp), np.int8)
    for t in range(n_tiles):
        tw = w[t * tile_rows:(t + 1) * tile_rows]
        lo, hi = tw.min(axis=0), tw.max(axis=0)
        sigma = _sigma(float(max(np.abs(lo).max(), np.abs(hi).max())))
        lo_u, hi_u = lo / sigma, hi / sigma  # exact: division by a power of two
        mid = np.round((lo_u + hi_u) / 2.0)
        half = np.ceil(np.maximum(hi_u - mid, mid - lo_u))
        if (np.abs(mid) > 127).any() or (half > 127).any() or (half < 0).any():
            raise AssertionError(f"tile {t}: box outside int8 (sigma {sigma})")
        scales[t] = sigma
        boxes[t, :head.cols] = mid.astype(np.int8)
        boxes[t, cp:cp + head.cols] = half.astype(np.int8)
    tiles = HeadTiles(head.rows, tile_rows, cp, order.astype(np.uint16), scales, boxes)
    problem = check(tiles, head)
    if problem is not None:
        raise AssertionError(f"internal error: built tiles fail their own check: {problem}")
    return tiles


def pack(tiles: HeadTiles) -> bytes:
    """The section payload (image_format.h, KIND_HEAD_TILES)."""
    hdr = TILES_HEADER.pack(tiles.rows, tiles.tile_rows, tiles.n_tiles, tiles.cols_padded)
    if tiles.n_tiles == 0:
        return hdr
    order = tiles.order.astype("<u2").tobytes()
    scales = tiles.scales.astype("<f4").tobytes()
    return b"".join([hdr, order, bytes(align_up(len(order), 16) - len(order)), scales,
                     bytes(align_up(len(scales), 16) - len(scales)),
                     np.ascontiguousarray(tiles.boxes, np.int8).tobytes()])


def packed_size(rows: int, cols: int, n_tiles: int) -> int:
    if n_tiles == 0:
        return TILES_HEADER.size
    return (TILES_HEADER.size + align_up(2 * rows, 16) + align_up(4 * n_tiles, 16)
            + n_tiles * 2 * cols_padded(cols))


def unpack(payload: bytes | memoryview, what: str = "head_tiles") -> HeadTiles:
    """Parse a payload; raises HeadTilesError on any layout problem."""
    if len(payload) < TILES_HEADER.size:
        raise HeadTilesError(f"section {what}: {len(payload)} bytes, too small for its header")
    rows, tile_rows, n_tiles, cp = TILES_HEADER.unpack_from(payload, 0)
    if n_tiles == 0:
        if len(payload) != TILES_HEADER.size:
            raise HeadTilesError(f"section {what}: no tiles but {len(payload)} bytes")
        return HeadTiles(rows, tile_rows, cp, np.zeros(0, np.uint16), np.zeros(0, np.float32),
                         np.zeros((0, 2 * cp), np.int8))
    if not 1 <= tile_rows <= MAX_TILE_ROWS or n_tiles != -(-rows // tile_rows):
        raise HeadTilesError(f"section {what}: {n_tiles} tiles of {tile_rows} rows do not "
                             f"cover {rows} rows")
    want = TILES_HEADER.size + align_up(2 * rows, 16) + align_up(4 * n_tiles, 16) + n_tiles * 2 * cp
    if len(payload) != want:
        raise HeadTilesError(f"section {what}: {len(payload)} bytes, layout needs {want}")
    at = TILES_HEADER.size
    order = np.frombuffer(payload, "<u2", rows, at).astype(np.uint16)
    at += align_up(2 * rows, 16)
    scales = np.frombuffer(payload, "<f4", n_tiles, at).astype(np.float32)
    at += align_up(4 * n_tiles, 16)
    boxes = np.frombuffer(payload, np.int8, n_tiles * 2 * cp, at).reshape(n_tiles, 2 * cp).copy()
    return HeadTiles(rows, tile_rows, cp, order, scales, boxes)


def check(tiles: HeadTiles, head: QMatrix) -> str | None:
    """What the engine checks at open: the order is a permutation and every
    weight lies in its tile's box (exactly). None when all is well."""
    if tiles.n_tiles == 0:
        return None
    if tiles.rows != head.rows or tiles.cols_padded != cols_padded(head.cols):
        return f"tiles for [{tiles.rows}, {tiles.cols_padded}], head is [{head.rows}, {head.cols}]"
    if sorted(tiles.order.tolist()) != list(range(head.rows)):
        return "the order is not a permutation of the head's rows"
    s = tiles.scales.astype(np.float64)
    mant, _ = np.frexp(s)
    if (s <= 0).any() or (mant != 0.5).any():
        return "a tile scale is not a positive power of two"
    w = _weights(head)[tiles.order.astype(np.int64)]
    cp = tiles.cols_padded
    t_of = np.arange(head.rows) // tiles.tile_rows
    mid = tiles.boxes[t_of, :head.cols].astype(np.float64)
    half = tiles.boxes[t_of, cp:cp + head.cols].astype(np.float64)
    sig = s[t_of][:, None]
    bad = (w < (mid - half) * sig) | (w > (mid + half) * sig) | (half < 0)
    if bad.any():
        r, j = np.argwhere(bad)[0]
        return f"token {int(tiles.order[r])} column {j} is outside tile {int(t_of[r])}'s box"
    return None
