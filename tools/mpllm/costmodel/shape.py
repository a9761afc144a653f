"""The dimensions the cost depends on (`Shape`, `RELEASE`), the engine's
stages, batch limits and memory regions, the matrices of one token
(`matrices`), and the byte and cache-line geometry of rows and streams.

The bottom of the package with s3: drafting imports `Shape` from here, so
nothing here may import drafting (or anything that does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..boards import STAGES  # re-exported: the engine's timed stages, one definition
from ..formats.drafts_table import MAX_DRAFT
from ..formats.image import q4_row_bytes  # re-exported: the image layout's one definition
from ..formats.model import WEIGHT_FORMATS, AttentionGeometry
from ..quantize import int8_group
from .s3 import TILE_ROWS

__all__ = [
    "MODEL_STAGES",
    "PREFILL_BATCH",
    "REGIONS",
    "RELEASE",
    "STAGES",
    "VERIFY_MAX",
    "Mat",
    "Shape",
    "lines_touched",
    "matrices",
    "matrix_row_bytes",
    "n_groups",
    "one_group_a_row",
    "ple_record_bytes",
    "q4_row_bytes",
    "story_positions",
    "stream_lines",
]

#: the engine's stages and what a token costs on the board around them:
#: llm.py's MicroPython loop ("python") and the instruction-cache refills of
#: the code a token runs ("icache"); the engine's own timers see neither
MODEL_STAGES = (*STAGES, "python", "icache")
#: tokens one prefill pass carries (engine_state.h LLM_BATCH_MAX): their
#: weights are read once per pass
PREFILL_BATCH = 8
#: positions one verification pass carries (llm.h LLM_VERIFY_MAX): the last
#: token and the image's drafts at most
VERIFY_MAX = MAX_DRAFT + 1
REGIONS = ("flash", "fast", "bulk")


@dataclass(frozen=True)
class Shape(AttentionGeometry):
    """The dimensions the cost depends on. Two families share it: the
    esp32-ai model (PLE, n_kv_heads == n_heads) and llama2.c's Llama
    (ple_dim 0: no PLE stage; n_kv_heads < n_heads: grouped-query attention,
    query head h reading kv head h // (n_heads / n_kv_heads)). n_kv_heads 0
    means n_heads (set so at construction)."""

    dim: int = 96
    n_layers: int = 6
    n_heads: int = 4
    ffn: int = 66
    ple_dim: int = 128
    vocab_out: int = 25353
    seq_len: int = 256
    group: int = 128
    n_kv_heads: int = 0
    #: the image's weight format (formats.model.WEIGHT_FORMATS): every matrix
    #: int4 (groups of `group`), int8 (quantize.int8_group) or fp32
    weights: str = "int4"

    def __post_init__(self) -> None:
        if self.n_kv_heads == 0:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads {self.n_kv_heads} must divide n_heads {self.n_heads}")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights {self.weights!r}: one of {', '.join(WEIGHT_FORMATS)}")

    @property
    def has_ple(self) -> bool:
        return self.ple_dim > 0

    @property
    def n_tiles(self) -> int:
        return cdiv(self.vocab_out, TILE_ROWS)

    @classmethod
    def from_config(cls, cfg: Mapping[str, object]) -> Shape:
        """From `_llm.Model.config()` (or any mapping with its keys)."""
        return cls(dim=int(cfg["dim"]), n_layers=int(cfg["n_layers"]),
                   n_heads=int(cfg["n_heads"]), ffn=int(cfg["ffn"]),
                   ple_dim=int(cfg["ple_dim"]), vocab_out=int(cfg["vocab_out"]),
                   seq_len=int(cfg["seq_len"]), group=int(cfg["group"]),
                   n_kv_heads=int(cfg.get("n_kv_heads", 0)),
                   weights=str(cfg.get("weights", "int4")))


RELEASE = Shape()


@dataclass(frozen=True)
class Mat:
    name: str
    rows: int
    cols: int
    per_token: int
    stage: str


def matrices(s: Shape) -> list[Mat]:
    """Every matvec of one token, with how often it runs and in which stage
    (the engine's order; without PLE its three matrices are absent)."""
    d, L = s.dim, s.n_layers
    ple = s.has_ple
    return [
        *([Mat("ple_model_proj", L * s.ple_dim, d, 1, "embed")] if ple else []),
        Mat("qkv", d + 2 * s.kv_dim, d, L, "attn"),
        Mat("attn_proj", d, d, L, "attn"),
        Mat("gate", s.ffn, d, L, "ffn"),
        Mat("up", s.ffn, d, L, "ffn"),
        Mat("down", d, s.ffn, L, "ffn"),
        *([Mat("ple_gate", s.ple_dim, d, L, "ple"),
           Mat("ple_proj", d, s.ple_dim, L, "ple")] if ple else []),
        Mat("head", s.vocab_out, d, 1, "head"),
    ]


def cdiv(a: float, b: int) -> int:
    return -(-math.ceil(a) // b)


def n_groups(cols: int, group: int) -> int:
    return cdiv(cols, group)


def matrix_row_bytes(s: Shape, cols: int) -> int:
    """Bytes one staged row of a `cols`-column matrix occupies in s's weight
    format, its scales included (image_format.h: int4 nibbles + an f32 per
    group; int8 codes padded to 32 + an f32 per group; fp32 padded to 4)."""
    if s.weights == "fp32":
        return 4 * cdiv(cols, 4) * 4
    if s.weights == "int8":
        return cdiv(cols, 32) * 32 + 4 * n_groups(cols, int8_group(cols))
    return q4_row_bytes(cols) + 4 * n_groups(cols, s.group)


def one_group_a_row(s: Shape) -> bool:
    """Whether the head rows are one int4 scale group: what the certified head
    and V cached as int16 dots need (only int4 matrices have either)."""
    return s.weights == "int4" and n_groups(s.dim, s.group) == 1


def ple_record_bytes(s: Shape) -> int:
    """One KIND_ROWS record: codes, fp16 scales, padding to 16."""
    lp = s.n_layers * s.ple_dim
    raw = cdiv(lp, 2) + 2 * n_groups(lp, s.group)
    return cdiv(raw, 16) * 16


def lines_touched(offset: int, nbytes: int, line: int) -> int:
    """Cache lines covering bytes [offset, offset + nbytes)."""
    if nbytes <= 0:
        return 0
    return (offset + nbytes - 1) // line - offset // line + 1


def stream_lines(nbytes: float, line: int) -> float:
    """Lines of a contiguous, line-aligned stream of nbytes."""
    return math.ceil(nbytes / line) if nbytes > 0 else 0


def story_positions(n_prompt: int = 4, n_generated: int = 200) -> list[int]:
    """Positions of the generated tokens of one story: the anchors were timed
    on 200 tokens after the 4-token "Once upon a time" (esp32-ai firmware's
    N_GENERATE = 200 and PROMPT_IDS), i.e. forward passes at positions 4..203."""
    return list(range(n_prompt, n_prompt + n_generated))
