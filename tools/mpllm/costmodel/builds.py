"""The firmware configurations the model predicts (`Build`, `BUILDS`):
esp32-ai's published builds (`UPSTREAM`), ours before and after the
certified head (`OURS`), and the speculative and fast builds (`SPEC`),
each with the assumptions its reading of the firmware needed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .s3 import (
    CODE_BYTES_BINDING,
    CODE_BYTES_ENGINE,
    CODE_BYTES_FREERTOS,
    CODE_BYTES_MICROPYTHON,
    CODE_BYTES_MICROPYTHON_IRAM,
    HANDOFF_S,
    HANDOFF_SEMAPHORE_S,
    ICACHE_BYTES_OURS,
    ICACHE_BYTES_UPSTREAM,
    RELEASE_GREEDY_FRACTION,
    RELEASE_GREEDY_RANGE,
)
from .sram import measured_core_regions, spill_by_stage

__all__ = [
    "BUILDS",
    "FAST_TARGET_MS",
    "OURS",
    "OUR_FORMATS",
    "SPEC",
    "SPEC_BUILD_MODE",
    "SPEC_TARGET_MS",
    "UPSTREAM",
    "Build",
]


#: Our engine's weight formats: the image's name (Shape.weights,
#: formats.model.WEIGHT_FORMATS) -> Build.core's and head_fmt's. int4 runs
#: llm_matvec_q4_pie, int8 llm_matvec_q8_pie (Q8_0 groups, ee.vmulas.s8.accx,
#: its input quantized in the same groups), fp32 llm_matvec_f32_pie (the
#: scalar FPU, no input quantization).
OUR_FORMATS = {"int4": "int4", "int8": "q8", "fp32": "f32"}


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
    #: ("int4-flash"|"int8"|"int4"|"q8"|"f32", "flash"|"psram"|"sram"); "int8" is
    #: esp32-ai's staged int8 (scalar dots), "q8" and "f32" our engine's int8
    #: groups and fp32 matrices (OUR_FORMATS)
    core: tuple[str, str]
    head_fmt: str  # "int8" | "int4" | "q8" | "f32"
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
    #: tiles per hand-off wave; None: every tile after the inline ones in one
    #: hand-off, two lanes with their own floors (head.c "Order of visits")
    wave_tiles: int | None = 32
    #: the head reads a row's token id only when the row could enter the
    #: candidate list (s3.HEAD_ID_READS), not for every row scored
    ids_for_entrants: bool = False
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
    #: bytes per cached K element: 4 (fp32, after RoPE) or 2 (the exact int16
    #: integer dot before RoPE, sharing V's position scale; rebuilt and rotated
    #: when read, with the position's RoPE row read from flash: engine.c
    #: cached_k, s3.K_REBUILD_OPS)
    k_bytes: int = 4
    #: attention reads one position's cache rows four at a time: four score
    #: sums at once (engine.c scores_rows4; s3.FDOT_ROWS4_OPS) and, for V rows
    #: held as dots, ao kept in a register across them with each value
    #: recomputed where it is used (values_rows4; s3.V_ROWS4_OPS)
    attn_rows4: bool = False
    #: core bytes that did not fit internal SRAM and live in PSRAM instead
    #: (a what-if: charged to the PLE stage, the last placed)...
    core_spill_bytes: int = 0
    #: ... or, per stage, the core bytes a placement put in PSRAM (our builds:
    #: the emulated board's measured placement, sram.MEASURED_PLACEMENT)
    spill_stages: tuple[tuple[str, int], ...] = ()
    #: ... and per stage, the core bytes read in place from flash (matrices
    #: that found no room in RAM: engine_open.c stage_mat)
    flash_stages: tuple[tuple[str, int], ...] = ()
    #: seconds of one hand-off to the second core and back: esp32-ai's task
    #: notification (s3.HANDOFF_S) or our port's semaphores
    handoff_s: float = HANDOFF_S
    #: instruction cache and the code one token runs through it (bytes): a
    #: working set larger than the cache is refetched from flash every token
    icache_bytes: int = ICACHE_BYTES_UPSTREAM
    code_bytes: int = CODE_BYTES_ENGINE + CODE_BYTES_FREERTOS
    #: llm.py's per-token loop on MicroPython (ours) or none (a C loop)
    python_loop: bool = False
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
    #: per pass (llm_head_certify_many's lanes); False: on one core
    many_split: bool = False
    #: where the KV cache and the head rows live: "psram" (engine_open.c places
    #: both in BULK) or "sram" (a board without PSRAM: BULK is internal SRAM,
    #: port_esp32.c; no line fills, the loads are inside the compute counts);
    #: a dense head may also be "flash" (read in place: no room in RAM)
    kv_tier: str = "psram"
    head_tier: str = "psram"
    #: bytes of a certified head row's scale as staged: 4 (f32: esp32-ai's
    #: builds) or 2 (ours: the fp16 it is, widened per scored tile, head.c
    #: staged_rows; s3.HEAD_SCALE_WIDEN_ROW_OPS)
    head_scale_bytes: int = 4
    assumptions: tuple[str, ...] = field(default=())


#: what esp32-ai's stock firmware runs and its PIE + int4 build kept: 32-byte
#: PSRAM lines, fp32 KV, newlib exp, lrintf, matvecs of >= 128 rows split, argmax
_STOCK_BASE = {
    "line": 32, "kv": "fp32-heads", "softmax_exp": "newlib", "act_exp": "newlib",
    "quant": "lrintf", "split_rows": 128, "sampler": "argmax",
}
_RESEARCH_BASE = {
    "kernels": "pie-upstream", "core": ("int4", "sram"), "head_fmt": "int4", "line": 64,
    "logits": "fused", "kv": "int8-rows", "score": "scalar", "softmax_exp": "fast-floorf",
    "act_exp": "newlib", "quant": "lrintf", "wquant": "lrintf", "quant_per_matvec": True,
    "split_rows": 128, "attn_split": "score+vacc", "attn_split_min_pos": 32, "sampler": "fused",
    "wave_tiles": 32,
}
#: the certified head as esp32-ai first ran it (the research_cert and
#: research_qact builds): scalar interval bounds, qsort, 8,427 rows scored
_RESEARCH_CERT_HEAD = {"head": "certified", "rows_fraction": RELEASE_GREEDY_RANGE[0],
                       "bound": "scalar", "order": "qsort"}
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

#: what every build of ours runs on: MicroPython's loop, our port's semaphore
#: hand-off, the 16 KB instruction cache, the measured placement of the core
_MEASURED_SPILL = tuple(sorted(spill_by_stage(measured_core_regions()).items()))
_OUR_PORT = {"handoff_s": HANDOFF_SEMAPHORE_S, "icache_bytes": ICACHE_BYTES_OURS,
             # through the instruction cache: the engine's token code is in IRAM
             # (LLM_HOT), and so are MicroPython's hottest VM functions; the
             # semaphore hand-off's FreeRTOS code is in flash (sdkconfig.mpllm)
             "code_bytes": (CODE_BYTES_MICROPYTHON - CODE_BYTES_MICROPYTHON_IRAM
                            + CODE_BYTES_FREERTOS + CODE_BYTES_BINDING),
             "python_loop": True, "spill_stages": _MEASURED_SPILL}
_OUR_PORT_NOTE = ("our port: llm.py's loop on MicroPython (measured on the unix port, scaled by "
                  "pystones), the hand-off through two binary semaphores, the engine's token code in "
                  "IRAM (LLM_HOT) and the rest through a 16 KB "
                  "instruction cache, the "
                  f"core placed as the emulated board measured ({sum(b for _, b in _MEASURED_SPILL):,} B "
                  "of it in PSRAM)")

BUILDS: dict[str, Build] = {
    "stock": Build(
        "stock", "stock esp32-ai", "scalar",
        core=("int8", "psram"), head_fmt="int8", logits="psram", **_STOCK_BASE,
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
        core=("int4", "psram"), head_fmt="int4", logits="sram", **_STOCK_BASE,
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
        "research_cert", "esp32-ai + certified head", **_RESEARCH_CERT_HEAD, **_RESEARCH_BASE,
        assumptions=(*_RESEARCH_NOTES,
                     ("CertiHead: 199 tiles, scalar interval bound (1.074 ms measured), qsort "
                      "(52 cycles per compare), waves of 32 tiles, 8,427 rows (33.2 %)"))),
    "research_qact": Build(
        "research_qact", "esp32-ai + no lrintf", **_RESEARCH_CERT_HEAD,
        **{**_RESEARCH_BASE, "quant": "round"},
        assumptions=(*_RESEARCH_NOTES,
                     ("as the certified build, quantize_act without lrintf (QACT=1); the "
                      "softmax-weight rounding and floorf still call libm"))),
    "research_final": Build(
        "research_final", "esp32-ai final (lossy)", head="certified",
        rows_fraction=RELEASE_GREEDY_RANGE[1], bound="pie-upstream", order="radix",
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
        rope="table", rows_from="image", **_OUR_PORT,
        assumptions=(
            _OUR_PORT_NOTE,
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
        rows_fraction=RELEASE_GREEDY_FRACTION, bound="pie", order="heap", wave_tiles=None,
        ids_for_entrants=True, first_wave_tiles=1, kv="fp32-rows", kv_offset=0, softmax_exp="llm", act_exp="llm",
        quant="round", quant_per_matvec=False, split_rows=None, attn_split="heads",
        sampler="cand-greedy", rope="table", rows_from="image", v_bytes=2, attn_rows4=True,
        chain_interleave=4, head_scale_bytes=2, **_OUR_PORT,
        assumptions=(
            _OUR_PORT_NOTE,
            ("certified head: rows permuted by norm at convert time, 199 tiles of 128, int8 "
             "boxes + tile scale in SRAM, max-heap order, first tile inline, then every tile "
             "still above its floor in two lanes (one per core, each with its own floor), "
             "one hand-off; scored rows + their scale from PSRAM, as the 2-byte fp16 it is "
             "(widened to f32 per scored tile, 8 ops a row), and the 2-byte id only of rows "
             "that could enter the candidate list"),
            ("no logits buffer; attention positions outer over 64-byte aligned rows: K as fp32, "
             "V as the exact int16 dots + one scale per position, each value recomputed with "
             "the kernel's two roundings when read (4 ops), one position's rows four at a "
             "time with the output in a register; split by heads (one hand-off per layer); no "
             "other matvec split; K as dots too is the set_k_dots switch, priced as variants"),
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
     "m = drafted + 1 and tokens per pass measured on the demo model "
     "(mpllm.costmodel.drafting_study.study; the release model's acceptance cannot be measured here); passes of floor(m) and ceil(m) "
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
#: fast mode's speed target, sampled (ms/token, modelled): the report says met or by how much not
FAST_TARGET_MS = 7.0
#: speculative exact decoding's speed target, sampled (ms/token, modelled), reported the same way
SPEC_TARGET_MS = 10.0
UPSTREAM = ("stock", "pie_int4", "research_line32", "research_line64", "research_cert",
            "research_qact", "research_final")
