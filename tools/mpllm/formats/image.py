"""Writer and reader of the mpllm model image (our flash format).

One module on purpose (~675 lines): the writer and the reader are the format's
two directions, kept side by side so that each section's layout is written and
read in one place.

native/engine/image_format.h is the specification; this module follows it and
keeps every constant of it in the block below, so a change of format is one
edit here and one there (tests/test_image_format_agrees.py checks the two agree; the
engine tests prove the C loader reads what this module writes).

The reader is deliberately strict: it accepts exactly the canonical layout the
writer produces (sections in the header file's order, each at the first
16-byte boundary after the previous one, zero padding, no trailing bytes), and
gives each kind of damage its own message. Reading an image back must give the
`Weights` that were written, bit for bit: scales are stored as f32 widened from
fp16, so they are narrowed back and checked to be exact.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..atomic import atomic_path
from ..checkout import board_module
from . import drafts_table
from . import head_tiles as tiles_mod
from .align import align_up
from .esp32ai import ModelFormatError, pack_nibbles, unpack_nibbles, validate_config
from .model import (
    FAMILIES,
    LAYER_FIELDS,
    PLE_LAYER_FIELDS,
    Config,
    F32Matrix,
    LayerWeights,
    Matrix,
    Q8Matrix,
    QMatrix,
    Weights,
    layer_fields,
)

# ---- constants of native/engine/image_format.h (the spec) ------------------ #
MAGIC = b"MPLLMIMG"
VERSION = 5
ARCH_ESP32AI = 0
ARCH_LLAMA = 1
HEADER_BYTES = 128
SECTION_BYTES = 32
ALIGN = 16
BLOCK_COLS = 32
NAME_BYTES = 16
MAX_SECTIONS = 512
FLAG_TIED_HEAD = 1
FLAGS_KNOWN = FLAG_TIED_HEAD
KIND_F32 = 1
KIND_Q4 = 2
KIND_ROWS = 3
KIND_TOKENIZER = 4
KIND_HEAD_TILES = 5
KIND_DRAFTS = 6
KIND_Q8 = 7
KIND_F32M = 8
KIND_WEIGHTS = 9
WEIGHTS_MAX_TRIED = 3
Q4_HEADER_BYTES = 16
PAD_CODE = 8  # offset-binary code of the value 0
# llm_image_header: magic, 16 x u32 (version .. group), f32 rope_theta, u32 eot_id,
# u8 source_sha256[32], u32 arch, u32 n_kv_heads, f32 norm_eps, u32 reserved.
HEADER = struct.Struct("<8s16IfI32s2IfI")
SECTION = struct.Struct(f"<{NAME_BYTES}s4I")
Q4_HEADER = struct.Struct("<4I")
WEIGHTS_HEADER = struct.Struct("<4I")  # chosen, n_tried, positions, reserved
WEIGHTS_TRIED = struct.Struct("<I2fI")  # kind, agreement, mean_abs_diff, bytes
HEADER_CRC_OFFSET = 8 + 4 * 4  # after magic, version, header_bytes, file_bytes, n_sections
# ----------------------------------------------------------------------------- #

assert HEADER.size == HEADER_BYTES and SECTION.size == SECTION_BYTES
assert Q4_HEADER.size == Q4_HEADER_BYTES

# Config.family <-> the header's arch (FAMILIES is in arch order).
ARCHS = {family: arch for arch, family in enumerate(FAMILIES)}
assert ARCHS == {"esp32ai": ARCH_ESP32AI, "llama2c": ARCH_LLAMA}

KIND_NAMES = {KIND_F32: "f32", KIND_Q4: "q4", KIND_ROWS: "rows", KIND_TOKENIZER: "tokenizer",
              KIND_HEAD_TILES: "head_tiles", KIND_DRAFTS: "drafts", KIND_Q8: "q8",
              KIND_F32M: "f32m", KIND_WEIGHTS: "weights"}
#: the matrix kinds and the --weights names of their formats
MATRIX_KINDS = {KIND_Q4: "int4", KIND_Q8: "int8", KIND_F32M: "fp32"}
#: sections whose format the converter chooses per tensor (llama2c images only)
CHOSEN_FIELDS = ("qkv", "attn_proj", "gate", "up", "down")


def matrix_kind(m: Matrix) -> int:
    """The section kind of a matrix (image_format.h)."""
    return KIND_Q8 if isinstance(m, Q8Matrix) else KIND_F32M if isinstance(m, F32Matrix) \
        else KIND_Q4


@dataclass(frozen=True)
class TriedFormat:
    """One format the converter measured (a KIND_WEIGHTS record)."""

    kind: int  # KIND_Q4 / KIND_Q8 / KIND_F32M
    agreement: float  # teacher-forced greedy agreement with the fp32 forward, 0..1
    mean_abs_diff: float  # mean |logit difference|
    bytes: int  # the whole image in that format

    @property
    def name(self) -> str:
        return MATRIX_KINDS[self.kind]


@dataclass(frozen=True)
class WeightsChoice:
    """The "weights" section: the format the converter chose and what it measured
    (chosen 0 and nothing tried: no measurement)."""

    chosen: int = 0
    positions: int = 0
    tried: tuple[TriedFormat, ...] = ()

    def pack(self) -> bytes:
        if len(self.tried) > WEIGHTS_MAX_TRIED or (self.chosen == 0) != (not self.tried):
            raise ValueError(f"weights choice: chosen {self.chosen} with {len(self.tried)} tried")
        if self.chosen and self.chosen not in {t.kind for t in self.tried}:
            raise ValueError("weights choice: the chosen format was not tried")
        return WEIGHTS_HEADER.pack(self.chosen, len(self.tried), self.positions, 0) + b"".join(
            WEIGHTS_TRIED.pack(t.kind, t.agreement, t.mean_abs_diff, t.bytes) for t in self.tried)

    @classmethod
    def unpack(cls, p: bytes | memoryview) -> WeightsChoice:
        if len(p) < WEIGHTS_HEADER.size:
            raise ImageFormatError(f"section 'weights': {len(p)} bytes, too short for its header")
        chosen, n, positions, reserved = WEIGHTS_HEADER.unpack_from(p, 0)
        if n > WEIGHTS_MAX_TRIED or (chosen == 0) != (n == 0) or reserved:
            raise ImageFormatError(f"section 'weights': chosen {chosen} with {n} formats tried")
        if len(p) != WEIGHTS_HEADER.size + n * WEIGHTS_TRIED.size:
            raise ImageFormatError(f"section 'weights': {len(p)} bytes for {n} records")
        tried = []
        for k in range(n):
            kind, agree, diff, size = WEIGHTS_TRIED.unpack_from(p, WEIGHTS_HEADER.size + 16 * k)
            if kind not in MATRIX_KINDS or kind in {t.kind for t in tried}:
                raise ImageFormatError(f"section 'weights': record {k} names kind {kind}")
            if not (np.isfinite(agree) and np.isfinite(diff)):
                raise ImageFormatError(f"section 'weights': record {k} is NaN or Inf")
            tried.append(TriedFormat(kind, float(agree), float(diff), size))
        if chosen and chosen not in {t.kind for t in tried}:
            raise ImageFormatError(f"section 'weights': the chosen kind {chosen} was not tried")
        return cls(chosen, positions, tuple(tried))


class ImageFormatError(ValueError):
    """The image is damaged, truncated or not an mpllm image of a version we read."""


@dataclass(frozen=True)
class ImageHeader:
    """The header (image_format.h): the model's Config (its vocab_in is the
    header's vocab_rows, the rows the image stores; tied_head is the flag)
    and the fields of the file itself."""

    config: Config
    file_bytes: int
    n_sections: int
    vocab_in_source: int
    eot_id: int
    source_sha256: bytes
    header_crc32: int = 0
    version: int = VERSION
    header_bytes: int = HEADER_BYTES

    @property
    def tied_head(self) -> bool:
        return self.config.tied_head

    @property
    def flags(self) -> int:
        return FLAG_TIED_HEAD if self.config.tied_head else 0

    @property
    def vocab_rows(self) -> int:
        return self.config.vocab_in

    def pack(self) -> bytes:
        c = self.config
        return HEADER.pack(
            MAGIC, self.version, self.header_bytes, self.file_bytes, self.n_sections,
            self.header_crc32, self.flags, c.vocab_in, c.vocab_out, self.vocab_in_source,
            c.dim, c.n_layers, c.n_heads, c.ffn, c.ple_dim, c.seq_len, c.group, c.rope_theta,
            self.eot_id, self.source_sha256, ARCHS[c.family], c.kv_heads, c.norm_eps, 0)


class Section(NamedTuple):
    name: str
    kind: int
    offset: int
    size: int
    crc32: int


@dataclass
class ImageReport:
    path: Path
    file_bytes: int
    header: ImageHeader
    sections: list[Section]


@dataclass
class Image:
    header: ImageHeader
    config: Config
    weights: Weights
    rope: np.ndarray  # f32 [seq_len, head_dim]
    tokenizer_section: bytes
    sections: list[Section]
    head_tiles: tiles_mod.HeadTiles
    drafts: drafts_table.DraftsTable
    weights_choice: WeightsChoice


# --------------------------------------------------------------------------- #
# layout


def section_plan(cfg: Config) -> list[tuple[str, int, tuple[int, int]]]:
    """(name, kind, (rows, cols)) in file order; F32 shapes are (1, n). A family
    without PLE (llama2c) has no PLE sections. Matrices are listed as KIND_Q4;
    a llama2c image's embed, head and CHOSEN_FIELDS may be KIND_Q8 or KIND_F32M
    instead (`may_be_wide`)."""
    d, lp = cfg.dim, cfg.n_layers * cfg.ple_dim
    plan: list[tuple[str, int, tuple[int, int]]] = [
        ("tokenizer", KIND_TOKENIZER, (0, 0)),
        ("rope", KIND_F32, (cfg.seq_len, cfg.head_dim)),
        ("embed", KIND_Q4, (cfg.vocab_in, d)),
    ]
    if cfg.has_ple:
        plan += [
            ("ple_rows", KIND_ROWS, (cfg.vocab_in, lp)),
            ("ple_model_proj", KIND_Q4, (lp, d)),
            ("ple_proj_norm", KIND_F32, (1, cfg.ple_dim)),
        ]
    layer = {
        "attn_norm": (KIND_F32, (1, d)),
        "qkv": (KIND_Q4, (d + 2 * cfg.kv_dim, d)),
        "attn_proj": (KIND_Q4, (d, d)),
        "ffn_norm": (KIND_F32, (1, d)),
        "gate": (KIND_Q4, (cfg.ffn, d)),
        "up": (KIND_Q4, (cfg.ffn, d)),
        "down": (KIND_Q4, (d, cfg.ffn)),
        "ple_gate": (KIND_Q4, (cfg.ple_dim, d)),
        "ple_proj": (KIND_Q4, (d, cfg.ple_dim)),
        "ple_norm": (KIND_F32, (1, d)),
    }
    for i in range(cfg.n_layers):
        for f in layer_fields(cfg):
            kind, shape = layer[f]
            plan.append((f"L{i}.{f}", kind, shape))
    plan.append(("out_norm", KIND_F32, (1, d)))
    if not cfg.tied_head:
        plan.append(("head", KIND_Q4, (cfg.vocab_out, d)))
    plan.append(("head_tiles", KIND_HEAD_TILES, (cfg.vocab_out, d)))
    plan.append(("drafts", KIND_DRAFTS, (cfg.vocab_out, 0)))
    plan.append(("weights", KIND_WEIGHTS, (0, 0)))
    return plan


def may_be_wide(cfg: Config, name: str) -> bool:
    """Whether section `name` may hold an int8 or fp32 matrix (image_format.h)."""
    if cfg.has_ple:
        return False
    return name in ("embed", "head") or name.partition(".")[2] in CHOSEN_FIELDS


def q4_row_bytes(cols: int) -> int:
    return align_up(cols, BLOCK_COLS) // 2


def rows_row_bytes(cols: int, group: int) -> int:
    return align_up((cols + 1) // 2 + 2 * (-(-cols // group)), ALIGN)


def q4_size(rows: int, cols: int, group: int) -> int:
    return Q4_HEADER_BYTES + rows * q4_row_bytes(cols) + rows * (-(-cols // group)) * 4


def q8_size(rows: int, cols: int, group: int) -> int:
    return Q4_HEADER_BYTES + rows * align_up(cols, BLOCK_COLS) + rows * (-(-cols // group)) * 4


def f32m_size(rows: int, cols: int) -> int:
    return Q4_HEADER_BYTES + rows * 4 * align_up(cols, 4)


def matrix_size(m: Matrix, group: int) -> int:
    """Payload bytes of a matrix section (`group`: the image's, for int4)."""
    if isinstance(m, Q8Matrix):
        return q8_size(m.rows, m.cols, m.group)
    if isinstance(m, F32Matrix):
        return f32m_size(m.rows, m.cols)
    return q4_size(m.rows, m.cols, group)


def rows_size(rows: int, cols: int, group: int) -> int:
    return Q4_HEADER_BYTES + rows * rows_row_bytes(cols, group)


def _check_group(cols: int, group: int, what: str, err: type[ValueError]) -> None:
    if group <= 0:
        raise err(f"{what}: group {group} must be positive")
    if group % BLOCK_COLS and group < cols:
        raise err(f"{what}: group {group} is neither a multiple of {BLOCK_COLS} nor >= "
                  f"cols {cols}; a {BLOCK_COLS}-column block would straddle two groups")


# --------------------------------------------------------------------------- #
# packing helpers (also used by the C engine's tests to build payloads)


def _check_q(m: QMatrix, what: str) -> None:
    _check_group(m.cols, m.group, what, ValueError)
    if m.q.dtype != np.int8:
        raise ValueError(f"{what}: q must be int8, got {m.q.dtype}")
    if m.scales.shape != (m.rows, m.n_groups):
        raise ValueError(f"{what}: scales shape {m.scales.shape}, expected "
                         f"{(m.rows, m.n_groups)}")
    if m.q.size and (int(m.q.min()) < -8 or int(m.q.max()) > 7):
        raise ValueError(f"{what}: int4 values must lie in -8..7")


def pack_q4(m: QMatrix, what: str = "matrix") -> bytes:
    """A whole KIND_Q4 payload: q4 header, kernel-layout codes, f32 scales."""
    _check_q(m, what)
    if not np.isfinite(m.scales).all():
        raise ValueError(f"{what}: non-finite scales")
    rows, cols = m.q.shape
    padded = align_up(cols, BLOCK_COLS)
    codes = np.full((rows, padded), PAD_CODE, np.uint8)
    codes[:, :cols] = (m.q + 8).view(np.uint8)
    blocks = codes.reshape(rows, padded // BLOCK_COLS, 2, BLOCK_COLS // 2)
    packed = blocks[:, :, 0, :] | (blocks[:, :, 1, :] << 4)
    scales = np.ascontiguousarray(m.scales, dtype=np.float16).astype("<f4")
    return b"".join((Q4_HEADER.pack(rows, cols, m.group, padded // 2),
                     packed.tobytes(), scales.tobytes()))


def _q4_header(payload: memoryview, what: str, kind: str) -> tuple[int, int, int, int]:
    if len(payload) < Q4_HEADER_BYTES:
        raise ImageFormatError(f"section {what}: {len(payload)} bytes, too short for its "
                               f"{kind} header")
    return Q4_HEADER.unpack_from(payload, 0)


def _f16_exact(s32: np.ndarray, what: str) -> np.ndarray:
    bad = ~np.isfinite(s32)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ImageFormatError(f"section {what}: non-finite scale {s32[r, c]} at row {r} "
                               f"group {c}")
    s16 = s32.astype(np.float16)
    if not np.array_equal(s16.astype(np.float32), s32):
        r, c = np.argwhere(s16.astype(np.float32) != s32)[0]
        raise ImageFormatError(f"section {what}: scale {s32[r, c]!r} at row {r} group {c} is "
                               f"not an fp16 value (scales are widened fp16)")
    return s16


def unpack_q4(payload: bytes | memoryview, what: str = "q4") -> QMatrix:
    """Inverse of pack_q4; checks sizes, padding codes and that scales are fp16 values."""
    payload = memoryview(payload)
    rows, cols, group, row_bytes = _q4_header(payload, what, "q4")
    _check_group(cols, group, f"section {what}", ImageFormatError)
    if row_bytes != q4_row_bytes(cols):
        raise ImageFormatError(f"section {what}: row_bytes {row_bytes}, expected "
                               f"{q4_row_bytes(cols)} for {cols} columns")
    ng = -(-cols // group)
    size = Q4_HEADER_BYTES + rows * row_bytes + rows * ng * 4
    if len(payload) != size:
        raise ImageFormatError(f"section {what}: {len(payload)} bytes, a [{rows}, {cols}] "
                               f"q4 matrix with group {group} needs {size}")
    packed = np.frombuffer(payload, np.uint8, rows * row_bytes, Q4_HEADER_BYTES)
    packed = packed.reshape(rows, row_bytes // (BLOCK_COLS // 2), BLOCK_COLS // 2)
    codes = np.stack((packed & 0x0F, packed >> 4), axis=2).reshape(rows, row_bytes * 2)
    if cols < row_bytes * 2 and (codes[:, cols:] != PAD_CODE).any():
        raise ImageFormatError(f"section {what}: padding columns must hold code {PAD_CODE}")
    q = codes[:, :cols].astype(np.int8) - np.int8(8)
    s32 = np.frombuffer(payload, "<f4", rows * ng, Q4_HEADER_BYTES + rows * row_bytes)
    scales = _f16_exact(s32.reshape(rows, ng).astype(np.float32), what)
    return QMatrix(q.astype(np.int8), scales, group)


def check_q8_group(cols: int, group: int, what: str, err: type[ValueError] = ValueError) -> None:
    """A KIND_Q8 group: a multiple of 32 below cols, or cols (one group per row)."""
    if group != cols and not (0 < group < cols and group % BLOCK_COLS == 0):
        raise err(f"{what}: int8 group {group}; the engine takes cols ({cols}) or a multiple "
                  f"of {BLOCK_COLS} below it")


def pack_q8(m: Q8Matrix, what: str = "matrix") -> bytes:
    """A whole KIND_Q8 payload: header, int8 codes (rows padded to 32), f32 scales."""
    check_q8_group(m.cols, m.group, what)
    if m.q.dtype != np.int8 or m.scales.shape != (m.rows, m.n_groups):
        raise ValueError(f"{what}: want int8 q and f32 scales [{m.rows}, {m.n_groups}]")
    if not np.isfinite(m.scales).all():
        raise ValueError(f"{what}: non-finite scales")
    padded = align_up(m.cols, BLOCK_COLS)
    codes = np.zeros((m.rows, padded), np.int8)
    codes[:, :m.cols] = m.q
    return b"".join((Q4_HEADER.pack(m.rows, m.cols, m.group, padded), codes.tobytes(),
                     np.ascontiguousarray(m.scales, "<f4").tobytes()))


def unpack_q8(payload: bytes | memoryview, what: str = "q8") -> Q8Matrix:
    """Inverse of pack_q8; checks sizes, zero padding and finite scales."""
    payload = memoryview(payload)
    rows, cols, group, row_bytes = _q4_header(payload, what, "q8")
    check_q8_group(cols, group, f"section {what}", ImageFormatError)
    if row_bytes != align_up(cols, BLOCK_COLS):
        raise ImageFormatError(f"section {what}: row_bytes {row_bytes}, expected "
                               f"{align_up(cols, BLOCK_COLS)}")
    ng = -(-cols // group) if cols else 0
    if len(payload) != q8_size(rows, cols, group if cols else 1):
        raise ImageFormatError(f"section {what}: {len(payload)} bytes, a [{rows}, {cols}] "
                               f"q8 matrix with group {group} needs {q8_size(rows, cols, group)}")
    codes = np.frombuffer(payload, np.int8, rows * row_bytes, Q4_HEADER_BYTES)
    codes = codes.reshape(rows, row_bytes)
    if (codes[:, cols:] != 0).any():
        raise ImageFormatError(f"section {what}: padding columns must be 0")
    sc = np.frombuffer(payload, "<f4", rows * ng, Q4_HEADER_BYTES + rows * row_bytes)
    sc = sc.reshape(rows, ng).astype(np.float32)
    if not np.isfinite(sc).all():
        raise ImageFormatError(f"section {what}: non-finite scale")
    return Q8Matrix(np.ascontiguousarray(codes[:, :cols]), sc, group)


def pack_f32m(m: F32Matrix, what: str = "matrix") -> bytes:
    """A whole KIND_F32M payload: header (group = cols), f32 rows padded to 4."""
    if not np.isfinite(m.w).all():
        raise ValueError(f"{what}: non-finite values")
    padded = align_up(m.cols, 4)
    w = np.zeros((m.rows, padded), "<f4")
    w[:, :m.cols] = m.w
    return Q4_HEADER.pack(m.rows, m.cols, m.cols, 4 * padded) + w.tobytes()


def unpack_f32m(payload: bytes | memoryview, what: str = "f32m") -> F32Matrix:
    """Inverse of pack_f32m; checks sizes, zero padding and finite values."""
    payload = memoryview(payload)
    rows, cols, group, row_bytes = _q4_header(payload, what, "f32m")
    if group != cols or row_bytes != 4 * align_up(cols, 4):
        raise ImageFormatError(f"section {what}: group {group}, row_bytes {row_bytes}; the "
                               f"layout needs {cols} and {4 * align_up(cols, 4)}")
    if len(payload) != f32m_size(rows, cols):
        raise ImageFormatError(f"section {what}: {len(payload)} bytes, a [{rows}, {cols}] "
                               f"f32 matrix needs {f32m_size(rows, cols)}")
    w = np.frombuffer(payload, "<f4", rows * row_bytes // 4, Q4_HEADER_BYTES)
    w = w.reshape(rows, row_bytes // 4).astype(np.float32)
    if not np.isfinite(w).all():
        raise ImageFormatError(f"section {what}: non-finite values")
    if (w[:, cols:] != 0).any():
        raise ImageFormatError(f"section {what}: padding columns must be 0")
    return F32Matrix(np.ascontiguousarray(w[:, :cols]))


def pack_matrix(m: Matrix, what: str = "matrix") -> bytes:
    """A matrix section's payload in its own kind."""
    if isinstance(m, Q8Matrix):
        return pack_q8(m, what)
    if isinstance(m, F32Matrix):
        return pack_f32m(m, what)
    return pack_q4(m, what)


def pack_rows(m: QMatrix, what: str = "rows") -> bytes:
    """A whole KIND_ROWS payload: q4 header, then one record per row (codes, fp16 scales)."""
    _check_q(m, what)
    if not np.isfinite(m.scales).all():
        raise ValueError(f"{what}: non-finite scales")
    rows, cols = m.q.shape
    nc, ng = (cols + 1) // 2, m.n_groups
    rb = rows_row_bytes(cols, m.group)
    rec = np.zeros((rows, rb), np.uint8)
    rec[:, :nc] = pack_nibbles(m.q, pad_code=PAD_CODE)
    scales = np.ascontiguousarray(m.scales, dtype=np.float16).astype("<f2")
    rec[:, nc:nc + 2 * ng] = scales.view(np.uint8).reshape(rows, 2 * ng)
    return Q4_HEADER.pack(rows, cols, m.group, rb) + rec.tobytes()


def unpack_rows(payload: bytes | memoryview, what: str = "rows") -> QMatrix:
    """Inverse of pack_rows; checks sizes, zero record padding and finite scales."""
    payload = memoryview(payload)
    rows, cols, group, rb = _q4_header(payload, what, "rows")
    if group <= 0:
        raise ImageFormatError(f"section {what}: group {group} must be positive")
    if cols == 0 or rb != rows_row_bytes(cols, group):
        raise ImageFormatError(f"section {what}: row_bytes {rb}, expected "
                               f"{rows_row_bytes(cols, group) if cols else 'cols > 0'}")
    size = Q4_HEADER_BYTES + rows * rb
    if len(payload) != size:
        raise ImageFormatError(f"section {what}: {len(payload)} bytes, {rows} rows of "
                               f"{rb} bytes need {size}")
    rec = np.frombuffer(payload, np.uint8, rows * rb, Q4_HEADER_BYTES).reshape(rows, rb)
    nc, ng = (cols + 1) // 2, -(-cols // group)
    if (rec[:, nc + 2 * ng:] != 0).any():
        raise ImageFormatError(f"section {what}: row padding bytes must be zero")
    q = unpack_nibbles(rec[:, :nc], cols)
    s16 = np.ascontiguousarray(rec[:, nc:nc + 2 * ng]).view("<f2").astype(np.float16)
    bad = ~np.isfinite(s16)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ImageFormatError(f"section {what}: non-finite scale at row {r} group {c}")
    return QMatrix(q, s16, group)


# --------------------------------------------------------------------------- #
# writing


def _payloads(
    weights: Weights, tokenizer_section: bytes, rope: np.ndarray, tiles_payload: bytes,
    drafts_payload: bytes, weights_payload: bytes
) -> Iterator[tuple[str, int, Callable[[], bytes]]]:
    """(name, kind, producer) in file order; producers pack lazily, one section at a time."""
    w = weights
    yield "tokenizer", KIND_TOKENIZER, lambda: bytes(tokenizer_section)
    yield "rope", KIND_F32, lambda: np.ascontiguousarray(rope, "<f4").tobytes()
    yield "embed", matrix_kind(w.tok_emb), lambda: pack_matrix(w.tok_emb, "embed")
    if w.config.has_ple:
        assert w.ple_table is not None and w.ple_model_proj is not None
        assert w.ple_proj_norm is not None
        ple_table, ple_model_proj, ple_proj_norm = w.ple_table, w.ple_model_proj, w.ple_proj_norm
        yield "ple_rows", KIND_ROWS, lambda: pack_rows(ple_table, "ple_rows")
        yield "ple_model_proj", KIND_Q4, lambda: pack_q4(ple_model_proj, "ple_model_proj")
        yield "ple_proj_norm", KIND_F32, lambda: _f32(ple_proj_norm)
    for i, layer in enumerate(w.layers):
        for f in layer_fields(w.config):
            t = getattr(layer, f)
            name = f"L{i}.{f}"
            if isinstance(t, (QMatrix, Q8Matrix, F32Matrix)):
                yield name, matrix_kind(t), (lambda t=t, name=name: pack_matrix(t, name))
            else:
                yield name, KIND_F32, (lambda t=t: _f32(t))
    yield "out_norm", KIND_F32, lambda: _f32(w.out_norm)
    if not w.config.tied_head:
        assert w.head is not None
        head = w.head
        yield "head", matrix_kind(head), lambda: pack_matrix(head, "head")
    yield "head_tiles", KIND_HEAD_TILES, lambda: tiles_payload
    yield "drafts", KIND_DRAFTS, lambda: drafts_payload
    yield "weights", KIND_WEIGHTS, lambda: weights_payload


def _f32(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, "<f4").tobytes()


def _planned_size(kind: int, shape: tuple[int, int], group: int, tok_len: int,
                  tensor: object) -> int:
    rows, cols = shape
    if isinstance(tensor, (QMatrix, Q8Matrix, F32Matrix)) and kind == KIND_Q4:
        return matrix_size(tensor, group)
    if kind == KIND_TOKENIZER:
        return tok_len
    if kind == KIND_F32:
        return 4 * rows * cols
    if kind == KIND_Q4:
        return q4_size(rows, cols, group)
    return rows_size(rows, cols, group)


def _tensors(weights: Weights) -> dict[str, object]:
    """Every tensor of `weights` by section name (None where the family has none)."""
    got: dict[str, object] = {
        "embed": weights.tok_emb, "ple_rows": weights.ple_table,
        "ple_model_proj": weights.ple_model_proj, "ple_proj_norm": weights.ple_proj_norm,
        "out_norm": weights.out_norm, "head": weights.head,
    }
    for i, layer in enumerate(weights.layers):
        for f in LAYER_FIELDS:
            got[f"L{i}.{f}"] = getattr(layer, f)
    return got


def _check_weights(weights: Weights) -> None:
    cfg = weights.config
    validate_config(cfg)
    if len(weights.layers) != cfg.n_layers:
        raise ValueError(f"{len(weights.layers)} layers, config says {cfg.n_layers}")
    if cfg.tied_head != (weights.head is None):
        raise ValueError("config.tied_head must be True exactly when weights.head is None")
    got = _tensors(weights)
    if not cfg.has_ple:
        extra = [n for n in ("ple_rows", "ple_model_proj", "ple_proj_norm") if got[n] is not None]
        extra += [f"L{i}.{f}" for i in range(cfg.n_layers) for f in PLE_LAYER_FIELDS
                  if got[f"L{i}.{f}"] is not None]
        if extra:
            raise ValueError(f"{extra[0]}: a {cfg.family} model has no PLE, the weights must "
                             f"hold None there")
    for name, kind, (rows, cols) in section_plan(cfg)[2:]:
        if kind in (KIND_HEAD_TILES, KIND_DRAFTS, KIND_WEIGHTS):
            continue  # built from the head by write_image / given to it
        t = got[name]
        if isinstance(t, (Q8Matrix, F32Matrix)):
            if not may_be_wide(cfg, name):
                raise ValueError(f"{name}: a {cfg.family} image holds this matrix as int4 only")
            if (t.rows, t.cols) != (rows, cols):
                raise ValueError(f"{name}: shape {(t.rows, t.cols)}, expected {(rows, cols)}")
            if isinstance(t, Q8Matrix):
                check_q8_group(cols, t.group, name)
            continue
        t = got[name]
        if kind == KIND_F32:
            if np.shape(t) != (cols,):
                raise ValueError(f"{name}: shape {np.shape(t)}, expected ({cols},)")
            if not np.isfinite(t).all():
                raise ValueError(f"{name}: non-finite values")
        elif not isinstance(t, QMatrix) or t.q.shape != (rows, cols) or t.group != cfg.group:
            shape = (t.q.shape, t.group) if isinstance(t, QMatrix) else type(t)
            raise ValueError(f"{name}: got {shape}, expected a [{rows}, {cols}] QMatrix with "
                             f"group {cfg.group}")


def write_image(
    path: str | os.PathLike[str],
    weights: Weights,
    *,
    tokenizer_section: bytes,
    rope: np.ndarray,
    source_sha256: bytes,
    eot_id: int = 0,
    vocab_in_source: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    tile_rows: int = tiles_mod.TILE_ROWS,
    drafts: drafts_table.DraftsTable | None = None,
    weights_choice: WeightsChoice | None = None,
) -> ImageReport:
    """Write `weights` as an image. The caller has already chosen which rows to keep:
    weights.config.vocab_in becomes vocab_rows (>= vocab_out). vocab_in_source defaults
    to vocab_rows. progress(section_name, bytes_done, bytes_total) is called after each
    section. The file appears only when complete (temp file + rename). tile_rows sets the
    certified head's tiles (0: no certificate; the engine then scores every row).
    drafts: the n-gram drafter's table (default: an empty one, no drafting).
    weights_choice: the converter's format choice and its figures (default: none).
    Only an int4 head gets a certificate (the engine's boxes bound int4 codes)."""
    _check_weights(weights)
    cfg = weights.config
    vin_src = cfg.vocab_in if vocab_in_source is None else vocab_in_source
    if vin_src < cfg.vocab_in:
        raise ValueError(f"vocab_in_source {vin_src} < the {cfg.vocab_in} rows being written")
    rope = np.asarray(rope)
    if rope.dtype != np.float32 or rope.shape != (cfg.seq_len, cfg.head_dim):
        raise ValueError(f"rope must be float32 {(cfg.seq_len, cfg.head_dim)}, got "
                         f"{rope.dtype} {rope.shape}")
    if len(source_sha256) != 32:
        raise ValueError("source_sha256 must be 32 bytes")
    if not 0 <= eot_id < cfg.vocab_out:
        raise ValueError(f"eot_id {eot_id} outside the vocabulary 0..{cfg.vocab_out - 1}")
    tok = bytes(tokenizer_section)
    if len(tok) < 16 or struct.unpack_from("<I", tok, 0)[0] != cfg.vocab_out:
        raise ValueError("tokenizer_section must start with u32 n_vocab == vocab_out "
                         f"({cfg.vocab_out})")

    head = weights.tok_emb.take_rows(cfg.vocab_out) if cfg.tied_head else weights.head
    assert head is not None
    tiles_payload = tiles_mod.pack(tiles_mod.build(head, tile_rows if isinstance(head, QMatrix)
                                                   else 0))
    weights_payload = (weights_choice or WeightsChoice()).pack()
    drafts_payload = drafts_table.EMPTY if drafts is None else drafts.pack()
    if drafts is not None:
        drafts_table.DraftsTable.unpack(drafts_payload, cfg.vocab_out)  # ids in range, order
    plan = section_plan(cfg)
    if len(plan) > MAX_SECTIONS:
        raise ValueError(f"{cfg.n_layers} layers need {len(plan)} sections, the format allows "
                         f"{MAX_SECTIONS}")
    offsets, sizes = [], []
    pos = align_up(HEADER_BYTES + SECTION_BYTES * len(plan), ALIGN)
    tensors = _tensors(weights)
    for name, kind, shape in plan:
        pos = align_up(pos, ALIGN)
        size = (len(tiles_payload) if kind == KIND_HEAD_TILES
                else len(drafts_payload) if kind == KIND_DRAFTS
                else len(weights_payload) if kind == KIND_WEIGHTS
                else _planned_size(kind, shape, cfg.group, len(tok), tensors.get(name)))
        offsets.append(pos)
        sizes.append(size)
        pos += size
    file_bytes = pos  # no padding after the last section
    if file_bytes >= 1 << 32:
        raise ValueError(f"image of {file_bytes} bytes does not fit the u32 offsets")

    path = Path(path)
    sections: list[Section] = []
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(bytes(offsets[0]))  # header + table, rewritten at the end
        for (name, kind, produce), off, size in zip(
                _payloads(weights, tok, rope, tiles_payload, drafts_payload, weights_payload),
                offsets, sizes):
            f.write(bytes(off - f.tell()))  # zero alignment padding
            data = produce()
            if len(data) != size:
                raise AssertionError(f"{name}: packed {len(data)} bytes, planned {size}")
            f.write(data)
            sections.append(Section(name, kind, off, size, zlib.crc32(data)))
            if progress is not None:
                progress(name, f.tell(), file_bytes)
        assert f.tell() == file_bytes
        header = ImageHeader(config=cfg, file_bytes=file_bytes, n_sections=len(sections),
                             vocab_in_source=vin_src, eot_id=eot_id,
                             source_sha256=bytes(source_sha256))
        table = b"".join(SECTION.pack(s.name.encode("ascii"), s.kind, s.offset, s.size,
                                      s.crc32) for s in sections)
        crc = zlib.crc32(table, zlib.crc32(header.pack()))
        header = dataclasses.replace(header, header_crc32=crc)
        f.seek(0)
        f.write(header.pack() + table)
    return ImageReport(path=path, file_bytes=file_bytes, header=header, sections=sections)


# --------------------------------------------------------------------------- #
# reading


def _source_bytes(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    return Path(source).read_bytes()


def read_header(data: bytes) -> tuple[ImageHeader, list[Section]]:
    """Parse and verify the header and section table (not the payloads)."""
    if len(data) < HEADER_BYTES:
        raise ImageFormatError(f"file too short for an image header: {len(data)} bytes, "
                               f"need {HEADER_BYTES}")
    (magic, version, header_bytes, file_bytes, n_sections, header_crc, flags, vocab_rows,
     vocab_out, vocab_in_source, dim, n_layers, n_heads, ffn, ple_dim, seq_len, group, theta,
     eot_id, sha, arch, n_kv_heads, norm_eps, reserved) = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ImageFormatError(f"bad magic {magic!r}: not an mpllm model image (expected "
                               f"{MAGIC!r}; a model.bin must be converted first)")
    if version != VERSION:
        raise ImageFormatError(f"image format version {version}; this reader knows version "
                               f"{VERSION}: convert the model again")
    if header_bytes != HEADER_BYTES:
        raise ImageFormatError(f"header_bytes {header_bytes}, version {VERSION} has "
                               f"{HEADER_BYTES}")
    if file_bytes != len(data):
        what = "truncated" if len(data) < file_bytes else "trailing bytes"
        raise ImageFormatError(f"{what}: the header says the image is {file_bytes} bytes, "
                               f"the file has {len(data)}")
    if not 1 <= n_sections <= MAX_SECTIONS:
        raise ImageFormatError(f"section count {n_sections} out of range 1..{MAX_SECTIONS}")
    table_end = HEADER_BYTES + SECTION_BYTES * n_sections
    if table_end > len(data):
        raise ImageFormatError(f"section table of {n_sections} entries runs past the end of "
                               f"the file")
    hdr_zeroed = bytearray(data[:HEADER_BYTES])
    hdr_zeroed[HEADER_CRC_OFFSET:HEADER_CRC_OFFSET + 4] = bytes(4)
    crc = zlib.crc32(data[HEADER_BYTES:table_end], zlib.crc32(bytes(hdr_zeroed)))
    if crc != header_crc:
        raise ImageFormatError(f"header CRC mismatch (stored 0x{header_crc:08x}, computed "
                               f"0x{crc:08x}): the header or section table is corrupt")
    if reserved:
        raise ImageFormatError(f"header reserved field is 0x{reserved:08x}, must be 0")
    if flags & ~FLAGS_KNOWN:
        raise ImageFormatError(f"unknown flag bits 0x{flags & ~FLAGS_KNOWN:x} in image flags")
    if arch >= len(FAMILIES):
        raise ImageFormatError(f"arch {arch} is unknown (0: esp32-ai, 1: llama2.c)")
    if n_kv_heads == 0:  # Config spells "as many as n_heads" 0: refuse it here
        raise ImageFormatError(f"image header: n_kv_heads = 0 does not divide n_heads {n_heads}")
    config = Config(vocab_in=vocab_rows, vocab_out=vocab_out, dim=dim, n_layers=n_layers,
                    n_heads=n_heads, ffn=ffn, ple_dim=ple_dim, seq_len=seq_len, group=group,
                    rope_theta=float(theta), tied_head=bool(flags & FLAG_TIED_HEAD),
                    family=FAMILIES[arch], n_kv_heads=n_kv_heads, norm_eps=float(norm_eps))
    header = ImageHeader(config, file_bytes, n_sections, vocab_in_source, eot_id, bytes(sha),
                         header_crc, version, header_bytes)
    try:
        validate_config(config)
    except ModelFormatError as e:
        raise ImageFormatError(f"image header: {e}") from None
    if vocab_rows > vocab_in_source:
        raise ImageFormatError(f"vocab_rows {vocab_rows} exceeds vocab_in_source "
                               f"{vocab_in_source}")
    if eot_id >= vocab_out:
        raise ImageFormatError(f"eot_id {eot_id} outside the vocabulary of {vocab_out}")

    cfg = header.config  # the count without building a plan (n_layers may be absurd)
    want = (len(section_plan(dataclasses.replace(cfg, n_layers=0)))
            + len(layer_fields(cfg)) * n_layers)
    if n_sections != want:
        raise ImageFormatError(f"{n_sections} sections, a {n_layers}-layer "
                               f"{'tied' if header.tied_head else 'untied'}-head model has "
                               f"{want}")
    plan = section_plan(header.config)
    valid = {name for name, _k, _s in plan}
    sections: list[Section] = []
    for i in range(n_sections):
        raw, kind, offset, size, scrc = SECTION.unpack_from(data, HEADER_BYTES + SECTION_BYTES * i)
        name_b, _, tail = raw.partition(b"\0")
        try:
            name = name_b.decode("ascii")
        except UnicodeDecodeError:
            raise ImageFormatError(f"section {i}: name {raw!r} is not ASCII") from None
        if any(tail):
            raise ImageFormatError(f"section {i}: name {raw!r} is not NUL-padded")
        sections.append(Section(name, kind, offset, size, scrc))
    names = [s.name for s in sections]
    for s in sections:
        if s.name not in valid:
            raise ImageFormatError(f"unknown section name {s.name!r}")
    for name, _k, _s in plan:
        if name not in names:
            raise ImageFormatError(f"missing section {name!r}")
    pos = table_end
    for i, (s, (name, kind, _shape)) in enumerate(zip(sections, plan)):
        if s.name != name:
            raise ImageFormatError(f"section {i} is {s.name!r}, expected {name!r}: sections "
                                   f"must appear in image_format.h's order")
        wide = kind == KIND_Q4 and s.kind in (KIND_Q8, KIND_F32M)
        if s.kind != kind and not (wide and may_be_wide(header.config, name)):
            raise ImageFormatError(f"section {name!r} has kind {s.kind}, expected {kind} "
                                   f"({KIND_NAMES[kind]})")
        if s.offset % ALIGN:
            raise ImageFormatError(f"section {name!r} at offset {s.offset} is not "
                                   f"{ALIGN}-byte aligned")
        if s.offset != align_up(pos, ALIGN):
            raise ImageFormatError(f"section {name!r} at offset {s.offset}, expected "
                                   f"{align_up(pos, ALIGN)} (overlap or gap in the layout)")
        if s.offset + s.size > file_bytes:
            raise ImageFormatError(f"section {name!r} [{s.offset}, {s.offset + s.size}) runs "
                                   f"past the end of the {file_bytes}-byte file")
        if any(data[pos:s.offset]):
            raise ImageFormatError(f"non-zero padding before section {name!r}")
        pos = s.offset + s.size
    if pos != file_bytes:
        raise ImageFormatError(f"{file_bytes - pos} bytes after the last section")
    return header, sections


def _verified_payloads(data: bytes) -> tuple[ImageHeader, list[Section], dict[str, memoryview]]:
    header, sections = read_header(data)
    mv = memoryview(data)
    payload: dict[str, memoryview] = {}
    for s in sections:
        p = mv[s.offset:s.offset + s.size]
        crc = zlib.crc32(p)
        if crc != s.crc32:
            raise ImageFormatError(f"section {s.name!r} CRC mismatch (stored 0x{s.crc32:08x}, "
                                   f"computed 0x{crc:08x}): the payload is corrupt")
        payload[s.name] = p
    return header, sections, payload


def verify_image(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> ImageHeader:
    """Check header, section table and every section's CRC (what the engine checks at
    open) without unpacking the weights; raises ImageFormatError."""
    return _verified_payloads(_source_bytes(source))[0]


def read_image(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> Image:
    """Read and fully verify an image; weights come back exactly as written."""
    header, sections, payload = _verified_payloads(_source_bytes(source))
    cfg = header.config
    plan = section_plan(cfg)

    tensors: dict[str, object] = {}
    kinds = {s.name: s.kind for s in sections}
    for name, kind, (rows, cols) in plan:
        p = payload[name]
        if kinds[name] in (KIND_Q8, KIND_F32M):
            wm = unpack_q8(p, name) if kinds[name] == KIND_Q8 else unpack_f32m(p, name)
            if (wm.rows, wm.cols) != (rows, cols):
                raise ImageFormatError(f"section {name!r}: [{wm.rows}, {wm.cols}], the header's "
                                       f"config needs [{rows}, {cols}]")
            tensors[name] = wm
        elif kind == KIND_WEIGHTS:
            tensors[name] = WeightsChoice.unpack(p)
        elif kind == KIND_HEAD_TILES:
            try:
                tensors[name] = tiles_mod.unpack(p, name)
            except tiles_mod.HeadTilesError as e:
                raise ImageFormatError(str(e)) from None
        elif kind == KIND_DRAFTS:
            try:
                tensors[name] = drafts_table.DraftsTable.unpack(p, cfg.vocab_out)
            except drafts_table.DraftsError as e:
                raise ImageFormatError(str(e)) from None
        elif kind == KIND_TOKENIZER:
            # the board's reader, whose rules are the C loader's (one set of checks)
            try:
                board_module("llm_tokenizer").check_section(p, cfg.vocab_out)
            except ValueError as e:
                raise ImageFormatError(str(e)) from None
        elif kind == KIND_F32:
            if len(p) != 4 * rows * cols:
                raise ImageFormatError(f"section {name!r}: {len(p)} bytes, expected "
                                       f"{4 * rows * cols} (f32 [{rows}, {cols}])")
            arr = np.frombuffer(p, "<f4").astype(np.float32)
            if not np.isfinite(arr).all():
                raise ImageFormatError(f"section {name!r}: non-finite values")
            tensors[name] = arr.reshape(rows, cols) if name == "rope" else arr
        else:
            m = unpack_q4(p, name) if kind == KIND_Q4 else unpack_rows(p, name)
            if (m.rows, m.cols, m.group) != (rows, cols, cfg.group):
                raise ImageFormatError(
                    f"section {name!r}: [{m.rows}, {m.cols}] group {m.group}, the header's "
                    f"config needs [{rows}, {cols}] group {cfg.group}")
            tensors[name] = m
    layers = [LayerWeights(**{f: tensors.get(f"L{i}.{f}") for f in LAYER_FIELDS})
              for i in range(cfg.n_layers)]
    weights = Weights(config=cfg, tok_emb=tensors["embed"],
                      ple_model_proj=tensors.get("ple_model_proj"),
                      ple_proj_norm=tensors.get("ple_proj_norm"), ple_table=tensors.get("ple_rows"),
                      layers=layers, out_norm=tensors["out_norm"], head=tensors.get("head"))
    head = weights.tok_emb.take_rows(cfg.vocab_out) if cfg.tied_head else weights.head
    assert head is not None
    tiles = tensors["head_tiles"]
    assert isinstance(tiles, tiles_mod.HeadTiles)
    if not isinstance(head, QMatrix):
        if tiles.n_tiles:
            raise ImageFormatError("section 'head_tiles': a certificate for an int8/fp32 head "
                                   "(only int4 heads are certified)")
    else:
        problem = tiles_mod.check(tiles, head)
        if problem is not None:
            raise ImageFormatError(f"section 'head_tiles': {problem}")
    return Image(header=header, config=cfg, weights=weights, rope=tensors["rope"],
                 tokenizer_section=bytes(payload["tokenizer"]), sections=sections,
                 head_tiles=tiles, drafts=tensors["drafts"],  # type: ignore[arg-type]
                 weights_choice=tensors["weights"])  # type: ignore[arg-type]
