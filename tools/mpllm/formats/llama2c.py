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


#: the header's seven sizes, in file order (llama2c's ModelArgs names)
FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
#: the largest Q8_0 group a v2 header may state (export.py uses 64)
MAX_GROUP_SIZE = 4096


def check_config(cfg: Llama2cConfig, where: str, shown: dict[str, int] | None = None
                 ) -> Llama2cConfig:
    """cfg, or CheckpointError naming the first header field the engine and
    the image format cannot hold (mpllm.formats.limits, the loader's own
    bounds), and the bound. shown: a field's value as the file states it
    (v0's vocab_size is negative for an unshared classifier)."""
    from .limits import MAX_DIM, size_limit

    def say(name: str) -> str:
        return f"{name} {(shown or {}).get(name, getattr(cfg, name))}"

    bounds = {"dim": size_limit("dim"), "hidden_dim": size_limit("ffn"),
              "n_layers": size_limit("n_layers"),
              "n_heads": (min(MAX_DIM, max(cfg.dim, 1)), (f"at most {say('dim')}: a head has "
                          "a column")),
              "n_kv_heads": (max(cfg.n_heads, 1), f"at most {say('n_heads')}"),
              "vocab_size": size_limit("vocab"), "seq_len": size_limit("seq_len")}
    for name in FIELDS:
        v = getattr(cfg, name)
        hi, why = bounds[name]
        lo = EOS_ID + 1 if name == "vocab_size" else 1  # <unk>, BOS and EOS at least
        if not lo <= v <= hi:
            raise CheckpointError(f"{where}: {say(name)} is out of range: the engine holds "
                                  f"{lo}..{hi} ({why})")
    dim, n_heads, n_kv_heads = cfg.dim, cfg.n_heads, cfg.n_kv_heads
    if dim % n_heads or (dim // n_heads) % 2:
        raise CheckpointError(f"{where}: {say('n_heads')} does not split {say('dim')} into heads "
                              "of an even size (RoPE rotates pairs)")
    most, why = size_limit("head_dim")
    if dim // n_heads > most:
        raise CheckpointError(f"{where}: {say('dim')} / {say('n_heads')} makes heads of "
                              f"{dim // n_heads}: the engine holds at most {most} ({why})")
    if n_heads % n_kv_heads:
        raise CheckpointError(f"{where}: {say('n_kv_heads')} does not divide {say('n_heads')} "
                              "(each kv head serves as many query heads)")
    return cfg


@dataclass(frozen=True)
class Header:
    """A checkpoint's header, checked against the engine's limits and the
    file's length (`read_header`)."""

    version: int
    config: Llama2cConfig
    group_size: int = 0  # v2 only


def _header_text(version: int, raw: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in {"version": version, **raw}.items())


def _layout(version: int, cfg: Llama2cConfig, group: int) -> list[tuple[str, int, int]]:
    """(what, bytes, values) of every tensor in file order after the header;
    values is the count a v2 tensor's group must divide (0: f32)."""
    L, d, v = cfg.n_layers, cfg.dim, cfg.vocab_size

    def f32(what: str, n: int) -> tuple[str, int, int]:
        return what, 4 * n, 0

    def tensor(what: str, n: int) -> list[tuple[str, int, int]]:
        if version != 2:
            return [f32(what, n)]
        return [(what, n, n), (f"{what} scales", 4 * (n // group), 0)]

    if version == 0:
        out = [f32("tok_embeddings", v * d), f32("attention_norm", L * d)]
        for name in LAYER_MATRICES[:4]:
            out.append(f32(name, L * math.prod(cfg.matrix_shape(name))))
        out.append(f32("ffn_norm", L * d))
        for name in LAYER_MATRICES[4:]:
            out.append(f32(name, L * math.prod(cfg.matrix_shape(name))))
        out += [f32("the final norm", d), f32("the RoPE tables", cfg.seq_len * cfg.head_dim)]
        if not cfg.shared_classifier:
            out.append(f32("the classifier", v * d))
        return out
    out = [f32("attention_norm", L * d), f32("ffn_norm", L * d), f32("the final norm", d)]
    out += tensor("tok_embeddings", v * d)
    for name in LAYER_MATRICES:
        for layer in range(L):
            out += tensor(f"layer {layer} {name}", math.prod(cfg.matrix_shape(name)))
    if not cfg.shared_classifier:
        out += tensor("the classifier", v * d)
    return out


def read_header(data: bytes, where: str = "model.bin") -> Header:
    """The header of any of the three versions, every field checked against
    what the engine can hold and the sizes it states against the file's
    length, before a byte of the weights is read; CheckpointError naming the
    field (or, for sizes that do not add up to the file, the whole header)."""
    if len(data) < _PARAMS.size:
        raise CheckpointError(f"{where}: {len(data)} bytes, too short for a llama2.c header")
    group = 0
    if struct.unpack_from("<I", data, 0)[0] == MAGIC:
        if len(data) < V1_HEADER_BYTES:
            raise CheckpointError(f"{where}: {len(data)} bytes, too short for its "
                                  f"{V1_HEADER_BYTES}-byte header")
        (version,) = struct.unpack_from("<i", data, 4)
        if version not in (1, 2):
            raise CheckpointError(f"{where}: llama2.c checkpoint version {version} "
                                  "(this converter reads 0, 1 and 2)")
        dims = _PARAMS.unpack_from(data, 8)
        raw = dict(zip(FIELDS, dims, strict=True))
        shared_flag = data[8 + _PARAMS.size]
        if shared_flag > 1:
            raise CheckpointError(f"{where}: shared_classifier flag {shared_flag} is not 0 or 1")
        raw["shared_classifier"] = shared_flag
        cfg = check_config(Llama2cConfig(*dims, bool(shared_flag)), where)
        if version == 2:
            (group,) = struct.unpack_from("<i", data, 9 + _PARAMS.size)
            if not 0 < group <= MAX_GROUP_SIZE:
                raise CheckpointError(f"{where}: Q8_0 group_size {group} is out of range "
                                      f"(1..{MAX_GROUP_SIZE})")
            raw["group_size"] = group
        at = V1_HEADER_BYTES
    else:
        version = 0
        dims = _PARAMS.unpack_from(data, 0)
        raw = dict(zip(FIELDS, dims, strict=True))
        shared = dims[5] > 0
        cfg = check_config(Llama2cConfig(*dims[:5], abs(dims[5]), dims[6], shared), where,
                           shown={"vocab_size": dims[5]})
        at = _PARAMS.size
    for what, size, values in _layout(version, cfg, group):
        if values % group if values else False:
            raise CheckpointError(f"{where}: {what} has {values} values, not a multiple of "
                                  f"the group size {group}")
        if at + size > len(data):
            raise CheckpointError(
                f"{where}: truncated in {what} (needs {size:,} bytes at offset {at:,}, the file "
                f"has {len(data):,}): the header ({_header_text(version, raw)}) does not "
                "describe this file")
        at += size
    if at != len(data):
        raise CheckpointError(f"{where}: {len(data) - at:,} bytes after the last tensor: the "
                              f"header ({_header_text(version, raw)}) describes {at:,} bytes "
                              "(a different shape or version?)")
    return Header(version, cfg, group)


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
        with np.errstate(over="ignore"):  # (said below in one line, not as numpy's warning)
            w = (q.reshape(-1, group) * scales[:, None]).astype(np.float32)
        if not np.isfinite(w).all():
            big = float(np.abs(scales).max())
            raise CheckpointError(f"{self.where}: {what}: a code times its scale ({big:g}) "
                                  "overflows float32")
        return w.reshape(shape)

    def end(self) -> None:
        if self.at != len(self.data):
            raise CheckpointError(f"{self.where}: {len(self.data) - self.at:,} bytes after the "
                                  "last tensor (a different shape or version?)")


def read_checkpoint(data: bytes, where: str = "model.bin") -> Llama2cCheckpoint:
    """Any of the three versions; CheckpointError, naming what was wrong, otherwise
    (the header, read_header, before any weight)."""
    head = read_header(data, where)
    cfg, version, group = head.config, head.version, head.group_size
    L, d = cfg.n_layers, cfg.dim
    if version:
        r = _Reader(data, V1_HEADER_BYTES, where)
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
    r = _Reader(data, _PARAMS.size, where)
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
    cls = None if cfg.shared_classifier else r.f32((cfg.vocab_size, d), "the classifier")
    r.end()
    return Llama2cCheckpoint(0, cfg, emb, attention_norm, ffn_norm, norm,
                             {k: layers[k] for k in LAYER_MATRICES}, cls)


def is_checkpoint(data: bytes) -> bool:
    """Whether `data` starts like a llama2.c checkpoint (v1/v2 magic, or a v0
    header whose sizes add up to the file's)."""
    if len(data) >= 4 and struct.unpack_from("<I", data, 0)[0] == MAGIC:
        return True
    try:
        read_header(data)
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
    """`ck` written as export.py writes version 0, 1 or 2 (models made here, tests;
    a v2 file of a v0/v1 one: checkpoint_bytes(read_checkpoint(data), 2, 64)).
    ValueError for a v2 group that does not divide every tensor."""
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
    if version == 2:  # export.py's rule (it asserts it): whole groups in every tensor
        if group_size < 1:
            raise ValueError(f"group_size {group_size}: must be >= 1")
        odd = next((t for t in tensors if t.size % group_size), None)
        if odd is not None:
            raise ValueError(f"group_size {group_size} does not divide a tensor of {odd.size} "
                             f"values ({' x '.join(map(str, odd.shape))}): a Q8_0 checkpoint "
                             "keeps whole groups (dim is a multiple of the group in export.py)")
    parts += [f32(t) if version == 1 else _q80(t, group_size) for t in tensors]
    return b"".join(parts)
