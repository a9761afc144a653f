"""In-memory form of a PLE TinyStories model, shared by every host tool.

Both readers (`mpllm.formats.esp32ai` for the published model.bin, `mpllm.formats.image` for
our flash image) produce a `Weights`; the converter, the reference numerics and
the PyTorch twin consume one. Quantized matrices keep their integer values and
fp16 scales exactly as the source stored them, so nothing here rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Config:
    vocab_in: int  # embedding / PLE rows
    vocab_out: int  # logits per step (tokenizer size)
    dim: int
    n_layers: int
    n_heads: int
    ffn: int
    ple_dim: int
    seq_len: int
    group: int
    rope_theta: float = 10000.0
    tied_head: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass
class QMatrix:
    """int4 matrix: q[r, c] in -8..7 (code - 8), one fp16 scale per group."""

    q: np.ndarray  # int8 [rows, cols]
    scales: np.ndarray  # float16 [rows, n_groups]
    group: int

    @property
    def rows(self) -> int:
        return int(self.q.shape[0])

    @property
    def cols(self) -> int:
        return int(self.q.shape[1])

    @property
    def n_groups(self) -> int:
        return -(-self.cols // self.group)

    def take_rows(self, n: int) -> QMatrix:
        return QMatrix(self.q[:n], self.scales[:n], self.group)

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], value = q * scale (exact in float32)."""
        scale = np.repeat(self.scales.astype(np.float32), self.group, axis=1)[:, : self.cols]
        return self.q.astype(np.float32) * scale


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # f32 [D]
    qkv: QMatrix  # [3D, D]
    attn_proj: QMatrix  # [D, D]
    ffn_norm: np.ndarray  # f32 [D]
    gate: QMatrix  # [F, D]
    up: QMatrix  # [F, D]
    down: QMatrix  # [D, F]
    ple_gate: QMatrix  # [P, D]
    ple_proj: QMatrix  # [D, P]
    ple_norm: np.ndarray  # f32 [D]


# Field order of LayerWeights is the file order of both formats.
LAYER_FIELDS = (
    "attn_norm",
    "qkv",
    "attn_proj",
    "ffn_norm",
    "gate",
    "up",
    "down",
    "ple_gate",
    "ple_proj",
    "ple_norm",
)


@dataclass
class Weights:
    config: Config
    tok_emb: QMatrix  # [vocab_in, D]
    ple_model_proj: QMatrix  # [L*P, D]
    ple_proj_norm: np.ndarray  # f32 [P]
    ple_table: QMatrix  # [vocab_in, L*P]
    layers: list[LayerWeights] = field(default_factory=list)
    out_norm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    head: QMatrix | None = None  # None when tied: first vocab_out rows of tok_emb

    def output_head(self) -> QMatrix:
        if self.head is not None:
            return self.head
        return self.tok_emb.take_rows(self.config.vocab_out)
