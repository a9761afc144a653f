"""A llama2.c checkpoint as the engine's weights (the converter's llama2c path).

Per tensor, which format and why:
- every matrix (tok_embeddings, wq/wk/wv as one qkv matrix, wo, w1, w3, w2,
  the classifier when unshared) takes the one weight format the converter
  chose for the image (`to_weights(ck, group, weights)`; convert.py --weights,
  by default measured: the smallest whose greedy agreement with the fp32
  forward reaches 85 %):
  - int4: one fp16 scale per group of columns (mpllm.quantize). One group for
    the whole image (its header has one); by default `default_group(dim)`,
    dim rounded up to a multiple of 32: one scale per row of every dim-column
    matrix, which the certified head needs (formats.head_tiles.certifiable),
    and the finest that allows it. `--group 32` quantizes finer and loses the
    certificate, so the engine then scores every head row. Smallest (about a
    seventh of fp32), but a small model may not survive it: stories260K keeps
    24 % of its greedy choices.
  - int8 (Q8_0, llama2.c's runq.c scheme): one f32 scale per group of 32
    columns, a row's last group holding what is left where 32 does not
    divide it (stories260K's w2, 172 columns: five of 32 and one of 12) -
    `quantize.int8_group`; the engine quantizes each matvec's input in the
    same groups. A v2 checkpoint keeps its own codes and scales where its
    group is one the engine takes (`own_int8`), nothing requantized. Under a
    third of fp32's bytes; stories260K keeps 88 % of its greedy choices.
  - fp32: the checkpoint's numbers, as run.c multiplies them (the engine's
    sum runs in eight fixed lanes: kernels.h). For models too small for
    int8.
  The tied head is the embedding's first rows, in its format; only an int4
  head can carry the certified head's tiles.
- the norms (attention_norm, ffn_norm, the final norm) stay float32: D
  values each, and the engine applies them in float.
- the v0 file's RoPE tables are not kept: the image bakes its own table
  (mpllm.formats.rope) for the engine's split-half rotation.

RoPE: llama2.c rotates adjacent pairs (2i, 2i+1) of each head; the engine
rotates (i, i + half). The rotation is the same once q's and k's rows are
permuted within each head, new row i <- old 2i and new row i + half <- old
2i + 1 (`rope_row_order`): q.k sums the same products in another order, so
attention scores agree to float rounding (tests/test_convert_llama2c.py
proves it on the fp32 forward). v is not rotated and keeps its order.

Stopping: llama2.c's run.c stops at BOS (a model ends a story by starting
the next one); EOS (2) also ends a text. The image's tokenizer lists both
(special_ids = [BOS, EOS]) and the image's eot_id is EOS: the id the header
names as end of text, which the board's tokenizer checks against; the board
stops at either (llm_tokenizer.Tokenizer.stop_ids).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats.align import align_up
from .formats.image import BLOCK_COLS
from .formats.llama2c import Llama2cCheckpoint
from .formats.model import (
    WEIGHT_FORMATS,
    Config,
    F32Matrix,
    LayerWeights,
    Matrix,
    Q8Matrix,
    Weights,
)
from .quantize import quantize_int4, quantize_int8


def default_group(dim: int) -> int:
    """The int4 group a checkpoint of this dim gets (see the module doc)."""
    return align_up(dim, BLOCK_COLS)
#: llama2.c's RMSNorm epsilon (run.c: 1e-5f)
NORM_EPS = 1e-5
#: llama2.c's RoPE base
ROPE_THETA = 10000.0


def rope_row_order(head_size: int, n_heads: int) -> np.ndarray:
    """Row index per new row of a q or k projection: within each head, the
    even rows (pair firsts) then the odd rows (pair seconds)."""
    half = head_size // 2
    within = np.concatenate([2 * np.arange(half), 2 * np.arange(half) + 1])
    return (np.arange(n_heads)[:, None] * head_size + within[None, :]).reshape(-1)


def split_half_checkpoint(ck: Llama2cCheckpoint) -> dict[str, np.ndarray]:
    """wq and wk of every layer with their rows in the engine's RoPE order."""
    c = ck.config
    return {"wq": ck.layers["wq"][:, rope_row_order(c.head_dim, c.n_heads)],
            "wk": ck.layers["wk"][:, rope_row_order(c.head_dim, c.n_kv_heads)]}


def to_weights(ck: Llama2cCheckpoint, group: int | None = None,
               weights: str = "int4") -> Weights:
    """The engine's Weights of a checkpoint: family llama2c (no PLE), every
    matrix in `weights`' format (int4: group None is default_group; int8:
    quantize.int8_group, a v2 checkpoint's own codes where their group is one
    the engine takes; fp32), the norms float32, q and k rows permuted for
    split-half RoPE."""
    c = ck.config
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights {weights!r}: one of {', '.join(WEIGHT_FORMATS)}")
    if group is None:
        group = default_group(c.dim)
    cfg = Config(vocab_in=c.vocab_size, vocab_out=c.vocab_size, dim=c.dim,
                 n_layers=c.n_layers, n_heads=c.n_heads, ffn=c.hidden_dim, ple_dim=0,
                 seq_len=c.seq_len, group=group, rope_theta=ROPE_THETA,
                 tied_head=c.shared_classifier, family="llama2c",
                 n_kv_heads=c.n_kv_heads, norm_eps=NORM_EPS)  # type: ignore[call-arg]
    qk = split_half_checkpoint(ck)

    raw = own_int8(ck) if weights == "int8" else {}

    def q4(w: np.ndarray, what: str, key: tuple[str, int] | None = None) -> Matrix:
        if weights == "fp32":
            return F32Matrix(np.ascontiguousarray(w, np.float32))
        if weights == "int8":
            return raw[key] if key in raw else quantize_int8(w)
        try:
            return quantize_int4(w, group)
        except ValueError as e:  # a weight too large for an fp16 scale
            raise ValueError(f"{what}: {e}") from None

    layers = []
    for i in range(c.n_layers):
        def m(name: str, i: int = i) -> Matrix:
            return q4(ck.layers[name][i], f"layer {i} {name}", (name, i))

        qkv = np.concatenate([qk["wq"][i], qk["wk"][i], ck.layers["wv"][i]])
        layers.append(LayerWeights(
            attn_norm=ck.attention_norm[i].astype(np.float32),
            qkv=q4(qkv, f"layer {i} wq/wk/wv", ("qkv", i)), attn_proj=m("wo"),
            ffn_norm=ck.ffn_norm[i].astype(np.float32), gate=m("w1"), up=m("w3"),
            down=m("w2"), ple_gate=None, ple_proj=None,  # type: ignore[arg-type]
            ple_norm=None))  # type: ignore[arg-type]
    return Weights(config=cfg, tok_emb=q4(ck.tok_embeddings, "tok_embeddings",
                                          ("tok_embeddings", 0)),
                   ple_model_proj=None, ple_proj_norm=None,  # type: ignore[arg-type]
                   ple_table=None, layers=layers,  # type: ignore[arg-type]
                   out_norm=ck.norm.astype(np.float32),
                   head=None if c.shared_classifier else q4(ck.output, "the classifier",
                                                            ("the classifier", 0)))


def own_int8(ck: Llama2cCheckpoint) -> dict[tuple[str, int], Q8Matrix]:
    """A v2 (Q8_0) checkpoint's own int8 codes and scales as the engine's int8
    matrices, keyed (tensor, layer) like to_weights asks (qkv: wq, wk, wv
    stacked, q and k rows in the engine's RoPE order), for every tensor whose
    group the engine takes (a multiple of 32 below the row, or the whole row:
    image_format.h KIND_Q8); the rest are left to quantize_int8. Nothing is
    requantized: value = code * scale exactly as llama2.c's runq.c reads it."""
    c, gs = ck.config, ck.group_size
    out: dict[tuple[str, int], Q8Matrix] = {}
    if ck.version != 2 or not ck.q80:
        return out

    def ok(cols: int) -> bool:
        return gs == cols or (gs < cols and gs % BLOCK_COLS == 0)

    def mat(q: np.ndarray, sc: np.ndarray) -> Q8Matrix:
        return Q8Matrix(np.ascontiguousarray(q), np.ascontiguousarray(sc, np.float32), gs)

    for key in ("tok_embeddings", "the classifier"):
        if key in ck.q80 and ok(c.dim):
            out[(key, 0)] = mat(*ck.q80[key])
    for name in ("wo", "w1", "w2", "w3"):
        if name in ck.q80 and ok(ck.q80[name][0].shape[-1]):
            for i in range(c.n_layers):
                out[(name, i)] = mat(ck.q80[name][0][i], ck.q80[name][1][i])
    if all(n in ck.q80 for n in ("wq", "wk", "wv")) and ok(c.dim):
        oq = rope_row_order(c.head_dim, c.n_heads)
        ok_ = rope_row_order(c.head_dim, c.n_kv_heads)
        for i in range(c.n_layers):
            q = np.concatenate([ck.q80["wq"][0][i][oq], ck.q80["wk"][0][i][ok_],
                                ck.q80["wv"][0][i]])
            sc = np.concatenate([ck.q80["wq"][1][i][oq], ck.q80["wk"][1][i][ok_],
                                 ck.q80["wv"][1][i]])
            out[("qkv", i)] = mat(q, sc)
    return out



#: positions the quality figure compares (the converter's default)
QUALITY_POSITIONS = 256


@dataclass(frozen=True)
class Quality:
    """The quantized engine against the checkpoint's fp32 forward, teacher-forced
    on the same ids: mean and largest |logit difference| over every position
    and vocabulary entry, and the share of positions whose greedy choice agrees."""

    positions: int
    mean_abs: float
    max_abs: float
    greedy_agree: float

    def line(self) -> str:
        return (f"quality: quantized engine vs fp32 forward over {self.positions} positions: "
                f"mean |logit diff| {self.mean_abs:.4f}, max {self.max_abs:.3f}, greedy "
                f"agreement {100 * self.greedy_agree:.1f} %")


def quality_ids(ck: Llama2cCheckpoint, positions: int = QUALITY_POSITIONS) -> list[int]:
    """The ids the quality figure feeds: BOS, then the fp32 model's own greedy
    text (past a story's end too: it starts the next one), up to `positions`."""
    from .formats.llama2c import BOS_ID
    from .reference.llama2c import Llama2c

    n = min(positions, ck.config.seq_len)
    story = Llama2c(ck).generate([[BOS_ID]], n - 1)[0]
    return [BOS_ID, *story][:n]


def quality(image: str | os.PathLike[str], ck: Llama2cCheckpoint, llm_module: Any,
            positions: int = QUALITY_POSITIONS) -> Quality:
    """The quality figure of `image` (converted from `ck`) run by the engine
    `llm_module` (the host's `_llm`)."""
    from .reference.llama2c import Llama2c

    ids = quality_ids(ck, positions)
    ref = Llama2c(ck)
    cache = ref.new_cache(1)
    want = np.stack([ref.step([t], p, cache)[0] for p, t in enumerate(ids)])
    got = np.empty_like(want)
    with llm_module.Model(os.fspath(image)) as m:
        m.sampler(0.0, 0, 0)
        for p, t in enumerate(ids):
            m.prefill([t])
            got[p] = np.frombuffer(m.logits(), "<f4")
    diff = np.abs(got.astype(np.float64) - want)
    agree = float((got.argmax(axis=1) == want.argmax(axis=1)).mean())
    return Quality(len(ids), float(diff.mean()), float(diff.max()), agree)
