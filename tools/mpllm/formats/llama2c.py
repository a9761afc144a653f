"""llama2.c's files: checkpoints (`model.bin`, three versions) and `tokenizer.bin`
(its export of a sentencepiece vocabulary).

Checkpoints, little-endian, as llama2.c's export.py writes them. Matrices are
PyTorch Linear weights, [out, in] row-major; "per layer" means the tensor of
layer 0, then layer 1, ...
- v0 (legacy): i32 dim, hidden_dim, n_layers, n_heads, n_kv_heads,
  vocab_size (negative: an unshared classifier follows), seq_len; then f32
  tok_embeddings [vocab, dim], attention_norm per layer, wq, wk, wv, wo per
  layer, ffn_norm per layer, w1, w2, w3 per layer, the final norm, the RoPE
  tables freq_cos and freq_sin [seq_len, head_dim/2] (skipped: the
  converter stores its own), and the classifier [vocab, dim] if unshared.
- v1: u32 magic 0x616b3432 ("ak42"), i32 version 1, the 7 i32 above (vocab
  positive), u8 shared_classifier, zeros to 256 bytes; then f32
  attention_norm per layer, ffn_norm per layer, the final norm,
  tok_embeddings, wq, wk, wv, wo, w1, w2, w3 per layer, the classifier if
  unshared.
- v2 (Q8_0): as v1 with version 2 and an i32 group_size after the flag; then
  f32 attention_norm per layer, ffn_norm per layer, the final norm; then each
  of tok_embeddings, wq.., w3 per layer (and the classifier if unshared) as
  i8 codes [numel] followed by f32 scales [numel / group_size]: value =
  code * scale of its group of group_size consecutive elements.

tokenizer.bin, little-endian: i32 max_token_length, then per token id in
order: f32 score, i32 length, that many bytes of text. The text is the
sentencepiece piece with U+2581 already turned into a space; the 256
byte-fallback pieces are the literal strings "<0x00>".."<0xFF>"; ids 0, 1, 2
are <unk>, BOS and EOS.

llama2.c encodes by score: start from one symbol per character (or its
bytes' fallback tokens), then repeatedly merge the adjacent pair whose
concatenated text is a token with the highest score, the leftmost among equal
scores. That is byte-pair encoding with a merge for every way of writing a
token as two tokens, ranked by the merged token's score: the tables here say
exactly that, and the board's `llm.Tokenizer` runs them (llm_tokenizer.py).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .model import AttentionGeometry
from .tokenizer import MAX_IDS, MAX_TOKEN_BYTES, TokenizerFormatError, TokenizerTables

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_BYTE_PIECES = {f"<0x{b:02X}>".encode(): b for b in range(256)}


def read_tokenizer_bin(data: bytes, where: str = "tokenizer.bin") -> tuple[list[bytes], list[float]]:
    """(texts, scores) per token id; TokenizerFormatError on anything malformed."""
    if len(data) < 4:
        raise TokenizerFormatError(f"{where}: {len(data)} bytes, too short for its header")
    (max_len,) = struct.unpack_from("<i", data, 0)
    if not 1 <= max_len <= 4096:
        raise TokenizerFormatError(f"{where}: max token length {max_len} is not a "
                                   "llama2.c tokenizer.bin header")
    texts: list[bytes] = []
    scores: list[float] = []
    at = 4
    while at < len(data):
        if at + 8 > len(data):
            raise TokenizerFormatError(f"{where}: truncated in the entry of token {len(texts)}")
        score, n = struct.unpack_from("<fi", data, at)
        at += 8
        if not 0 < n <= max_len:
            raise TokenizerFormatError(f"{where}: token {len(texts)} has length {n} "
                                       f"(the header's max is {max_len})")
        if at + n > len(data):
            raise TokenizerFormatError(f"{where}: truncated in the text of token {len(texts)} "
                                       f"({n} bytes, {len(data) - at} left)")
        if math.isnan(score):
            raise TokenizerFormatError(f"{where}: token {len(texts)} has a NaN score")
        texts.append(data[at:at + n])
        scores.append(score)
        at += n
    if len(texts) <= EOS_ID:
        raise TokenizerFormatError(f"{where}: {len(texts)} tokens, needs <unk>, BOS and EOS")
    if len(texts) > MAX_IDS:
        raise TokenizerFormatError(f"{where}: {len(texts)} tokens, the image holds {MAX_IDS}")
    return texts, scores


def tokenizer_tables(texts: list[bytes], scores: list[float],
                     where: str = "tokenizer.bin") -> TokenizerTables:
    """The image's KIND_TOKENIZER tables for llama2.c's encoding of this vocabulary."""
    n = len(texts)
    ids: dict[bytes, int] = {}
    for i, t in enumerate(texts):
        ids.setdefault(t, i)  # llama2.c's sorted-vocabulary lookup: unique texts assumed
    if len(ids) != n:
        raise TokenizerFormatError(f"{where}: {n - len(ids)} token texts appear twice")
    byte_ids = [0xFFFF] * 256
    token_bytes: list[bytes] = []
    for i, t in enumerate(texts):
        b = _BYTE_PIECES.get(t)
        if b is not None:
            byte_ids[b] = i
            t = bytes([b])  # decoding writes the byte itself
        if len(t) > MAX_TOKEN_BYTES:
            raise TokenizerFormatError(f"{where}: token {i} is {len(t)} bytes "
                                       f"(the image holds {MAX_TOKEN_BYTES})")
        token_bytes.append(t)
    # Every split of a token's text into two tokens' texts is a merge (llama2.c
    # looks the concatenation up); its priority is the merged token's score.
    merges = [(ids[t[:k]], ids[t[k:]], i) for i, t in enumerate(texts)
              for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    by_score = sorted({scores[m[2]] for m in merges}, reverse=True)
    if len(by_score) > MAX_IDS:
        raise TokenizerFormatError(f"{where}: {len(by_score)} distinct merge scores, "
                                   f"ranks hold {MAX_IDS}")
    rank_of = {s: r for r, s in enumerate(by_score)}
    merges.sort(key=lambda m: (rank_of[scores[m[2]]], m[2], m[0]))
    return TokenizerTables(vocab_size=n, eot_id=EOS_ID, token_bytes=token_bytes, merges=merges,
                           byte_ids=byte_ids, special_ids=[BOS_ID, EOS_ID],
                           ranks=[rank_of[scores[m[2]]] for m in merges])


def load_tokenizer_bin(path: str | Path) -> TokenizerTables:
    path = Path(path)
    return tokenizer_tables(*read_tokenizer_bin(path.read_bytes(), str(path)), where=str(path))


def tokenizer_bin_bytes(texts: list[bytes], scores: list[float]) -> bytes:
    """A tokenizer.bin of these tokens, as llama2.c's export writes it (tests,
    and models trained here)."""
    out = bytearray(struct.pack("<i", max(len(t) for t in texts)))
    for t, s in zip(texts, scores, strict=True):
        out += struct.pack("<fi", s, len(t)) + t
    return bytes(out)


MAGIC = 0x616B3432
V1_HEADER_BYTES = 256
_PARAMS = struct.Struct("<7i")
#: the per-layer matrices, in the order every version stores them
LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


class CheckpointError(ValueError):
    """A file that is not a llama2.c checkpoint this converter can read."""


@dataclass(frozen=True)
class Llama2cConfig(AttentionGeometry):
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool

    def matrix_shape(self, name: str) -> tuple[int, int]:
        """[out, in] of a per-layer matrix."""
        return {"wq": (self.dim, self.dim), "wk": (self.kv_dim, self.dim),
                "wv": (self.kv_dim, self.dim), "wo": (self.dim, self.dim),
                "w1": (self.hidden_dim, self.dim), "w2": (self.dim, self.hidden_dim),
                "w3": (self.hidden_dim, self.dim)}[name]


@dataclass
class Llama2cCheckpoint:
    """A checkpoint's weights as float32 (v2's Q8_0 codes times their scales)."""

    version: int
    config: Llama2cConfig
    tok_embeddings: np.ndarray  # [vocab, dim]
    attention_norm: np.ndarray  # [n_layers, dim]
    ffn_norm: np.ndarray  # [n_layers, dim]
    norm: np.ndarray  # [dim]
    layers: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [n_layers, out, in]
    classifier: np.ndarray | None = None  # [vocab, dim]; None when shared
    group_size: int = 0  # v2 only
    #: v2 only: each tensor's own Q8_0 codes and scales, (int8 [..., rows, cols],
    #: f32 [..., rows, cols // group_size]), where its groups lie within rows
    #: (cols % group_size == 0); keys "tok_embeddings", "the classifier", and the
    #: layer matrices' names ("wq", ...) stacked over layers
    q80: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def output(self) -> np.ndarray:
        return self.tok_embeddings if self.classifier is None else self.classifier


def _config(dims: tuple[int, ...], shared: bool, where: str) -> Llama2cConfig:
    return check_config(Llama2cConfig(*dims, shared), where)  # type: ignore[call-arg]


def check_config(cfg: Llama2cConfig, where: str) -> Llama2cConfig:
    """cfg, or CheckpointError naming the first size llama2.c's Llama cannot have."""
    dim, n_heads, n_kv_heads = cfg.dim, cfg.n_heads, cfg.n_kv_heads
    for name in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                 "seq_len"):
        v = getattr(cfg, name)
        if not 0 < v <= 1 << 20:
            raise CheckpointError(f"{where}: {name} {v} is not a llama2.c model's")
    if dim % n_heads or (dim // n_heads) % 2:
        raise CheckpointError(f"{where}: dim {dim} does not split into {n_heads} heads of an "
                              "even size (RoPE rotates pairs)")
    if n_heads % n_kv_heads:
        raise CheckpointError(f"{where}: {n_heads} heads do not share {n_kv_heads} kv heads evenly")
    return cfg


class _Reader:
    def __init__(self, data: bytes, at: int, where: str) -> None:
        self.data, self.at, self.where = data, at, where

    def take(self, dtype: str, count: int, what: str) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if self.at + size > len(self.data):
            raise CheckpointError(f"{self.where}: truncated in {what} (needs {size:,} bytes at "
                                  f"offset {self.at:,}, the file has {len(self.data):,})")
        a = np.frombuffer(self.data, dtype, count, self.at)
        self.at += size
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CheckpointError(f"{self.where}: {what} holds NaN or Inf")
        return a

    def f32(self, shape: tuple[int, ...], what: str) -> np.ndarray:
        return self.take("<f4", int(np.prod(shape)), what).reshape(shape).astype(np.float32)

    def q80(self, shape: tuple[int, ...], group: int, what: str,
            raw: list[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
        """The tensor as float32; its codes and scales appended to `raw` when its
        groups lie within rows."""
        n = int(np.prod(shape))
        if n % group:
            raise CheckpointError(f"{self.where}: {what} has {n} values, not a multiple of "
                                  f"the group size {group}")
        codes = self.take("<i1", n, what)
        scales = self.take("<f4", n // group, f"{what} scales")
        if raw is not None and shape[-1] % group == 0:
            raw.append((codes.reshape(shape).copy(),
                        scales.reshape(*shape[:-1], shape[-1] // group).astype(np.float32)))
        q = codes.astype(np.float32)
        return (q.reshape(-1, group) * scales[:, None]).astype(np.float32).reshape(shape)

    def end(self) -> None:
        if self.at != len(self.data):
            raise CheckpointError(f"{self.where}: {len(self.data) - self.at:,} bytes after the "
                                  "last tensor (a different shape or version?)")


def read_checkpoint(data: bytes, where: str = "model.bin") -> Llama2cCheckpoint:
    """Any of the three versions; CheckpointError, naming what was wrong, otherwise."""
    if len(data) < _PARAMS.size:
        raise CheckpointError(f"{where}: {len(data)} bytes, too short for a llama2.c header")
    if struct.unpack_from("<I", data, 0)[0] == MAGIC:
        if len(data) < V1_HEADER_BYTES:
            raise CheckpointError(f"{where}: {len(data)} bytes, too short for its "
                                  f"{V1_HEADER_BYTES}-byte header")
        (version,) = struct.unpack_from("<i", data, 4)
        if version not in (1, 2):
            raise CheckpointError(f"{where}: llama2.c checkpoint version {version} "
                                  "(this converter reads 0, 1 and 2)")
        dims = _PARAMS.unpack_from(data, 8)
        shared_flag = data[8 + _PARAMS.size]
        if shared_flag > 1:
            raise CheckpointError(f"{where}: shared-classifier flag {shared_flag} is not 0 or 1")
        cfg = _config(dims, bool(shared_flag), where)
        group = 0
        if version == 2:
            (group,) = struct.unpack_from("<i", data, 9 + _PARAMS.size)
            if not 0 < group <= 4096:
                raise CheckpointError(f"{where}: Q8_0 group size {group} out of range")
        r = _Reader(data, V1_HEADER_BYTES, where)
        L, d = cfg.n_layers, cfg.dim
        attention_norm = r.f32((L, d), "attention_norm")
        ffn_norm = r.f32((L, d), "ffn_norm")
        norm = r.f32((d,), "the final norm")

        raws: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

        def tensor(shape: tuple[int, ...], what: str, key: str) -> np.ndarray:
            if version == 1:
                return r.f32(shape, what)
            return r.q80(shape, group, what, raws.setdefault(key, []))

        emb = tensor((cfg.vocab_size, d), "tok_embeddings", "tok_embeddings")
        layers = {name: np.stack([tensor(cfg.matrix_shape(name), f"layer {layer} {name}", name)
                                  for layer in range(L)]) for name in LAYER_MATRICES}
        cls = None if cfg.shared_classifier else tensor((cfg.vocab_size, d), "the classifier",
                                                        "the classifier")
        r.end()
        q80 = {k: (np.stack([q for q, _ in v]), np.stack([sc for _, sc in v])) if k in
               LAYER_MATRICES else v[0] for k, v in raws.items() if v}
        return Llama2cCheckpoint(version, cfg, emb, attention_norm, ffn_norm, norm, layers, cls,
                                 group, q80)
    dims = list(_PARAMS.unpack_from(data, 0))
    shared = dims[5] > 0
    dims[5] = abs(dims[5])
    cfg = _config(tuple(dims), shared, where)
    r = _Reader(data, _PARAMS.size, where)
    L, d = cfg.n_layers, cfg.dim
    emb = r.f32((cfg.vocab_size, d), "tok_embeddings")
    attention_norm = r.f32((L, d), "attention_norm")
    layers = {}
    for name in ("wq", "wk", "wv", "wo"):
        layers[name] = r.f32((L, *cfg.matrix_shape(name)), name)
    ffn_norm = r.f32((L, d), "ffn_norm")
    for name in ("w1", "w2", "w3"):
        layers[name] = r.f32((L, *cfg.matrix_shape(name)), name)
    norm = r.f32((d,), "the final norm")
    r.f32((2, cfg.seq_len, cfg.head_dim // 2), "the RoPE tables")
    cls = None if shared else r.f32((cfg.vocab_size, d), "the classifier")
    r.end()
    return Llama2cCheckpoint(0, cfg, emb, attention_norm, ffn_norm, norm,
                             {k: layers[k] for k in LAYER_MATRICES}, cls)


def is_checkpoint(data: bytes) -> bool:
    """Whether `data` starts like a llama2.c checkpoint (v1/v2 magic, or a v0
    header whose sizes add up to the file's)."""
    if len(data) >= 4 and struct.unpack_from("<I", data, 0)[0] == MAGIC:
        return True
    try:
        read_checkpoint(data)
    except CheckpointError:
        return False
    return True


def _rope_tables(cfg: Llama2cConfig) -> np.ndarray:
    """The freq_cos / freq_sin tables a v0 file carries (what export.py wrote)."""
    hs = cfg.head_dim
    freqs = 1.0 / (10000.0 ** (np.arange(0, hs, 2, dtype=np.float64)[: hs // 2] / hs))
    ang = np.outer(np.arange(cfg.seq_len, dtype=np.float64), freqs)
    return np.stack([np.cos(ang), np.sin(ang)]).astype(np.float32)


def _q80(w: np.ndarray, group: int) -> bytes:
    g = w.astype(np.float32).reshape(-1, group)
    scale = (np.abs(g).max(axis=1) / np.float32(127.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    q = np.rint(g / safe[:, None]).astype(np.int8)
    return q.tobytes() + scale.astype("<f4").tobytes()


def checkpoint_bytes(ck: Llama2cCheckpoint, version: int, group_size: int = 64) -> bytes:
    """`ck` written as export.py writes version 0, 1 or 2 (models made here, tests)."""
    cfg = ck.config

    def f32(a: np.ndarray) -> bytes:
        return np.ascontiguousarray(a, "<f4").tobytes()

    per_layer = [ck.layers[name][layer] for name in LAYER_MATRICES
                 for layer in range(cfg.n_layers)]
    dims = (cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size,
            cfg.seq_len)
    if version == 0:
        v0_dims = (*dims[:5], cfg.vocab_size if cfg.shared_classifier else -cfg.vocab_size,
                   cfg.seq_len)
        parts = [_PARAMS.pack(*v0_dims), f32(ck.tok_embeddings), f32(ck.attention_norm)]
        parts += [f32(ck.layers[name]) for name in ("wq", "wk", "wv", "wo")]
        parts += [f32(ck.ffn_norm)] + [f32(ck.layers[name]) for name in ("w1", "w2", "w3")]
        parts += [f32(ck.norm), f32(_rope_tables(cfg))]
        if not cfg.shared_classifier:
            parts.append(f32(ck.output))
        return b"".join(parts)
    if version not in (1, 2):
        raise ValueError(f"llama2.c checkpoint version {version}: 0, 1 or 2")
    head = struct.pack("<Ii", MAGIC, version) + _PARAMS.pack(*dims)
    head += struct.pack("<B", int(cfg.shared_classifier))
    if version == 2:
        head += struct.pack("<i", group_size)
    parts = [head + bytes(V1_HEADER_BYTES - len(head)), f32(ck.attention_norm),
             f32(ck.ffn_norm), f32(ck.norm)]
    tensors = [ck.tok_embeddings, *per_layer]
    if not cfg.shared_classifier:
        tensors.append(ck.output)
    parts += [f32(t) if version == 1 else _q80(t, group_size) for t in tensors]
    return b"".join(parts)
