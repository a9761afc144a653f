"""Reader and writer of the esp32-ai `model.bin` (the published release format).

The file is a packed little-endian stream with no names, padding or checksums
(the release model's layout), so every structural fact is checked here and each kind of damage
gets its own message: this is where a wrong download or a truncated copy is
caught before anything is converted or flashed.

Two headers exist:
  * v1, magic "PLE\\0": u32 version, header_bytes, flags, input_vocab,
    output_vocab; i32 dim, n_layers, n_heads, ffn, ple_dim, seq_len, group;
    f32 rope_theta (56 bytes; readers seek to header_bytes, which may be larger).
  * legacy, magic "PLE1": i32 vocab, dim, n_layers, n_heads, ffn, ple_dim,
    seq_len, group; f32 rope_theta (40 bytes). It has no flags (the head is
    tied) and no output vocabulary: the caller supplies it (the tokenizer size).

Scales: NaN/Inf scales are rejected (the exporter produces them for an all-zero
group it divided by zero). An exactly zero scale is accepted: every value of
that group is then exactly 0, which is what an all-zero group means, and every
kernel computes it correctly (the integer dot is multiplied by 0).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes
from .model import FAMILIES, LAYER_FIELDS, Config, LayerWeights, QMatrix, Weights

MAGIC_V1 = b"PLE\x00"
MAGIC_LEGACY = b"PLE1"
VERSION = 1
HEADER_V1 = struct.Struct("<4sIIIII7if")  # 56 bytes
HEADER_LEGACY = struct.Struct("<4s8if")  # 40 bytes
FLAG_TIED_HEAD = 1
FLAGS_KNOWN = FLAG_TIED_HEAD
# Our kernels pack 32-column blocks; a block must never straddle two groups.
KERNEL_BLOCK_COLS = 32

assert HEADER_V1.size == 56 and HEADER_LEGACY.size == 40


class ModelFormatError(ValueError):
    """model.bin is malformed or describes a model this project cannot run."""


# --------------------------------------------------------------------------- #
# shapes


def tensor_specs(cfg: Config) -> Iterator[tuple[str, str, int, int]]:
    """(name, kind 'q'|'f', rows, cols) in file order; 'f' tensors are 1-D (cols)."""
    d, lp = cfg.dim, cfg.n_layers * cfg.ple_dim
    yield "tok_emb", "q", cfg.vocab_in, d
    yield "ple_model_proj", "q", lp, d
    yield "ple_proj_norm", "f", 1, cfg.ple_dim
    yield "ple_table", "q", cfg.vocab_in, lp
    shapes = {
        "attn_norm": ("f", 1, d),
        "qkv": ("q", 3 * d, d),
        "attn_proj": ("q", d, d),
        "ffn_norm": ("f", 1, d),
        "gate": ("q", cfg.ffn, d),
        "up": ("q", cfg.ffn, d),
        "down": ("q", d, cfg.ffn),
        "ple_gate": ("q", cfg.ple_dim, d),
        "ple_proj": ("q", d, cfg.ple_dim),
        "ple_norm": ("f", 1, d),
    }
    for layer in range(cfg.n_layers):
        for f in LAYER_FIELDS:
            kind, rows, cols = shapes[f]
            yield f"layers[{layer}].{f}", kind, rows, cols
    yield "out_norm", "f", 1, d
    if not cfg.tied_head:
        yield "head", "q", cfg.vocab_out, d


def validate_config(cfg: Config) -> None:
    """Reject dimensions no forward pass (ours or upstream's) can use."""
    if cfg.family not in FAMILIES:
        raise ModelFormatError(f"unknown model family {cfg.family!r} (known: "
                               f"{', '.join(FAMILIES)})")
    for name in ("vocab_in", "vocab_out", "dim", "n_layers", "n_heads", "ffn", "seq_len",
                 "group") + (("ple_dim",) if cfg.has_ple else ()):
        v = getattr(cfg, name)
        if v <= 0:
            raise ModelFormatError(f"impossible dimension: {name} = {v} (must be positive)")
    if not cfg.has_ple and cfg.ple_dim != 0:
        raise ModelFormatError(f"ple_dim = {cfg.ple_dim}, a {cfg.family} model has no PLE (0)")
    if cfg.dim % cfg.n_heads:
        raise ModelFormatError(
            f"impossible dimensions: dim {cfg.dim} is not divisible by n_heads {cfg.n_heads}")
    if cfg.head_dim % 2:
        raise ModelFormatError(
            f"impossible dimensions: head dim {cfg.head_dim} (dim {cfg.dim} / n_heads "
            f"{cfg.n_heads}) is odd; RoPE's split-half rotation needs an even head dim")
    if cfg.vocab_out > cfg.vocab_in:
        raise ModelFormatError(
            f"impossible dimensions: output vocab {cfg.vocab_out} exceeds input vocab "
            f"{cfg.vocab_in} (the tied head scores the first output-vocab embedding rows)")
    if not np.isfinite(cfg.rope_theta) or cfg.rope_theta <= 0.0:
        raise ModelFormatError(
            f"impossible rope_theta {cfg.rope_theta} (must be finite and positive)")
    if cfg.group % KERNEL_BLOCK_COLS:
        for name, cols in _matrix_widths(cfg):
            if cfg.group < cols:
                raise ModelFormatError(
                    f"unsupported quantization group {cfg.group}: it is neither a multiple of "
                    f"{KERNEL_BLOCK_COLS} nor >= the {cols} columns of {name}, so a "
                    f"{KERNEL_BLOCK_COLS}-column kernel block would straddle two groups")
    if cfg.n_kv_heads < 0 or cfg.n_heads % cfg.kv_heads:
        raise ModelFormatError(f"n_kv_heads = {cfg.n_kv_heads} does not divide n_heads "
                               f"{cfg.n_heads}")
    if cfg.has_ple and cfg.kv_heads != cfg.n_heads:
        raise ModelFormatError(f"n_kv_heads = {cfg.n_kv_heads}, an esp32-ai model has n_heads "
                               f"({cfg.n_heads})")
    if not np.isfinite(cfg.norm_eps) or cfg.norm_eps <= 0.0:
        raise ModelFormatError(f"norm_eps {cfg.norm_eps} must be positive and finite")


def _matrix_widths(cfg: Config) -> list[tuple[str, int]]:
    # Every layer has the same shapes: list layer 0 only, so a header claiming
    # 2**31 layers is rejected without iterating over them.
    d, lp = cfg.dim, cfg.n_layers * cfg.ple_dim
    if not cfg.has_ple:
        return [("tok_emb", d), ("layers[0].qkv", d), ("layers[0].down", cfg.ffn)]
    return [("tok_emb", d), ("ple_model_proj", d), ("ple_table", lp), ("layers[0].qkv", d),
            ("layers[0].down", cfg.ffn), ("layers[0].ple_proj", cfg.ple_dim)]


def expected_size(cfg: Config, header_bytes: int = HEADER_V1.size) -> int:
    """Total file size the header's dimensions imply (computed without a per-layer loop)."""
    def q(rows: int, cols: int) -> int:
        return 4 + rows * ((cols + 1) // 2) + rows * (-(-cols // cfg.group)) * 2

    d, f, p, lp = cfg.dim, cfg.ffn, cfg.ple_dim, cfg.n_layers * cfg.ple_dim
    layer = (3 * 4 * d + q(3 * d, d) + q(d, d) + 2 * q(f, d) + q(d, f) + q(p, d) + q(d, p))
    total = (header_bytes + q(cfg.vocab_in, d) + q(lp, d) + 4 * p + q(cfg.vocab_in, lp)
             + cfg.n_layers * layer + 4 * d)
    if not cfg.tied_head:
        total += q(cfg.vocab_out, d)
    return total


# --------------------------------------------------------------------------- #
# nibble helpers (source order: column j in byte j >> 1, even j in the low nibble)


def unpack_nibbles(codes: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, ceil(cols/2)] -> int8 q = code - 8, [rows, cols]."""
    rows = codes.shape[0]
    out = np.empty((rows, codes.shape[1] * 2), np.uint8)
    out[:, 0::2] = codes & 0x0F
    out[:, 1::2] = codes >> 4
    q = out[:, :cols].astype(np.int8)
    q -= 8
    return q


def pack_nibbles(q: np.ndarray, pad_code: int = 8) -> np.ndarray:
    """int8 q [rows, cols] -> uint8 [rows, ceil(cols/2)]; an odd tail nibble gets pad_code."""
    cols = q.shape[1]
    if q.dtype != np.int8:
        raise ValueError(f"int4 values must be stored as int8, got {q.dtype}")
    if q.size and (q.min() < -8 or q.max() > 7):
        raise ValueError(f"int4 values must lie in -8..7 (got {q.min()}..{q.max()})")
    codes = (q + np.int8(8)).view(np.uint8)  # -8..7 -> 0..15, no overflow in int8
    packed = codes[:, 0::2].copy()
    packed[:, : cols // 2] |= codes[:, 1::2] << 4
    if cols & 1:
        packed[:, -1] |= np.uint8(pad_code << 4)
    return packed


# --------------------------------------------------------------------------- #
# reading


def _read_source(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    return Path(source).read_bytes()


def _parse_header(data: bytes, vocab_out: int | None) -> tuple[Config, int]:
    if len(data) < 4:
        raise ModelFormatError(f"file too short for a model.bin header ({len(data)} bytes)")
    magic = data[:4]
    if magic == MAGIC_V1:
        if len(data) < HEADER_V1.size:
            raise ModelFormatError(
                f"truncated header: {len(data)} bytes, the v1 header needs {HEADER_V1.size}")
        (_m, version, header_bytes, flags, vin, vout, dim, n_layers, n_heads, ffn, ple_dim,
         seq_len, group, theta) = HEADER_V1.unpack_from(data, 0)
        if version != VERSION:
            raise ModelFormatError(
                f"unsupported model.bin version {version} (this reader knows version {VERSION})")
        if header_bytes < HEADER_V1.size or header_bytes > len(data):
            raise ModelFormatError(
                f"header size {header_bytes} out of range (must be >= {HEADER_V1.size} and "
                f"<= the file size {len(data)})")
        unknown = flags & ~FLAGS_KNOWN
        if unknown:
            raise ModelFormatError(
                f"unknown flag bits 0x{unknown:x} in flags 0x{flags:x} (known: 0x{FLAGS_KNOWN:x})")
        tied = bool(flags & FLAG_TIED_HEAD)
        if vocab_out is not None and vocab_out != vout:
            raise ModelFormatError(
                f"output vocab mismatch: the header says {vout}, the caller expects {vocab_out}")
    elif magic == MAGIC_LEGACY:
        if len(data) < HEADER_LEGACY.size:
            raise ModelFormatError(
                f"truncated header: {len(data)} bytes, the legacy header needs "
                f"{HEADER_LEGACY.size}")
        (_m, vin, dim, n_layers, n_heads, ffn, ple_dim, seq_len, group,
         theta) = HEADER_LEGACY.unpack_from(data, 0)
        if vocab_out is None:
            raise ModelFormatError(
                "legacy 'PLE1' header has no output vocab: pass vocab_out (the tokenizer size)")
        vout, header_bytes, tied = vocab_out, HEADER_LEGACY.size, True
    else:
        raise ModelFormatError(
            f"bad magic {magic!r}: not an esp32-ai model.bin (expected {MAGIC_V1!r} or "
            f"{MAGIC_LEGACY!r})")
    cfg = Config(vocab_in=vin, vocab_out=vout, dim=dim, n_layers=n_layers, n_heads=n_heads,
                 ffn=ffn, ple_dim=ple_dim, seq_len=seq_len, group=group,
                 rope_theta=float(theta), tied_head=tied)
    validate_config(cfg)
    return cfg, header_bytes


def read_model_bin(
    source: str | os.PathLike[str] | bytes, *, vocab_out: int | None = None
) -> Weights:
    """Parse an esp32-ai model.bin into `Weights` (codes as int8 q, fp16 scales as stored).

    vocab_out is required for the legacy header (which lacks it); for a v1 header it is
    optional and, when given, must equal the header's output vocab.
    """
    data = _read_source(source)
    cfg, pos = _parse_header(data, vocab_out)
    need = expected_size(cfg, pos)
    tensors: dict[str, object] = {}
    for name, kind, rows, cols in tensor_specs(cfg):
        if kind == "f":
            n = 4 * cols
            if pos + n > len(data):
                raise _truncated(name, pos, n, len(data), need)
            arr = np.frombuffer(data, "<f4", cols, pos).astype(np.float32)
            pos += n
            bad = np.flatnonzero(~np.isfinite(arr))
            if bad.size:
                raise ModelFormatError(
                    f"{name}: non-finite weight {arr[bad[0]]} at index {bad[0]}")
            tensors[name] = arr
            continue
        if pos + 4 > len(data):
            raise _truncated(name, pos, 4, len(data), need)
        (g,) = struct.unpack_from("<i", data, pos)
        if g != cfg.group:
            raise ModelFormatError(
                f"{name}: tensor group prefix {g} does not match the header group {cfg.group} "
                f"at byte {pos} (misaligned stream or a file from another exporter)")
        ncode = rows * ((cols + 1) // 2)
        ng = -(-cols // g)
        n = 4 + ncode + rows * ng * 2
        if pos + n > len(data):
            raise _truncated(name, pos, n, len(data), need)
        codes = np.frombuffer(data, np.uint8, ncode, pos + 4).reshape(rows, (cols + 1) // 2)
        scales = np.frombuffer(data, "<f2", rows * ng, pos + 4 + ncode).reshape(rows, ng)
        pos += n
        finite = np.isfinite(scales)
        if not finite.all():
            r, c = np.argwhere(~finite)[0]
            raise ModelFormatError(
                f"{name}: scale of row {r} group {c} is {scales[r, c]} (NaN/Inf scales come "
                f"from an all-zero group the exporter divided by zero; the file is unusable)")
        tensors[name] = QMatrix(unpack_nibbles(codes, cols), scales.astype(np.float16), g)
    if pos != len(data):
        raise ModelFormatError(
            f"{len(data) - pos} trailing bytes after the last tensor (file is {len(data)} "
            f"bytes, the header's dimensions account for {pos})")
    layers = [
        LayerWeights(**{f: tensors[f"layers[{i}].{f}"] for f in LAYER_FIELDS})
        for i in range(cfg.n_layers)
    ]
    return Weights(
        config=cfg,
        tok_emb=tensors["tok_emb"],
        ple_model_proj=tensors["ple_model_proj"],
        ple_proj_norm=tensors["ple_proj_norm"],
        ple_table=tensors["ple_table"],
        layers=layers,
        out_norm=tensors["out_norm"],
        head=tensors.get("head"),
    )


def _truncated(name: str, pos: int, n: int, have: int, need: int) -> ModelFormatError:
    return ModelFormatError(
        f"truncated tensor stream: {name} needs {n} bytes at offset {pos} but the file ends at "
        f"{have} (the header's dimensions need {need} bytes in total)")


# --------------------------------------------------------------------------- #
# writing


def _iter_tensors(w: Weights) -> Iterator[tuple[str, object]]:
    yield "tok_emb", w.tok_emb
    yield "ple_model_proj", w.ple_model_proj
    yield "ple_proj_norm", w.ple_proj_norm
    yield "ple_table", w.ple_table
    for i, layer in enumerate(w.layers):
        for f in LAYER_FIELDS:
            yield f"layers[{i}].{f}", getattr(layer, f)
    yield "out_norm", w.out_norm
    if not w.config.tied_head:
        yield "head", w.head


def encode_model_bin(weights: Weights, *, legacy: bool = False) -> bytes:
    """The bytes of model.bin for `weights` (shapes are checked against the config)."""
    cfg = weights.config
    validate_config(cfg)
    if legacy and not cfg.tied_head:
        raise ValueError("the legacy 'PLE1' header cannot describe an untied head")
    if cfg.tied_head and weights.head is not None:
        raise ValueError("config says the head is tied but weights.head is set")
    if len(weights.layers) != cfg.n_layers:
        raise ValueError(f"{len(weights.layers)} layers, config says {cfg.n_layers}")
    if legacy:
        parts = [HEADER_LEGACY.pack(MAGIC_LEGACY, cfg.vocab_in, cfg.dim, cfg.n_layers,
                                    cfg.n_heads, cfg.ffn, cfg.ple_dim, cfg.seq_len, cfg.group,
                                    cfg.rope_theta)]
    else:
        flags = FLAG_TIED_HEAD if cfg.tied_head else 0
        parts = [HEADER_V1.pack(MAGIC_V1, VERSION, HEADER_V1.size, flags, cfg.vocab_in,
                                cfg.vocab_out, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.ffn,
                                cfg.ple_dim, cfg.seq_len, cfg.group, cfg.rope_theta)]
    for (name, kind, rows, cols), (_n, t) in zip(tensor_specs(cfg), _iter_tensors(weights)):
        if kind == "f":
            arr = np.asarray(t)
            if arr.shape != (cols,):
                raise ValueError(f"{name}: shape {arr.shape}, expected ({cols},)")
            parts.append(arr.astype("<f4").tobytes())
            continue
        assert isinstance(t, QMatrix)
        ng = -(-cols // cfg.group)
        if t.q.shape != (rows, cols) or t.scales.shape != (rows, ng) or t.group != cfg.group:
            raise ValueError(
                f"{name}: q {t.q.shape} scales {t.scales.shape} group {t.group}, expected "
                f"q ({rows}, {cols}) scales ({rows}, {ng}) group {cfg.group}")
        parts.append(struct.pack("<i", t.group))
        parts.append(pack_nibbles(t.q, pad_code=0).tobytes())
        parts.append(np.asarray(t.scales, np.float16).astype("<f2").tobytes())
    return b"".join(parts)


def write_model_bin(
    weights: Weights, path: str | os.PathLike[str], *, legacy: bool = False
) -> None:
    """Write `weights` as an esp32-ai model.bin (v1 header, or the legacy 40-byte one)."""
    atomic_write_bytes(path, encode_model_bin(weights, legacy=legacy))
