"""Cost model: predicted ms/token per stage on the ESP32-S3 N16R8.

There is no board here, so speed is predicted from what a token costs:

    time(stage) = PSRAM line fills x seconds per fill (32- or 64-byte lines)
                + flash bytes / flash bandwidth
                + (cycles on one core + cycles split over both cores / 2) / 240 MHz
                - the memory of split work hidden behind the other core's compute
                + hand-offs to the second core x 34 us

  * Memory is counted in cache lines, not bytes: every PSRAM read goes
    through the 32 KB data cache, so a stream costs the lines it touches
    (`lines_touched`). A 96-byte head slice of a 384-byte KV row costs two
    64-byte lines, a whole row six; that is how cache-line overfetch enters,
    and why walking the KV cache head by head costs 8-10 lines a row.
  * The LX7 is in order: a miss stalls its core until the line arrives, so
    on one core memory and compute add. Two cores streaming from one bus can
    hide one core's fills behind the other's compute: a split stage ideally
    takes max(M, (M + C)/2) for M bus seconds and C compute seconds; the
    fitted `overlap` is the share of that ideal reached. Every split costs a
    hand-off (the task-notify round trip).
  * Compute: PIE instructions (1 cycle each; ours counted by the exact host
    model of the vector unit, `measure_pie_counts`), scalar int8 MACs, scalar
    ops, dependent float chains (exp/erf/log polynomials, divide, square
    root: each op waits for the previous one) and the board-measured cost of
    libm calls (lrintf, newlib expf/erff), each priced by its own constant.
  * Our build's bytes come from the engine's own counters
    (`_llm.Model.stats()`), checked byte for byte against the formulas here
    (`check_bytes`) and then used as a scale on the formulas' line counts.
    The share of head rows the certified head scores is an input
    (`HeadFractions`): the real release head is not available here.
  * Every other build is somebody else's firmware (slvDev/esp32-ai at
    9965f5ec), predicted from its own configuration (`BUILDS`: weight formats,
    placement, cache line, kernels, splits, libm calls), each assumption
    stated beside it.

Speculative decoding (`pass_work`; builds mpllm-spec-greedy/-sampled): a
verify pass of m <= 8 positions (llm_verify) reads every weight once (they
are in SRAM, so what that saves is PIE work: llm_matvec_q4_cols's count per
row per column, `measure_cols_pie`), the KV cache once per layer, and each
head tile once for all m (llm_head_certify_many, on one core, no hand-offs);
everything else runs m times. ms/token = (time of one pass) / (story tokens
per pass), passes starting at positions 4..203. Tokens per pass and m =
drafted + 1 are measured on the demo model (`measure_drafting`, i.e.
mpllm.drafting.study; the release model's acceptance cannot be measured
here), and so is how many tiles the positions of a pass have in common
(`measure_union`: pass tiles / m steps' tiles), applied to the release
head's step fraction. Positions 1..m-1's buffers and the scan's scratch live
in PSRAM and are charged in cache lines, though the engine's byte counters
(checked per pass, `pass_region_bytes`) do not see them (`_batch_buffers`).

Calibration (`fit`): four constants are solved jointly and exactly from four
published stage times and then held fixed:
  C_OP          cycles per scalar op               <- stock attention (20 ms)
  overlap       two-core memory/compute overlap    <- stock head (59 ms)
  S_LINE32/64   seconds per PSRAM line fill         <- esp32-ai's dense int4 head,
                                                       20.8 ms on 32-byte and 14.6 ms
                                                       on 64-byte lines
(the quoted 60.6/86.3 MiB/s are head bytes over head time, compute and
hand-off included, so the fill cost is what is left after them). Three more
follow from those and a published sub-stage measurement that is not an
anchor (`DERIVED_CONSTANTS`): C_MAC_I8 (scalar int8 dot at 24.8 M MAC/s),
the cost of a dependent float op (the 1.93 ms softmax pass) and newlib erff
(the 1.5 ms PLE stage). Every other anchor in `ANCHORS` is a prediction held
to ANCHOR_TOLERANCE; the remaining constants are published figures or counts
read off source code, each with its source.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

STAGES = ("embed", "attn", "ffn", "ple", "head", "sample")
#: tokens one prefill pass carries (engine_state.h LLM_BATCH_MAX): their
#: weights are read once per pass
PREFILL_BATCH = 8
#: positions one verification pass carries (llm.h LLM_VERIFY_MAX)
VERIFY_MAX = 8
REGIONS = ("flash", "fast", "bulk")

# ---------------------------------------------------------------------------
# Constants: published figures and source-code counts (never fitted)
# ---------------------------------------------------------------------------

#: CPU clock: 240 MHz (the board's sdkconfig; esp32-ai's sdkconfig.defaults
#: CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_240).
CPU_HZ = 240e6
#: Both LX7 cores compute; MicroPython (or upstream's loop task) runs on one,
#: the worker task on the other (port_esp32.c).
CORES = 2
#: One hand-off of work to the second core and back (task notify round trip):
#: ~34 us, measured on the board by esp32-ai (firmware/esp32_tinystories,
#: CERT_WAVE: "the ~34 us task-notify round trip", swept on the board).
HANDOFF_S = 34e-6
#: Data cache: 32 KB (the board's sdkconfig; esp32-ai sdkconfig.defaults
#: CONFIG_ESP32S3_DATA_CACHE_32KB). A working set that fits is fetched once.
DCACHE_BYTES = 32 * 1024
#: A random 512-byte row from memory-mapped flash costs ~20 us (published esp32-ai measurement),
#: applied as 512 B / 20 us to the bytes of the lines read from flash.
FLASH_ROW_BYTES = 512
FLASH_ROW_S = 20e-6
FLASH_BPS = FLASH_ROW_BYTES / FLASH_ROW_S
#: One PIE instruction issues per cycle (single-issue LX7 pipeline; a PIE MAC
#: is 16 int8 products, pie.h). Internal SRAM reads are inside the
#: instruction counts: no bandwidth term.
PIE_CYCLES = 1.0

# Scalar routines, as op counts (x C_OP) read off the sources, or as cycles
# where the board measured them.
#: Activation quantization, per element, without a libm call: 34 cycles.
#: Derived from two esp32-ai board measurements (runtime/llm.h, QACT notes):
#: 0.61 ms/token over the 18 attention call sites (EXP-129: "~85 cycles per
#: element"), of which lrintf was 51 cycles (EXP-130: prep 0.66 -> 0.29 ms
#: over the same 1,728 elements when lrintf became add-half-and-truncate).
#: Our magic-number round-half-even has the same loop shape: assumed equal.
QUANT_CYCLES = 85.0 - 51.0
#: The libm lrintf call on the S3 toolchain (EXP-130, above).
LRINTF_CYCLES = 51.0
#: newlib expf: "roughly 200 cycles" (esp32-ai runtime/llm.h, llm_fast_expf
#: note). Used by the stock softmax and by every esp32-ai SiLU.
NEWLIB_EXPF_CYCLES = 200.0
#: newlib erff (GELU in every esp32-ai build) is not published; it is
#: derived after the fit from the research branch's "The PLE stage measures
#: 1.5 ms" (runtime/llm.h, FASTACT note, a build without lrintf): what that
#: stage leaves after everything but its 768 erff calls (`Fit.erff_cycles`).
RESEARCH_PLE_MS = 1.5
#: powf/cosf/sinf (stock and esp32-ai compute the RoPE row per token, 12 of
#: each): an assumption of the same order as newlib expf.
NEWLIB_TRIG_CYCLES = 200.0
#: The softmax-weight rounding's lrintf and llm_fast_expf's floorf (libm
#: calls in esp32-ai's int8-KV softmax until its last build): 12 cycles each.
#: From "Two other libm calls (lrintf, twice) were worth 1.4 ms/token"
#: (llm.h, llm_fast_expf note): 1.4 - 1.27 ms for quantize_act's = 0.13 ms
#: over the 2,520 softmax weights of a token; floorf assumed the same.
SOFT_LIBM_CYCLES = (1.4e-3 - 1.27e-3) * CPU_HZ / 2520
#: esp32-ai's softmax pass per (position, head) with llm_fast_expf, the V-scale
#: fold and the weight rounding, both libm calls included: 1.93 ms for the
#: 2,520 pairs of a token ("softmax now the largest single term ... 1.93 ms",
#: llm.h, measured before the pass was split by heads) = 184 cycles.
SOFTMAX_PAIR_CYCLES = 1.93e-3 * CPU_HZ / 2520
#: Ops of that pass per pair that are not one dependent float chain (loads,
#: stores, compares, the rounding's clamps)...
SOFTMAX_PAIR_OPS = 10
#: ... and the chain: llm_fast_expf without its call (mul, cvt, compare,
#: sub, 3-term Horner (6), exponent build (3), mul) plus s - max, * vscale,
#: * 1/wscale, |w|. Dependent float ops wait for the previous result, so
#: they cost more than the fitted average op: the pass above prices them
#: (`Fit.chain_cycles`, derived after the fit).
FAST_EXPF_CHAIN_OPS = 14 + 4
#: llm_expf (native/engine/mathf.c), as chain ops: range reduction (mul, 2
#: add, cvt, 2 mul+2 add), degree-4 Horner (8), final (r*r, mul, 2 add),
#: exponent build and scale (3), 2 tests.
EXPF_OPS = 22
#: llm_erff on |x| < 1 (where GELU inputs mostly fall): degree-7 Horner in
#: x^2 (14), x^2, the final ax + ax*p (2), sign and range tests (5).
ERFF_OPS = 22
#: llm_logf: classify (4), mantissa split (6), s = f/(2+f) (div), Horner (6),
#: the final combination (8).
LOGF_OPS = 24
#: The S3 FPU has no one-step divide or square root: div0.s/divn.s and
#: sqrt0.s/nexp01.s + Newton steps expand to about ten dependent float
#: instructions each (priced as chain ops).
DIV_OPS = 10
SQRT_OPS = 10
#: PCG32 step on a 32-bit core: 64-bit multiply-add (4 mul + carries), the
#: xorshift/rotate, the float conversion of the uniform.
PCG32_OPS = 20
#: fp32 dot product inner loop: load q, load k, mul, add (no FMA:
#: -ffp-contract=off).
FDOT_OPS = 4
#: fp32 axpy inner loop (ao[i] += w*v[i]): load v, load ao, mul, add, store.
FAXPY_OPS = 5
#: A scalar kernel reading int4 weights in place (core "int4-flash": llm.h
#: matvec_q, esp32-ai before it staged weights) unpacks each one in the inner
#: loop: byte load, parity test, shift or mask, -8, int->float, beside the MAC.
Q4_UNPACK_OPS = 4
#: Per output row of a matvec: (float)g, * scale, acc +=, * xscale, store,
#: loop; the PIE kernels add the -8*sum(x) correction.
ROW_OPS_SCALAR = 6
ROW_OPS_PIE = 7
#: esp32-ai's PIE int4 kernels put one asm block per 32-column block inside a
#: C loop: counter and branch around it.
UPSTREAM_BLOCK_OPS = 2
#: esp32-ai's scalar int8 dot (llm_dot_i8, one core, weights resident in
#: PSRAM): 24.8 M MAC/s measured on the board (runtime/llm.h, LLM_SIMD_S8
#: note: "56.8 Mops/s vs 24.8 scalar ... with the weights PSRAM-resident";
#: 32-byte lines assumed, the default then). Pins C_MAC_I8 (see Fit).
SCALAR_DOT_MACS_PER_S = 24.8e6
#: esp32-ai's half2float, normal-number path.
HALF2FLOAT_OPS = 8
#: llm_matvec_q4_cols_pie (kernels_pie.c) keeps a row of up to this many
#: 32-column blocks in q0..q5 and multiplies it with every column; wider or
#: multi-group rows go through the single-vector kernel once per column.
COLS_RESIDENT_BLOCKS = 3

# Certified head: tiles, bounds, order.
#: Rows per tile (ours and esp32-ai: CERT_TILE 128): 199 tiles for 25,353 rows.
TILE_ROWS = 128
#: Our bound kernel, per tile: two int8 dot products of 96 (xq.mid and
#: |xq|.half) = ~2 x (6 loads + 6 MACs) + zero/read-out. Used when no count
#: was measured; measure_host counts llm_matvec_s8_pie through the host model
#: (29 per tile for 199 tiles of 2 x 96 columns).
BOUND_PIE_PER_TILE = 30
#: ... and per tile the int -> float, two multiplies (tile scale, slack) and
#: the binary-heap insertion.
BOUND_OPS_PER_TILE = 12
#: A heap operation costs ~2*log2(n) compares (sift-down); each compare is a
#: load, compare and move.
HEAP_OPS_PER_CMP = 3
#: Candidate update per scored row: compare with the floor, branch, count.
CAND_OPS_PER_ROW = 3
#: esp32-ai's scalar tile bound (max of two products per dimension): 1.074 ms
#: for 199 tiles x 96 dims (EXP-134, runtime of the build before it moved to
#: PIE) = 13.5 cycles per tile dimension.
UPSTREAM_BOUND_SCALAR_CYCLES_PER_DIM = 1.074e-3 * CPU_HZ / (199 * 96)
#: ... and its PIE bound (two dot chains per tile): 0.099 ms = 119 cycles/tile.
UPSTREAM_BOUND_PIE_CYCLES_PER_TILE = 0.099e-3 * CPU_HZ / 199
#: esp32-ai's qsort of the 199 tile bounds: "~1500 comparisons at ~52 cycles
#: each" (0.330 ms, EXP-134); its radix sort: "~1800 operations".
QSORT_CMP_CYCLES = 52.0
RADIX_OPS_PER_KEY = 9

#: Published rows-scored share of the certified head for greedy on the real
#: release model: 8,427-8,749 of 25,353 rows (esp32-ai board runs, CERT_SEED
#: and action_bench notes). The headline uses 0.34, the range is shown.
RELEASE_GREEDY_FRACTION = 0.34
RELEASE_GREEDY_RANGE = (8427 / 25353, 8749 / 25353)

# ---------------------------------------------------------------------------
# Anchors (published, release model, N16R8)
# ---------------------------------------------------------------------------

#: Tolerance every anchor is held to (tests/test_costmodel.py). Fitted rows are
#: exact by construction.
ANCHOR_TOLERANCE = 0.10


@dataclass(frozen=True)
class Anchor:
    """One published figure: a stage (or "total") of one build."""

    name: str
    build: str
    stage: str
    published_ms: float
    fitted: bool
    source: str


ANCHORS: tuple[Anchor, ...] = (
    Anchor("stock head", "stock", "head", 59.0, True,
           "esp32-ai stock firmware stage profile"),
    Anchor("stock attention", "stock", "attn", 20.0, True, "same profile"),
    Anchor("stock FFN", "stock", "ffn", 6.4, False, "same profile"),
    Anchor("stock PLE", "stock", "ple", 6.4, False, "same profile"),
    Anchor("stock total", "stock", "total", 95.0, False,
           "~10.3 tok/s, 95.0 ms/token (esp32-ai; llm.h: 'inference from 95.0')"),
    Anchor("PIE+int4 total", "pie_int4", "total", 43.3, False,
           "PIE + int4 head/core + logits in SRAM, 22.6 tok/s (esp32-ai)"),
    Anchor("32-byte-line head", "research_line32", "head", 20.8, True,
           "esp32-ai idf_tinystories/sweep/line64.conf: '20.8 ms and 60.6 MiB/s on "
           "32-byte lines'"),
    Anchor("64-byte-line head", "research_line64", "head", 14.6, True,
           "line64.conf: '14.6 ms/token for 1.26 MiB, i.e. 86.3 MiB/s'"),
    Anchor("64-byte-line total", "research_line64", "total", 25.0, False,
           "line64.conf: 40.01 tok/s; esp32_tinystories.ino: 'The head is 14.6 ms of "
           "a 25.0 ms token'"),
    Anchor("certified head total", "research_cert", "total", 16.2, False,
           "esp32_tinystories.ino CERT_SEED/EXP-124 and llm.h EXP-130: 61.5-61.96 tok/s, "
           "33.2 % of rows"),
    Anchor("no libm lrintf total", "research_qact", "total", 15.0, False,
           "llm.h EXP-130 QACT=1: 66.64/67.14 tok/s"),
    Anchor("final lossy total", "research_final", "total", 13.3, False,
           "action_bench.h: '13.3 ms/token, 75 tok/s'"),
    Anchor("final lossy head", "research_final", "head", 5.4, False,
           "action_bench.h: 'The output head is 41% of a token (5.4 of 13.3 ms)', "
           "34.5 % of rows"),
)
#: The four fitted constants, solved jointly from the four fitted anchors; the
#: anchor that mainly determines each is listed (the others move it a little).
FITTED_CONSTANTS = {
    "c_op": ("stock attention",),
    "overlap": ("stock head",),
    "s_line32": ("32-byte-line head",),
    "s_line64": ("64-byte-line head",),
}
#: Constants derived from the fitted ones and a published sub-stage
#: measurement that is not an anchor.
DERIVED_CONSTANTS = {
    "c_mac_i8": "esp32-ai scalar int8 dot at 24.8 M MAC/s from PSRAM, less s_line32 per byte",
    "chain_cycles": "esp32-ai softmax pass, 1.93 ms for 2,520 pairs, less its ops and libm calls",
    "erff_cycles": "esp32-ai PLE stage, 1.5 ms, less everything but its 768 erff calls",
}


# ---------------------------------------------------------------------------
# Shape
# ---------------------------------------------------------------------------

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

    @property
    def n_tiles(self) -> int:
        return _cdiv(self.vocab_out, TILE_ROWS)

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


def _cdiv(a: float, b: int) -> int:
    return -(-math.ceil(a) // b)


def n_groups(cols: int, group: int) -> int:
    return _cdiv(cols, group)


def q4_row_bytes(cols: int) -> int:
    """Codes of one row in the image's KIND_Q4 layout (32-column blocks)."""
    return _cdiv(cols, 32) * 16


def ple_record_bytes(s: Shape) -> int:
    """One KIND_ROWS record: codes, fp16 scales, padding to 16."""
    lp = s.n_layers * s.ple_dim
    raw = _cdiv(lp, 2) + 2 * n_groups(lp, s.group)
    return _cdiv(raw, 16) * 16


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


def pie_row_instructions(cols: int, group: int) -> int:
    """The per-row part of pie_matvec_instructions (a certified head scores
    rows tile by tile, each tile one kernel call)."""
    return pie_matvec_instructions(1, cols, group) - pie_matvec_instructions(0, cols, group)


def cols_resident(cols: int, group: int) -> bool:
    """Rows the many-columns kernel keeps in registers (one group, <= 3 blocks)."""
    return n_groups(cols, group) == 1 and 1 <= _cdiv(cols, 32) <= COLS_RESIDENT_BLOCKS


def pie_cols_instructions(rows: int, cols: int, group: int, m: int) -> int:
    """PIE instructions of one llm_matvec_q4_cols_pie call with m columns
    (kernels_pie.c), the closed form of what the host model counts
    (`measure_cols_pie` parses its count, tests/test_costmodel.py holds the
    two equal). Resident rows: per column the -8*sum(x) correction (the -8
    broadcast, zero.accx, first load, 2*nb MACs, 2 nops, rur); per row the mask
    broadcast, ssai and 4 per block to load and split the row once, then per
    column zero.accx, the activation load, 2*nb MACs, 2 nops, rur. Other rows:
    the single-vector kernel once per column."""
    if m < 1:
        raise ValueError(f"{m} columns")
    if not cols_resident(cols, group):
        return m * pie_matvec_instructions(rows, cols, group)
    nb = _cdiv(cols, 32)
    return m * (6 + 2 * nb) + rows * (2 + 4 * nb + m * (5 + 2 * nb))


def upstream_pie_instructions(rows: int, cols: int) -> int:
    """esp32-ai's int4 PIE kernels (firmware/esp32_tinystories, head_i4_range and
    i4_range): per row zero.accx, the mask load, 8 PIE instructions per
    32-column block (weight load, andq, vsr.32, andq, two activation loads,
    two MACs) and rur.accx_0; ssai once per call."""
    return 1 + rows * (3 + 8 * _cdiv(cols, 32))


_COUNT_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "pie_model.h"
/* argv: q rows cols group ... | s rows n; prints the PIE instructions of one call */
int main(int argc, char **argv) {
    int a = 1;
    while (a < argc) {
        if (argv[a][0] == 'q' && a + 3 < argc) {
            uint32_t rows = (uint32_t)atol(argv[a + 1]), cols = (uint32_t)atol(argv[a + 2]);
            uint32_t group = (uint32_t)atol(argv[a + 3]);
            uint32_t nb = (cols + 31u) / 32u, ng = (cols + group - 1u) / group;
            uint8_t *codes = aligned_alloc(16, (size_t)rows * nb * 16u + 16u);
            float *scales = aligned_alloc(16, ((size_t)rows * ng * 4u + 15u) / 16u * 16u + 16u);
            int8_t *xq = aligned_alloc(16, nb * 32u);
            float *y = aligned_alloc(16, ((size_t)rows * 4u + 15u) / 16u * 16u + 16u);
            if (!codes || !scales || !xq || !y) { fprintf(stderr, "out of memory\n"); return 2; }
            memset(codes, 0x88, (size_t)rows * nb * 16u);
            for (size_t i = 0; i < (size_t)rows * ng; i++) scales[i] = 1.0f;
            for (uint32_t i = 0; i < nb * 32u; i++) xq[i] = (int8_t)(i < cols ? (i % 7) - 3 : 0);
            llm_q4 w;
            memset(&w, 0, sizeof w);
            w.codes = codes; w.scales = scales; w.rows = rows; w.cols = cols;
            w.group = group; w.n_groups = ng; w.row_bytes = nb * 16u;
            llm_pie_counts_reset();
            llm_matvec_q4_pie(&w, xq, 1.0f, y, 0, rows);
            printf("q %u %u %u %llu\n", rows, cols, group,
                   (unsigned long long)llm_pie_counts_total());
            free(codes); free(scales); free(xq); free(y);
            a += 4;
#ifdef COUNT_S8
        } else if (argv[a][0] == 's' && a + 2 < argc) {
            uint32_t rows = (uint32_t)atol(argv[a + 1]), n = (uint32_t)atol(argv[a + 2]);
            int8_t *m = aligned_alloc(16, (size_t)rows * n + 16u);
            int8_t *x = aligned_alloc(16, n + 16u);
            int32_t *out = aligned_alloc(16, (size_t)rows * 4u + 16u);
            if (!m || !x || !out) { fprintf(stderr, "out of memory\n"); return 2; }
            for (size_t i = 0; i < (size_t)rows * n; i++) m[i] = (int8_t)((i % 5) - 2);
            for (uint32_t i = 0; i < n; i++) x[i] = (int8_t)((i % 7) - 3);
            llm_pie_counts_reset();
            llm_matvec_s8_pie(m, rows, n, x, out);
            printf("s %u %u %llu\n", rows, n, (unsigned long long)llm_pie_counts_total());
            free(m); free(x); free(out);
            a += 3;
#endif
        } else {
            fprintf(stderr, "bad arguments at %d\n", a);
            return 2;
        }
    }
    return 0;
}
"""


def repo_root() -> Path:
    """The checkout this module runs from."""
    from .checkout import ROOT

    return ROOT


def _has_s8_matvec(engine: Path) -> bool:
    header = engine / "kernels.h"
    return header.is_file() and re.search(r"\bllm_matvec_s8_pie\s*\(", header.read_text()) is not None


def measure_pie_counts(
    shapes: Iterable[tuple[int, int, int]],
    *,
    bound_shapes: Iterable[tuple[int, int]] = (),
    engine_dir: Path | None = None,
    build_dir: Path | None = None,
    compiler: str | None = None,
) -> dict[tuple[int, ...], int]:
    """PIE instructions per call, counted by the exact host model of the vector
    unit: llm_matvec_q4_pie for each (rows, cols, group) in `shapes`, and the
    certified head's bound kernel llm_matvec_s8_pie for each (rows, n) in
    `bound_shapes` (only when kernels.h declares it; otherwise those keys are
    absent and the caller keeps BOUND_PIE_PER_TILE).

    Compiles a small driver against native/engine/kernels_pie.c and
    pie_model.c (needs a C compiler: $CC, else gcc or cc). Raises
    FileNotFoundError when the engine sources or a compiler are missing and
    RuntimeError when the build or the run fails."""
    shapes = [tuple(int(v) for v in sh) for sh in shapes]
    engine = engine_dir or repo_root() / "native" / "engine"
    sources = [engine / "kernels_pie.c", engine / "pie_model.c"]
    for src in sources:
        if not src.is_file():
            raise FileNotFoundError(f"PIE counters need {src} (run from a source checkout)")
    with_s8 = _has_s8_matvec(engine)
    bounds = [tuple(int(v) for v in sh) for sh in bound_shapes] if with_s8 else []
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FileNotFoundError("PIE counters need a C compiler (set CC or install gcc)")
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        driver = Path(tmp) / "pie_count.c"
        driver.write_text(_COUNT_DRIVER)
        exe = Path(tmp) / "pie_count"
        cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
               *(["-DCOUNT_S8"] if with_s8 else []),
               "-I", str(engine), str(driver), *map(str, sources), "-o", str(exe), "-lm"]
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"building the PIE counter failed:\n{built.stderr}")
        args = [v for sh in shapes for v in ("q", *map(str, sh))]
        args += [v for sh in bounds for v in ("s", *map(str, sh))]
        ran = subprocess.run([str(exe), *args], capture_output=True, text=True, check=False,
                             timeout=300)
        if ran.returncode != 0:
            raise RuntimeError(f"the PIE counter failed:\n{ran.stdout}\n{ran.stderr}")
    out: dict[tuple[int, ...], int] = {}
    for line in ran.stdout.splitlines():
        _kind, *vals = line.split()
        nums = [int(v) for v in vals]
        out[tuple(nums[:-1])] = nums[-1]
    missing = [sh for sh in [*shapes, *bounds] if sh not in out]
    if missing:
        raise RuntimeError(f"the PIE counter printed nothing for {missing}")
    return out


def measure_cols_pie(*, root: Path | None = None, build_dir: Path | None = None,
                     compiler: str | None = None) -> dict[int, float]:
    """PIE instructions per row per column of llm_matvec_q4_cols_pie on a 128 x
    96 matrix (the release head's tile, and the width of every resident core
    matrix) for m = 1..8 columns, counted by the exact host model of the
    vector unit: builds tests/c/pie_kernels_test.c as tests/test_pie_kernels.py
    does and parses its "cols m=N 128x96: X PIE instructions per row per
    column" lines. Raises FileNotFoundError without the sources or a compiler,
    RuntimeError when the build or the run fails."""
    base = root or repo_root()
    engine, ctests = base / "native" / "engine", base / "tests" / "c"
    sources = [ctests / "pie_kernels_test.c", engine / "kernels_pie.c",
               engine / "kernels_ref.c", engine / "pie_model.c"]
    for src in sources:
        if not src.is_file():
            raise FileNotFoundError(f"the many-columns PIE count needs {src} (a source checkout)")
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FileNotFoundError("the many-columns PIE count needs a C compiler (set CC)")
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        exe = Path(tmp) / "pie_kernels_test"
        cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O2",
               "-I", str(engine), "-I", str(base / "native" / "port" / "host"),
               *map(str, sources), "-o", str(exe), "-lm"]
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"building pie_kernels_test failed:\n{built.stderr}")
        # no random cases (N = 0): only the counts of m = 1..8 columns
        ran = subprocess.run([str(exe), "cols", "5", "0"], capture_output=True, text=True,
                             check=False, timeout=120)
    if ran.returncode != 0:
        raise RuntimeError(f"pie_kernels_test cols failed:\n{ran.stdout}\n{ran.stderr}")
    out = {int(m): float(v) for m, v in re.findall(
        r"cols m=(\d+) 128x96: ([\d.]+) PIE instructions per row per column", ran.stdout)}
    if sorted(out) != list(range(1, VERIFY_MAX + 1)):
        raise RuntimeError(f"pie_kernels_test cols printed counts for m = {sorted(out)}")
    return out


# ---------------------------------------------------------------------------
# Builds
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Build:
    """A firmware configuration, as far as the cost model needs to know it.

    Every field is something one can read off that firmware's source or
    sdkconfig; `assumptions` says where that reading needed a guess."""

    name: str
    label: str
    #: "scalar" (esp32-ai llm.h C loops), "pie-upstream" (esp32-ai's int4 PIE
    #: kernels), "pie" (ours, counted by the host model)
    kernels: str
    #: weight format and tier of the core (all matrices but the head):
    #: ("int4-flash"|"int8"|"int4", "flash"|"psram"|"sram")
    core: tuple[str, str]
    head_fmt: str  # "int8" | "int4"; the head is always in PSRAM
    line: int  # PSRAM data-cache line, bytes
    #: head: "dense" (every row) or "certified" (tiles in bound order)
    head: str = "dense"
    #: dense head output: "psram"/"sram" logits buffer, "fused" (argmax in the
    #: kernel, nothing stored)
    logits: str = "psram"
    #: certified: the share of head rows scored (an input; see HeadFractions)
    rows_fraction: float = 1.0
    bound: str = "pie"  # "scalar" | "pie-upstream" | "pie"
    order: str = "heap"  # "qsort" | "radix" | "heap"
    wave_tiles: int = 32  # tiles per hand-off wave
    first_wave_tiles: int = 0  # tiles scored inline before the first wave
    #: KV cache: "fp32-heads" (head-outer walks), "fp32-rows" (positions
    #: outer, all heads of a row together), "int8-rows", "int8-rows-pad"
    #: (each head's K slice padded to 16 bytes: esp32-ai KPAD), "int8-fast"
    #: (our fast mode: attention_fast.c)
    kv: str = "fp32-heads"
    #: byte offset of the KV arrays from a line boundary; None: only 16-byte
    #: alignment is known (port_esp32.c), so average over the offsets
    kv_offset: int | None = 0
    score: str = "scalar"  # int8 KV: score dots "scalar" | "pie"
    softmax_exp: str = "newlib"  # "newlib" | "llm" | "fast-floorf" | "fast"
    act_exp: str = "newlib"  # SiLU/GELU: "newlib" (expf/erff) | "llm"
    quant: str = "lrintf"  # activation quantization: "lrintf" | "round"
    wquant: str = "lrintf"  # int8 V path, softmax-weight rounding: "lrintf" | "round"
    quant_per_matvec: bool = True  # False: gate and up share one quantized input
    split_rows: int | None = 128  # matvecs with >= this many rows are split
    #: attention core across cores: "none", "heads" (one hand-off per layer),
    #: "score+vacc" / "score+soft+vacc" (esp32-ai par_for passes)
    attn_split: str = "none"
    attn_split_min_pos: int = 0  # esp32-ai splits attention only from pos 32
    #: "argmax" (scan of the logits), "argmax-nancheck" / "topk-full" (ours
    #: today over the full logits), "cand-greedy" / "cand-topk" (ours after:
    #: the certified head's candidate list), "fused" (nothing left to do)
    sampler: str = "argmax"
    top_k: int = 40
    #: bytes per cached V element: 4 (fp32) or 2 (the exact int16 integer dot,
    #: recomputed to the same float when read: engine.c attention())
    v_bytes: int = 4
    #: core bytes that did not fit internal SRAM and live in PSRAM instead
    core_spill_bytes: int = 0
    #: independent element-wise float chains (exp, erf, log, divide) evaluated
    #: this many at a time, hiding the FPU latency (same bits: mathf.c llm_expf4)
    chain_interleave: int = 1
    rope: str = "libm"  # "libm" (powf/cosf/sinf per token) | "table" (flash row)
    rows_from: str = "model.bin"  # flash rows per token: "model.bin" | "image"
    #: a verify pass of m positions (pass_work): where positions 1..m-1's
    #: working buffers and the many-positions head scan's scratch live,
    #: "psram" (engine_open.c places them in BULK) or "sram" (a what-if)
    batch: str = "psram"
    #: the many-positions head scan in two lanes, one per core, one hand-off
    #: per pass (llm_head_certify_many since session 3); False: on one core
    many_split: bool = False
    assumptions: tuple[str, ...] = field(default=())


_RESEARCH_BASE = {
    "kernels": "pie-upstream", "core": ("int4", "sram"), "head_fmt": "int4", "line": 64,
    "logits": "fused", "kv": "int8-rows", "score": "scalar", "softmax_exp": "fast-floorf",
    "act_exp": "newlib", "quant": "lrintf", "wquant": "lrintf", "quant_per_matvec": True,
    "split_rows": 128, "attn_split": "score+vacc", "attn_split_min_pos": 32, "sampler": "fused",
    "wave_tiles": 32,
}
_RESEARCH_NOTES = (
    ("core int4 staged in internal SRAM (stage_core_int4, 'nearly all of it fits'); head int4 "
     "in PSRAM; logits never written (FUSE_ARGMAX)"),
    ("int8 KV, positions outer (LLM_KV_INT8; present by the 25.0 ms build: its llm_forward "
     "frame held the two V-accumulation banks), int8 scores, llm_fast_expf, quantized "
     "softmax weights, integer V accumulation"),
    ("matvecs of >= 128 rows split (layer_matvec_i4, head hooks); attention score and V passes "
     "split from position 32 (par_for)"),
    ("libm lrintf in quantize_act and in the softmax-weight rounding, floorf in llm_fast_expf, "
     "newlib expf/erff in SiLU/GELU (FASTACT 0)"),
)

BUILDS: dict[str, Build] = {
    "stock": Build(
        "stock", "stock esp32-ai", "scalar",
        core=("int8", "psram"), head_fmt="int8", line=32, logits="psram",
        kv="fp32-heads", softmax_exp="newlib", act_exp="newlib", quant="lrintf",
        split_rows=128, sampler="argmax",
        assumptions=(
            ("every matrix staged int8 (unpacked nibbles, fp32 scales) in PSRAM with 32-byte "
             "lines (esp32_tinystories.ino: 'PSRAM staged int8 core + head, KV'; llm.h "
             "matvec_i8_range, 'inference from 95.0'), scalar int8 dots, int8 activations "
             "quantized per matvec with lrintf"),
            "matvecs of >= 128 rows split over both cores (matvec_par serves both hooks)",
            "logits written to PSRAM by the head and read back by the argmax (198 KiB/token)",
            "fp32 KV in PSRAM walked head by head; newlib expf/erff; RoPE by powf/cosf/sinf",
        )),
    "pie_int4": Build(
        "pie_int4", "esp32-ai PIE + int4", "pie-upstream",
        core=("int4", "psram"), head_fmt="int4", line=32, logits="sram",
        kv="fp32-heads", softmax_exp="newlib", act_exp="newlib", quant="lrintf",
        split_rows=128, sampler="argmax",
        assumptions=(
            "core and head staged int4 (32-column blocks, fp32 scales) in PSRAM, 32-byte lines",
            ("upstream int4 PIE kernel, 8 PIE instructions per 32 weights; matvecs >= 128 rows "
             "split over both cores"),
            "logits in SRAM; fp32 KV in PSRAM walked head by head; lrintf; newlib expf/erff",
        )),
    "research_line32": Build(
        "research_line32", "esp32-ai core SRAM, 32-B lines", head="dense",
        **{**_RESEARCH_BASE, "line": 32},
        assumptions=(*_RESEARCH_NOTES, ("the 64-byte-line build on 32-byte lines "
                     "(line64.conf's control arm)"))),
    "research_line64": Build(
        "research_line64", "esp32-ai core SRAM, 64-B lines", head="dense",
        **_RESEARCH_BASE, assumptions=_RESEARCH_NOTES),
    "research_cert": Build(
        "research_cert", "esp32-ai + certified head", head="certified",
        rows_fraction=8427 / 25353, bound="scalar", order="qsort",
        **_RESEARCH_BASE,
        assumptions=(*_RESEARCH_NOTES,
                     ("CertiHead: 199 tiles, scalar interval bound (1.074 ms measured), qsort "
                      "(52 cycles per compare), waves of 32 tiles, 8,427 rows (33.2 %)"))),
    "research_qact": Build(
        "research_qact", "esp32-ai + no lrintf", head="certified",
        rows_fraction=8427 / 25353, bound="scalar", order="qsort",
        **{**_RESEARCH_BASE, "quant": "round"},
        assumptions=(*_RESEARCH_NOTES,
                     ("as the certified build, quantize_act without lrintf (QACT=1); the "
                      "softmax-weight rounding and floorf still call libm"))),
    "research_final": Build(
        "research_final", "esp32-ai final (lossy)", head="certified",
        rows_fraction=8749 / 25353, bound="pie-upstream", order="radix",
        **{**_RESEARCH_BASE, "quant": "round", "wquant": "round", "softmax_exp": "fast",
           "kv": "int8-rows-pad", "score": "pie", "attn_split": "score+soft+vacc"},
        assumptions=(*_RESEARCH_NOTES[:3],
                     ("no libm call left in quantize, softmax weights or llm_fast_expf; K "
                      "padded per head (KPAD) for PIE scores; softmax split by heads"),
                     ("CertiHead with PIE bounds (0.099 ms measured) and radix sort, 8,749 rows "
                      "(34.5 %)"))),
    "mpllm-before-sampled": Build(
        "mpllm-before-sampled", "today, T 0.8 top-40", "pie",
        core=("int4", "sram"), head_fmt="int4", line=64, head="dense", logits="sram",
        kv="fp32-heads", kv_offset=None, softmax_exp="llm", act_exp="llm", quant="lrintf",
        quant_per_matvec=False, split_rows=64, attn_split="none", sampler="topk-full",
        rope="table", rows_from="image",
        assumptions=(
            ("the engine before the certified head (2e691e3): dense head into a 100 KB "
             "logits buffer in SRAM, NaN check + top-40 pass over all logits; every matvec of "
             ">= 64 rows split (44 hand-offs)"),
            ("core in SRAM; head (int4, fp32 scales) and fp32 KV in PSRAM with 64-byte lines; "
             "attention walks the KV cache head by head; quantization through libm lrintf"),
            "PIE counts from the host model (the same kernels as after)",
        )),
    "mpllm-exact-greedy": Build(
        "mpllm-exact-greedy", "exact, greedy", "pie",
        core=("int4", "sram"), head_fmt="int4", line=64, head="certified", logits="fused",
        rows_fraction=RELEASE_GREEDY_FRACTION, bound="pie", order="heap", wave_tiles=8,
        first_wave_tiles=1, kv="fp32-rows", kv_offset=0, softmax_exp="llm", act_exp="llm",
        quant="round", quant_per_matvec=False, split_rows=None, attn_split="heads",
        sampler="cand-greedy", rope="table", rows_from="image", v_bytes=2, chain_interleave=4,
        assumptions=(
            ("certified head: rows permuted by norm at convert time, 199 tiles of 128, int8 "
             "boxes + tile scale in SRAM, max-heap order, first tile inline then waves of "
             "LLM_HEAD_WAVE_TILES (8) tiles, one hand-off each; scored rows + 4-byte scale + "
             "2-byte id from PSRAM"),
            ("no logits buffer; attention positions outer over 64-byte aligned rows: K as fp32, "
             "V as the exact int16 dots + one scale per position, each value recomputed with "
             "the kernel's two roundings when read (4 ops); split by heads (one hand-off per "
             "layer); no other matvec split"),
            ("softmax weights, SiLU and GELU four elements at a time (llm_expf4 / llm_erff4, "
             "unrolled: four independent chains for the in-order FPU; same bits)"),
            "quantization by the magic-number round half to even (no lrintf)",
        )),
}
BUILDS["mpllm-exact-sampled"] = dataclasses.replace(
    BUILDS["mpllm-exact-greedy"], name="mpllm-exact-sampled", label="exact, T 0.8 top-40",
    sampler="cand-topk",
    assumptions=(*BUILDS["mpllm-exact-greedy"].assumptions,
                 ("top-40 Gumbel sampling on the candidate list: sort 40 ids, 40 draws (2 logf + "
                  "PCG32 each); rows fraction = greedy fraction x (top-40 / greedy) measured on "
                  "the demo model")))
BUILDS["mpllm-before-greedy"] = dataclasses.replace(
    BUILDS["mpllm-before-sampled"], name="mpllm-before-greedy", label="today, greedy",
    sampler="argmax-nancheck")
#: our builds, in table order: before (today's engine) and after, greedy and sampled
OURS = ("mpllm-before-greedy", "mpllm-before-sampled", "mpllm-exact-greedy",
        "mpllm-exact-sampled")
_SPEC_NOTES = (
    ("speculative decoding: drafts verified in passes of m positions (llm_verify), output "
     "bit-identical to plain decoding; ms/token = the time of one pass / story tokens per pass, "
     "m = drafted + 1 and tokens per pass measured on the demo model (mpllm.drafting.study; "
     "the release model's acceptance cannot be measured here); passes of floor(m) and ceil(m) "
     "positions mixed to the measured mean, starting at positions 4..203"),
    ("a pass: the core's weights once (they are in SRAM: what it saves is PIE work, the "
     "many-columns kernel's count per row per column, measured by the host model); KV rows "
     "0..pos+m-1 once per layer for all m positions; per-position scalar work, scores, softmax "
     "and V accumulation m times (each V row recomputed from its dots once); attention split by "
     "heads, one hand-off per layer per pass"),
    ("head: one certified scan for the m positions (llm_head_certify_many) in two lanes, one "
     "per core (alternate tiles in key order, each lane with its own floors), one hand-off, the "
     "lanes' lists merged: tiles fetched = the demo model's union ratio x m x the release "
     "step's tiles, rows scored per position = the demo's rows ratio x the step's (measured "
     "with the one-core scan; two lanes score ~2 % more rows); bounds per position, one heap; "
     "m samplings"),
    ("positions 1..m-1's buffers, every candidate list and the scan's scratch are in PSRAM "
     "(engine_open.c 'batch'), uncharged by the engine's counters: each buffer fetched and "
     "written back once per layer (the KV stream evicts them), attention scores 5 transfers "
     "per line, m + 8 line fills per popped tile"),
)
BUILDS["mpllm-spec-greedy"] = dataclasses.replace(
    BUILDS["mpllm-exact-greedy"], name="mpllm-spec-greedy", label="speculative, greedy",
    many_split=True,
    assumptions=(*BUILDS["mpllm-exact-greedy"].assumptions, *_SPEC_NOTES))
BUILDS["mpllm-spec-sampled"] = dataclasses.replace(
    BUILDS["mpllm-exact-sampled"], name="mpllm-spec-sampled", label="speculative, T 0.8 top-40",
    many_split=True,
    assumptions=(*BUILDS["mpllm-exact-sampled"].assumptions, *_SPEC_NOTES))
_FAST_NOTE = ("fast mode (LOSSY, opt-in: attention_fast.c): K rows and transposed V rows "
              "int8 with a scale per position and head, scores and the weighted sum by the "
              "int8 PIE kernel (llm_matvec_s8), a cheap exp; a position's V bytes land in "
              "dim different lines (each fetched and written back); split by heads")
BUILDS["mpllm-fast-sampled"] = dataclasses.replace(
    BUILDS["mpllm-spec-sampled"], name="mpllm-fast-sampled",
    label="fast (lossy), speculative, T 0.8 top-40", kv="int8-fast", v_bytes=1,
    assumptions=(*BUILDS["mpllm-spec-sampled"].assumptions, _FAST_NOTE))
#: the speculative builds and the decoding mode whose drafting each uses
SPEC = ("mpllm-spec-greedy", "mpllm-spec-sampled", "mpllm-fast-sampled")
SPEC_BUILD_MODE = {"mpllm-spec-greedy": "greedy", "mpllm-spec-sampled": "sampled",
                   "mpllm-fast-sampled": "sampled"}
#: the issue's target for fast mode, sampled (ms/token, modelled)
FAST_TARGET_MS = 7.0
#: the issue's target for speculative exact decoding, sampled (ms/token, modelled)
SPEC_TARGET_MS = 10.0
UPSTREAM = ("stock", "pie_int4", "research_line32", "research_line64", "research_cert",
            "research_qact", "research_final")


# ---------------------------------------------------------------------------
# Work: the cost drivers of one stage
# ---------------------------------------------------------------------------

@dataclass
class Work:
    """One stage's cost drivers for one token.

    `serial` runs on one core, `split` is shared by both; each holds scalar
    int8 MACs ("mac"), other scalar ops ("ops"), PIE instructions ("pie") and
    measured cycles ("cycles")."""

    serial: dict[str, float] = field(default_factory=dict)
    split: dict[str, float] = field(default_factory=dict)
    lines: dict[int, float] = field(default_factory=dict)  # PSRAM line fills by line size
    lines_split: dict[int, float] = field(default_factory=dict)  # ... of the split work
    flash_bytes: float = 0.0
    handoffs: float = 0.0
    bytes: dict[str, float] = field(default_factory=dict)  # tier -> bytes touched (display)

    def compute(self, *, split: bool = False, **kinds: float) -> None:
        target = self.split if split else self.serial
        for k, v in kinds.items():
            target[k] = target.get(k, 0.0) + v

    def psram(self, nlines: float, line: int, nbytes: float, *, split: bool = False) -> None:
        target = self.lines_split if split else self.lines
        target[line] = target.get(line, 0.0) + nlines
        self.bytes["psram"] = self.bytes.get("psram", 0.0) + nbytes

    def flash(self, nbytes: float, line: int) -> None:
        self.flash_bytes += stream_lines(nbytes, line) * line
        self.bytes["flash"] = self.bytes.get("flash", 0.0) + nbytes

    def sram(self, nbytes: float) -> None:
        self.bytes["sram"] = self.bytes.get("sram", 0.0) + nbytes

    def scaled(self, k: float) -> Work:
        return Work({a: v * k for a, v in self.serial.items()},
                    {a: v * k for a, v in self.split.items()},
                    {a: v * k for a, v in self.lines.items()},
                    {a: v * k for a, v in self.lines_split.items()}, self.flash_bytes * k,
                    self.handoffs * k, {a: v * k for a, v in self.bytes.items()})

    def add(self, o: Work) -> None:
        for mine, theirs in ((self.serial, o.serial), (self.split, o.split),
                             (self.lines, o.lines), (self.lines_split, o.lines_split),
                             (self.bytes, o.bytes)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + v
        self.flash_bytes += o.flash_bytes
        self.handoffs += o.handoffs


@dataclass(frozen=True)
class Fit:
    """The calibrated constants (see the module docstring): four fitted, and
    C_MAC_I8 derived from them and a published kernel rate."""

    c_op: float  # cycles per scalar op (not a MAC)
    s_line32: float  # seconds per 32-byte PSRAM line fill
    s_line64: float  # seconds per 64-byte PSRAM line fill
    overlap: float  # share of the ideal two-core memory/compute overlap achieved
    erff_cycles: float = 250.0  # newlib erff, derived after the fit (see RESEARCH_PLE_MS)
    chain_cycles: float = 7.0  # per dependent float op, derived after the fit (SOFTMAX_PAIR_*)

    @property
    def c_mac_i8(self) -> float:
        """Cycles per scalar int8 MAC: esp32-ai's single-core scalar int8 dot
        ran at SCALAR_DOT_MACS_PER_S with its weights in PSRAM, one weight
        byte per MAC; take out that byte's share of a 32-byte line fill."""
        return CPU_HZ / SCALAR_DOT_MACS_PER_S - self.s_line32 * CPU_HZ / 32

    def psram_bps(self, line: int) -> float:
        """Pure memory bandwidth the fit implies (bytes/s) for a line size."""
        return line / (self.s_line32 if line == 32 else self.s_line64)

    def as_dict(self) -> dict[str, float]:
        return {"c_mac_i8": self.c_mac_i8, "c_op": self.c_op, "s_line32": self.s_line32,
                "s_line64": self.s_line64, "overlap": self.overlap,
                "newlib_erff_cycles": self.erff_cycles, "chain_op_cycles": self.chain_cycles,
                "psram_MBps_line32": self.psram_bps(32) / 1e6,
                "psram_MBps_line64": self.psram_bps(64) / 1e6}


@dataclass
class HeadCounts:
    """What one certified head evaluation scores, averaged per token. When the
    engine measured them (`head_rows` etc. in stats()), these are its figures;
    otherwise they follow from a rows fraction (`from_fraction`)."""

    rows: float
    tiles: float
    waves: float
    handoffs: float
    source: str = "analytic"

    @classmethod
    def from_fraction(cls, b: Build, s: Shape, fraction: float) -> HeadCounts:
        rows = fraction * s.vocab_out
        tiles = min(float(s.n_tiles), max(1.0, rows / TILE_ROWS))
        rest = max(0.0, tiles - b.first_wave_tiles)
        waves = (1.0 if b.first_wave_tiles else 0.0) + math.ceil(rest / b.wave_tiles)
        handoffs = math.ceil(rest / b.wave_tiles)
        return cls(rows, tiles, waves, handoffs)


# ---------------------------------------------------------------------------
# The forward pass, as work
# ---------------------------------------------------------------------------

def _quantize(w: Work, b: Build, n: int, *, split: bool = False, pad: int = 0) -> None:
    """Activation quantization of an n-vector (plus zeroing a pad)."""
    cyc = n * (QUANT_CYCLES + (LRINTF_CYCLES if b.quant == "lrintf" else 0.0))
    w.compute(split=split, cycles=cyc, ops=pad)


def _rmsnorm(w: Work, n: int) -> None:
    # ss += x*x (load, mul, add), ss/n + eps (2), sqrt, 1/., (w*x)*inv (2 loads, 2 mul, store)
    w.compute(ops=3 * n + 2 + 5 * n, chain=SQRT_OPS + DIV_OPS)


def _chain(w: Work, b: Build, ops: float, *, split: bool = False) -> None:
    """Element-wise dependent float chains (independent across elements)."""
    w.compute(split=split, chain=ops / b.chain_interleave)


def _exp(w: Work, b: Build, kind: str, count: float, *, split: bool = False) -> None:
    if kind == "newlib":
        w.compute(split=split, cycles=count * NEWLIB_EXPF_CYCLES)
    elif kind == "llm":
        _chain(w, b, count * EXPF_OPS, split=split)
    else:
        raise ValueError(f"unknown exp {kind!r}")


def _matvec(w: Work, b: Build, s: Shape, m: Mat, pie_calls: Mapping[str, int] | None) -> None:
    """One call of a matvec (the caller multiplies by per_token)."""
    fmt, tier = (b.head_fmt, "psram") if m.name == "head" else b.core
    rows, cols = m.rows, m.cols
    ng = n_groups(cols, s.group)
    split = b.split_rows is not None and rows >= b.split_rows
    if split:
        w.handoffs += 1
    if fmt == "int8":
        code_b, scale_b = rows * cols, rows * ng * 4
    elif fmt == "int4-flash":
        code_b, scale_b = rows * _cdiv(cols, 2), rows * ng * 2
    else:
        code_b, scale_b = rows * q4_row_bytes(cols), rows * ng * 4
    if tier == "psram":
        w.psram(stream_lines(code_b, b.line) + stream_lines(scale_b, b.line), b.line,
                code_b + scale_b, split=split)
    elif tier == "flash":
        w.flash(code_b + scale_b, b.line)
    else:
        w.sram(code_b + scale_b)
    if b.kernels == "scalar":
        ops = rows * ROW_OPS_SCALAR
        if fmt == "int4-flash":
            ops += rows * cols * Q4_UNPACK_OPS + rows * ng * HALF2FLOAT_OPS
        w.compute(split=split, mac=rows * cols, ops=ops)
    elif b.kernels == "pie-upstream":
        nblk = _cdiv(cols, 32)
        w.compute(split=split, pie=upstream_pie_instructions(rows, cols),
                  ops=rows * (ROW_OPS_PIE + UPSTREAM_BLOCK_OPS * nblk))
        w.compute(ops=2 * cols + (nblk * 32 - cols))  # 8*sum(xq) and the zeroed tail
    else:
        pie = (pie_calls[m.name] if pie_calls and m.name in pie_calls
               else pie_matvec_instructions(rows, cols, s.group))
        w.compute(split=split, pie=pie, ops=rows * ROW_OPS_PIE)


def _v_row(b: Build, d: int) -> int:
    """Bytes of one cached V row: fp32, or int16 dots + the position's scale."""
    return 4 * d if b.v_bytes == 4 else b.v_bytes * d + 4


def _kv_offsets(b: Build) -> list[int]:
    return list(range(0, b.line, 16)) if b.kv_offset is None else [b.kv_offset]


def _kv_read(w: Work, b: Build, s: Shape, pos: int, *, split: bool) -> None:
    """Attention's reads of the cached K and V rows 0..pos of one layer,
    averaged over the possible alignments of the cache."""
    offs = _kv_offsets(b)
    for off in offs:
        part = Work()
        _kv_read_at(part, dataclasses.replace(b, kv_offset=off), s, pos, split=split)
        w.add(part.scaled(1.0 / len(offs)))


def _kv_read_at(w: Work, b: Build, s: Shape, pos: int, *, split: bool) -> None:
    d, t, h, dh = s.dim, pos + 1, s.n_heads, s.head_dim
    line = b.line
    if b.kv == "int8-fast":
        # per head: K rows contiguous (t x dhp), dh transposed V rows of the
        # t positions rounded up to 16 (rows seq_len apart), two scale arrays
        dhp, t16 = _cdiv(dh, 16) * 16, _cdiv(t, 16) * 16
        nl = h * (lines_touched(0, t * dhp, line) + dh * lines_touched(0, t16, line)
                  + 2 * lines_touched(0, 4 * t, line))
        w.psram(nl, line, h * (t * dhp + dh * t16 + 8 * t), split=split)
        return
    if b.kv.startswith("fp32"):
        row = 4 * d
        v_row = _v_row(b, d)
        total = (lines_touched(b.kv_offset, t * row, line)
                 + lines_touched(b.kv_offset, t * v_row, line))
        if b.kv == "fp32-heads" and t * (row + v_row) > DCACHE_BYTES:
            # each head's pass re-fetches its slice of every row (4*dh bytes at
            # h*4*dh), overfetching at line edges; rows cycle through
            # line/gcd(row, line) alignments
            phases = line // math.gcd(row, line)
            per_row = sum(lines_touched((b.kv_offset + r * row + j * 4 * dh) % line, 4 * dh, line)
                          for r in range(phases) for j in range(h)) / phases
            total = 2 * t * per_row
        w.psram(total, line, t * (row + v_row), split=split)
    else:
        krow = h * _cdiv(dh, 16) * 16 if b.kv == "int8-rows-pad" else d
        nbytes = t * (krow + d) + 2 * 4 * t  # K rows, V rows, two per-row scale arrays
        nl = (lines_touched(b.kv_offset, t * krow, line) + lines_touched(b.kv_offset, t * d, line)
              + 2 * lines_touched(0, 4 * t, line))
        w.psram(nl, line, nbytes, split=split)


#: llm_matvec_s8_pie per row of n 16-byte blocks: row setup and readout, and
#: per block the two 128-bit loads and the multiply-accumulate
S8_ROW_PIE_FIXED, S8_BLOCK_PIE = 4, 3
#: attention_fast.c's exp: range reduction (mul, cvt, compare, cvt, sub),
#: degree-4 Horner (8), exponent build and the scale (3), the range test
FAST_EXP_OPS = 17


def _s8_pie(rows: float, n: int) -> float:
    return rows * (S8_ROW_PIE_FIXED + S8_BLOCK_PIE * _cdiv(n, 16))


def _fast_query(w: Work, b: Build, s: Shape, t: int, *, split: bool) -> None:
    """Fast mode's attention for one query over t cached positions (all
    heads): quantized q, integer scores by the s8 kernel, softmax with the
    cheap exp, quantized weights, transposed V rows by the s8 kernel."""
    h, dh = s.n_heads, s.head_dim
    dhp, t16 = _cdiv(dh, 16) * 16, _cdiv(t, 16) * 16
    _quantize(w, b, h * dh, split=split)
    w.compute(split=split, pie=h * _s8_pie(t, dhp), ops=h * t * 6)  # scores, scale, max
    _chain(w, b, h * t * FAST_EXP_OPS, split=split)
    w.compute(split=split, ops=h * t * 4)  # s - max, den +=, * vscale, store
    _quantize(w, b, h * t, split=split, pad=h * (t16 - t))
    w.compute(split=split, pie=h * _s8_pie(dh, t16), ops=h * dh * 3)
    _chain(w, b, h * dh * DIV_OPS, split=split)


def _attention_core(w: Work, b: Build, s: Shape, pos: int) -> None:
    """One layer's attention over positions 0..pos (after q, k, v exist)."""
    t, h, dh = pos + 1, s.n_heads, s.head_dim
    if b.kv == "int8-fast":
        sp = b.attn_split == "heads"
        w.handoffs += sp
        _kv_read(w, b, s, pos, split=sp)
        _fast_query(w, b, s, t, split=sp)
        return
    n = t * h  # (position, head) pairs
    split_on = pos >= b.attn_split_min_pos
    sp_all = split_on and b.attn_split == "heads"
    sp_score = split_on and b.attn_split in ("heads", "score+vacc", "score+soft+vacc")
    sp_soft = split_on and b.attn_split in ("heads", "score+soft+vacc")
    sp_vacc = sp_score
    if split_on and b.attn_split != "none":
        w.handoffs += {"heads": 1, "score+vacc": 2, "score+soft+vacc": 3}[b.attn_split]
    _kv_read(w, b, s, pos, split=sp_score)
    if b.kv.startswith("fp32"):
        # scores: dot, * 1/sqrt(dh), store, max; softmax: s - max, exp, denom +=;
        # V: ao += w * v; finish: zero ao, ao /= denom
        w.compute(split=sp_score, ops=n * (FDOT_OPS * dh + 4))
        w.compute(split=sp_soft, ops=n * 4)
        _exp(w, b, b.softmax_exp, n, split=sp_soft)
        w.compute(split=sp_vacc, ops=n * FAXPY_OPS * dh)
        if b.v_bytes != 4:  # recompute (float)g * scale_i * xscale per element read
            w.compute(split=sp_vacc, ops=n * 4 * dh)
        w.compute(split=sp_all, ops=h * dh * 2)
        _chain(w, b, h * dh * DIV_OPS, split=sp_all)
        return
    # esp32-ai int8 KV: integer scores (scalar or PIE), softmax with
    # llm_fast_expf folding the V scale, weights quantized to int8, integer V
    if b.score == "pie":
        blocks = _cdiv(dh, 16)
        w.compute(split=sp_score, pie=n * (2 + 3 * blocks), ops=n * 5 + t * 3)
    else:
        w.compute(split=sp_score, mac=n * dh, ops=n * 5 + t * 3)
    libm = (b.softmax_exp == "fast-floorf") + (b.wquant == "lrintf")
    w.compute(split=sp_soft, ops=n * SOFTMAX_PAIR_OPS, chain=n * FAST_EXPF_CHAIN_OPS,
              cycles=n * libm * SOFT_LIBM_CYCLES)
    w.compute(split=sp_vacc, mac=n * dh, ops=n * (2 + dh))
    w.compute(ops=h * dh * 3, chain=h * DIV_OPS)


def _kv_store(w: Work, b: Build, s: Shape) -> None:
    """This position's K and V rows written to the cache (one layer): the
    written lines are fetched first (write-allocate) and written back later,
    counted as one transfer each way the way esp32-ai counts its logits
    round trip."""
    d = s.dim
    if b.kv == "int8-fast":
        # K and V quantized per head; a K row (h x 16-byte lines of dhp) and
        # one byte in each of the dim transposed V rows: every line it lands
        # in is fetched and written back (write-allocate)
        h, dh = s.n_heads, s.head_dim
        _quantize(w, b, 2 * d)
        w.compute(ops=2 * d)
        nl = h * lines_touched(0, _cdiv(dh, 16) * 16, b.line) + d + 2 * h
        w.psram(2 * nl, b.line, h * _cdiv(dh, 16) * 16 + d + 8 * h)
        return
    if b.kv.startswith("fp32"):
        offs = _kv_offsets(b)
        nl = sum(lines_touched(o, 4 * d, b.line) + lines_touched(o, _v_row(b, d), b.line)
                 for o in offs) / len(offs)
        w.psram(nl, b.line, 4 * d + _v_row(b, d))
        w.compute(ops=2 * 2 * d)  # memcpy: load + store per float
        return
    dh, h = s.head_dim, s.n_heads
    pad = h * (_cdiv(dh, 16) * 16 - dh) if b.kv == "int8-rows-pad" else 0
    _quantize(w, b, d, pad=pad)  # K
    _quantize(w, b, d)  # V
    _quantize(w, b, d, pad=pad)  # q, for the integer scores
    nl = lines_touched(0, d + pad, b.line) + lines_touched(0, d, b.line) + 2
    w.psram(nl, b.line, 2 * d + pad + 8)


def _head(w: Work, b: Build, s: Shape, pie_calls: Mapping[str, int] | None,
          counts: HeadCounts | None, bound_pie: float | None) -> None:
    d = s.dim
    _rmsnorm(w, d)
    _quantize(w, b, d)
    head = next(m for m in matrices(s) if m.name == "head")
    if b.head == "dense":
        _matvec(w, b, s, head, pie_calls)
        v = s.vocab_out
        split = b.split_rows is not None and v >= b.split_rows
        if b.logits == "psram":
            w.psram(stream_lines(4 * v, b.line), b.line, 4 * v, split=split)
        elif b.logits == "fused":
            w.compute(split=True, ops=2 * v)  # compare with the running best
        else:
            w.sram(4 * v)
        return
    # certified: bound every tile from the SRAM index, order, scan in waves
    c = counts or HeadCounts.from_fraction(b, s, b.rows_fraction)
    nt = s.n_tiles
    if b.bound == "scalar":
        w.compute(cycles=nt * d * UPSTREAM_BOUND_SCALAR_CYCLES_PER_DIM)
    elif b.bound == "pie-upstream":
        w.compute(cycles=nt * UPSTREAM_BOUND_PIE_CYCLES_PER_TILE)
    else:
        w.compute(pie=nt * (bound_pie if bound_pie is not None else BOUND_PIE_PER_TILE),
                  ops=nt * BOUND_OPS_PER_TILE + 2 * d)  # + |xq| once
    w.sram(nt * (2 * _cdiv(d, 16) * 16 + 4))
    log_n = math.log2(max(nt, 2))
    if b.order == "qsort":
        w.compute(cycles=nt * log_n * QSORT_CMP_CYCLES)
    elif b.order == "radix":
        w.compute(ops=nt * RADIX_OPS_PER_KEY)
    else:  # max-heap: build, then one pop per tile scanned (+ the one that stops)
        w.compute(ops=HEAP_OPS_PER_CMP * (2 * nt + (c.tiles + 1) * 2 * log_n))
    rows = c.rows
    inline_rows = min(rows, b.first_wave_tiles * TILE_ROWS)
    row_bytes = q4_row_bytes(d)
    if b.kernels == "pie":
        per_row_pie = (pie_calls.get("head_row") if pie_calls and "head_row" in pie_calls
                       else pie_row_instructions(d, s.group))
        call_pie = pie_matvec_instructions(0, d, s.group)
    else:
        per_row_pie = upstream_pie_instructions(1, d) - upstream_pie_instructions(0, d)
        call_pie = 1
    per_row_ops = ROW_OPS_PIE + CAND_OPS_PER_ROW + (
        UPSTREAM_BLOCK_OPS * _cdiv(d, 32) if b.kernels != "pie" else 0)
    for part_rows, sp in ((inline_rows, False), (rows - inline_rows, True)):
        w.compute(split=sp, pie=part_rows * per_row_pie, ops=part_rows * per_row_ops)
    w.compute(pie=c.tiles * call_pie)  # one kernel call per tile
    if b.sampler == "cand-topk":
        k = b.top_k
        inserts = k * (1.0 + math.log(max(rows / k, 1.0)))
        w.compute(split=True, ops=inserts * (k / 2) * 3)
    w.handoffs += c.handoffs
    ids_b = 2 if b.kernels == "pie" else 0  # esp32-ai reads head4_tok only on ties
    tile_lines = (stream_lines(TILE_ROWS * row_bytes, b.line) + stream_lines(TILE_ROWS * 4, b.line)
                  + stream_lines(TILE_ROWS * ids_b, b.line))
    inline_tiles = min(c.tiles, float(b.first_wave_tiles))
    w.psram(inline_tiles * tile_lines, b.line, inline_tiles / c.tiles * rows * (row_bytes + 4 + ids_b))
    w.psram((c.tiles - inline_tiles) * tile_lines, b.line,
            (1 - inline_tiles / c.tiles) * rows * (row_bytes + 4 + ids_b), split=True)


def _sample(w: Work, b: Build, s: Shape) -> None:
    v, k = s.vocab_out, b.top_k
    if b.sampler == "argmax":
        w.compute(ops=2 * v)  # load + compare per logit
        if b.logits == "psram":
            w.psram(stream_lines(4 * v, b.line), b.line, 4 * v)
    elif b.sampler == "argmax-nancheck":
        w.compute(ops=3 * v)  # ours today: NaN check, then the argmax
    elif b.sampler == "topk-full":
        # ours today: NaN check, one pass keeping the k best (insertion sort:
        # ~k*ln(n/k) insertions of ~k/2 moves), then the draw as below
        inserts = k * math.log(max(v / k, 1.0))
        w.compute(ops=3 * v + inserts * k / 2 * 3)
        _draws(w, b, k)
    elif b.sampler == "cand-topk":
        _draws(w, b, k)
    elif b.sampler in ("cand-greedy", "fused"):
        w.compute(ops=10)
    else:
        raise ValueError(f"unknown sampler {b.sampler!r}")


def _draws(w: Work, b: Build, k: int) -> None:
    """Gumbel-max over k candidates: sort the ids (insertion, ~k^2/4 moves),
    then per id x/T, a Gumbel draw (2 logf + PCG32) and the compare."""
    w.compute(ops=k * k / 4 * 3 + k * (PCG32_OPS + 4))
    _chain(w, b, k * (2 * LOGF_OPS + DIV_OPS))


def _embed_position(e: Work, b: Build, s: Shape) -> None:
    """One position's embed stage but the PLE projection: embedding and PLE
    rows from flash, the PLE input, the RoPE row."""
    d, L, p, dh = s.dim, s.n_layers, s.ple_dim, s.head_dim
    lp = L * p
    if b.rows_from == "image":
        e.flash(q4_row_bytes(d) + 4, b.line)
        e.flash(ple_record_bytes(s), b.line)
    else:  # model.bin in place: packed nibbles + fp16 scales
        e.flash(_cdiv(d, 2) + 2, b.line)
        e.flash(_cdiv(lp, 2) + 2 * n_groups(lp, s.group), b.line)
    e.compute(ops=3 * d + lp * 4 + L * HALF2FLOAT_OPS + lp + lp * 3)
    for _ in range(L):
        _rmsnorm(e, p)
    _quantize(e, b, d)
    if b.rope == "libm":
        e.compute(cycles=3 * (dh // 2) * NEWLIB_TRIG_CYCLES, ops=dh * 3)
    else:
        e.flash(dh * 4, b.line)


def token_work(b: Build, s: Shape, pos: int, *, pie_calls: Mapping[str, int] | None = None,
               counts: HeadCounts | None = None, bound_pie: float | None = None
               ) -> dict[str, Work]:
    """Per-stage cost drivers of one generated token at `pos`."""
    if not 0 <= pos < s.seq_len:
        raise ValueError(f"position {pos} outside the {s.seq_len}-position context")
    d, L, f, p, h, dh = s.dim, s.n_layers, s.ffn, s.ple_dim, s.n_heads, s.head_dim
    mats = {m.name: m for m in matrices(s)}
    work = {st: Work() for st in STAGES}

    # embed: embedding and PLE rows from flash, the PLE input, the RoPE row
    e = work["embed"]
    _embed_position(e, b, s)
    _matvec(e, b, s, mats["ple_model_proj"], pie_calls)

    if b.core_spill_bytes:
        # the spilled tail of the core (ple_proj, ple_gate, ... of the last
        # layers, staged last) streams from PSRAM once per token
        spill = b.core_spill_bytes
        work["ple"].psram(stream_lines(spill, b.line), b.line, spill)
    one = {st: Work() for st in ("attn", "ffn", "ple")}
    a = one["attn"]
    _rmsnorm(a, d)
    _quantize(a, b, d)
    _matvec(a, b, s, mats["qkv"], pie_calls)
    a.compute(ops=2 * h * (dh // 2) * 6)  # RoPE on q and k
    _kv_store(a, b, s)
    _attention_core(a, b, s, pos)
    _quantize(a, b, d)
    _matvec(a, b, s, mats["attn_proj"], pie_calls)
    a.compute(ops=3 * d)

    fw = one["ffn"]
    _rmsnorm(fw, d)
    _quantize(fw, b, d)
    if b.quant_per_matvec:
        _quantize(fw, b, d)  # gate and up each quantize their (same) input
    _matvec(fw, b, s, mats["gate"], pie_calls)
    _matvec(fw, b, s, mats["up"], pie_calls)
    fw.compute(ops=f * 4)  # silu's 1 + e, * up
    _chain(fw, b, f * DIV_OPS)  # x / (1 + e)
    _exp(fw, b, b.act_exp, f)
    _quantize(fw, b, f)
    _matvec(fw, b, s, mats["down"], pie_calls)
    fw.compute(ops=3 * d)

    pw = one["ple"]
    _quantize(pw, b, d)
    _matvec(pw, b, s, mats["ple_gate"], pie_calls)
    if b.act_exp == "newlib":
        pw.compute(erff=p)  # priced by Fit.erff_cycles
    else:
        _chain(pw, b, p * ERFF_OPS)
    pw.compute(ops=p * 5)  # 0.5*v*(1+erf(v*c)) * ple
    _quantize(pw, b, p)
    _matvec(pw, b, s, mats["ple_proj"], pie_calls)
    _rmsnorm(pw, d)
    pw.compute(ops=3 * d)
    for st, wk in one.items():
        work[st].add(wk.scaled(L))

    _head(work["head"], b, s, pie_calls, counts, bound_pie)
    _sample(work["sample"], b, s)
    return work


def build_work(b: Build, s: Shape = RELEASE, positions: Sequence[int] | None = None,
               *, pie_calls: Mapping[str, int] | None = None, counts: HeadCounts | None = None,
               bound_pie: float | None = None) -> dict[str, Work]:
    """Per-stage cost drivers of one token, averaged over `positions`."""
    positions = list(positions if positions is not None else story_positions())
    if not positions:
        raise ValueError("positions is empty")
    total = {st: Work() for st in STAGES}
    for pos in positions:
        one = token_work(b, s, pos, pie_calls=pie_calls, counts=counts, bound_pie=bound_pie)
        for st in STAGES:
            total[st].add(one[st])
    return {st: w.scaled(1.0 / len(positions)) for st, w in total.items()}


# ---------------------------------------------------------------------------
# Speculative decoding: one verification pass of m positions (llm_verify)
# ---------------------------------------------------------------------------

#: A verify pass keeps position 0's working buffers (llm_col) in internal SRAM
#: and those of positions 1..m-1, every position's candidate list and the
#: many-positions head scan's scratch in PSRAM (engine_open.c places "batch" in
#: BULK). The engine's byte counters do not charge them; the model does, in
#: cache lines, assuming each layer's KV stream evicts them, so every buffer a
#: layer touches is fetched and written back once per layer (write-allocate
#: and write-back, one transfer each way as for the KV rows)...
BATCH_VECTOR_TRANSFERS = 2
#: ... except the attention scores ([n_heads][seq_len] per position): written
#: in the score pass (fill + write-back), evicted by the K stream, read and
#: rewritten by the softmax (fill + write-back), evicted by the V stream
#: while it reads them (fill).
SCORE_LINE_TRANSFERS = 5
#: Line fills per tile the many-positions scan pops, its scratch in PSRAM:
#: the deep levels of the heap sift (heap ids and their keys; the top levels
#: stay cached), on top of one fill per position for that tile's bound (tiles
#: come in bound order, not address order, and the tile stream between pops
#: evicts the bound lines).
MANY_POP_HEAP_LINES = 8


@dataclass(frozen=True)
class PassHead:
    """What the many-positions head scan (llm_head_certify_many) does in one
    pass: tiles fetched once for all positions (their rows read once) and rows
    scored, summed over the positions (the engine's head_tiles and head_rows)."""

    tiles: float
    rows: float
    source: str = "analytic"

    @classmethod
    def from_union(cls, b: Build, s: Shape, fraction: float, m: int, union: float,
                   rows_ratio: float) -> PassHead:
        """A pass of m positions from a single step's rows fraction: tiles =
        union x m x one step's tiles (at most every tile), rows scored = rows
        ratio x m x one step's rows (at most every fetched row per position)."""
        one = HeadCounts.from_fraction(b, s, fraction)
        tiles = min(float(s.n_tiles), union * m * one.tiles)
        rows = min(tiles * TILE_ROWS * m, rows_ratio * m * one.rows)
        return cls(tiles, rows, f"union {union:.3f}, rows ratio {rows_ratio:.3f}")


def _cols_scale(m: int, cols_pie: Mapping[int, float] | None) -> float:
    """Measured / closed-form PIE count of the many-columns kernel at m columns
    (1.0 without a measurement; measured equal to it, tests/test_costmodel.py)."""
    if not cols_pie or m not in cols_pie:
        return 1.0
    return cols_pie[m] / (pie_cols_instructions(TILE_ROWS, 96, 128, m) / (TILE_ROWS * m))


def _matvec_pass(w: Work, b: Build, s: Shape, mat: Mat, m: int,
                 pie_calls: Mapping[str, int] | None,
                 cols_pie: Mapping[int, float] | None) -> None:
    """One matrix for the m positions of a pass (engine.c matvec_rows): the
    weights read once, the many-columns kernel for resident rows, the
    single-vector kernel once per column for the others."""
    if b.kernels != "pie" or b.core[0] != "int4":
        raise ValueError(f"{b.name}: passes are modelled for our int4 PIE kernels")
    rows, cols = mat.rows, mat.cols
    ng = n_groups(cols, s.group)
    nbytes = rows * q4_row_bytes(cols) + rows * ng * 4
    split = b.split_rows is not None and rows >= b.split_rows
    if split:
        w.handoffs += 1
    tier = b.core[1]
    if tier == "psram":
        w.psram(stream_lines(rows * q4_row_bytes(cols), b.line)
                + stream_lines(rows * ng * 4, b.line), b.line, nbytes, split=split)
    elif tier == "flash":
        w.flash(nbytes, b.line)
    else:
        w.sram(nbytes)
    if cols_resident(cols, s.group):
        pie = pie_cols_instructions(rows, cols, s.group, m) * _cols_scale(m, cols_pie)
    else:
        one = (pie_calls[mat.name] if pie_calls and mat.name in pie_calls
               else pie_matvec_instructions(rows, cols, s.group))
        pie = m * one
    w.compute(split=split, pie=pie, ops=m * rows * ROW_OPS_PIE)


def _attention_pass(w: Work, b: Build, s: Shape, pos: int, m: int) -> None:
    """One layer's attention for positions pos..pos+m-1 (engine.c
    attention_heads): every cached K/V row 0..pos+m-1 read once for all of
    them, scores, softmax and V accumulation per (position, head), each V row
    recomputed from its int16 dots once for all positions, split by heads
    across the two cores (one hand-off)."""
    if not (b.kv.startswith("fp32") or b.kv == "int8-fast") or \
            b.attn_split not in ("heads", "none"):
        raise ValueError(f"{b.name}: passes are modelled for fp32 K rows or fast mode's int8 "
                         "cache, split by heads")
    h, dh = s.n_heads, s.head_dim
    last = pos + m - 1
    if b.kv == "int8-fast":
        sp = b.attn_split == "heads"
        w.handoffs += sp
        _kv_read(w, b, s, last, split=sp)  # once: the lines stay cached for the m queries
        for c in range(m):
            _fast_query(w, b, s, pos + c + 1, split=sp)
        return
    pairs = h * sum(pos + c + 1 for c in range(m))
    sp = b.attn_split == "heads" and pos >= b.attn_split_min_pos
    if sp:
        w.handoffs += 1
    _kv_read(w, b, s, last, split=sp)
    w.compute(split=sp, ops=pairs * (FDOT_OPS * dh + 4))
    w.compute(split=sp, ops=pairs * 4)
    _exp(w, b, b.softmax_exp, pairs, split=sp)
    w.compute(split=sp, ops=pairs * FAXPY_OPS * dh)
    if b.v_bytes != 4:
        w.compute(split=sp, ops=(last + 1) * h * dh * 4)
    w.compute(split=sp, ops=m * h * dh * 2)
    _chain(w, b, m * h * dh * DIV_OPS, split=sp)


def _scored_row_pie(n: float, s: Shape, cols_pie: Mapping[int, float] | None) -> float:
    """PIE instructions per fetched head row scored for n positions (n may be
    a mean): the single-vector kernel's row for one, the many-columns kernel's
    row for several, linear between whole n (the count is linear in n)."""
    d, g = s.dim, s.group

    def at(k: int) -> float:
        if k <= 1:
            return float(pie_row_instructions(d, g))
        nb = _cdiv(d, 32)
        return (2 + 4 * nb + k * (5 + 2 * nb)) * _cols_scale(k, cols_pie)

    n = min(max(n, 1.0), float(VERIFY_MAX))
    lo = math.floor(n)
    return at(lo) + (n - lo) * (at(min(lo + 1, VERIFY_MAX)) - at(lo))


def _head_many(w: Work, b: Build, s: Shape, m: int, ph: PassHead,
               cols_pie: Mapping[int, float] | None, bound_pie: float | None) -> None:
    """The head of a pass (llm_head_certify_many): every position's input and
    tile bounds, one max-heap on the largest of the m bounds, each tile's rows
    fetched once and scored for the positions whose floor it does not fall
    below. `many_split`: in two lanes, one per core (head.c: the tiles in key
    order, alternate ranks per lane, each lane with its own floors), one
    hand-off per pass, then the lanes' candidate lists merged; otherwise on
    one core, tiles popped from the heap one at a time."""
    if b.head != "certified" or b.kernels != "pie":
        raise ValueError(f"{b.name}: passes are modelled for our certified head")
    d, nt = s.dim, s.n_tiles
    for _ in range(m):
        _rmsnorm(w, d)
        _quantize(w, b, d)
    bp = bound_pie if bound_pie is not None else BOUND_PIE_PER_TILE
    # bounds per position, the key (largest bound) kept beside them
    w.compute(pie=m * nt * bp, ops=m * (nt * BOUND_OPS_PER_TILE + 2 * d + 2 * nt))
    w.sram(m * nt * (2 * _cdiv(d, 16) * 16 + 4))
    log_n = math.log2(max(nt, 2))
    pops = nt if b.many_split else ph.tiles + 1  # the lanes need every tile in order
    w.compute(ops=HEAP_OPS_PER_CMP * (2 * nt + pops * 2 * log_n)
              + pops * m * 3 + ph.tiles * m * 3)  # lowest floor, then each position's test
    rows_read = ph.tiles * TILE_ROWS
    n_bar = ph.rows / rows_read if rows_read else 1.0
    nb = _cdiv(d, 32)
    split = b.many_split
    w.compute(split=split, pie=rows_read * _scored_row_pie(n_bar, s, cols_pie)
              + ph.tiles * n_bar * (6 + 2 * nb),
              ops=ph.rows * (ROW_OPS_PIE + CAND_OPS_PER_ROW))
    if b.sampler == "cand-topk":
        k = b.top_k
        inserts = k * (1.0 + math.log(max(ph.rows / m / k, 1.0)))
        w.compute(split=split, ops=m * inserts * (k / 2) * 3)
    if split:
        w.handoffs += 1
        k = b.top_k if b.sampler == "cand-topk" else 1
        w.compute(ops=m * k * (k / 2) * 3)  # lane 1's lists offered into lane 0's
    row_bytes = q4_row_bytes(d)
    tile_lines = (stream_lines(TILE_ROWS * row_bytes, b.line) + stream_lines(TILE_ROWS * 4, b.line)
                  + stream_lines(TILE_ROWS * 2, b.line))
    w.psram(ph.tiles * tile_lines, b.line, rows_read * (row_bytes + 4 + 2), split=split)


def _batch_buffers(work: Mapping[str, Work], b: Build, s: Shape, pos: int, m: int,
                   ph: PassHead) -> None:
    """PSRAM line transfers of a pass's batch buffers (see BATCH_VECTOR_TRANSFERS):
    positions 1..m-1's working vectors and scores, every position's candidate
    list, the many-positions scan's bounds, key and heap."""
    if b.batch != "psram":
        return
    line = b.line
    d, L, p, h, nt = s.dim, s.n_layers, s.ple_dim, s.n_heads, s.n_tiles
    widest = max(d, s.ffn, p)

    def lines(nbytes: int) -> int:
        return stream_lines(nbytes, line)

    def charge(st: str, transfers: float, *, split: bool = False) -> None:
        work[st].psram(transfers, line, transfers * line, split=split)

    act = lines(_cdiv(widest, 32) * 32)
    cp = _cdiv(d, 32) * 32
    att_split = b.attn_split == "heads"
    for c in range(1, m):
        # embed: x, its quantized copy, the PLE inputs and table row (written)
        charge("embed", BATCH_VECTOR_TRANSFERS * (lines(4 * d) + act + 2 * lines(4 * L * p)))
        # per layer: x, xb, xb2, att, qkv, the quantized input, max/den
        charge("attn", L * BATCH_VECTOR_TRANSFERS * (4 * lines(4 * d) + lines(12 * d) + act + 1))
        charge("attn", L * SCORE_LINE_TRANSFERS * h * lines_touched(0, 4 * (pos + c + 1), line),
               split=att_split)
        charge("ffn", L * BATCH_VECTOR_TRANSFERS * 2 * lines(4 * widest))  # hb, hb2
        charge("ple", L * lines(4 * p))  # the layer's PLE input, read
        charge("head", BATCH_VECTOR_TRANSFERS * (lines(4 * d) + lines(cp)))  # x, head input
    cand = lines(8 + 8 * b.top_k)
    scratch = 2 * m * lines(4 * nt) + lines(4 * nt) + lines(2 * nt)
    charge("head", BATCH_VECTOR_TRANSFERS * (m * cand + scratch))
    charge("head", ph.tiles * (m + MANY_POP_HEAP_LINES))


def pass_work(b: Build, s: Shape, pos: int, m: int, *, head: PassHead | None = None,
              pie_calls: Mapping[str, int] | None = None, bound_pie: float | None = None,
              cols_pie: Mapping[int, float] | None = None) -> dict[str, Work]:
    """Per-stage cost drivers of one verification pass feeding positions
    pos..pos+m-1 (llm_verify): every weight read once, the KV cache read once
    per layer for all m, compute for each position, one hand-off per layer
    (attention), the head's one scan for the m positions (`head`, default:
    no sharing at b.rows_fraction), m samplings. A pass of one position is a
    step (`token_work`: llm_verify evaluates its head by select_next)."""
    if not 1 <= m <= VERIFY_MAX:
        raise ValueError(f"a pass carries 1..{VERIFY_MAX} positions, not {m}")
    if not 0 <= pos or pos + m > s.seq_len:
        raise ValueError(f"positions {pos}..{pos + m - 1} outside the {s.seq_len}-position "
                         "context")
    if m == 1:
        return token_work(b, s, pos, pie_calls=pie_calls, bound_pie=bound_pie)
    ph = head or PassHead.from_union(b, s, b.rows_fraction, m, 1.0, 1.0)
    d, L, f, p, h, dh = s.dim, s.n_layers, s.ffn, s.ple_dim, s.n_heads, s.head_dim
    mats = {mt.name: mt for mt in matrices(s)}
    work = {st: Work() for st in STAGES}

    e = work["embed"]
    for _ in range(m):
        _embed_position(e, b, s)
    _matvec_pass(e, b, s, mats["ple_model_proj"], m, pie_calls, cols_pie)
    if b.core_spill_bytes:  # the spilled core streams from PSRAM once per pass
        spill = b.core_spill_bytes
        work["ple"].psram(stream_lines(spill, b.line), b.line, spill)

    one = {st: Work() for st in ("attn", "ffn", "ple")}
    a = one["attn"]
    for _ in range(m):
        _rmsnorm(a, d)
        _quantize(a, b, d)
        a.compute(ops=2 * h * (dh // 2) * 6)  # RoPE on q and k
        _kv_store(a, b, s)
        _quantize(a, b, d)
        a.compute(ops=3 * d)
    _matvec_pass(a, b, s, mats["qkv"], m, pie_calls, cols_pie)
    _attention_pass(a, b, s, pos, m)
    _matvec_pass(a, b, s, mats["attn_proj"], m, pie_calls, cols_pie)

    fw = one["ffn"]
    for _ in range(m):
        _rmsnorm(fw, d)
        _quantize(fw, b, d)
        if b.quant_per_matvec:
            _quantize(fw, b, d)
        fw.compute(ops=f * 4)
        _chain(fw, b, f * DIV_OPS)
        _exp(fw, b, b.act_exp, f)
        _quantize(fw, b, f)
        fw.compute(ops=3 * d)
    for name in ("gate", "up", "down"):
        _matvec_pass(fw, b, s, mats[name], m, pie_calls, cols_pie)

    pw = one["ple"]
    for _ in range(m):
        _quantize(pw, b, d)
        if b.act_exp == "newlib":
            pw.compute(erff=p)
        else:
            _chain(pw, b, p * ERFF_OPS)
        pw.compute(ops=p * 5)
        _quantize(pw, b, p)
        _rmsnorm(pw, d)
        pw.compute(ops=3 * d)
    for name in ("ple_gate", "ple_proj"):
        _matvec_pass(pw, b, s, mats[name], m, pie_calls, cols_pie)
    for st, wk in one.items():
        work[st].add(wk.scaled(L))

    _head_many(work["head"], b, s, m, ph, cols_pie, bound_pie)
    for _ in range(m):
        _sample(work["sample"], b, s)
    _batch_buffers(work, b, s, pos, m, ph)
    return work


def pass_build_work(b: Build, s: Shape, starts: Sequence[int], m: int, *,
                    head: PassHead | None = None, pie_calls: Mapping[str, int] | None = None,
                    bound_pie: float | None = None,
                    cols_pie: Mapping[int, float] | None = None) -> dict[str, Work]:
    """Per-stage cost drivers of one pass of m positions, averaged over the
    passes starting at `starts`."""
    starts = list(starts)
    if not starts:
        raise ValueError("starts is empty")
    total = {st: Work() for st in STAGES}
    for pos in starts:
        one = pass_work(b, s, pos, m, head=head, pie_calls=pie_calls, bound_pie=bound_pie,
                        cols_pie=cols_pie)
        for st in STAGES:
            total[st].add(one[st])
    return {st: w.scaled(1.0 / len(starts)) for st, w in total.items()}


def stage_breakdown(w: Work, fit: Fit) -> dict[str, float]:
    """Seconds of one stage: memory, compute, the part of the split work's
    memory that the other core's compute hid ("overlap", negative), hand-offs.

    Two cores streaming from one bus: while one computes on its line the bus
    can fill the other's, so ideally a split stage takes max(M, (M + C)/2)
    for M bus seconds and C compute seconds in total, i.e. M + C/2 less
    min(M, C)/2; the fitted `overlap` is the share of that achieved."""
    def cycles(d: Mapping[str, float]) -> float:
        return (d.get("mac", 0.0) * fit.c_mac_i8 + d.get("ops", 0.0) * fit.c_op
                + d.get("pie", 0.0) * PIE_CYCLES + d.get("cycles", 0.0)
                + d.get("erff", 0.0) * fit.erff_cycles + d.get("chain", 0.0) * fit.chain_cycles)

    def fills(lines: Mapping[int, float]) -> float:
        return lines.get(32, 0.0) * fit.s_line32 + lines.get(64, 0.0) * fit.s_line64

    m_split, c_split = fills(w.lines_split), cycles(w.split) / CPU_HZ
    return {"memory": fills(w.lines) + m_split + w.flash_bytes / FLASH_BPS,
            "compute": cycles(w.serial) / CPU_HZ + c_split / CORES,
            "overlap": -fit.overlap * min(m_split, c_split) / CORES,
            "handoffs": w.handoffs * HANDOFF_S}


def stage_seconds(w: Work, fit: Fit) -> float:
    return sum(stage_breakdown(w, fit).values())


def predict(b: Build, fit: Fit, s: Shape = RELEASE, positions: Sequence[int] | None = None,
            **kw: object) -> dict[str, float]:
    """Predicted ms per stage (and "total") for one generated token."""
    work = build_work(b, s, positions, **kw)  # type: ignore[arg-type]
    out = {st: 1e3 * stage_seconds(work[st], fit) for st in STAGES}
    out["total"] = sum(out[st] for st in STAGES)
    return out


def _anchor_ms(an: Anchor, works: Mapping[str, Mapping[str, Work]], f: Fit) -> float:
    w = works[an.build]
    stages = STAGES if an.stage == "total" else (an.stage,)
    return 1e3 * sum(stage_seconds(w[st], f) for st in stages)


def _derived(f: Fit, ple: Work) -> Fit:
    """Fill in the two constants derived from the fitted four: the cost of a
    dependent float op (from esp32-ai's measured softmax pass) and newlib erff
    (from its measured PLE stage, `ple` = that build's PLE work)."""
    pair = SOFTMAX_PAIR_CYCLES - 2 * SOFT_LIBM_CYCLES - SOFTMAX_PAIR_OPS * f.c_op
    f = dataclasses.replace(f, chain_cycles=float(pair / FAST_EXPF_CHAIN_OPS))
    calls = ple.serial.get("erff", 0.0) + ple.split.get("erff", 0.0)
    rest = stage_seconds(ple, dataclasses.replace(f, erff_cycles=0.0))
    return dataclasses.replace(f, erff_cycles=float((RESEARCH_PLE_MS / 1e3 - rest)
                                                    * CPU_HZ / calls))


def fit(s: Shape = RELEASE, positions: Sequence[int] | None = None,
        anchors: Sequence[Anchor] = ANCHORS) -> Fit:
    """Solve the four fitted constants so that the four anchors marked fitted
    are reproduced exactly (Newton's method on a piecewise-linear system,
    started from a plain additive model), the two derived constants following
    along (`_derived`)."""
    import numpy as np

    fitted = [an for an in anchors if an.fitted]
    if len(fitted) != 4:
        raise ArithmeticError(f"{len(fitted)} fitted anchors for four constants")
    works = {an.build: build_work(BUILDS[an.build], s, positions) for an in fitted}
    ple = build_work(BUILDS["research_qact"], s, positions)["ple"]
    target = np.array([an.published_ms for an in fitted])

    def resid(theta: np.ndarray) -> np.ndarray:
        f = _derived(Fit(*theta), ple)
        return np.array([_anchor_ms(an, works, f) for an in fitted]) - target

    theta = np.array([1.0, 0.5e-6, 0.6e-6, 0.5])
    scale = theta.copy()
    for _ in range(60):
        r = resid(theta)
        if np.max(np.abs(r)) < 1e-9:
            break
        jac = np.empty((4, 4))
        for i in range(4):
            d = np.zeros(4)
            d[i] = 1e-6 * scale[i]
            jac[:, i] = (resid(theta + d) - r) / d[i]
        try:
            theta = theta - np.linalg.solve(jac, r)
        except np.linalg.LinAlgError as e:
            raise ArithmeticError("the fitted anchors do not determine the constants") from e
    else:
        raise ArithmeticError(f"fit did not converge (residuals {resid(theta)} ms)")
    out = _derived(Fit(*(float(v) for v in theta)), ple)
    if (min(out.c_op, out.s_line32, out.s_line64, out.c_mac_i8, out.chain_cycles,
            out.erff_cycles) <= 0 or not 0 <= out.overlap <= 1):
        raise ArithmeticError(f"fit gave non-physical constants {out.as_dict()}")
    return out


def fit_stock(s: Shape = RELEASE, positions: Sequence[int] | None = None) -> Fit:
    """Backwards-compatible name of `fit`."""
    return fit(s, positions)


# ---------------------------------------------------------------------------
# Bytes per region (the engine's accounting, engine.c), checked against the
# engine's counters
# ---------------------------------------------------------------------------

def engine_stage_bytes(s: Shape, pos: int, placement: Mapping[str, str] | None = None,
                       *, head: bool = False, head_mode: str = "dense",
                       head_rows: float | None = None, head_ids: bool = True,
                       v_dots: bool = True, weights: bool = True,
                       kv_rows_read: int | None = None) -> dict[str, dict[str, float]]:
    """Bytes the engine (native/engine/engine.c) charges per stage and region
    for one token at `pos`; with `head`, one head evaluation as well
    (`head_eval_bytes`).

    `placement` maps "core", "head", "ids", "tiles", "logits", "kv", "norms" to
    a region (default: the board plan: core, tiles and norms "fast"; head,
    ids, logits and KV "bulk")."""
    pl = {"core": "fast", "kv": "bulk", "norms": "fast"}
    pl.update(placement or {})
    out = {st: dict.fromkeys(REGIONS, 0.0) for st in STAGES}
    for m in matrices(s):
        if m.name == "head" or not weights:  # weights: once per pass (several prompt tokens)
            continue
        b = m.rows * q4_row_bytes(m.cols) + m.rows * n_groups(m.cols, s.group) * 4
        out[m.stage][pl["core"]] += b * m.per_token
    d, L = s.dim, s.n_layers
    out["embed"]["flash"] += q4_row_bytes(d) + n_groups(d, s.group) * 4  # embedding row
    out["embed"]["flash"] += ple_record_bytes(s)
    out["embed"]["flash"] += s.head_dim * 4  # this position's RoPE row
    # K rows as floats, V rows as int16 dots + the position's scale (engine.c
    # attention(); rows that do not fit int16 stay floats: none in a checked
    # run), or as floats in plain mode (v_dots False)
    v_row = 2 * d + 4 if v_dots else 4 * d
    rows_read = pos + 1 if kv_rows_read is None else kv_rows_read
    out["attn"][pl["kv"]] += L * (4 * d + v_row + rows_read * (4 * d + v_row))
    # every rmsnorm charges its weights: the shared PLE-input norm once per layer slice
    out["embed"][pl["norms"]] += L * s.ple_dim * 4
    for st in ("attn", "ffn", "ple"):
        out[st][pl["norms"]] += L * d * 4
    if head:
        out["head"][pl["norms"]] += d * 4
        for r, v in head_eval_bytes(s, pl, mode=head_mode, rows=head_rows,
                                    ids=head_ids).items():
            out["head"][r] += v
    return out


def head_eval_bytes(s: Shape, placement: Mapping[str, str] | None = None, *, mode: str,
                    rows: float | None = None, ids: bool = True) -> dict[str, float]:
    """Bytes one head evaluation charges, per region (engine.c charge_head):
    the scored rows with their fp32 scales and 2-byte ids; a certified
    evaluation adds the whole tile index (int8 box mid+half over the padded
    columns + an f32 tile scale per tile), a dense one (plain mode, top_k 0)
    the logits buffer written by the head and read by the sampler."""
    pl = {"head": "bulk", "ids": "bulk", "tiles": "fast", "logits": "bulk"}
    pl.update(placement or {})
    out = dict.fromkeys(REGIONS, 0.0)
    rb = q4_row_bytes(s.dim) + 4 * n_groups(s.dim, s.group)
    if mode == "dense":
        rows = float(s.vocab_out) if rows is None else rows
        out[pl["logits"]] += s.vocab_out * 2 * 4
    elif mode == "certified":
        if rows is None:
            raise ValueError("a certified head evaluation needs the rows it scored")
        cp = _cdiv(s.dim, 32) * 32
        out[pl["tiles"]] += s.n_tiles * (2 * cp + 4)
    else:
        raise ValueError(f"unknown head mode {mode!r}: dense or certified")
    out[pl["head"]] += rows * rb
    if ids:
        out[pl["ids"]] += rows * 2
    return out


def _prompt_pass(pos: int, n_prompt: int) -> dict[str, object]:
    """A prompt runs in passes of PREFILL_BATCH tokens: the first token of a
    pass is charged the pass's weights and its cache reads (rows 0 .. the
    pass's last, once), the others neither. Steps are passes of one."""
    if pos >= n_prompt:
        return {}
    if pos % PREFILL_BATCH:
        return {"weights": False, "kv_rows_read": 0}
    return {"kv_rows_read": min(pos + PREFILL_BATCH, n_prompt)}


def run_region_bytes(s: Shape, n_prompt: int, n_steps: int,
                     placement: Mapping[str, str] | None = None, *, head_mode: str = "dense",
                     head_rows: float | None = None, head_ids: bool = True,
                     v_dots: bool = True) -> dict[str, int]:
    """Region totals the engine reports after prefill(n_prompt tokens) and
    n_steps step() calls from position 0 (one head evaluation per call).
    `head_rows` is the engine's total of head rows scored (default: all rows
    of every evaluation, the dense head)."""
    tot = dict.fromkeys(REGIONS, 0.0)
    for pos in range(n_prompt + n_steps):
        for st in engine_stage_bytes(s, pos, placement, v_dots=v_dots,
                                     **_prompt_pass(pos, n_prompt)).values():  # type: ignore[arg-type]
            for r, b in st.items():
                tot[r] += b
    heads = n_steps + 1
    rows = float(heads * s.vocab_out) if head_rows is None else float(head_rows)
    pl = {"norms": "fast", **(placement or {})}
    tot[pl["norms"]] += heads * s.dim * 4
    per_eval = head_eval_bytes(s, placement, mode=head_mode, rows=0.0, ids=head_ids)
    with_rows = head_eval_bytes(s, placement, mode=head_mode, rows=rows, ids=head_ids)
    for r in REGIONS:
        tot[r] += heads * per_eval[r] + (with_rows[r] - per_eval[r])
    return {r: round(v) for r, v in tot.items()}


def check_bytes(measured_totals: Mapping[str, int], s: Shape, n_prompt: int, n_steps: int,
                placement: Mapping[str, str] | None = None, *, head_mode: str = "dense",
                head_rows: float | None = None, head_ids: bool = True,
                v_dots: bool = True) -> dict[str, int]:
    """Analytic region totals for the same run; raises ValueError naming the
    regions where the engine's counters disagree with the formulas."""
    expect = run_region_bytes(s, n_prompt, n_steps, placement, head_mode=head_mode,
                              head_rows=head_rows, head_ids=head_ids, v_dots=v_dots)
    bad = {r: (int(measured_totals.get(r, 0)), expect[r]) for r in REGIONS
           if int(measured_totals.get(r, 0)) != expect[r]}
    if bad:
        detail = ", ".join(f"{r}: engine {m} vs formula {e}" for r, (m, e) in bad.items())
        raise ValueError(f"engine byte counters disagree with the cost model ({head_mode} "
                         f"head): {detail}")
    return expect


def placement_from_memory(memory: Iterable[tuple[str, str, int]]) -> dict[str, str]:
    """The engine's placement report -> the regions engine_stage_bytes needs."""
    by_name = {name: region for name, region, _ in memory}
    pl = {}
    if "head" in by_name:
        pl["head"] = by_name["head"]
    for key, name in (("kv", "kv_cache"), ("norms", "norms"), ("core", "L0.qkv"),
                      ("tiles", "head_tiles"), ("ids", "head_ids"), ("logits", "logits")):
        if name in by_name:
            pl[key] = by_name[name]
    cores = {region for name, region, _ in memory
             if name.startswith("L") and "." in name and not name.endswith("norm")}
    if len(cores) > 1:
        raise ValueError(f"core matrices placed in several regions {sorted(cores)}: "
                         "the per-stage split assumes one")
    return pl


# ---------------------------------------------------------------------------
# Measuring the host engine
# ---------------------------------------------------------------------------

@dataclass
class Measured:
    """What the host engine measured, per generated token."""

    region_bytes: dict[str, float]  # flash/fast/bulk per token (averaged)
    pie_per_call: dict[str, int]  # matrix name -> PIE instructions per call
    positions: list[int]
    sources: dict[str, str]
    #: the certified head's counters (None: an engine without them)
    head_rows_fraction: float | None = None  # mean share of head rows scored
    head_tiles: float | None = None  # per head evaluation
    head_waves: float | None = None  # per head evaluation
    handoffs_per_token: float | None = None
    bound_pie_per_tile: float | None = None
    memory: list[tuple[str, str, int]] = field(default_factory=list)
    head_mode: str = "dense"  # how the engine evaluated the head ("certified" | "dense")
    head_ids: bool = True  # the image stores a head row order (ids charged per row)

    def head_counts(self, b: Build, s: Shape) -> HeadCounts | None:
        """The measured head work at this image's own rows fraction."""
        if self.head_rows_fraction is None or self.head_tiles is None:
            return None
        waves = self.head_waves if self.head_waves is not None else math.ceil(
            self.head_tiles / b.wave_tiles)
        return HeadCounts(self.head_rows_fraction * s.vocab_out, self.head_tiles, waves,
                          max(0.0, waves - (1.0 if b.first_wave_tiles else 0.0)),
                          source="engine")


def _open(llm_module: object, image: object, plain: bool) -> object:
    if plain:
        return llm_module.Model(image, plain=True)  # type: ignore[attr-defined]
    return llm_module.Model(image)  # type: ignore[attr-defined]


def measure_host(image: object, *, prompt: Sequence[int] | None = None, n_steps: int = 200,
                 llm_module: object | None = None, pie: bool = True,
                 plain: bool = False) -> Measured:
    """Run the CPython `_llm` on `image` (a path or bytes), greedy from
    `prompt` (default: the first 4 ids of the story prompt, 433 447 259 405,
    clipped to the vocabulary) for n_steps tokens, and return per-token
    region bytes (checked against the formulas: today's dense head, or the
    certified head when the engine reports head_rows) and measured PIE counts."""
    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    with _open(llm_module, image, plain) as m:  # type: ignore[attr-defined]
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
        memory = [tuple(x) for x in m.memory()]
    if st.get("v_wide"):
        raise ValueError(f"{st['v_wide']} V rows were cached as floats (dots wider than int16): "
                         "the byte formulas assume none; measure on another prompt")
    placement = placement_from_memory(memory)
    totals = {r: int(st["bytes"][r]) for r in REGIONS}
    heads = int(st.get("heads", n_steps + 1))
    certified = not plain and int(st.get("head_tiles", 0)) > 0
    mode = "certified" if certified else "dense"
    has_ids = any(name == "head_ids" for name, _, _ in memory)
    head_rows = float(st.get("head_rows", heads * s.vocab_out))
    check_bytes(totals, s, len(ids), n_steps, placement, head_mode=mode, head_rows=head_rows,
                v_dots=not plain,
                head_ids=has_ids)
    # per generated token: subtract the prompt's layer passes but one token's
    # (a story's steady state does not pay them per token)
    prompt_only = dict.fromkeys(REGIONS, 0.0)
    for pos in range(len(ids)):
        for regs in engine_stage_bytes(s, pos, placement, v_dots=not plain,
                                       **_prompt_pass(pos, len(ids))).values():  # type: ignore[arg-type]
            for r, v in regs.items():
                prompt_only[r] += v
    for regs in engine_stage_bytes(s, len(ids) - 1, placement, v_dots=not plain).values():
        for r, v in regs.items():
            prompt_only[r] -= v
    per_token = {r: (totals[r] - prompt_only[r]) / (n_steps + 1) for r in REGIONS}
    positions = list(range(len(ids) - 1, len(ids) + n_steps))
    sources = {"bytes": f"_llm {llm_module.build_info()} stats() over {n_steps} steps, "  # type: ignore[attr-defined]
                        "checked equal to the formulas"}
    pie_calls: dict[str, int] = {}
    bound_pie = None
    if pie:
        shapes = {mat.name: (mat.rows, mat.cols, s.group) for mat in matrices(s)}
        cp = _cdiv(s.dim, 32) * 32
        counts = measure_pie_counts(set(shapes.values()), bound_shapes=[(s.n_tiles, 2 * cp)])
        pie_calls = {name: counts[shape] for name, shape in shapes.items()}
        pie_calls["head_row"] = pie_row_instructions(s.dim, s.group)
        if (s.n_tiles, 2 * cp) in counts:
            bound_pie = counts[(s.n_tiles, 2 * cp)] / s.n_tiles
            sources["bound_pie"] = "llm_matvec_s8_pie through pie_model.c's counters"
        sources["pie"] = "kernels_pie.c through pie_model.c's instruction counters"
    out = Measured(per_token, pie_calls, positions, sources, memory=memory,
                   bound_pie_per_tile=bound_pie, head_mode=mode, head_ids=has_ids)
    if "head_rows" in st and heads:
        out.head_rows_fraction = head_rows / heads / s.vocab_out
        out.head_tiles = float(st.get("head_tiles", 0)) / heads
        if "head_waves" in st:
            out.head_waves = float(st["head_waves"]) / heads
        if "handoffs" in st:
            out.handoffs_per_token = float(st["handoffs"]) / max(int(st.get("tokens", 1)), 1)
        sources["head"] = "engine head_rows/head_tiles/head_waves counters"
    return out


def measure_head_fraction(image: object, *, llm_module: object | None = None,
                          prompts: Sequence[Sequence[int]] = ((433, 447, 259, 405),),
                          n_steps: int = 200, temperature: float = 0.0, top_k: int = 0,
                          seeds: Sequence[int] = (0,)) -> float | None:
    """Mean share of head rows the engine's certified head scored per head
    evaluation (stats()["head_rows"] / heads / vocab_out) over the prompts and
    seeds; None when the engine has no certified head (no head_rows counter)."""
    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    rows = heads = 0
    vocab = 1
    for seed in seeds:
        for prompt in prompts:
            with llm_module.Model(image) as m:  # type: ignore[attr-defined]
                cfg = m.config()
                vocab = int(cfg["vocab_out"])
                ids = [t % vocab for t in prompt]
                steps = min(n_steps, int(cfg["seq_len"]) - len(ids))
                m.sampler(temperature, top_k, seed)
                tok = m.prefill(ids)
                for _ in range(steps):
                    tok = m.step(tok)
                st = m.stats()
            if "head_rows" not in st:
                return None
            rows += int(st["head_rows"])
            heads += int(st["heads"])
    return rows / heads / vocab if heads else None


@dataclass
class HeadFractions:
    """The certified head's rows-scored share: the release figure used for
    our headline, and what the engine measured on the models we have.

    The real release head is not available here: greedy uses the published
    33-35 % (esp32-ai, same rows, same norm ordering idea, tiles of 128); the
    sampled figure scales it by the top-40/greedy ratio measured on the demo
    model. The release-shaped random model's figure shows what a head
    without trained structure costs."""

    greedy: float = RELEASE_GREEDY_FRACTION
    greedy_range: tuple[float, float] = RELEASE_GREEDY_RANGE
    demo_greedy: float | None = None
    demo_topk: float | None = None
    random_greedy: float | None = None
    random_topk: float | None = None
    source: dict[str, str] = field(default_factory=dict)

    @property
    def topk_ratio(self) -> float | None:
        if self.demo_greedy and self.demo_topk is not None:
            return self.demo_topk / self.demo_greedy
        return None

    @property
    def sampled(self) -> float | None:
        r = self.topk_ratio
        return None if r is None else min(1.0, self.greedy * r)


def measure_fractions(demo_image: object | None, random_image: object | None = None, *,
                      llm_module: object | None = None, n_steps: int = 200,
                      seeds: Sequence[int] = (1, 2, 3, 4, 5)) -> HeadFractions:
    """Greedy and T 0.8 top-40 rows fractions of the engine's certified head
    on the demo model (and on a release-shaped random model); fields stay None
    when the engine has no certified head yet."""
    fr = HeadFractions()
    prompts = ((433, 447, 259, 405), (1, 2, 3), (7, 11))
    for key, img in (("demo", demo_image), ("random", random_image)):
        if img is None:
            continue
        g = measure_head_fraction(img, llm_module=llm_module, prompts=prompts, n_steps=n_steps)
        if g is None:
            fr.source[key] = "engine has no certified head yet (no head_rows counter)"
            continue
        t = measure_head_fraction(img, llm_module=llm_module, prompts=prompts, n_steps=n_steps,
                                  temperature=0.8, top_k=40, seeds=seeds)
        setattr(fr, f"{key}_greedy", g)
        setattr(fr, f"{key}_topk", t)
        fr.source[key] = (f"engine stats() head_rows over {len(prompts)} prompts x {n_steps} "
                          f"steps, greedy and T 0.8 top-40 x seeds {list(seeds)}")
    return fr


# ---------------------------------------------------------------------------
# Speculative decoding: what a pass yields (drafting) and how much of the head
# its positions share (measured on the host engine)
# ---------------------------------------------------------------------------

#: mpllm.drafting.study's story prompts (its defaults), used for every
#: measurement of the speculative inputs.
SPEC_PROMPTS = ("Once upon a time", "One day, a little girl named Lily", "Tom and his dog",
                "The sun was", "Once upon a time, there was")
#: the sampled runs' seeds (drafting.study's defaults): T 0.8, top-k 40
SPEC_SEEDS = (1, 2, 3, 4, 5)
SPEC_MODES = ("greedy", "sampled")


def _samplers(mode: str, seeds: Sequence[int]) -> list[tuple[float, int, int]]:
    if mode == "greedy":
        return [(0.0, 0, 0)]
    if mode == "sampled":
        return [(0.8, 40, sd) for sd in seeds]
    raise ValueError(f"unknown mode {mode!r}: greedy or sampled")


@dataclass(frozen=True)
class DraftFigures:
    """One drafter replayed over plainly decoded stories (mpllm.drafting.simulate):
    story tokens per pass and the drafts each pass verifies."""

    drafter: str
    tokens_per_pass: float
    drafted_per_pass: float
    accept_rate: float = 0.0
    passes: int = 0
    story_tokens: int = 0

    @property
    def positions_per_pass(self) -> float:
        """m: the pass's own token plus the drafts it verifies."""
        return 1.0 + self.drafted_per_pass

    @property
    def usable(self) -> bool:
        return (math.isfinite(self.drafted_per_pass) and self.tokens_per_pass >= 1.0
                and 1.0 <= self.positions_per_pass <= VERIFY_MAX)

    @classmethod
    def from_study(cls, name: str, r: Mapping[str, float]) -> DraftFigures:
        """From one drafting.study() row. The drafts per pass are its "drafted"
        count when it has one, else accepted / accept_rate, accepted = story
        tokens - passes (each pass emits its accepted drafts and one token)."""
        passes, story = int(r["passes"]), int(r["story_tokens"])
        rate = float(r["accept_rate"])
        if "drafted" in r:
            drafted = float(r["drafted"])
        else:
            accepted = story - passes
            drafted = accepted / rate if rate > 0 else (0.0 if accepted == 0 and
                                                         float(r["tokens_per_pass"]) == 1.0
                                                         else math.nan)
        return cls(name, float(r["tokens_per_pass"]), drafted / passes if passes else math.nan,
                   rate, passes, story)


#: mpllm.drafting.study on the demo model (n_tokens 200, table_stories 200,
#: seeds 1-5, the drafts table priced by draft_prices() for the release
#: shape, as convert builds it): the figures used when it is not re-run
#: (bench.py --model-s3 re-runs it whenever the engine and demo are here).
DEFAULT_STUDY: dict[str, dict[str, dict[str, float]]] = {
    "greedy": {
        "lookup": {"tokens_per_pass": 484 / 457, "accept_rate": 27 / 1081,
                   "passes": 457, "drafted": 1081, "story_tokens": 484},
        "ngram": {"tokens_per_pass": 484 / 158, "accept_rate": 326 / 354,
                  "passes": 158, "drafted": 354, "story_tokens": 484},
        "both": {"tokens_per_pass": 484 / 193, "accept_rate": 291 / 752,
                 "passes": 193, "drafted": 752, "story_tokens": 484},
    },
    "sampled": {
        "lookup": {"tokens_per_pass": 2395 / 2278, "accept_rate": 117 / 5288,
                   "passes": 2278, "drafted": 5288, "story_tokens": 2395},
        "ngram": {"tokens_per_pass": 2395 / 1021, "accept_rate": 1374 / 1788,
                  "passes": 1021, "drafted": 1788, "story_tokens": 2395},
        "both": {"tokens_per_pass": 2395 / 1117, "accept_rate": 1278 / 4048,
                 "passes": 1117, "drafted": 4048, "story_tokens": 2395},
    },
}


@dataclass
class UnionRatios:
    """Per pass of m positions, what the many-positions head scan did relative
    to m single steps over the same positions (the same tokens): tiles fetched
    (the "union" ratio: 1/m when every position needs the same tiles, 1 when
    they share none) and rows scored summed over the positions."""

    tiles: dict[int, float]
    rows: dict[int, float]
    step_tiles: float = math.nan  # mean tiles one step fetched
    step_fraction: float = math.nan  # mean share of head rows one step scored
    n_tiles: int = 0
    passes: dict[int, int] = field(default_factory=dict)
    source: str = "default"

    def at(self, m: int) -> tuple[float, float]:
        """(tiles ratio, rows ratio) at m: m x ratio is interpolated linearly in
        m between the measured m (1 at m = 1), continued along the last two."""
        if m == 1:
            return 1.0, 1.0
        out = []
        for ratios in (self.tiles, self.rows):
            pts = sorted({1: 1.0, **{int(k): k * v for k, v in ratios.items()}}.items())
            if len(pts) == 1:
                out.append(1.0 / m)
                continue
            for (m0, y0), (m1, y1) in itertools.pairwise(pts):
                if m <= m1:
                    break
            y = y0 + (m - m0) * (y1 - y0) / (m1 - m0)
            out.append(max(y, 0.0) / m)
        return out[0], out[1]


#: What measure_union found on the demo model at 9a6b552 (SPEC_PROMPTS x 200
#: tokens, greedy and T 0.8/top-40 x seeds 1-5): its 8-tile head fetches the
#: same tiles at every position, so a pass fetches one step's tiles (greedy
#: exactly; sampled slightly fewer: the one-tile-at-a-time scan has no wave
#: overshoot). Used when it is not re-measured.
DEFAULT_UNION = {
    "greedy": UnionRatios({m: 1.0 / m for m in range(2, VERIFY_MAX + 1)},
                          {m: 1.0 for m in range(2, VERIFY_MAX + 1)}, n_tiles=8,
                          source="default (demo model, measured at 9a6b552)"),
    "sampled": UnionRatios({m: u / m for m, u in zip(range(2, VERIFY_MAX + 1),
                                                     (0.947, 0.952, 0.960, 0.964, 0.971,
                                                      0.978, 0.987), strict=True)},
                           {m: 0.937 for m in range(2, VERIFY_MAX + 1)}, n_tiles=8,
                           source="default (demo model, measured at 9a6b552)"),
}


@dataclass
class SpecInputs:
    """What the speculative builds are computed from: the drafters' tokens and
    drafts per pass and the head's union ratios on the demo model (the
    release model's acceptance cannot be measured here), the release-shaped
    random head's union ratios (shown), the many-columns kernel's PIE counts,
    and optionally an n-gram threshold x draft cap sweep (`adaptive`)."""

    drafts: dict[str, dict[str, DraftFigures]]
    union: dict[str, UnionRatios]
    union_release: dict[str, UnionRatios] = field(default_factory=dict)
    cols_pie: dict[int, float] | None = None
    adaptive: dict[str, list[DraftFigures]] = field(default_factory=dict)
    table: dict[str, object] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    @classmethod
    def default(cls) -> SpecInputs:
        return cls({mode: {n: DraftFigures.from_study(n, r) for n, r in rows.items()}
                    for mode, rows in DEFAULT_STUDY.items()},
                   {k: dataclasses.replace(v) for k, v in DEFAULT_UNION.items()},
                   source={"drafts": "default: drafting.study on the demo (200 table "
                                     "stories, release-priced drafts table)",
                           "union": DEFAULT_UNION["greedy"].source,
                           "cols_pie": "closed form (pie_cols_instructions)"})


def measure_drafting(image: object, *, table_stories: int = 200, n_tokens: int = 200,
                     seeds: Sequence[int] = SPEC_SEEDS, llm_module: object | None = None
                     ) -> tuple[dict[str, dict[str, DraftFigures]], dict[str, object]]:
    """mpllm.drafting.study on `image` (the demo model): per mode and drafter
    the tokens and drafts per pass; and the n-gram table's size."""
    from . import drafting

    res = drafting.study(os.fspath(image), n_tokens=n_tokens,  # type: ignore[arg-type]
                         prices=draft_prices(),
                         table_stories=table_stories, seeds=seeds, llm_module=llm_module)
    table = dict(res.pop("table").get("entries", {}))  # type: ignore[union-attr]
    drafts = {mode: {n: DraftFigures.from_study(n, r) for n, r in rows.items()}
              for mode, rows in res.items()}
    return drafts, table


def _encode_prompts(m: object, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    vocab = int(m.config()["vocab_out"])  # type: ignore[attr-defined]
    if all(not isinstance(p, str) for p in prompts):
        return [[int(t) % vocab for t in p] for p in prompts]  # type: ignore[union-attr]
    from .checkout import import_llm

    tok = import_llm().Tokenizer(m.tokenizer())  # type: ignore[attr-defined]
    return [tok.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def pass_region_bytes(s: Shape, pos: int, m: int, placement: Mapping[str, str] | None = None,
                      *, rows_read: float = 0.0, head_ids: bool = True,
                      v_dots: bool = True) -> dict[str, float]:
    """Bytes the engine charges per region for one llm_verify pass of m
    positions at pos (m >= 2, the many-positions head scan): the weights and
    the cache rows 0..pos+m-1 once, each position's flash rows, norms, cache
    row written and tile boxes, and `rows_read` head rows (with their scales
    and ids) once."""
    tot = dict.fromkeys(REGIONS, 0.0)
    for c in range(m):
        kw: dict[str, object] = ({"kv_rows_read": pos + m} if c == 0
                                 else {"weights": False, "kv_rows_read": 0})
        for regs in engine_stage_bytes(s, pos + c, placement, v_dots=v_dots,
                                       **kw).values():  # type: ignore[arg-type]
            for r, v in regs.items():
                tot[r] += v
    pl = {"norms": "fast", **(placement or {})}
    tot[pl["norms"]] += m * s.dim * 4
    per_eval = head_eval_bytes(s, placement, mode="certified", rows=0.0, ids=head_ids)
    rows = head_eval_bytes(s, placement, mode="certified", rows=rows_read, ids=head_ids)
    for r in REGIONS:
        tot[r] += m * per_eval[r] + (rows[r] - per_eval[r])
    return tot


def _check_pass_bytes(delta: Mapping[str, int], s: Shape, pos: int, m: int, tiles: int,
                      placement: Mapping[str, str], head_ids: bool) -> None:
    """The engine's bytes for one pass equal pass_region_bytes with the head
    rows it read: a whole number of rows, within the tiles it fetched."""
    base = pass_region_bytes(s, pos, m, placement, head_ids=head_ids)
    per_row = head_eval_bytes(s, placement, mode="certified", rows=1.0, ids=head_ids)
    empty = head_eval_bytes(s, placement, mode="certified", rows=0.0, ids=head_ids)
    row_b = {r: per_row[r] - empty[r] for r in REGIONS}
    head_region = max(row_b, key=row_b.get)  # type: ignore[arg-type]
    rows = (delta[head_region] - base[head_region]) / row_b[head_region]
    expect = {r: base[r] + rows * row_b[r] for r in REGIONS}
    bad = {r: (delta[r], expect[r]) for r in REGIONS if abs(delta[r] - expect[r]) > 0.5}
    last = s.vocab_out - (s.n_tiles - 1) * TILE_ROWS
    if (bad or rows != int(rows) or not (tiles - 1) * TILE_ROWS < rows <= tiles * TILE_ROWS
            and not (tiles - 1) * TILE_ROWS + last == rows):
        raise ValueError(f"verify pass of {m} at {pos}: engine bytes {dict(delta)} disagree with "
                         f"the pass formulas ({tiles} tiles, {rows} head rows; {bad})")


def measure_union(image: object, *, llm_module: object | None = None,
                  prompts: Sequence[str | Sequence[int]] = SPEC_PROMPTS, n_tokens: int = 200,
                  seeds: Sequence[int] = SPEC_SEEDS, ms: Iterable[int] = range(2, VERIFY_MAX + 1),
                  modes: Sequence[str] = SPEC_MODES) -> dict[str, UnionRatios]:
    """Per mode, the head's union and rows ratios of verify passes against
    single steps on `image`: each prompt's story is decoded by step() (its
    per-step head_tiles and head_rows recorded), then fed again in passes of m
    of its own tokens (Model.verify: every draft right, so every position's
    head input is the step's); the pass must return the story's next tokens,
    and its bytes must equal the pass formulas (`pass_region_bytes`)."""
    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    ms = sorted({int(k) for k in ms})
    if not ms or ms[0] < 2 or ms[-1] > VERIFY_MAX:
        raise ValueError(f"m in 2..{VERIFY_MAX}, not {ms}")
    out: dict[str, UnionRatios] = {}
    with llm_module.Model(os.fspath(image)) as mdl:  # type: ignore[attr-defined]
        cfg = mdl.config()
        s = Shape.from_config(cfg)
        eot, seq = int(cfg["eot_id"]), int(cfg["seq_len"])
        ids = _encode_prompts(mdl, prompts)
        memory = [tuple(x) for x in mdl.memory()]
        placement = placement_from_memory(memory)
        has_ids = any(name == "head_ids" for name, _, _ in memory)
        for mode in modes:
            sums = {k: [0, 0, 0, 0, 0] for k in ms}  # pass tiles, step tiles, rows, rows, passes
            steps = step_tiles = step_rows = 0
            for smp in _samplers(mode, seeds):
                for prompt in ids:
                    mdl.reset()
                    mdl.sampler(*smp)
                    story = [mdl.prefill(prompt)]
                    tiles: list[int] = []
                    rows: list[int] = []
                    while (story[-1] != eot and len(story) < n_tokens
                           and len(prompt) + len(story) < seq):
                        a = mdl.stats()
                        story.append(mdl.step(story[-1]))
                        z = mdl.stats()
                        tiles.append(z["head_tiles"] - a["head_tiles"])
                        rows.append(z["head_rows"] - a["head_rows"])
                    if story[-1] == eot:
                        story.pop()
                        tiles, rows = tiles[:len(story) - 1], rows[:len(story) - 1]
                    steps += len(tiles)
                    step_tiles += sum(tiles)
                    step_rows += sum(rows)
                    for k in ms:
                        mdl.reset()
                        mdl.sampler(*smp)
                        if mdl.prefill(prompt) != story[0]:
                            raise RuntimeError("prefill changed between two runs")
                        i = 0
                        while i + k <= len(tiles):
                            a = mdl.stats()
                            pos = mdl.pos()
                            got = mdl.verify(story[i:i + k])
                            z = mdl.stats()
                            if list(got) != story[i + 1:i + k + 1]:
                                raise RuntimeError(f"verify of {k} at {pos} returned {list(got)}, "
                                                   f"steps {story[i + 1:i + k + 1]}")
                            if z.get("v_wide", 0) != a.get("v_wide", 0):
                                raise ValueError("V rows cached as floats: the byte formulas "
                                                 "assume none")
                            pt = z["head_tiles"] - a["head_tiles"]
                            _check_pass_bytes({r: z["bytes"][r] - a["bytes"][r] for r in REGIONS},
                                              s, pos, k, pt, placement, has_ids)
                            acc = sums[k]
                            acc[0] += pt
                            acc[1] += sum(tiles[i:i + k])
                            acc[2] += z["head_rows"] - a["head_rows"]
                            acc[3] += sum(rows[i:i + k])
                            acc[4] += 1
                            i += k
            out[mode] = UnionRatios(
                {k: v[0] / v[1] for k, v in sums.items() if v[1]},
                {k: v[2] / v[3] for k, v in sums.items() if v[3]},
                step_tiles=step_tiles / steps if steps else math.nan,
                step_fraction=step_rows / steps / s.vocab_out if steps else math.nan,
                n_tiles=s.n_tiles, passes={k: v[4] for k, v in sums.items()},
                source=(f"engine verify vs step on {Path(os.fspath(image)).name} "  # type: ignore[arg-type]
                        f"({s.n_tiles} tiles): {len(ids)} prompts x {n_tokens} tokens"
                        + (f" x seeds {list(seeds)}" if mode == "sampled" else "")
                        + ", bytes checked equal to the pass formulas"))
    return out


def measure_adaptive(image: object, *, llm_module: object | None = None,
                     table_stories: int = 200, n_tokens: int = 200,
                     seeds: Sequence[int] = SPEC_SEEDS,
                     odds: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                     caps: Sequence[int] = tuple(range(1, VERIFY_MAX)),
                     ) -> dict[str, list[DraftFigures]]:
    """The self-distilled n-gram drafter with other (constant) thresholds on
    the chance that a whole draft is accepted (the drafts table's min_odds)
    and draft caps, replayed over the same stories as
    drafting.study (its table built the same way: drafting.self_distilled),
    beside the table convert stores ("ngram priced": draft_prices()): the
    cost model picks the threshold and cap that minimise ms/token."""
    from . import drafting

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    out: dict[str, list[DraftFigures]] = {}
    with llm_module.Model(os.fspath(image)) as mdl:  # type: ignore[attr-defined]
        eot = int(mdl.config()["eot_id"])
        ids = _encode_prompts(mdl, SPEC_PROMPTS)
        table = drafting.self_distilled(mdl, ids, table_stories, n_tokens, eot)
        for mode in SPEC_MODES:
            stories = [pair for smp in _samplers(mode, seeds)
                       for pair in drafting.decode_stories(mdl, ids, smp, n_tokens, eot)]
            r = drafting.simulate(stories, table.table(draft_prices()).draft)
            rows = [DraftFigures("ngram priced", r.tokens_per_pass, r.drafted / r.passes,
                                 r.accept_rate, r.passes, r.story_tokens)]
            for x in odds:
                for cap in caps:
                    t = table.table([x] * cap, cap)
                    r = drafting.simulate(stories, t.draft, max_draft=cap)
                    rows.append(DraftFigures(f"ngram odds>={x:.2f} cap {cap}",
                                             r.tokens_per_pass, r.drafted / r.passes,
                                             r.accept_rate, r.passes, r.story_tokens))
            out[mode] = rows
    return out


def measure_spec(demo_image: object, release_image: object | None = None, *,
                 llm_module: object | None = None, table_stories: int = 200,
                 n_tokens: int = 200, seeds: Sequence[int] = SPEC_SEEDS,
                 adaptive: bool = True, cols: bool = True) -> SpecInputs:
    """Every speculative input measured: drafting on the demo model, the
    union ratios on the demo (and on a release-shaped image, fewer runs), the
    many-columns PIE counts (when a compiler is here), the adaptive sweep."""
    spec = SpecInputs.default()
    drafts, table = measure_drafting(demo_image, table_stories=table_stories,
                                     n_tokens=n_tokens, seeds=seeds, llm_module=llm_module)
    spec.drafts, spec.table = drafts, table
    spec.source["drafts"] = (f"drafting.study on the demo: {n_tokens} tokens, {table_stories} "
                             f"table stories, seeds {list(seeds)}")
    spec.union = measure_union(demo_image, llm_module=llm_module, n_tokens=n_tokens, seeds=seeds)
    spec.source["union"] = spec.union["sampled"].source
    if release_image is not None:
        spec.union_release = measure_union(release_image, llm_module=llm_module,
                                           prompts=SPEC_PROMPTS[:2], n_tokens=min(n_tokens, 100),
                                           seeds=tuple(seeds)[:2], ms=(2, 4, 8))
        spec.source["union_release"] = spec.union_release["sampled"].source
    if cols:
        try:
            spec.cols_pie = measure_cols_pie()
            spec.source["cols_pie"] = ("tests/c/pie_kernels_test.c cols through pie_model.c's "
                                       "counters")
        except (FileNotFoundError, RuntimeError) as e:
            spec.source["cols_pie"] = f"closed form (not measured: {e})"
    if adaptive:
        spec.adaptive = measure_adaptive(demo_image, llm_module=llm_module,
                                         table_stories=table_stories, n_tokens=n_tokens,
                                         seeds=seeds)
        spec.source["adaptive"] = (f"n-gram thresholds x caps over the same stories "
                                   f"({table_stories} table stories)")
    return spec


# ---------------------------------------------------------------------------
# Internal SRAM: what the placement plan needs and what is left
# ---------------------------------------------------------------------------

#: ESP32-S3 internal SRAM: 512 KB (Espressif ESP32-S3 datasheet); 64 KB of it
#: are the instruction and data caches at the sizes configured here (32 KB
#: each, sdkconfig.board), which leaves ~448 KB data-capable (ESP-IDF "Memory
#: Types" guide for the S3; micropython discussion #19924).
SRAM_TOTAL_BYTES = 512 * 1024
SRAM_CACHE_BYTES = 64 * 1024
#: Internal SRAM free once MicroPython is up with its GC heap in PSRAM: an
#: ESP32-S3 N16R8 running MicroPython v1.20 (ESP-IDF 5.0.2) reported
#: esp32.idf_heap_info(esp32.HEAP_DATA) internal heaps free 32,031 + 230,676 +
#: 64 + 16,864 + 7,752 bytes (micropython issue #12075), largest block
#: 229,376. An ASSUMPTION for our v1.28 / IDF 5.5.1 build until a board
#: reports its own (the board self-test should print idf_heap_info).
SRAM_FREE_AT_BOOT = 32031 + 230676 + 64 + 16864 + 7752
SRAM_LARGEST_BLOCK = 229376
#: The engine's own state struct in FAST, as the host port reports it
#: (`_llm.Model.memory()` "engine", certified-head engine).
ENGINE_STRUCT_BYTES = 7072


def _r16(n: int) -> int:
    return _cdiv(n, 16) * 16


def sram_plan(s: Shape = RELEASE, *, memory: Iterable[tuple[str, str, int]] | None = None,
              wave_tiles: int = 8) -> dict[str, object]:
    """Internal SRAM the placement plan asks for against what is free at boot
    (`SRAM_FREE_AT_BOOT`). With `memory` (the engine's placement report on a
    release-shaped image) the plan is exactly what the engine put in FAST;
    otherwise it is computed: core matrices, norms, the head's tile index,
    activations (with the certified head's scratch), the engine state."""
    items: dict[str, int] = {}
    if memory is not None:
        for name, region, size in memory:
            if region != "fast":
                continue
            key = ("core matrices (int4 + fp32 scales)"
                   if name == "ple_model_proj" or (name.startswith("L") and "." in name)
                   else {"head_tiles": "head tile index (boxes + scales)",
                         "activations": "activations + head scratch"}.get(name, name))
            items[key] = items.get(key, 0) + int(size)
        source = "the engine's placement report (FAST entries)"
    else:
        d, L, p = s.dim, s.n_layers, s.ple_dim
        nt, cp = s.n_tiles, _cdiv(d, 32) * 32
        items["core matrices (int4 + fp32 scales)"] = sum(
            (m.rows * q4_row_bytes(m.cols) + m.rows * n_groups(m.cols, s.group) * 4)
            * m.per_token for m in matrices(s) if m.name != "head")
        items["norm weights"] = (3 * L * d + p + d) * 4
        items["head tile index (boxes + scales)"] = nt * (2 * cp + 4)
        # x, xb, xb2, qkv, att, hb, hb2 (max(F, P)), ple, trow, scores [H][S], two
        # quantized inputs; the head's [xq | |xq|], bounds, heap, wave and values;
        # the V cache's per-position "wide" flags and the dots' unit scales
        act = (3 * d + 3 * d + d + 2 * max(s.ffn, p) + 2 * L * p + s.n_heads * s.seq_len) * 4
        act += 2 * _r16(4 * s.n_heads) + _r16(L * s.seq_len) + _r16(4 * d)
        scratch = (_r16(2 * cp) + 2 * _r16(4 * nt) + _r16(2 * nt) + _r16(2 * wave_tiles)
                   + _r16(4 * wave_tiles * TILE_ROWS) + 40 * 8)
        items["activations + head scratch"] = _r16(act) + 2 * _r16(cp) + scratch
        items["engine"] = ENGINE_STRUCT_BYTES
        source = "computed from the shape (no placement report given)"
    need = sum(items.values())
    free = SRAM_FREE_AT_BOOT - need
    return {"items": items, "need_bytes": need, "free_at_boot_bytes": SRAM_FREE_AT_BOOT,
            "left_free_bytes": free, "core_spill_bytes": max(0, -free),
            "largest_block_bytes": SRAM_LARGEST_BLOCK, "plan_source": source,
            "sources": ("ESP32-S3 datasheet: 512 KB internal SRAM; 32 KB I + 32 KB D cache "
                        "taken from it (sdkconfig); free at boot under MicroPython (GC heap in "
                        "PSRAM): micropython#12075 idf_heap_info on an N16R8 (v1.20/IDF "
                        "5.0.2), ASSUMED for v1.28/IDF 5.5.1")}


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def _scale_memory(work: Mapping[str, Work], bulk: float, flash: float) -> dict[str, Work]:
    """Our build with its PSRAM line fills scaled by measured/formula bulk bytes
    and flash bytes by measured/formula flash bytes (1.0 once check_bytes
    passed: the engine's counters drive the prediction)."""
    out = {}
    for st, w in work.items():
        c = dataclasses.replace(w, lines={k: v * bulk for k, v in w.lines.items()},
                                lines_split={k: v * bulk for k, v in w.lines_split.items()},
                                flash_bytes=w.flash_bytes * flash)
        out[st] = c
    return out


def _formula_per_token(s: Shape, positions: Sequence[int], placement: Mapping[str, str] | None,
                       **head: object) -> dict[str, float]:
    tot = dict.fromkeys(REGIONS, 0.0)
    for pos in positions:
        for regs in engine_stage_bytes(s, pos, placement, head=True, **head).values():  # type: ignore[arg-type]
            for r, v in regs.items():
                tot[r] += v / len(positions)
    return tot


@dataclass
class Report:
    fit: Fit
    anchors: list[dict[str, object]]
    builds: dict[str, dict[str, object]]
    variants: dict[str, dict[str, object]]
    fractions: HeadFractions
    sram: dict[str, object]
    measured: Measured | None
    positions: list[int]
    spec: SpecInputs | None = None

    @property
    def predictions(self) -> dict[str, dict[str, float]]:
        """build -> stage/total -> ms (every build in the report)."""
        return {n: {**b["stages"], "total": b["total_ms"]}  # type: ignore[dict-item]
                for n, b in self.builds.items()}

    def table(self) -> str:
        f = self.fit
        lines = [
            ("ESP32-S3 N16R8 cost model, per generated token, positions "
             f"{self.positions[0]}..{self.positions[-1]}"),
            (f"fitted (jointly): C_OP {f.c_op:.3f} cycles/op (stock attention), two-core "
             f"overlap {f.overlap:.2f} (stock head), PSRAM line fill "
             f"{f.s_line32 * 1e6:.3f} us/32 B = {f.psram_bps(32) / 1e6:.1f} MB/s (32-byte-line "
             f"head), {f.s_line64 * 1e6:.3f} us/64 B = {f.psram_bps(64) / 1e6:.1f} MB/s "
             "(64-byte-line head)"),
            (f"derived: C_MAC_I8 {f.c_mac_i8:.2f} cycles (24.8 M MAC/s scalar dot), dependent "
             f"float op {f.chain_cycles:.2f} cycles (softmax 1.93 ms), newlib erff "
             f"{f.erff_cycles:.0f} cycles (PLE 1.5 ms); hand-off {HANDOFF_S * 1e6:.0f} us"),
            "",
            f"{'anchor':<24} {'published':>9} {'predicted':>9} {'error':>7}  fitted",
        ]
        for a in self.anchors:
            lines.append(f"{a['name']:<24} {a['published_ms']:>7.1f}ms {a['predicted_ms']:>7.2f}ms "
                         f"{100 * a['error']:>+6.1f}%  {'yes' if a['fitted'] else 'no'}")
        lines += ["", "upstream builds (predicted ms/token):"]
        lines.append(f"{'build':<32}" + "".join(f"{st:>7}" for st in STAGES)
                     + f"{'total':>8}{'tok/s':>7}")
        for name in UPSTREAM:
            b = self.builds[name]
            lines.append(f"{BUILDS[name].label:<32}"
                         + "".join(f"{b['stages'][st]:>7.2f}" for st in STAGES)
                         + f"{b['total_ms']:>8.2f}{1e3 / b['total_ms']:>7.1f}")
        lines += ["", "mpllm (ours), before -> after, ms/token:"]
        hdr = f"{'stage':<9}" + "".join(f"{BUILDS[n].label:>21}" for n in OURS)
        lines.append(hdr)
        rows_line = f"{'rows':<9}"
        for n in OURS:
            fr = self.builds[n].get("rows_fraction")
            rows_line += f"{'dense 100 %' if fr is None else f'{100 * fr:.1f} % of rows':>21}"
        lines.append(rows_line)
        for st in (*STAGES, "total"):
            lines.append(f"{st:<9}" + "".join(
                f"{self.predictions[n][st]:>21.2f}" for n in OURS))
        lines.append(f"{'tok/s':<9}" + "".join(
            f"{1e3 / self.predictions[n]['total']:>21.1f}" for n in OURS))
        lines.append(f"{'hand-offs':<9}" + "".join(
            f"{self.builds[n]['handoffs_per_token']:>21.1f}" for n in OURS))
        lines.append(f"{'pos 255':<9}" + "".join(
            f"{self.builds[n]['at_255']['total_ms']:>21.2f}" for n in OURS))
        lines += ["", "variants (ms/token, total):"]
        for name, v in self.variants.items():
            lines.append(f"  {name:<58} {v['total_ms']:>6.2f}  ({v['note']})")
        lines += self._spec_table()
        g = self.builds["mpllm-exact-greedy"]["total_ms"]
        sp = self.builds["mpllm-exact-sampled"]["total_ms"]
        lines += ["", (f"targets: exact greedy {g:.2f} ms (<= 13: {'met' if g <= 13 else 'NOT met'}),"
                  f" exact sampled {sp:.2f} ms (<= 14: {'met' if sp <= 14 else 'NOT met'})")]
        if "mpllm-spec-sampled" in self.builds:
            lines.append(self.spec_target_line())
        sr = self.sram
        lines.append(f"SRAM: plan needs {sr['need_bytes'] / 1024:.1f} KiB of the "
                     f"{sr['free_at_boot_bytes'] / 1024:.1f} KiB free at boot (assumed) -> "
                     f"{sr['left_free_bytes'] / 1024:+.1f} KiB left")
        return "\n".join(lines)

    def spec_target_line(self) -> str:
        """The speculative target (sampled, <= SPEC_TARGET_MS): met, or by how much not."""
        b = self.builds["mpllm-spec-sampled"]
        ms, tpp, m = b["total_ms"], b["tokens_per_pass"], b["positions_per_pass"]
        head = (f"speculative exact sampled {ms:.2f} ms/token ({b['drafter']}, {tpp:.2f} "
                f"tokens/pass, m {m:.2f})")
        if ms <= SPEC_TARGET_MS:
            line = f"target: {head} (<= {SPEC_TARGET_MS:g}: met)"
        else:
            need = b["pass_ms"] / SPEC_TARGET_MS  # type: ignore[operator]
            line = (f"target: {head} (<= {SPEC_TARGET_MS:g}: NOT met, {ms - SPEC_TARGET_MS:.2f} "
                    f"ms = {100 * (ms / SPEC_TARGET_MS - 1):.0f} % over; this pass would need "
                    f"{need:.2f} tokens/pass)")
        ad = self.variants.get("spec sampled, adaptive draft")
        if ad is not None:
            ams = float(ad["total_ms"])  # type: ignore[arg-type]
            line += (f"; adaptive draft length ({ad['drafter']}): {ams:.2f} ms ("
                     + ("met" if ams <= SPEC_TARGET_MS else
                        f"NOT met, {ams - SPEC_TARGET_MS:.2f} ms over") + ")")
        fb = self.builds.get("mpllm-fast-sampled")
        if fb is not None:
            fms = float(fb["total_ms"])  # type: ignore[arg-type]
            line += (f"\ntarget: fast (lossy) sampled {fms:.2f} ms/token (speculative, "
                     f"{fb['tokens_per_pass']:.2f} tokens/pass) (<= {FAST_TARGET_MS:g}: "
                     + ("met" if fms <= FAST_TARGET_MS else
                        f"NOT met, {fms - FAST_TARGET_MS:.2f} ms = "
                        f"{100 * (fms / FAST_TARGET_MS - 1):.0f} % over; this pass would need "
                        f"{float(fb['pass_ms']) / FAST_TARGET_MS:.2f} tokens/pass") + ")")
        return line

    def _spec_table(self) -> list[str]:
        names = [n for n in SPEC if n in self.builds]
        if not names:
            return []
        bs = [self.builds[n] for n in names]
        w = 32
        out = ["", ("speculative decoding, verify passes of m positions (drafting and head "
                    "sharing measured on the demo model):"),
               f"{'':<20}" + "".join(f"{BUILDS[n].label:>{w}}" for n in names)]

        def row(label: str, vals: Iterable[str]) -> None:
            out.append(f"{label:<20}" + "".join(f"{v:>{w}}" for v in vals))

        row("drafter", (str(b["drafter"]) for b in bs))
        row("tokens / pass", (f"{b['tokens_per_pass']:.2f}" for b in bs))
        row("m = drafted + 1", (f"{b['positions_per_pass']:.2f}" for b in bs))
        row("head rows / step", (f"{100 * b['rows_fraction']:.1f} %" for b in bs))
        row("head tiles / pass", (f"{b['head_tiles_per_pass']:.1f} (union {b['union_ratio']:.2f})"
                                  for b in bs))
        out.append("one pass (ms):")
        for st in STAGES:
            row(f"  {st}", (f"{b['pass_stages'][st]:.2f}" for b in bs))
        row("  pass total", (f"{b['pass_ms']:.2f}" for b in bs))
        row("  hand-offs", (f"{b['handoffs_per_token'] * b['tokens_per_pass']:.1f}" for b in bs))
        out.append("per generated token (ms):")
        for st in (*STAGES, "total"):
            row(f"  {st}", (f"{(b['total_ms'] if st == 'total' else b['stages'][st]):.2f}"
                            for b in bs))
        row("  tok/s", (f"{b['tok_s']:.1f}" for b in bs))
        row("  pos 255", (f"{b['at_255']['total_ms']:.2f}" for b in bs))
        for n, b in zip(names, bs, strict=True):
            by_m = b.get("pass_ms_by_m", {})
            out.append(f"pass ms by m ({BUILDS[n].label}): "
                       + ", ".join(f"{m} {v:.1f}" for m, v in by_m.items()))
            out.append(f"drafters ({SPEC_BUILD_MODE[n]}): " + "; ".join(
                f"{d} {v['total_ms']:.2f} ms ({v['tokens_per_pass']:.2f} tok/pass, m "
                f"{v['positions_per_pass']:.2f})" for d, v in b.get("drafters", {}).items()))
        if self.spec is not None:
            out.append("union (pass tiles / m steps' tiles, shown as m x ratio; rows ratio):")
            for label, table in (("demo", self.spec.union),
                                 ("release-shaped random", self.spec.union_release)):
                for mode, u in table.items():
                    out.append(f"  {label} {mode} ({u.n_tiles} tiles): " + ", ".join(
                        f"m{m} {m * v:.3f}/{u.rows.get(m, math.nan):.3f}"
                        for m, v in sorted(u.tiles.items())))
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "builds": self.builds,
            "anchors": self.anchors,
            "fit": self.fit.as_dict(),
            "fitted_constants": {k: list(v) for k, v in FITTED_CONSTANTS.items()},
            "derived_constants": DERIVED_CONSTANTS,
            "positions": [self.positions[0], self.positions[-1]],
            "head_fractions": {**dataclasses.asdict(self.fractions),
                               "topk_ratio": self.fractions.topk_ratio,
                               "sampled": self.fractions.sampled},
            "variants": self.variants,
            "sram": self.sram,
            "assumptions": {n: list(b.assumptions) for n, b in BUILDS.items()},
            "measured": None if self.measured is None else dataclasses.asdict(self.measured),
            "speculative": None if self.spec is None else _finite(
                {**dataclasses.asdict(self.spec), "target_ms": SPEC_TARGET_MS,
                 "modes": SPEC_BUILD_MODE}),
        }


def _finite(x: object) -> object:
    """JSON-safe: non-finite floats as None, keys as strings."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _build_entry(b: Build, f: Fit, s: Shape, positions: Sequence[int],
                 *, counts: HeadCounts | None = None, pie_calls: Mapping[str, int] | None = None,
                 bound_pie: float | None = None, scale: tuple[float, float] = (1.0, 1.0)
                 ) -> dict[str, object]:
    def one(pos: Sequence[int]) -> tuple[dict[str, float], dict[str, Work]]:
        work = build_work(b, s, pos, pie_calls=pie_calls, counts=counts, bound_pie=bound_pie)
        if scale != (1.0, 1.0):
            work = _scale_memory(work, *scale)
        return {st: 1e3 * stage_seconds(work[st], f) for st in STAGES}, work

    stages, work = one(positions)
    total = sum(stages.values())
    st255, _ = one([min(255, s.seq_len - 1)])
    out: dict[str, object] = {
        "label": b.label, "total_ms": total, "stages": stages, "tok_s": 1e3 / total,
        "positions": [positions[0], positions[-1]],
        "handoffs_per_token": sum(w.handoffs for w in work.values()),
        "breakdown_ms": {st: {k: 1e3 * v for k, v in stage_breakdown(work[st], f).items()}
                         for st in STAGES},
        "psram_bytes_per_token": sum(w.bytes.get("psram", 0.0) for w in work.values()),
        "at_255": {"total_ms": sum(st255.values()), "stages": st255},
    }
    if b.head == "certified":
        c = counts or HeadCounts.from_fraction(b, s, b.rows_fraction)
        out["rows_fraction"] = c.rows / s.vocab_out
        out["head_tiles"] = c.tiles
        out["head_waves"] = c.waves
    return out


class _Passes:
    """Pass work of builds at whole m over given start positions, cached
    (across reports too: the key holds everything the work depends on)."""

    _memo: ClassVar[dict[tuple[object, ...], dict[str, Work]]] = {}
    _MEMO_MAX = 4096

    def __init__(self, f: Fit, s: Shape, *, pie_calls: Mapping[str, int] | None,
                 bound_pie: float | None, cols_pie: Mapping[int, float] | None,
                 scale: tuple[float, float]) -> None:
        self.f, self.s = f, s
        self.pie_calls, self.bound_pie, self.cols_pie, self.scale = (pie_calls, bound_pie,
                                                                     cols_pie, scale)
        self._key = (s, tuple(sorted((pie_calls or {}).items())), bound_pie,
                     tuple(sorted((cols_pie or {}).items())), scale)

    def head(self, b: Build, m: int, union: UnionRatios) -> PassHead | None:
        if m == 1:
            return None
        u, r = union.at(m)
        return PassHead.from_union(b, self.s, b.rows_fraction, m, u, r)

    def work(self, b: Build, m: int, union: UnionRatios, starts: Sequence[int]
             ) -> dict[str, Work]:
        head = self.head(b, m, union)
        key = (*self._key, b, m, head, tuple(starts))
        if key not in self._memo:
            if len(self._memo) >= self._MEMO_MAX:
                self._memo.clear()
            w = pass_build_work(b, self.s, starts, m, head=head, pie_calls=self.pie_calls,
                                bound_pie=self.bound_pie, cols_pie=self.cols_pie)
            self._memo[key] = _scale_memory(w, *self.scale) if self.scale != (1.0, 1.0) else w
        return self._memo[key]

    def ms(self, b: Build, m: int, union: UnionRatios, starts: Sequence[int]) -> float:
        w = self.work(b, m, union, starts)
        return sum(1e3 * stage_seconds(w[st], self.f) for st in STAGES)


def _pass_mix(m: float) -> dict[int, float]:
    """Passes of floor(m) and ceil(m) positions with mean m."""
    m = min(max(m, 1.0), float(VERIFY_MAX))
    lo = math.floor(m)
    a = m - lo
    return {lo: 1.0} if a < 1e-12 or lo == VERIFY_MAX else {lo: 1.0 - a, lo + 1: a}


def _spec_entry(b: Build, passes: _Passes, draft: DraftFigures, union: UnionRatios,
                positions: Sequence[int], *, by_m: bool = False) -> dict[str, object]:
    """One speculative build, in _build_entry's schema (per generated token:
    the pass's time / tokens per pass) plus the pass itself."""
    if not draft.usable:
        raise ValueError(f"drafter {draft.drafter}: no usable drafts per pass ({draft})")
    f, s = passes.f, passes.s
    mix = _pass_mix(draft.positions_per_pass)

    def blend(starts_for: object) -> dict[str, object]:
        stages = dict.fromkeys(STAGES, 0.0)
        bd = {st: dict.fromkeys(("memory", "compute", "overlap", "handoffs"), 0.0)
              for st in STAGES}
        handoffs = psram = tiles = rows = 0.0
        for m, wt in mix.items():
            starts = starts_for(m)  # type: ignore[operator]
            work = passes.work(b, m, union, starts)
            for st in STAGES:
                stages[st] += wt * 1e3 * stage_seconds(work[st], f)
                for k, v in stage_breakdown(work[st], f).items():
                    bd[st][k] += wt * 1e3 * v
            handoffs += wt * sum(w.handoffs for w in work.values())
            psram += wt * sum(w.bytes.get("psram", 0.0) for w in work.values())
            head = passes.head(b, m, union) or HeadCounts.from_fraction(b, s, b.rows_fraction)
            tiles += wt * head.tiles
            rows += wt * head.rows
        return {"stages": stages, "breakdown": bd, "handoffs": handoffs, "psram": psram,
                "tiles": tiles, "rows": rows}

    avg = blend(lambda m: positions)
    end = blend(lambda m: [s.seq_len - m])  # the pass ending at the last position
    tpp = draft.tokens_per_pass
    per_tok = {st: v / tpp for st, v in avg["stages"].items()}  # type: ignore[attr-defined]
    total = sum(per_tok.values())
    one = HeadCounts.from_fraction(b, s, b.rows_fraction)
    out: dict[str, object] = {
        "label": b.label, "total_ms": total, "stages": per_tok, "tok_s": 1e3 / total,
        "positions": [positions[0], positions[-1]],
        "handoffs_per_token": avg["handoffs"] / tpp,  # type: ignore[operator]
        "breakdown_ms": {st: {k: v / tpp for k, v in d.items()}
                         for st, d in avg["breakdown"].items()},  # type: ignore[attr-defined]
        "psram_bytes_per_token": avg["psram"] / tpp,  # type: ignore[operator]
        "at_255": {"total_ms": sum(end["stages"].values()) / tpp,  # type: ignore[attr-defined]
                   "stages": {st: v / tpp for st, v in end["stages"].items()}},  # type: ignore[attr-defined]
        "rows_fraction": b.rows_fraction,
        "tokens_per_pass": tpp, "positions_per_pass": draft.positions_per_pass,
        "drafted_per_pass": draft.drafted_per_pass, "drafter": draft.drafter,
        "accept_rate": draft.accept_rate,
        "pass_ms": sum(avg["stages"].values()),  # type: ignore[attr-defined]
        "pass_stages": avg["stages"], "pass_breakdown_ms": avg["breakdown"],
        "pass_mix": {str(m): wt for m, wt in mix.items()},
        "head_tiles_per_pass": avg["tiles"], "head_rows_per_pass": avg["rows"],
        "head_tiles_per_step": one.tiles,
        "union_ratio": avg["tiles"] / (draft.positions_per_pass * one.tiles),  # type: ignore[operator]
        "union_source": union.source,
    }
    if by_m:
        out["pass_ms_by_m"] = {str(m): passes.ms(b, m, union, positions)
                               for m in range(1, VERIFY_MAX + 1)}
    return out


def _best_draft(b: Build, passes: _Passes, drafts: Mapping[str, DraftFigures],
                union: UnionRatios, positions: Sequence[int]
                ) -> tuple[DraftFigures, dict[str, dict[str, float]]]:
    """The drafter with the lowest modelled ms/token, and every drafter's figure."""
    table: dict[str, dict[str, float]] = {}
    for name, d in drafts.items():
        if not d.usable:
            continue
        e = _spec_entry(b, passes, d, union, positions)
        table[name] = {"total_ms": float(e["total_ms"]),  # type: ignore[arg-type]
                       "tokens_per_pass": d.tokens_per_pass,
                       "positions_per_pass": d.positions_per_pass,
                       "accept_rate": d.accept_rate}
    if not table:
        raise ValueError("no usable drafter figures")
    best = min(table, key=lambda n: table[n]["total_ms"])
    return drafts[best], table


def _spec_builds(ours: Mapping[str, Build], passes: _Passes, spec: SpecInputs,
                 positions: Sequence[int]) -> tuple[dict[str, Build], dict[str, dict[str, object]]]:
    """The speculative builds: our exact builds (their rows fractions) in
    verify passes, each with the best drafter measured for its mode."""
    builds: dict[str, Build] = {}
    entries: dict[str, dict[str, object]] = {}
    for name in SPEC:
        mode = SPEC_BUILD_MODE[name]
        exact = ours["mpllm-exact-" + mode]
        b = dataclasses.replace(BUILDS[name], rows_fraction=exact.rows_fraction)
        union = spec.union[mode]
        best, table = _best_draft(b, passes, spec.drafts[mode], union, positions)
        e = _spec_entry(b, passes, best, union, positions, by_m=True)
        e["drafters"] = table
        builds[name], entries[name] = b, e
    return builds, entries


def _spec_variants(spec_builds: Mapping[str, Build], entries: Mapping[str, Mapping[str, object]],
                   passes: _Passes, spec: SpecInputs, positions: Sequence[int],
                   sram: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """What-ifs of the speculative builds (none of them exists as such)."""
    out: dict[str, dict[str, object]] = {}

    def add(key: str, b: Build, draft: DraftFigures, union: UnionRatios, note: str) -> None:
        e = _spec_entry(b, passes, draft, union, positions)
        out[key] = {"total_ms": e["total_ms"], "stages": e["stages"],
                    "rows_fraction": e["rows_fraction"], "tokens_per_pass": e["tokens_per_pass"],
                    "positions_per_pass": e["positions_per_pass"], "pass_ms": e["pass_ms"],
                    "note": note}

    spill = int(sram["core_spill_bytes"])  # type: ignore[call-overload]
    for name in SPEC:
        mode = SPEC_BUILD_MODE[name]
        b, union = spec_builds[name], spec.union[mode]
        best = spec.drafts[mode][str(entries[name]["drafter"])]
        short = ("fast " if b.kv == "int8-fast" else "") + "spec " + mode
        if spill:
            add(f"{short}, {spill / 1024:.0f} KiB of core spilled to PSRAM",
                dataclasses.replace(b, core_spill_bytes=spill), best, union,
                "if the SRAM plan must fit the assumed free SRAM (once per pass)")
        if mode != "sampled":
            continue
        for other, d in spec.drafts[mode].items():
            if other != best.drafter and d.usable:
                add(f"{short}, drafter {other}", b, d, union,
                    f"{d.tokens_per_pass:.2f} tokens/pass, m {d.positions_per_pass:.2f}")
        add(f"{short}, batch buffers in internal SRAM", dataclasses.replace(b, batch="sram"),
            best, union, "positions 1..7's buffers and the scan's scratch in SRAM (~110 KiB "
            "the plan does not have)")
        add(f"{short}, head scan on one core", dataclasses.replace(b, many_split=False),
            best, union, "llm_head_certify_many without its two lanes (as in session 2)")
        nosh = UnionRatios({k: 1.0 for k in range(2, VERIFY_MAX + 1)}, union.rows,
                           source="no sharing")
        add(f"{short}, no tile shared between positions", b, best, nosh,
            "pessimistic bound: a pass fetches m steps' tiles (capped at all 199)")
        rel = spec.union_release.get(mode)
        if rel is not None and rel.tiles:
            add(f"{short}, the release-shaped random head's union", b, best, rel,
                "union and rows ratios measured on the release-shaped random model")
    for mode, rows in spec.adaptive.items():
        name = f"mpllm-spec-{mode}"
        base, union = spec_builds[name], spec.union[mode]
        usable = [d for d in rows if d.usable]
        if not usable:
            continue
        whatifs = [("", base)]
        if mode == "sampled":
            whatifs += [(" + batch buffers in SRAM", dataclasses.replace(base, batch="sram")),
                        (" + batch buffers in SRAM, head scan on one core",
                         dataclasses.replace(base, batch="sram", many_split=False))]
        for extra, b in whatifs:
            d = min(usable, key=lambda x, b=b: float(_spec_entry(b, passes, x, union,
                                                                 positions)["total_ms"]))
            add(f"spec {mode}, adaptive draft{extra}", b, d, union,
                f"the n-gram threshold and cap the model picks, {d.drafter}: "
                f"{d.tokens_per_pass:.2f} tokens/pass, m {d.positions_per_pass:.2f}")
            out[f"spec {mode}, adaptive draft{extra}"]["drafter"] = d.drafter
    return out


def report(measured: Measured | None = None, fractions: HeadFractions | None = None,
           s: Shape = RELEASE, positions: Sequence[int] | None = None,
           spec: SpecInputs | None = None) -> Report:
    """Fit on the fitted anchors, predict every anchor's build from its own
    configuration and our builds before/after. `measured` (from measure_host
    on a release-shaped image) supplies our bytes (as a checked scale on the
    formulas) and PIE counts; `fractions` the certified head's rows fractions;
    `spec` (measure_spec, default SpecInputs.default()) the speculative
    builds' drafting, union ratios and many-columns PIE counts."""
    pos = list(positions if positions is not None else story_positions())
    f = fit()
    fr = fractions or HeadFractions()
    builds: dict[str, dict[str, object]] = {}
    for name in UPSTREAM:
        builds[name] = _build_entry(BUILDS[name], f, RELEASE, story_positions())
    anchors = []
    for an in ANCHORS:
        got = builds[an.build]["total_ms"] if an.stage == "total" else \
            builds[an.build]["stages"][an.stage]  # type: ignore[index]
        anchors.append({"name": an.name, "build": an.build, "stage": an.stage,
                        "published_ms": an.published_ms, "predicted_ms": got,
                        "error": (got - an.published_ms) / an.published_ms,
                        "fitted": an.fitted, "source": an.source})
    pie_calls = measured.pie_per_call if measured and measured.pie_per_call else None
    bound_pie = measured.bound_pie_per_tile if measured else None
    scale = (1.0, 1.0)
    if measured is not None:
        placement = placement_from_memory(measured.memory) if measured.memory else None
        rows = (measured.head_rows_fraction or 1.0) * s.vocab_out
        formula = _formula_per_token(s, measured.positions, placement,
                                     head_mode=measured.head_mode, head_rows=rows,
                                     head_ids=measured.head_ids)
        scale = (measured.region_bytes["bulk"] / formula["bulk"] if formula["bulk"] else 1.0,
                 measured.region_bytes["flash"] / formula["flash"] if formula["flash"] else 1.0)
    sampled_fraction = fr.sampled if fr.sampled is not None else fr.greedy
    ours = {"mpllm-before-greedy": BUILDS["mpllm-before-greedy"],
            "mpllm-before-sampled": BUILDS["mpllm-before-sampled"],
            "mpllm-exact-greedy": dataclasses.replace(BUILDS["mpllm-exact-greedy"],
                                                      rows_fraction=fr.greedy),
            "mpllm-exact-sampled": dataclasses.replace(BUILDS["mpllm-exact-sampled"],
                                                       rows_fraction=sampled_fraction)}
    for name, b in ours.items():
        builds[name] = _build_entry(b, f, s, pos, pie_calls=pie_calls, bound_pie=bound_pie,
                                    scale=scale)
    builds["mpllm-exact-sampled"]["rows_fraction_source"] = (
        "greedy x demo top-40/greedy" if fr.sampled is not None
        else "greedy fraction (no demo top-40 measurement: engine without head_rows)")
    sram = sram_plan(s, memory=measured.memory if measured and measured.memory else None)
    variants = _variants(ours, f, s, pos, fr, sram, pie_calls, bound_pie, measured)
    sp = spec or SpecInputs.default()
    passes = _Passes(f, s, pie_calls=pie_calls, bound_pie=bound_pie, cols_pie=sp.cols_pie,
                     scale=scale)
    spec_builds, spec_entries = _spec_builds(ours, passes, sp, pos)
    builds.update(spec_entries)
    variants.update(_spec_variants(spec_builds, spec_entries, passes, sp, pos, sram))
    return Report(f, anchors, builds, variants, fr, sram, measured, pos, sp)


def _variants(ours: Mapping[str, Build], f: Fit, s: Shape, pos: Sequence[int],
              fr: HeadFractions, sram: Mapping[str, object],
              pie_calls: Mapping[str, int] | None, bound_pie: float | None,
              measured: Measured | None) -> dict[str, dict[str, object]]:
    """Our after-builds at other rows fractions and with the changes that
    would move them (each a what-if, not a build that exists)."""
    out: dict[str, dict[str, object]] = {}

    def add(key: str, b: Build, note: str, counts: HeadCounts | None = None) -> None:
        e = _build_entry(b, f, s, pos, pie_calls=pie_calls, bound_pie=bound_pie, counts=counts)
        out[key] = {"total_ms": e["total_ms"], "stages": e["stages"],
                    "rows_fraction": e.get("rows_fraction"), "note": note}

    g, t = ours["mpllm-exact-greedy"], ours["mpllm-exact-sampled"]
    lo, hi = fr.greedy_range
    add("greedy at 33.2 % rows (8,427 published)", dataclasses.replace(g, rows_fraction=lo),
        "published range, low")
    add("greedy at 34.5 % rows (8,749 published)", dataclasses.replace(g, rows_fraction=hi),
        "published range, high")
    for key, label in (("demo", "demo model"), ("random", "release-shaped random head")):
        for kind, b in (("greedy", g), ("topk", t)):
            val = getattr(fr, f"{key}_{kind}")
            if val is not None:
                add(f"{'greedy' if kind == 'greedy' else 'sampled'} at the {label}'s "
                    f"{100 * val:.1f} %", dataclasses.replace(b, rows_fraction=val),
                    f"engine-measured on the {label}")
    spill = int(sram["core_spill_bytes"])  # type: ignore[call-overload]
    if spill:  # the engine places FAST what fits and the rest in PSRAM (llm_open)
        add(f"greedy, {spill / 1024:.0f} KiB of core spilled to PSRAM",
            dataclasses.replace(g, core_spill_bytes=spill),
            "if the SRAM plan must fit the assumed free SRAM")
        add(f"sampled, {spill / 1024:.0f} KiB of core spilled to PSRAM",
            dataclasses.replace(t, core_spill_bytes=spill),
            "if the SRAM plan must fit the assumed free SRAM")
    # what each exact change of the after-build is worth: the build without it
    add("greedy without the int16 V cache (fp32 V)", dataclasses.replace(g, v_bytes=4),
        "V rows as floats: twice the V traffic, no recompute")
    add("fast (lossy) sampled, no drafting", dataclasses.replace(t, kv="int8-fast", v_bytes=1),
        "fast mode's int8 KV cache, one position per pass")
    add("greedy without the four-wide exp/erf/div", dataclasses.replace(g, chain_interleave=1),
        "one element at a time: every dependent float op waits for the previous one")
    add("greedy with 16-byte-aligned KV rows", dataclasses.replace(g, kv_offset=None),
        "KV rows not on line boundaries: a 384-byte row touches 7 lines 3 times in 4")
    add("greedy, waves of 16 tiles", dataclasses.replace(g, wave_tiles=16),
        "fewer hand-offs; same rows assumed (pruning between waves lost is not modelled)")
    return out


def plot(rep: Report, path: str | os.PathLike[str]) -> Path:
    """Stacked bars: predicted ms per stage for each build, published totals
    as markers. Written through a temporary file, then renamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .atomic import atomic_path

    names = [*UPSTREAM, *OURS, *(n for n in SPEC if n in rep.builds)]
    preds = rep.predictions
    published = {a["build"]: a["published_ms"] for a in rep.anchors if a["stage"] == "total"}
    fig, ax = plt.subplots(figsize=(11, 5))
    bottom = [0.0] * len(names)
    labels = [textwrap.fill(BUILDS[n].label, 14) for n in names]
    for st in STAGES:
        vals = [preds[n][st] for n in names]
        ax.bar(labels, vals, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, n in enumerate(names):
        pub = published.get(n)
        if pub is not None:
            ax.plot([i - 0.4, i + 0.4], [pub, pub], "k--", lw=1.2)
        ax.annotate(f"{preds[n]['total']:.1f}", (i, bottom[i]), textcoords="offset points",
                    xytext=(0, 3), ha="center", fontsize=7)
    ax.set_ylabel("ms per token (ESP32-S3 N16R8, predicted; dashed: published)")
    ax.set_title("mpllm cost model: per-stage time per generated token")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out


__all__ = [
    "ANCHORS",
    "ANCHOR_TOLERANCE",
    "BUILDS",
    "OURS",
    "RELEASE",
    "SPEC",
    "SPEC_TARGET_MS",
    "STAGES",
    "UPSTREAM",
    "Anchor",
    "Build",
    "DraftFigures",
    "Fit",
    "HeadCounts",
    "HeadFractions",
    "Measured",
    "PassHead",
    "Report",
    "Shape",
    "SpecInputs",
    "UnionRatios",
    "build_work",
    "check_bytes",
    "engine_stage_bytes",
    "fit",
    "head_eval_bytes",
    "lines_touched",
    "matrices",
    "measure_adaptive",
    "measure_cols_pie",
    "measure_drafting",
    "measure_fractions",
    "measure_head_fraction",
    "measure_host",
    "measure_pie_counts",
    "measure_spec",
    "measure_union",
    "pass_build_work",
    "pass_region_bytes",
    "pass_work",
    "pie_cols_instructions",
    "pie_matvec_instructions",
    "plot",
    "predict",
    "report",
    "run_region_bytes",
    "sram_plan",
    "stage_seconds",
    "story_positions",
    "upstream_pie_instructions",
]


def draft_prices(s: Shape = RELEASE, *, build: str = "mpllm-spec-sampled",
                 rows_fraction: float | None = None) -> list[float]:
    """What draft k (k = 1..VERIFY_MAX-1) adds to a verify pass, as a fraction
    of one plain step: (pass(k+1 positions) - pass(k)) / pass(1), modeled on
    the S3 for shape `s` over the story positions (every 10th start), with
    the default union ratios. The converter writes these as the drafts
    table's min_odds: a guess is proposed only while the chance that it and
    every guess before it are accepted pays for its position."""
    b = BUILDS[build]
    if rows_fraction is not None:
        b = dataclasses.replace(b, rows_fraction=rows_fraction)
    sp = SpecInputs.default()
    passes = _Passes(fit(), s, pie_calls=None, bound_pie=None, cols_pie=sp.cols_pie,
                     scale=(1.0, 1.0))
    union = sp.union[SPEC_BUILD_MODE[build]]
    starts = [p for p in story_positions() if p + VERIFY_MAX <= s.seq_len][::10]
    ms = [passes.ms(b, m, union, starts) for m in range(1, VERIFY_MAX + 1)]
    return [(ms[k] - ms[k - 1]) / ms[0] for k in range(1, VERIFY_MAX)]
