"""In-memory form of a model the engine runs, shared by every host tool: the
esp32-ai PLE TinyStories model (family "esp32ai") or llama2.c's Llama (family
"llama2c": no PLE, n_kv_heads may be below n_heads, rmsnorm epsilon 1e-5).

Both readers (`mpllm.formats.esp32ai` for the published model.bin, `mpllm.formats.image` for
our flash image) produce a `Weights`; the converter, the reference numerics and
the PyTorch twin consume one. Quantized matrices keep their integer values and
fp16 scales exactly as the source stored them, so nothing here rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class AttentionGeometry:
    """head_dim and kv_dim from a config's dim, n_heads and n_kv_heads (0 means
    n_heads), defined once for every config that has them (`Config`, llama2.c's
    `Llama2cConfig`, the cost model's `Shape`): query head h reads key/value
    head h // (n_heads / kv_heads), and a cached K or V row is kv_dim wide."""

    dim: int
    n_heads: int
    n_kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Config(AttentionGeometry):
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
    family: str = "esp32ai"  # "esp32ai" | "llama2c" (FAMILIES)
    n_kv_heads: int = 0  # 0 means n_heads
    norm_eps: float = 1e-6  # rmsnorm epsilon

    def __post_init__(self) -> None:
        # One spelling per model, so configs compare equal exactly when they
        # describe the same model: n_kv_heads == n_heads is the default 0, and
        # norm_eps is the float32 the engine (and the image header) holds.
        if self.n_kv_heads == self.n_heads:
            object.__setattr__(self, "n_kv_heads", 0)
        object.__setattr__(self, "norm_eps", float(np.float32(self.norm_eps)))

    @property
    def has_ple(self) -> bool:
        return self.family == "esp32ai"


# The families a Config may name, in the order of the image header's arch field.
FAMILIES = ("esp32ai", "llama2c")


class Shaped:
    """rows and cols, read off the array with one entry a weight (the codes,
    or the floats): what every format's shape is, defined once."""

    def elements(self) -> np.ndarray:
        raise NotImplementedError

    @property
    def rows(self) -> int:
        return int(self.elements().shape[0])

    @property
    def cols(self) -> int:
        return int(self.elements().shape[1])


@dataclass
class GroupedMatrix(Shaped):
    """Integer codes q [rows, cols] with one scale per group of `group`
    consecutive columns of a row (the last group may be shorter): value =
    q * scale. QMatrix and Q8Matrix are its two formats."""

    q: np.ndarray  # int8 [rows, cols]
    scales: np.ndarray  # [rows, n_groups]
    group: int

    def elements(self) -> np.ndarray:
        return self.q

    @property
    def n_groups(self) -> int:
        return -(-self.cols // self.group)

    def take_rows(self, n: int) -> GroupedMatrix:
        """The first n rows, a matrix of self's own format."""
        return type(self)(self.q[:n], self.scales[:n], self.group)

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], value = float(q) * scale: one rounding (exact for
        int4 codes and fp16 scales), as the engine's row lookup computes it."""
        scale = np.repeat(self.scales.astype(np.float32), self.group, axis=1)[:, : self.cols]
        return self.q.astype(np.float32) * scale


@dataclass
class QMatrix(GroupedMatrix):
    """int4 matrix: q[r, c] in -8..7 (code - 8), one fp16 scale (float16
    scales [rows, n_groups]) per group."""


@dataclass
class Q8Matrix(GroupedMatrix):
    """int8 matrix in groups (Q8_0, llama2.c's runq.c scheme): one f32 scale
    (float32 scales [rows, n_groups]) per group of `group` columns, a row's
    last group holding what is left (quantize.int8_group)."""


@dataclass
class F32Matrix(Shaped):
    """fp32 matrix: the checkpoint's own numbers."""

    w: np.ndarray  # float32 [rows, cols]

    def elements(self) -> np.ndarray:
        return self.w

    def take_rows(self, n: int) -> F32Matrix:
        return F32Matrix(self.w[:n])

    def dequantize(self) -> np.ndarray:
        return np.asarray(self.w, dtype=np.float32)


#: a matrix in any of the image's weight formats
Matrix = QMatrix | Q8Matrix | F32Matrix

#: the --weights names of the formats, smallest first
WEIGHT_FORMATS = ("int4", "int8", "fp32")


def weight_format(m: Matrix) -> str:
    """The --weights name of a matrix's format."""
    return "int4" if isinstance(m, QMatrix) else "int8" if isinstance(m, Q8Matrix) else "fp32"


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # f32 [D]
    qkv: Matrix  # [D + 2*kv_dim, D]: q rows, k rows, v rows
    attn_proj: Matrix  # [D, D]
    ffn_norm: np.ndarray  # f32 [D]
    gate: Matrix  # [F, D]
    up: Matrix  # [F, D]
    down: Matrix  # [D, F]
    ple_gate: QMatrix | None  # [P, D]; None without PLE (llama2c)
    ple_proj: QMatrix | None  # [D, P]; None without PLE
    ple_norm: np.ndarray | None  # f32 [D]; None without PLE


# Field order of LayerWeights is the file order of both formats; a family
# without PLE has only the fields before PLE_LAYER_FIELDS.
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
PLE_LAYER_FIELDS = ("ple_gate", "ple_proj", "ple_norm")


def layer_fields(cfg: Config) -> tuple[str, ...]:
    """The LayerWeights fields a layer of this config has, in file order."""
    return LAYER_FIELDS if cfg.has_ple else LAYER_FIELDS[: -len(PLE_LAYER_FIELDS)]


@dataclass
class Weights:
    config: Config
    tok_emb: Matrix  # [vocab_in, D]
    ple_model_proj: QMatrix | None  # [L*P, D]; None without PLE (llama2c)
    ple_proj_norm: np.ndarray | None  # f32 [P]; None without PLE
    ple_table: QMatrix | None  # [vocab_in, L*P]; None without PLE
    layers: list[LayerWeights] = field(default_factory=list)
    out_norm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    head: Matrix | None = None  # None when tied: first vocab_out rows of tok_emb

    def output_head(self) -> Matrix:
        if self.head is not None:
            return self.head
        return self.tok_emb.take_rows(self.config.vocab_out)
