"""Cost model: predicted ms/token per stage on the ESP32-S3 N16R8 (DESIGN §9).

There is no board here, so speed is predicted from what a token costs:

    time(stage) = sum over memory tiers of bytes / bandwidth(tier)
                + cycles / (CPU_HZ * cores)

  * bytes per region per token: for our build, the engine's own counters
    (`_llm.Model.stats()["bytes"]` on the host port, which charges every
    weight, norm, RoPE row, embedding/PLE row and KV read/write to the region
    it was placed in). They are split into stages with the analytic per-stage
    formulas below, after checking that the formulas reproduce the measured
    region totals byte for byte (`check_bytes`). The other two builds are
    someone else's firmware; their bytes come from the same formulas with
    their published placement and weight formats.
  * PIE instructions per matvec: measured by running kernels_pie.c through
    the exact host model of the vector unit (pie_model.c), which counts every
    executed instruction (`measure_pie_counts`); `pie_matvec_instructions` is
    the closed form those counts obey (asserted by tests).
  * scalar operations per stage (norms, activation quantization, RoPE,
    attention's fp32 dot products and softmax, SiLU/GELU, the sampler), counted
    from the engine's forward pass; attention's grows with the position, so
    it is averaged over a story (prompt of 4 tokens + 200 generated).

Memory and compute are added, not overlapped: the LX7 is an in-order core
and a data-cache miss stalls it until the line arrives. Two cores split a
matvec's compute but share the one PSRAM/flash bus, so only the cycles term
is divided.

Calibration: every constant below is either a published figure (source
given) or an operation count read off source code. The only two fitted
numbers are C_MAC_I8 (cycles per scalar int8 MAC of the stock kernel) and
C_OP (cycles per other scalar op, int or float). They are solved exactly from
two stock anchors -- the head (59 ms) and attention (20 ms) -- and then held
fixed. Everything else is a prediction: the stock FFN, PLE and total, the
PIE + int4 build's total, and ours.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .atomic import atomic_path

STAGES = ("embed", "attn", "ffn", "ple", "head", "sample")
REGIONS = ("flash", "fast", "bulk")

# ---------------------------------------------------------------------------
# Constants. Every one is a published figure or an op count; see each source.
# ---------------------------------------------------------------------------

#: CPU clock (DESIGN §7 sdkconfig: 240 MHz; the stock firmware's arduino-cli
#: FQBN also sets CPUFreq=240).
CPU_HZ = 240e6
#: PSRAM read bandwidth through the data cache with 32-byte lines: 60.7 MB/s,
#: measured by esp32-ai on this model's head scan (DESIGN §9; the same figure
#: is quoted in esp32-ai's firmware/esp32_tinystories sources).
PSRAM_BPS_LINE32 = 60.7e6
#: ... and with 64-byte lines: ~86 MB/s (DESIGN §7 and §9, same measurement).
PSRAM_BPS_LINE64 = 86e6
#: A random 512-byte row from memory-mapped flash costs ~20 us (DESIGN §9):
#: applied as 512 B / 20 us to every byte read from flash.
FLASH_ROW_BYTES = 512
FLASH_ROW_S = 20e-6
FLASH_BPS = FLASH_ROW_BYTES / FLASH_ROW_S
#: Internal SRAM is read by the load instructions themselves (no cache
#: miss): its cost is inside the instruction/op counts, not a bandwidth term.
SRAM_BPS = float("inf")
#: One PIE instruction issues per cycle (single-issue LX7 pipeline; the PIE
#: MAC is 16 int8 products per instruction, DESIGN §6/§9). Not fitted.
PIE_CYCLES = 1.0

# Scalar op counts of the routines the forward pass calls, read off the
# sources (native/engine/mathf.c for ours; the stock runtime calls newlib's
# expf/erff, assumed to cost the same -- a stated assumption, not a fit).
#: llm_expf: range reduction (mul, 2 add, cvt, 2 mul+2 add), degree-4
#: Horner (8), final (r*r, mul, 2 add), exponent build and scale (3), 2 tests.
EXPF_OPS = 22
#: llm_erff on |x| < 1 (where GELU inputs mostly fall): degree-7 Horner in
#: x^2 (14), x^2, the final ax + ax*p (2), sign and range tests (5).
ERFF_OPS = 22
#: llm_logf: classify (4), mantissa split (6), s = f/(2+f) (div), Horner (6),
#: the final combination (8).
LOGF_OPS = 24
#: The S3 FPU has no one-step divide or square root: div0.s/divn.s and
#: sqrt0.s/nexp01.s + Newton steps expand to about ten instructions each.
DIV_OPS = 10
SQRT_OPS = 10
#: The stock scalar int4 kernel (esp32-ai matvec_q8_range) unpacks every
#: weight in the inner loop: byte load, parity test, shift or mask, -8.
Q4_UNPACK_OPS = 4
#: Per output row of a matvec: (float)g, * scale, acc +=, * xscale, store,
#: loop; the PIE kernels add rur.accx_0's result to the -8*sum(x) correction.
ROW_OPS_SCALAR = 6
ROW_OPS_PIE = 7
#: esp32-ai's half2float (fp16 group scale, converted once per row and group
#: by the stock int4 kernel): normal-number path.
HALF2FLOAT_OPS = 8

# Published anchors (DESIGN §9), all on the release model and an N16R8 board.
ANCHORS_MS: dict[str, dict[str, float]] = {
    "stock": {"head": 59.0, "attn": 20.0, "ple": 6.4, "ffn": 6.4, "total": 95.0},
    "pie_int4": {"total": 43.0},
}
ANCHORS_TOK_S = {"stock": 10.3, "pie_int4": 22.6, "research": 67.0}
ANCHOR_SOURCES = {
    "stock": "esp32-ai stock firmware, ~95 ms/token (10.3 tok/s); stage profile head ~59, "
             "attention ~20, PLE ~6.4, FFN ~6.4 ms (DESIGN §9)",
    "pie_int4": "esp32-ai PIE kernels + int4 head/core + logits in SRAM: ~43 ms/token, "
                "22.6 tok/s (DESIGN §9)",
    "research": "esp32-ai research branch: core in SRAM, 64-byte lines, int8 KV, exact pruned "
                "head, greedy only: ~67 tok/s (DESIGN §9; not modelled here)",
}
#: Tolerance the model is held to on the anchors (tests/test_costmodel.py):
#: the two fitted stages are exact by construction; the predicted ones must be
#: within this fraction of the published figure.
ANCHOR_TOLERANCE = 0.25


@dataclass(frozen=True)
class Shape:
    """The dimensions the cost depends on."""

    dim: int = 96
    n_layers: int = 6
    n_heads: int = 4
    ffn: int = 66
    ple_dim: int = 128
    vocab_out: int = 25353
    seq_len: int = 256
    group: int = 128

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_config(cls, cfg: Mapping[str, object]) -> Shape:
        """From `_llm.Model.config()` (or any mapping with its keys)."""
        return cls(dim=int(cfg["dim"]), n_layers=int(cfg["n_layers"]),
                   n_heads=int(cfg["n_heads"]), ffn=int(cfg["ffn"]),
                   ple_dim=int(cfg["ple_dim"]), vocab_out=int(cfg["vocab_out"]),
                   seq_len=int(cfg["seq_len"]), group=int(cfg["group"]))


RELEASE = Shape()


@dataclass(frozen=True)
class Mat:
    name: str
    rows: int
    cols: int
    per_token: int
    stage: str


def matrices(s: Shape) -> list[Mat]:
    """Every matvec of one token, with how often it runs and in which stage."""
    d, L = s.dim, s.n_layers
    return [
        Mat("ple_model_proj", L * s.ple_dim, d, 1, "embed"),
        Mat("qkv", 3 * d, d, L, "attn"),
        Mat("attn_proj", d, d, L, "attn"),
        Mat("gate", s.ffn, d, L, "ffn"),
        Mat("up", s.ffn, d, L, "ffn"),
        Mat("down", d, s.ffn, L, "ffn"),
        Mat("ple_gate", s.ple_dim, d, L, "ple"),
        Mat("ple_proj", d, s.ple_dim, L, "ple"),
        Mat("head", s.vocab_out, d, 1, "head"),
    ]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def n_groups(cols: int, group: int) -> int:
    return _cdiv(cols, group)


# ---------------------------------------------------------------------------
# PIE instruction counts
# ---------------------------------------------------------------------------

def pie_matvec_instructions(rows: int, cols: int, group: int) -> int:
    """PIE instructions of one full llm_matvec_q4_pie call (kernels_pie.c).

    The closed form of what the host model counts (tests/test_pie_kernels.py
    asserts the same): per call the two broadcasts and the activation
    prologue, per group of nb blocks 5 + 2*nb for the -8*sum(x) correction;
    per row ssai, the first block's load/split (4), 6 per further block, the
    last block's 2 MACs, and per group zero.accx + 2 nops + rur.
    """
    n_blocks = _cdiv(cols, 32)
    per_group = n_blocks if group >= cols else group // 32
    groups = [min(per_group, n_blocks - b) for b in range(0, n_blocks, per_group)]
    per_call = 3 + sum(5 + 2 * nb for nb in groups)
    per_row = 1 + 4 + 6 * n_blocks - 4 + 4 * len(groups)
    return per_call + rows * per_row


def upstream_pie_instructions(rows: int, cols: int) -> int:
    """esp32-ai's int4 PIE head kernel (firmware/esp32_tinystories, head_i4_range):
    per row zero.accx, the mask load, 8 PIE instructions per 32-column block
    (weight load, andq, vsr.32, andq, two activation loads, two MACs) and
    rur.accx_0; ssai once per call. Used for the PIE + int4 build."""
    return 1 + rows * (3 + 8 * _cdiv(cols, 32))


_COUNT_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "pie_model.h"
/* argv: rows cols group ...; prints the PIE instructions of one full call */
int main(int argc, char **argv) {
    for (int a = 1; a + 2 < argc; a += 3) {
        uint32_t rows = (uint32_t)atol(argv[a]), cols = (uint32_t)atol(argv[a + 1]);
        uint32_t group = (uint32_t)atol(argv[a + 2]);
        uint32_t nb = (cols + 31u) / 32u, ng = (cols + group - 1u) / group;
        uint8_t *codes = aligned_alloc(16, (size_t)rows * nb * 16u);
        float *scales = aligned_alloc(16, ((size_t)rows * ng * 4u + 15u) / 16u * 16u);
        int8_t *xq = aligned_alloc(16, nb * 32u);
        float *y = aligned_alloc(16, ((size_t)rows * 4u + 15u) / 16u * 16u);
        if (!codes || !scales || !xq || !y) { fprintf(stderr, "out of memory\n"); return 2; }
        memset(codes, 0x88, (size_t)rows * nb * 16u);
        for (size_t i = 0; i < (size_t)rows * ng; i++) scales[i] = 1.0f;
        for (uint32_t i = 0; i < nb * 32u; i++) xq[i] = (int8_t)(i < cols ? (i % 7) - 3 : 0);
        llm_q4 w = {codes, scales, rows, cols, group, ng, nb * 16u};
        llm_pie_counts_reset();
        llm_matvec_q4_pie(&w, xq, 1.0f, y, 0, rows);
        printf("%u %u %u %llu\n", rows, cols, group, (unsigned long long)llm_pie_counts_total());
        free(codes); free(scales); free(xq); free(y);
    }
    return 0;
}
"""


def repo_root() -> Path:
    """The checkout this module runs from (tools/mpllm/ -> root)."""
    return Path(__file__).resolve().parent.parent.parent


def measure_pie_counts(
    shapes: Iterable[tuple[int, int, int]],
    *,
    engine_dir: Path | None = None,
    build_dir: Path | None = None,
    compiler: str | None = None,
) -> dict[tuple[int, int, int], int]:
    """PIE instructions per call of llm_matvec_q4_pie for each (rows, cols, group),
    counted by the exact host model of the vector unit.

    Compiles a small driver against native/engine/kernels_pie.c and
    pie_model.c (needs a C compiler: $CC, else gcc or cc). Raises
    FileNotFoundError when the engine sources or a compiler are missing and
    RuntimeError when the build or the run fails."""
    shapes = [tuple(int(v) for v in s) for s in shapes]
    engine = engine_dir or repo_root() / "native" / "engine"
    sources = [engine / "kernels_pie.c", engine / "pie_model.c"]
    for src in sources:
        if not src.is_file():
            raise FileNotFoundError(f"PIE counters need {src} (run from a source checkout)")
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FileNotFoundError("PIE counters need a C compiler (set CC or install gcc)")
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        driver = Path(tmp) / "pie_count.c"
        driver.write_text(_COUNT_DRIVER)
        exe = Path(tmp) / "pie_count"
        cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
               "-I", str(engine), str(driver), *map(str, sources), "-o", str(exe), "-lm"]
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"building the PIE counter failed:\n{built.stderr}")
        args = [str(v) for s in shapes for v in s]
        ran = subprocess.run([str(exe), *args], capture_output=True, text=True, check=False, timeout=300)
        if ran.returncode != 0:
            raise RuntimeError(f"the PIE counter failed:\n{ran.stdout}\n{ran.stderr}")
    out: dict[tuple[int, int, int], int] = {}
    for line in ran.stdout.splitlines():
        r, c, g, n = (int(v) for v in line.split())
        out[(r, c, g)] = n
    missing = [s for s in shapes if s not in out]
    if missing:
        raise RuntimeError(f"the PIE counter printed nothing for {missing}")
    return out


# ---------------------------------------------------------------------------
# Scalar operation counts (the forward pass of native/engine/engine.c)
# ---------------------------------------------------------------------------

def rmsnorm_ops(n: int) -> int:
    # ss += x*x (2n), ss/n + eps (2), sqrt, 1/., (w*x)*inv (2n)
    return 4 * n + 2 + SQRT_OPS + DIV_OPS


def quantize_ops(n: int) -> int:
    # |x| and max (2n), 127/xmax, x*inv + lrintf + two clamps + store (5n), xmax/127
    return 7 * n + 2 * DIV_OPS


def attention_ops(s: Shape, pos: int) -> float:
    """fp32 work of one layer's attention at `pos` (positions 0..pos)."""
    t, dh, h = pos + 1, s.head_dim, s.n_heads
    scores = t * (2 * dh + 3)  # dot (mul+add per dim), * 1/sqrt(dh), store, max
    softmax = t * (2 + EXPF_OPS)  # s - max, expf, denom +=
    weighted = t * 2 * dh  # ao[i] += w * v[i]
    finish = dh * (1 + DIV_OPS)  # zero ao, ao /= denom
    return h * (scores + softmax + weighted + finish)


def stage_scalar_ops(s: Shape, pos: int, *, sampler: str = "greedy",
                     top_k: int = 40) -> dict[str, float]:
    """Scalar ops per stage for one token at `pos`, matvec kernels excluded."""
    d, L, f, p, dh = s.dim, s.n_layers, s.ffn, s.ple_dim, s.head_dim
    lp = L * p
    embed = (3 * d  # embedding row: nibble select, -8, * scale
             + quantize_ops(d)
             + lp  # *= 1/sqrt(D)
             + L * rmsnorm_ops(p)
             + lp * 4 + L * HALF2FLOAT_OPS  # PLE row dequant
             + lp * 3)  # (c + t*sqrt(P)) * 0.707
    rope = 2 * s.n_heads * (dh // 2) * 6
    attn = L * (rmsnorm_ops(d) + quantize_ops(d) + rope + 2 * d  # KV store
                + quantize_ops(d) + d) + L * attention_ops(s, pos)
    ffn = L * (rmsnorm_ops(d) + quantize_ops(d) + f * (EXPF_OPS + DIV_OPS + 3)
               + quantize_ops(f) + d)
    ple = L * (quantize_ops(d) + p * (ERFF_OPS + 5) + quantize_ops(p) + rmsnorm_ops(d) + d)
    head = rmsnorm_ops(d) + quantize_ops(d)
    n = s.vocab_out
    if sampler == "greedy":
        sample = 2 * n  # load + compare per logit
    elif sampler == "argmax-nancheck":
        sample = 3 * n  # ours: NaN check, then the argmax
    elif sampler == "topk":
        # ours, temperature + top-k Gumbel-max: NaN check, one pass keeping
        # the k best (insertion sort: ~k*ln(n/k) insertions of ~k/2 moves),
        # the id sort, then per kept id x/T and a Gumbel draw (2 logf + PCG32)
        import math

        inserts = top_k * math.log(max(n / top_k, 1.0))
        sample = (3 * n + inserts * top_k / 2 * 3 + top_k * top_k
                  + top_k * (DIV_OPS + 2 * LOGF_OPS + 20))
    else:
        raise ValueError(f"unknown sampler {sampler!r}: greedy, argmax-nancheck or topk")
    return {"embed": embed, "attn": attn, "ffn": ffn, "ple": ple, "head": head,
            "sample": float(sample)}


def story_positions(n_prompt: int = 4, n_generated: int = 200) -> list[int]:
    """Positions of the generated tokens of one story: the anchors were timed
    on 200 tokens after the 4-token "Once upon a time" (esp32-ai firmware's
    N_GENERATE = 200 and PROMPT_IDS)."""
    return list(range(n_prompt, n_prompt + n_generated))


# ---------------------------------------------------------------------------
# Bytes per region (the engine's accounting, engine.c)
# ---------------------------------------------------------------------------

def q4_row_bytes(cols: int) -> int:
    """Codes of one row in the image's KIND_Q4 layout (32-column blocks)."""
    return _cdiv(cols, 32) * 16


def ple_record_bytes(s: Shape) -> int:
    """One KIND_ROWS record: codes, fp16 scales, padding to 16."""
    lp = s.n_layers * s.ple_dim
    raw = _cdiv(lp, 2) + 2 * n_groups(lp, s.group)
    return _cdiv(raw, 16) * 16


def engine_stage_bytes(s: Shape, pos: int, placement: Mapping[str, str] | None = None,
                       *, head: bool = True) -> dict[str, dict[str, int]]:
    """Bytes the engine charges per stage and region for one token at `pos`.

    `placement` maps "core", "head", "kv", "norms" to a region (default: the
    host/board plan: core and norms "fast", head and KV "bulk")."""
    pl = {"core": "fast", "head": "bulk", "kv": "bulk", "norms": "fast"}
    pl.update(placement or {})
    out = {st: dict.fromkeys(REGIONS, 0) for st in STAGES}
    for m in matrices(s):
        if m.name == "head" and not head:
            continue
        b = m.rows * q4_row_bytes(m.cols) + m.rows * n_groups(m.cols, s.group) * 4
        out[m.stage][pl["head" if m.name == "head" else "core"]] += b * m.per_token
    d, L = s.dim, s.n_layers
    out["embed"]["flash"] += q4_row_bytes(d) + n_groups(d, s.group) * 4  # embedding row
    out["embed"]["flash"] += ple_record_bytes(s)
    out["embed"]["flash"] += s.head_dim * 4  # this position's RoPE row
    out["attn"][pl["kv"]] += L * (2 * d * 4 + 2 * (pos + 1) * d * 4)
    out["embed"][pl["norms"]] += s.ple_dim * 4
    out["attn"][pl["norms"]] += L * d * 4
    out["ffn"][pl["norms"]] += L * d * 4
    out["ple"][pl["norms"]] += L * d * 4
    if head:
        out["head"][pl["norms"]] += d * 4
    return out


def run_region_bytes(s: Shape, n_prompt: int, n_steps: int,
                     placement: Mapping[str, str] | None = None) -> dict[str, int]:
    """Region totals the engine reports after prefill(n_prompt tokens) and
    n_steps step() calls from position 0 (head once per call)."""
    tot = dict.fromkeys(REGIONS, 0)
    for pos in range(n_prompt + n_steps):
        with_head = pos >= n_prompt - 1
        for st in engine_stage_bytes(s, pos, placement, head=with_head).values():
            for r, b in st.items():
                tot[r] += b
    return tot


# ---------------------------------------------------------------------------
# The three builds
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Build:
    """A firmware configuration, as far as the cost model needs to know it."""

    name: str
    label: str
    #: "scalar" (esp32-ai llm.h C loops), "pie-upstream" (esp32-ai's int4 PIE
    #: kernel), "pie" (ours, counted by the host model)
    kernels: str
    #: weight format and memory tier of the core (all matrices but the head)
    core: tuple[str, str]
    head: tuple[str, str]
    kv_tier: str
    logits_tier: str
    #: matvecs with at least this many rows are split over both cores
    split_rows: int
    sampler: str
    assumptions: tuple[str, ...] = field(default=())


BUILDS: dict[str, Build] = {
    "stock": Build(
        "stock", "stock esp32-ai", "scalar",
        core=("int4-flash", "flash"), head=("int8", "psram32"),
        kv_tier="psram32", logits_tier="psram32", split_rows=25353, sampler="greedy",
        assumptions=(
            ("core matrices read in place from mapped flash as int4 and unpacked per weight "
            "(llm.h matvec_q8_range; only the head is staged, as int8, in PSRAM)"),
            "logits written to and read back from PSRAM (198 KiB/token)",
            ("the head matvec is split over both cores (llm.h keeps row ranges for that); "
            "nothing else is"),
        )),
    "pie_int4": Build(
        "pie_int4", "esp32-ai PIE + int4", "pie-upstream",
        core=("int4", "psram32"), head=("int4", "psram32"),
        kv_tier="psram32", logits_tier="sram", split_rows=25353, sampler="greedy",
        assumptions=(
            "core and head staged int4 (32-column blocks, fp32 scales) in PSRAM, 32-byte lines",
            "upstream int4 PIE kernel, 8 PIE instructions per 32 weights",
            "head split over both cores; logits in SRAM; fp32 KV in PSRAM",
        )),
    "ours": Build(
        "ours", "mpllm (ours)", "pie",
        core=("int4", "sram"), head=("int4", "psram64"),
        kv_tier="psram64", logits_tier="sram", split_rows=256, sampler="topk",
        assumptions=(
            "bytes per region from the engine's counters; PIE counts from the host model",
            "core in SRAM; head and fp32 KV in PSRAM with 64-byte lines; rows from flash",
            "matvecs of >= 256 rows (head, ple_model_proj, qkv) split over both cores",
            "sampling: temperature + top-k 40 Gumbel-max (greedy costs less)",
        )),
}


TIER_BPS = {"flash": FLASH_BPS, "psram32": PSRAM_BPS_LINE32, "psram64": PSRAM_BPS_LINE64,
            "sram": SRAM_BPS}
REGION_TIER = {"flash": "flash", "fast": "sram"}  # "bulk" -> the build's PSRAM tier


@dataclass(frozen=True)
class Fit:
    """Cycles per scalar op; fitted to the stock anchors (see module doc)."""

    c_mac_i8: float
    c_op: float


@dataclass
class Work:
    """One stage's cost drivers for one token."""

    bytes: dict[str, float] = field(default_factory=dict)  # tier -> bytes
    mac_i8: float = 0.0  # scalar int8 MACs, staged int8 weights
    mac_q4: float = 0.0  # scalar int8 MACs on int4 weights unpacked in the loop
    pie: float = 0.0  # PIE instructions
    ops: float = 0.0  # other scalar ops
    split: dict[str, float] = field(default_factory=dict)  # the same, on two cores

    def add_bytes(self, tier: str, n: float) -> None:
        self.bytes[tier] = self.bytes.get(tier, 0.0) + n


@dataclass
class Measured:
    """What the host engine measured, per generated token."""

    region_bytes: dict[str, float]  # flash/fast/bulk per token (averaged)
    pie_per_call: dict[str, int]  # matrix name -> PIE instructions per call
    positions: list[int]
    sources: dict[str, str]


def _matvec_work(w: Work, b: Build, s: Shape, m: Mat, pie_per_call: Mapping[str, int] | None,
                 split: bool) -> None:
    fmt, tier = b.head if m.name == "head" else b.core
    ng = n_groups(m.cols, s.group)
    rows, cols, k = m.rows, m.cols, m.per_token
    if fmt == "int8":
        nbytes = rows * cols + rows * ng * 4  # int8 codes + fp32 scale8
    elif fmt == "int4-flash":
        nbytes = rows * _cdiv(cols, 2) + rows * ng * 2  # model.bin in place, fp16 scales
    else:
        nbytes = rows * q4_row_bytes(cols) + rows * ng * 4
    w.add_bytes(tier, k * nbytes)
    target = w.split if split else None
    macs = k * rows * cols
    if b.kernels == "scalar":
        key = "mac_i8" if fmt == "int8" else "mac_q4"
        ops = k * rows * (ROW_OPS_SCALAR + (HALF2FLOAT_OPS * ng if fmt == "int4-flash" else 0))
        if target is None:
            setattr(w, key, getattr(w, key) + macs)
            w.ops += ops
        else:
            target[key] = target.get(key, 0.0) + macs
            target["ops"] = target.get("ops", 0.0) + ops
        return
    if b.kernels == "pie-upstream":
        pie = k * upstream_pie_instructions(rows, cols)
    else:
        if pie_per_call is not None and m.name in pie_per_call:
            pie = k * pie_per_call[m.name]
        else:
            pie = k * pie_matvec_instructions(rows, cols, s.group)
    ops = k * rows * ROW_OPS_PIE
    if target is None:
        w.pie += pie
        w.ops += ops
    else:
        target["pie"] = target.get("pie", 0.0) + pie
        target["ops"] = target.get("ops", 0.0) + ops


def build_work(b: Build, s: Shape = RELEASE, positions: Sequence[int] | None = None,
               measured: Measured | None = None) -> dict[str, Work]:
    """Per-stage cost drivers of one token, averaged over `positions`."""
    positions = list(positions if positions is not None else story_positions())
    if not positions:
        raise ValueError("positions is empty")
    if max(positions) >= s.seq_len:
        raise ValueError(f"position {max(positions)} outside the {s.seq_len}-position context")
    work = {st: Work() for st in STAGES}
    pie_calls = measured.pie_per_call if measured else None
    for m in matrices(s):
        _matvec_work(work[m.stage], b, s, m, pie_calls, split=m.rows >= b.split_rows)
    n = len(positions)
    for pos in positions:
        ops = stage_scalar_ops(s, pos, sampler=b.sampler)
        for st in STAGES:
            work[st].ops += ops[st] / n
    d, L = s.dim, s.n_layers
    mean_t = sum(p + 1 for p in positions) / n
    kv_elem = 4  # fp32 KV in all three builds
    work["attn"].add_bytes(b.kv_tier, L * 2 * d * kv_elem * (mean_t + 1))
    # rows read per token from flash: embedding + PLE (stock reads model.bin's
    # packed rows: 48 + 2 and 384 + 12 bytes; ours the image's records)
    if b.name == "ours":
        work["embed"].add_bytes("flash", q4_row_bytes(d) + 4 + ple_record_bytes(s)
                                + s.head_dim * 4)
    else:
        lp = L * s.ple_dim
        work["embed"].add_bytes("flash", _cdiv(d, 2) + 2 + _cdiv(lp, 2)
                                + 2 * n_groups(lp, s.group))
    if b.logits_tier != "sram":  # written by the head, read back by the argmax
        work["head"].add_bytes(b.logits_tier, 4 * s.vocab_out)
        work["sample"].add_bytes(b.logits_tier, 4 * s.vocab_out)
    if measured is not None and b.name == "ours":
        _apply_measured_bytes(work, b, s, positions, measured)
    return work


def _apply_measured_bytes(work: dict[str, Work], b: Build, s: Shape, positions: Sequence[int],
                          measured: Measured) -> None:
    """Replace our analytic bytes by the engine's measured region totals, split
    over stages in the analytic proportions (which check_bytes has shown equal
    the measurement)."""
    per_stage = {st: dict.fromkeys(REGIONS, 0.0) for st in STAGES}
    for pos in positions:
        for st, regs in engine_stage_bytes(s, pos).items():
            for r, v in regs.items():
                per_stage[st][r] += v / len(positions)
    tier_of = {"flash": "flash", "fast": "sram", "bulk": b.head[1]}
    for st in STAGES:
        work[st].bytes = {}
    for r in REGIONS:
        total = sum(per_stage[st][r] for st in STAGES)
        for st in STAGES:
            share = per_stage[st][r] / total if total else 0.0
            work[st].add_bytes(tier_of[r], share * measured.region_bytes[r])


def _seconds(w: Work, fit: Fit, *, cores: int = 2) -> tuple[float, float]:
    """(memory seconds, compute seconds) of one stage."""
    mem = sum(n / TIER_BPS[t] for t, n in w.bytes.items() if TIER_BPS[t] != float("inf"))
    c_q4 = fit.c_mac_i8 + Q4_UNPACK_OPS * fit.c_op

    def cycles(mac_i8: float, mac_q4: float, pie: float, ops: float) -> float:
        return mac_i8 * fit.c_mac_i8 + mac_q4 * c_q4 + pie * PIE_CYCLES + ops * fit.c_op

    one = cycles(w.mac_i8, w.mac_q4, w.pie, w.ops)
    sp = w.split
    two = cycles(sp.get("mac_i8", 0.0), sp.get("mac_q4", 0.0), sp.get("pie", 0.0),
                 sp.get("ops", 0.0)) / cores
    return mem, (one + two) / CPU_HZ


def predict(b: Build, fit: Fit, s: Shape = RELEASE, positions: Sequence[int] | None = None,
            measured: Measured | None = None) -> dict[str, float]:
    """Predicted ms per stage (and "total") for one generated token."""
    work = build_work(b, s, positions, measured)
    out = {}
    for st in STAGES:
        mem, comp = _seconds(work[st], fit)
        out[st] = 1e3 * (mem + comp)
    out["total"] = sum(out[st] for st in STAGES)
    return out


def fit_stock(s: Shape = RELEASE, positions: Sequence[int] | None = None) -> Fit:
    """Solve C_MAC_I8 and C_OP from the stock head and attention anchors.

    Both stage times are linear in the two unknowns:
      t = mem + (a_mac * C_MAC_I8 + a_op * C_OP) / CPU_HZ,
    (q4 MACs cost C_MAC_I8 + Q4_UNPACK_OPS * C_OP), a 2x2 system."""
    b = BUILDS["stock"]
    work = build_work(b, s, positions)
    rows = []
    for st in ("head", "attn"):
        w = work[st]
        mem, _ = _seconds(w, Fit(0.0, 0.0))
        sp = w.split
        a_mac = w.mac_i8 + w.mac_q4 + (sp.get("mac_i8", 0.0) + sp.get("mac_q4", 0.0)) / 2
        a_op = (w.ops + Q4_UNPACK_OPS * w.mac_q4
                + (sp.get("ops", 0.0) + Q4_UNPACK_OPS * sp.get("mac_q4", 0.0)) / 2)
        rhs = (ANCHORS_MS["stock"][st] / 1e3 - mem) * CPU_HZ
        rows.append((a_mac, a_op, rhs))
    (a1, b1, r1), (a2, b2, r2) = rows
    det = a1 * b2 - a2 * b1
    if abs(det) < 1e-9:
        raise ArithmeticError("stock anchors do not determine the two cycle constants")
    c_mac = (r1 * b2 - r2 * b1) / det
    c_op = (a1 * r2 - a2 * r1) / det
    if c_mac <= 0 or c_op <= 0:
        raise ArithmeticError(f"fit gave non-physical cycles (mac {c_mac:.3g}, op {c_op:.3g}):"
                              " the memory terms alone exceed an anchor")
    return Fit(c_mac, c_op)


# ---------------------------------------------------------------------------
# Measuring the host engine
# ---------------------------------------------------------------------------

def check_bytes(measured_totals: Mapping[str, int], s: Shape, n_prompt: int, n_steps: int,
                placement: Mapping[str, str] | None = None) -> dict[str, int]:
    """Analytic region totals for the same run; raises ValueError naming the
    regions where the engine's counters disagree with the formulas."""
    expect = run_region_bytes(s, n_prompt, n_steps, placement)
    bad = {r: (int(measured_totals.get(r, 0)), expect[r]) for r in REGIONS
           if int(measured_totals.get(r, 0)) != expect[r]}
    if bad:
        detail = ", ".join(f"{r}: engine {m} vs formula {e}" for r, (m, e) in bad.items())
        raise ValueError(f"engine byte counters disagree with the cost model: {detail}")
    return expect


def placement_from_memory(memory: Iterable[tuple[str, str, int]]) -> dict[str, str]:
    """The engine's placement report -> the regions engine_stage_bytes needs."""
    by_name = {name: region for name, region, _ in memory}
    pl = {}
    if "head" in by_name:
        pl["head"] = by_name["head"]
    for key, name in (("kv", "kv_cache"), ("norms", "norms"), ("core", "L0.qkv")):
        if name in by_name:
            pl[key] = by_name[name]
    cores = {region for name, region, _ in memory
             if name.startswith("L") and "." in name and not name.endswith("norm")}
    if len(cores) > 1:
        raise ValueError(f"core matrices placed in several regions {sorted(cores)}: "
                         "the per-stage split assumes one")
    return pl


def measure_host(image: object, *, prompt: Sequence[int] | None = None, n_steps: int = 200,
                 llm_module: object | None = None, pie: bool = True) -> Measured:
    """Run the CPython `_llm` on `image` (a path or bytes), greedy from
    `prompt` (default: the first 4 ids of the story prompt, 433 447 259 405,
    clipped to the vocabulary) for n_steps tokens, and return per-token
    region bytes (checked against the formulas) and measured PIE counts."""
    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    with llm_module.Model(image) as m:
        cfg = m.config()
        s = Shape.from_config(cfg)
        ids = list(prompt) if prompt is not None else [433, 447, 259, 405]
        ids = [t % cfg["vocab_out"] for t in ids]
        n_steps = min(n_steps, s.seq_len - len(ids))
        if n_steps < 1:
            raise ValueError(f"prompt of {len(ids)} leaves no room in {s.seq_len} positions")
        m.sampler(0.0, 0, 0)
        tok = m.prefill(ids)
        for _ in range(n_steps):
            tok = m.step(tok)
        st = m.stats()
        placement = placement_from_memory(m.memory())
    totals = {r: int(st["bytes"][r]) for r in REGIONS}
    check_bytes(totals, s, len(ids), n_steps, placement)
    # per generated token: subtract the prompt's layer passes, which a story's
    # steady state does not pay per token
    prompt_only = dict.fromkeys(REGIONS, 0)
    for pos in range(len(ids) - 1):  # layers only: the head ran for the last prompt token
        for regs in engine_stage_bytes(s, pos, placement, head=False).values():
            for r, v in regs.items():
                prompt_only[r] += v
    per_token = {r: (totals[r] - prompt_only[r]) / (n_steps + 1) for r in REGIONS}
    positions = list(range(len(ids) - 1, len(ids) + n_steps))
    sources = {"bytes": f"_llm {llm_module.build_info()} stats() over {n_steps} steps, "
                        "checked equal to the formulas"}
    pie_calls: dict[str, int] = {}
    if pie:
        shapes = {m.name: (m.rows, m.cols, s.group) for m in matrices(s)}
        counts = measure_pie_counts(set(shapes.values()))
        pie_calls = {name: counts[shape] for name, shape in shapes.items()}
        sources["pie"] = "kernels_pie.c through pie_model.c's instruction counters"
    return Measured(per_token, pie_calls, positions, sources)


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

@dataclass
class Report:
    fit: Fit
    predictions: dict[str, dict[str, float]]  # build -> stage/total -> ms
    measured: Measured | None

    def rows(self) -> list[tuple[str, str, float, float | None, float | None]]:
        """(build, stage, predicted ms, published ms or None, error % or None)."""
        out = []
        for name, pred in self.predictions.items():
            pub = ANCHORS_MS.get(name, {})
            for st in (*STAGES, "total"):
                p = pred[st]
                a = pub.get(st)
                out.append((name, st, p, a, None if a is None else 100.0 * (p - a) / a))
        return out

    def table(self) -> str:
        lines = [(f"cost model: C_MAC_I8 = {self.fit.c_mac_i8:.3f} cycles/MAC, "
                 f"C_OP = {self.fit.c_op:.3f} cycles/op (fitted to stock head + attention)"),
                 f"{'build':<24} {'stage':<7} {'predicted':>10} {'published':>10} {'error':>8}"]
        for name, st, p, a, e in self.rows():
            label = BUILDS[name].label
            lines.append(f"{label:<24} {st:<7} {p:>8.2f}ms "
                         + (f"{a:>8.1f}ms {e:>+7.1f}%" if a is not None else f"{'-':>10} {'':>8}"))
        for name, pred in self.predictions.items():
            tok = 1e3 / pred["total"]
            pub = ANCHORS_TOK_S.get(name)
            lines.append(f"{BUILDS[name].label:<24} {tok:6.1f} tok/s predicted"
                         + (f" (published {pub} tok/s)" if pub else ""))
        lines.append(f"research branch (not modelled): {ANCHORS_TOK_S['research']} tok/s "
                     "published")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "fit": dataclasses.asdict(self.fit),
            "predictions_ms": self.predictions,
            "anchors_ms": ANCHORS_MS,
            "anchors_tok_s": ANCHORS_TOK_S,
            "anchor_sources": ANCHOR_SOURCES,
            "assumptions": {n: list(b.assumptions) for n, b in BUILDS.items()},
            "measured": None if self.measured is None else dataclasses.asdict(self.measured),
        }


def report(measured: Measured | None = None, s: Shape = RELEASE,
           positions: Sequence[int] | None = None) -> Report:
    """Fit on the stock anchors, predict all three builds. `measured` (from
    measure_host on a release-shaped image) supplies our bytes and PIE counts;
    without it ours is analytic (the engine's formulas, the PIE closed form)."""
    fit = fit_stock(RELEASE)
    preds = {n: predict(BUILDS[n], fit, RELEASE) for n in ("stock", "pie_int4")}
    if measured is not None:
        pos = measured.positions
    else:
        pos = positions
    preds["ours"] = predict(BUILDS["ours"], fit, s, pos, measured)
    return Report(fit, preds, measured)


def plot(rep: Report, path: str | os.PathLike[str]) -> Path:
    """Stacked bars: predicted ms per stage for each build, published totals
    as markers. Written through a temporary file, then renamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rep.predictions)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = [0.0] * len(names)
    for st in STAGES:
        vals = [rep.predictions[n][st] for n in names]
        ax.bar([BUILDS[n].label for n in names], vals, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, n in enumerate(names):
        pub = ANCHORS_MS.get(n, {}).get("total")
        if pub is not None:
            ax.plot([i - 0.4, i + 0.4], [pub, pub], "k--", lw=1.5)
            ax.annotate(f"published {pub:g} ms", (i, pub), textcoords="offset points",
                        xytext=(0, 4), ha="center", fontsize=8)
        ax.annotate(f"{rep.predictions[n]['total']:.1f} ms", (i, bottom[i]),
                    textcoords="offset points", xytext=(0, -12), ha="center", fontsize=8,
                    color="white")
    ax.set_ylabel("ms per token (ESP32-S3 N16R8, predicted)")
    ax.set_title("mpllm cost model: per-stage time per generated token")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out


__all__ = [
    "ANCHORS_MS",
    "ANCHORS_TOK_S",
    "ANCHOR_TOLERANCE",
    "BUILDS",
    "RELEASE",
    "STAGES",
    "Build",
    "Fit",
    "Measured",
    "Report",
    "Shape",
    "build_work",
    "check_bytes",
    "engine_stage_bytes",
    "fit_stock",
    "matrices",
    "measure_host",
    "measure_pie_counts",
    "pie_matvec_instructions",
    "plot",
    "predict",
    "report",
    "run_region_bytes",
    "stage_scalar_ops",
    "story_positions",
    "upstream_pie_instructions",
]
