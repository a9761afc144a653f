"""The forward pass of one generated token, as work per stage: matvecs,
attention and the KV cache as each build lays them out, the dense or
certified head, the sampler (`token_work`; averaged over a story,
`build_work`; in ms, `predict`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from ..quantize import int8_group
from .builds import Build
from .pie import (
    pie_matvec_instructions,
    pie_q8_matvec_instructions,
    pie_row_instructions,
    upstream_pie_instructions,
)
from .s3 import (
    BOUND_OPS_PER_TILE,
    BOUND_PIE_PER_TILE,
    CAND_OPS_PER_ROW,
    CPU_HZ,
    DCACHE_BYTES,
    DIV_OPS,
    ERFF_OPS,
    EXPF_OPS,
    F32_ROW_OPS,
    F32_STEP_OPS,
    F32_WEIGHT_OPS,
    FAST_EXPF_CHAIN_OPS,
    FAXPY_OPS,
    FDOT_OPS,
    FDOT_ROWS4_OPS,
    HALF2FLOAT_OPS,
    HEAD_ID_READS,
    HEAD_SCALE_WIDEN_CALL_OPS,
    HEAD_SCALE_WIDEN_ROW_OPS,
    HEAP_OPS_PER_CMP,
    ICACHE_LINE,
    ICACHE_MISS_S,
    K_DOTS_STORE_OPS,
    K_REBUILD_OPS,
    LOGF_OPS,
    LRINTF_CYCLES,
    NEWLIB_EXPF_CYCLES,
    NEWLIB_TRIG_CYCLES,
    PCG32_OPS,
    Q4_UNPACK_OPS,
    Q8_GROUP_OPS,
    Q8_QUANT_GROUP_CHAIN,
    Q8_ROW_OPS,
    QSORT_CMP_CYCLES,
    QUANT_CYCLES,
    RADIX_OPS_PER_KEY,
    ROW_OPS_PIE,
    ROW_OPS_SCALAR,
    SOFT_LIBM_CYCLES,
    SOFTMAX_PAIR_OPS,
    SQRT_OPS,
    TILE_ROWS,
    UPSTREAM_BLOCK_OPS,
    UPSTREAM_BOUND_PIE_CYCLES_PER_TILE,
    UPSTREAM_BOUND_SCALAR_CYCLES_PER_DIM,
    V_ROWS4_OPS,
    python_loop_s,
)
from .shape import (
    MODEL_STAGES,
    RELEASE,
    Mat,
    Shape,
    cdiv,
    lines_touched,
    matrices,
    matrix_row_bytes,
    n_groups,
    ple_record_bytes,
    q4_row_bytes,
    story_positions,
    stream_lines,
)
from .work import Fit, HeadCounts, Work, stage_seconds

__all__ = [
    "FAST_EXP_OPS",
    "S8_BLOCK_PIE",
    "S8_ROW_PIE_FIXED",
    "build_work",
    "charge_port",
    "charge_spill",
    "matvec_input_work",
    "matvec_work",
    "predict",
    "token_work",
]


def quantize_work(w: Work, b: Build, n: int, *, split: bool = False, pad: int = 0) -> None:
    """Activation quantization of an n-vector (plus zeroing a pad)."""
    cyc = n * (QUANT_CYCLES + (LRINTF_CYCLES if b.quant == "lrintf" else 0.0))
    w.compute(split=split, cycles=cyc, ops=pad)


def matvec_input_work(w: Work, b: Build, fmt: str, n: int) -> None:
    """An n-vector made the input of the matvecs that read it, in the form
    their format reads (engine.c quantize / act_in): int4 (and esp32-ai's
    formats) one int8 scale for the vector; our int8 groups (fmt "q8") the
    same loop on each group alone (kernels.h llm_quantize_act_groups, in the
    groups of int8_group(n)) and the padding to 32 zeroed; fp32 ("f32") reads
    the floats as they are."""
    if fmt == "f32":
        return
    if fmt == "q8":
        w.compute(cycles=n * QUANT_CYCLES, ops=cdiv(n, 32) * 32 - n,
                  chain=n_groups(n, int8_group(n)) * Q8_QUANT_GROUP_CHAIN)
        return
    quantize_work(w, b, n)


def rmsnorm_work(w: Work, n: int) -> None:
    # ss += x*x (load, mul, add), ss/n + eps (2), sqrt, 1/., (w*x)*inv (2 loads, 2 mul, store)
    w.compute(ops=3 * n + 2 + 5 * n, chain=SQRT_OPS + DIV_OPS)


def chain_work(w: Work, b: Build, ops: float, *, split: bool = False) -> None:
    """Element-wise dependent float chains (independent across elements)."""
    w.compute(split=split, chain=ops / b.chain_interleave)


def exp_work(w: Work, b: Build, kind: str, count: float, *, split: bool = False) -> None:
    if kind == "newlib":
        w.compute(split=split, cycles=count * NEWLIB_EXPF_CYCLES)
    elif kind == "llm":
        chain_work(w, b, count * EXPF_OPS, split=split)
    else:
        raise ValueError(f"unknown exp {kind!r}")


def matvec_work(w: Work, b: Build, s: Shape, m: Mat, pie_calls: Mapping[str, int] | None) -> None:
    """One call of a matvec (the caller multiplies by per_token)."""
    fmt, tier = (b.head_fmt, b.head_tier) if m.name == "head" else b.core
    rows, cols = m.rows, m.cols
    ng = n_groups(cols, s.group)
    split = b.split_rows is not None and rows >= b.split_rows
    if fmt in ("q8", "f32"):
        _matvec_ours(w, b, s, m, fmt, tier)
        return
    if split:
        w.handoff(1, b.handoff_s)
    if fmt == "int8":
        code_b, scale_b = rows * cols, rows * ng * 4
    elif fmt == "int4-flash":
        code_b, scale_b = rows * cdiv(cols, 2), rows * ng * 2
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
        nblk = cdiv(cols, 32)
        w.compute(split=split, pie=upstream_pie_instructions(rows, cols),
                  ops=rows * (ROW_OPS_PIE + UPSTREAM_BLOCK_OPS * nblk))
        w.compute(ops=2 * cols + (nblk * 32 - cols))  # 8*sum(xq) and the zeroed tail
    else:
        pie = (pie_calls[m.name] if pie_calls and m.name in pie_calls
               else pie_matvec_instructions(rows, cols, s.group))
        w.compute(split=split, pie=pie, ops=rows * ROW_OPS_PIE)


def _matvec_ours(w: Work, b: Build, s: Shape, m: Mat, fmt: str, tier: str) -> None:
    """One call of our int8-groups ("q8") or fp32 ("f32") matvec, on the
    calling core (engine.c matvec_other, head.c dense_other: neither is
    split): the weights' bytes where they are, and the kernel's own count,
    the PIE instructions of llm_matvec_q8_pie with its float steps per group,
    or llm_matvec_f32_pie's scalar instructions (s3.F32_*)."""
    rows, cols = m.rows, m.cols
    width = cdiv(cols, 32) * 32
    if fmt == "q8":
        group = int8_group(cols)
        ng = 1 if group >= cols else cdiv(width, group)
        code_b, scale_b = rows * width, rows * ng * 4
    else:
        code_b, scale_b = rows * cdiv(cols, 4) * 4 * 4, 0
    if rows * matrix_row_bytes(s, cols) != code_b + scale_b:
        raise ValueError(f"{m.name}: a {fmt} build priced on a {s.weights} shape")
    if tier == "psram":
        w.psram(stream_lines(code_b, b.line) + stream_lines(scale_b, b.line), b.line,
                code_b + scale_b)
    elif tier == "flash":
        w.flash(code_b + scale_b, b.line)
    else:
        w.sram(code_b + scale_b)
    if fmt == "q8":
        w.compute(pie=pie_q8_matvec_instructions(rows, cols, group),
                  ops=rows * (Q8_ROW_OPS + ng * Q8_GROUP_OPS))
    else:
        w.compute(ops=rows * (cols * F32_WEIGHT_OPS + cdiv(cols, 8) * F32_STEP_OPS
                              + F32_ROW_OPS))


def _v_row(b: Build, d: int) -> int:
    """Bytes of one cached V row: fp32, or int16 dots + the position's scale."""
    return 4 * d if b.v_bytes == 4 else b.v_bytes * d + 4


def _k_row(b: Build, d: int) -> int:
    """Bytes of one cached K row: fp32, or int16 dots (+ the position's scale
    unless V's row carries it)."""
    return 4 * d if b.k_bytes == 4 else b.k_bytes * d + (0 if b.v_bytes != 4 else 4)


def _kv_offsets(b: Build) -> list[int]:
    return list(range(0, b.line, 16)) if b.kv_offset is None else [b.kv_offset]


def _kv_mem(w: Work, b: Build, nlines: float, nbytes: float, *, split: bool = False) -> None:
    """The KV cache's traffic where the build keeps it: PSRAM line fills, or
    internal SRAM (a board without PSRAM: loads inside the compute counts)."""
    if b.kv_tier == "sram":
        w.sram(nbytes)
    else:
        w.psram(nlines, b.line, nbytes, split=split)


def kv_read_work(w: Work, b: Build, s: Shape, pos: int, *, split: bool) -> None:
    """Attention's reads of the cached K and V rows 0..pos of one layer,
    averaged over the possible alignments of the cache."""
    offs = _kv_offsets(b)
    for off in offs:
        part = Work()
        _kv_read_at(part, dataclasses.replace(b, kv_offset=off), s, pos, split=split)
        w.add(part.scaled(1.0 / len(offs)))


def _kv_read_at(w: Work, b: Build, s: Shape, pos: int, *, split: bool) -> None:
    # the cache holds kv heads (n_kv_heads x head_dim = kv_dim a row); query
    # head j reads kv head j // group
    kvd, t, kvh, dh = s.kv_dim, pos + 1, s.n_kv_heads, s.head_dim
    h, group = s.n_heads, s.n_heads // s.n_kv_heads
    line = b.line
    if b.kv == "int8-fast":
        # per kv head: K rows contiguous (t x dhp), dh transposed V rows of the
        # t positions rounded up to 16 (rows seq_len apart), two scale arrays
        dhp, t16 = cdiv(dh, 16) * 16, cdiv(t, 16) * 16
        nl = kvh * (lines_touched(0, t * dhp, line) + dh * lines_touched(0, t16, line)
                    + 2 * lines_touched(0, 4 * t, line))
        _kv_mem(w, b, nl, kvh * (t * dhp + dh * t16 + 8 * t), split=split)
        return
    if b.kv.startswith("fp32"):
        row = _k_row(b, kvd)
        v_row = _v_row(b, kvd)
        total = (lines_touched(b.kv_offset, t * row, line)
                 + lines_touched(b.kv_offset, t * v_row, line))
        if b.kv == "fp32-heads" and t * (row + v_row) > DCACHE_BYTES:
            # each head's pass re-fetches its slice of every row (4*dh bytes at
            # h*4*dh), overfetching at line edges; rows cycle through
            # line/gcd(row, line) alignments
            phases = line // math.gcd(row, line)
            per_row = sum(lines_touched((b.kv_offset + r * row + (j // group) * 4 * dh) % line,
                                        4 * dh, line)
                          for r in range(phases) for j in range(h)) / phases
            total = 2 * t * per_row
        _kv_mem(w, b, total, t * (row + v_row), split=split)
    else:
        krow = kvh * cdiv(dh, 16) * 16 if b.kv == "int8-rows-pad" else kvd
        nbytes = t * (krow + kvd) + 2 * 4 * t  # K rows, V rows, two per-row scale arrays
        nl = (lines_touched(b.kv_offset, t * krow, line)
              + lines_touched(b.kv_offset, t * kvd, line) + 2 * lines_touched(0, 4 * t, line))
        _kv_mem(w, b, nl, nbytes, split=split)


#: llm_matvec_s8_pie per row of n 16-byte blocks: row setup and readout, and
#: per block the two 128-bit loads and the multiply-accumulate
S8_ROW_PIE_FIXED, S8_BLOCK_PIE = 4, 3
#: attention_fast.c's exp: range reduction (mul, cvt, compare, cvt, sub),
#: degree-4 Horner (8), exponent build and the scale (3), the range test
FAST_EXP_OPS = 17


def _s8_pie(rows: float, n: int) -> float:
    return rows * (S8_ROW_PIE_FIXED + S8_BLOCK_PIE * cdiv(n, 16))


def fast_query_work(w: Work, b: Build, s: Shape, t: int, *, split: bool) -> None:
    """Fast mode's attention for one query over t cached positions (all
    heads): quantized q, integer scores by the s8 kernel, softmax with the
    cheap exp, quantized weights, transposed V rows by the s8 kernel."""
    h, dh = s.n_heads, s.head_dim
    dhp, t16 = cdiv(dh, 16) * 16, cdiv(t, 16) * 16
    quantize_work(w, b, h * dh, split=split)
    w.compute(split=split, pie=h * _s8_pie(t, dhp), ops=h * t * 6)  # scores, scale, max
    chain_work(w, b, h * t * FAST_EXP_OPS, split=split)
    w.compute(split=split, ops=h * t * 4)  # s - max, den +=, * vscale, store
    quantize_work(w, b, h * t, split=split, pad=h * (t16 - t))
    w.compute(split=split, pie=h * _s8_pie(dh, t16), ops=h * dh * 3)
    chain_work(w, b, h * dh * DIV_OPS, split=split)


def _attention_core(w: Work, b: Build, s: Shape, pos: int) -> None:
    """One layer's attention over positions 0..pos (after q, k, v exist)."""
    t, h, dh = pos + 1, s.n_heads, s.head_dim
    if b.kv == "int8-fast":
        sp = b.attn_split == "heads"
        w.handoff(sp, b.handoff_s)
        kv_read_work(w, b, s, pos, split=sp)
        fast_query_work(w, b, s, t, split=sp)
        return
    n = t * h  # (position, head) pairs
    split_on = pos >= b.attn_split_min_pos
    sp_all = split_on and b.attn_split == "heads"
    sp_score = split_on and b.attn_split in ("heads", "score+vacc", "score+soft+vacc")
    sp_soft = split_on and b.attn_split in ("heads", "score+soft+vacc")
    sp_vacc = sp_score
    if split_on and b.attn_split != "none":
        w.handoff({"heads": 1, "score+vacc": 2, "score+soft+vacc": 3}[b.attn_split],
                  b.handoff_s)
    kv_read_work(w, b, s, pos, split=sp_score)
    if b.kv.startswith("fp32"):
        # scores: dot, * 1/sqrt(dh), store, max; softmax: s - max, exp, denom +=;
        # V: ao += w * v; finish: zero ao, ao /= denom. One position reads its
        # rows four at a time (scores_rows4, and values_rows4 for V dots), the
        # rest (the last t % 4) row by row.
        n4 = (t // 4) * 4 * h if b.attn_rows4 else 0
        w.compute(split=sp_score, ops=n4 * (FDOT_ROWS4_OPS * dh + 4)
                  + (n - n4) * (FDOT_OPS * dh + 4))
        w.compute(split=sp_soft, ops=n * 4)
        exp_work(w, b, b.softmax_exp, n, split=sp_soft)
        v4 = n4 if b.v_bytes != 4 else 0
        w.compute(split=sp_vacc, ops=v4 * V_ROWS4_OPS * dh + (n - v4) * FAXPY_OPS * dh)
        if b.v_bytes != 4:  # recompute (float)g * scale_i * xscale per element read
            w.compute(split=sp_vacc, ops=(n - v4) * 4 * dh)
        if b.k_bytes != 4:
            # every cached k rebuilt and rotated once per row and kv head, with
            # its position's RoPE row from flash (re-read every layer: the
            # layer's KV stream evicts it)
            w.compute(split=sp_score, ops=t * s.kv_dim * K_REBUILD_OPS)
            w.flash(t * dh * 4, b.line)
        w.compute(split=sp_all, ops=h * dh * 2)
        chain_work(w, b, h * dh * DIV_OPS, split=sp_all)
        return
    # esp32-ai int8 KV: integer scores (scalar or PIE), softmax with
    # llm_fast_expf folding the V scale, weights quantized to int8, integer V
    if b.score == "pie":
        blocks = cdiv(dh, 16)
        w.compute(split=sp_score, pie=n * (2 + 3 * blocks), ops=n * 5 + t * 3)
    else:
        w.compute(split=sp_score, mac=n * dh, ops=n * 5 + t * 3)
    libm = (b.softmax_exp == "fast-floorf") + (b.wquant == "lrintf")
    w.compute(split=sp_soft, ops=n * SOFTMAX_PAIR_OPS, chain=n * FAST_EXPF_CHAIN_OPS,
              cycles=n * libm * SOFT_LIBM_CYCLES)
    w.compute(split=sp_vacc, mac=n * dh, ops=n * (2 + dh))
    w.compute(ops=h * dh * 3, chain=h * DIV_OPS)


def kv_store_work(w: Work, b: Build, s: Shape) -> None:
    """This position's K and V rows written to the cache (one layer): the
    written lines are fetched first (write-allocate) and written back later,
    counted as one transfer each way the way esp32-ai counts its logits
    round trip. K and V rows are kv_dim wide (grouped-query attention)."""
    kvd, d = s.kv_dim, s.dim
    if b.kv == "int8-fast":
        # K and V quantized per kv head; a K row (kvh x 16-byte lines of dhp)
        # and one byte in each of the kv_dim transposed V rows: every line it
        # lands in is fetched and written back (write-allocate)
        kvh, dh = s.n_kv_heads, s.head_dim
        quantize_work(w, b, 2 * kvd)
        w.compute(ops=2 * kvd)
        nl = kvh * lines_touched(0, cdiv(dh, 16) * 16, b.line) + kvd + 2 * kvh
        _kv_mem(w, b, 2 * nl, kvh * cdiv(dh, 16) * 16 + kvd + 8 * kvh)
        return
    if b.kv.startswith("fp32"):
        offs = _kv_offsets(b)
        k_row = _k_row(b, kvd)
        nl = sum(lines_touched(o, k_row, b.line) + lines_touched(o, _v_row(b, kvd), b.line)
                 for o in offs) / len(offs)
        _kv_mem(w, b, nl, k_row + _v_row(b, kvd))
        w.compute(ops=2 * 2 * kvd)  # memcpy: load + store per float
        if b.k_bytes != 4:
            w.compute(ops=kvd * K_DOTS_STORE_OPS)
        return
    dh, kvh, h = s.head_dim, s.n_kv_heads, s.n_heads
    pad = kvh * (cdiv(dh, 16) * 16 - dh) if b.kv == "int8-rows-pad" else 0
    quantize_work(w, b, kvd, pad=pad)  # K
    quantize_work(w, b, kvd)  # V
    quantize_work(w, b, d, pad=h * (cdiv(dh, 16) * 16 - dh) if pad else 0)  # q, for the scores
    nl = lines_touched(0, kvd + pad, b.line) + lines_touched(0, kvd, b.line) + 2
    _kv_mem(w, b, nl, 2 * kvd + pad + 8)


def _head(w: Work, b: Build, s: Shape, pie_calls: Mapping[str, int] | None,
          counts: HeadCounts | None, bound_pie: float | None) -> None:
    d = s.dim
    rmsnorm_work(w, d)
    if b.head_fmt == "f32":  # head.c head_input_other: x into the head's own copy
        w.compute(ops=2 * d)
    else:
        matvec_input_work(w, b, b.head_fmt, d)
    head = next(m for m in matrices(s) if m.name == "head")
    if b.head == "dense":
        matvec_work(w, b, s, head, pie_calls)
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
    w.sram(nt * (2 * cdiv(d, 16) * 16 + 4))
    log_n = math.log2(max(nt, 2))
    if b.order == "qsort":
        w.compute(cycles=nt * log_n * QSORT_CMP_CYCLES)
    elif b.order == "radix":
        w.compute(ops=nt * RADIX_OPS_PER_KEY)
    else:  # max-heap: build, then one pop per tile scanned (+ the one that stops)
        # the lanes' order: every tile above the first tile's floor popped
        # (charged as all of them); waves pop one per tile scanned (+ the stop)
        pops = nt if b.wave_tiles is None else c.tiles + 1
        w.compute(ops=HEAP_OPS_PER_CMP * (2 * nt + pops * 2 * log_n))
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
        UPSTREAM_BLOCK_OPS * cdiv(d, 32) if b.kernels != "pie" else 0)
    for part_rows, sp in ((inline_rows, False), (rows - inline_rows, True)):
        w.compute(split=sp, pie=part_rows * per_row_pie, ops=part_rows * per_row_ops)
    w.compute(pie=c.tiles * call_pie)  # one kernel call per tile
    inline = min(c.tiles, float(b.first_wave_tiles)) / c.tiles  # share scored inline
    if b.head_scale_bytes == 2:  # every fetched tile's fp16 scales widened (head.c staged_rows)
        widen = c.tiles * (TILE_ROWS * HEAD_SCALE_WIDEN_ROW_OPS + HEAD_SCALE_WIDEN_CALL_OPS)
        w.compute(ops=inline * widen)
        w.compute(split=True, ops=(1 - inline) * widen)
    if b.sampler == "cand-topk":
        k = b.top_k
        inserts = k * (1.0 + math.log(max(rows / k, 1.0)))
        w.compute(split=True, ops=inserts * (k / 2) * 3)
        if b.wave_tiles is None:
            w.compute(ops=k * (k / 2) * 3)  # lane 1's list offered into lane 0's
    w.handoff(c.handoffs, b.handoff_s)
    ids_b = 2 if b.kernels == "pie" else 0  # esp32-ai reads head4_tok only on ties
    scale_b = b.head_scale_bytes
    lines = c.tiles * (stream_lines(TILE_ROWS * row_bytes, b.line)
                       + stream_lines(TILE_ROWS * scale_b, b.line))
    id_lines, id_reads = c.tiles * stream_lines(TILE_ROWS * ids_b, b.line), rows
    if ids_b and b.ids_for_entrants:  # each read a line, at most the rows' id lines
        id_reads = min(rows, head_id_reads(b))
        id_lines = min(id_lines, id_reads)
    total_b = rows * (row_bytes + scale_b) + id_reads * ids_b
    if b.head_tier == "sram":  # a board without PSRAM: the rows are loads in the kernel
        w.sram(total_b)
        return
    if b.head_tier == "flash":  # read in place: the rows it scores through the flash cache
        w.flash(total_b, b.line)
        return
    w.psram(inline * (lines + id_lines), b.line, inline * total_b)
    w.psram((1 - inline) * (lines + id_lines), b.line, (1 - inline) * total_b, split=True)


def head_id_reads(b: Build) -> float:
    """Token ids one certified head evaluation reads (s3.HEAD_ID_READS) for this
    build's sampler."""
    return HEAD_ID_READS["top40" if b.sampler == "cand-topk" else "greedy"]


def sample_work(w: Work, b: Build, s: Shape) -> None:
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
    chain_work(w, b, k * (2 * LOGF_OPS + DIV_OPS))


def embed_position_work(e: Work, b: Build, s: Shape) -> None:
    """One position's embed stage but the PLE projection: embedding and PLE
    rows from flash, the PLE input, the RoPE row (no PLE row, input or norms
    without PLE: llama2.c)."""
    d, L, p, dh = s.dim, s.n_layers, s.ple_dim, s.head_dim
    lp = L * p
    ng = n_groups(d, s.group)
    if b.rows_from == "image":  # a row of the embedding in the image's format
        e.flash(matrix_row_bytes(s, d), b.line)
        if s.has_ple:
            e.flash(ple_record_bytes(s), b.line)
    else:  # model.bin in place: packed nibbles + fp16 scales
        e.flash(cdiv(d, 2) + 2 * ng, b.line)
        if s.has_ple:
            e.flash(cdiv(lp, 2) + 2 * n_groups(lp, s.group), b.line)
    e.compute(ops=3 * d + (lp * 4 + L * HALF2FLOAT_OPS + lp + lp * 3 if s.has_ple else 0))
    for _ in range(L if s.has_ple else 0):
        rmsnorm_work(e, p)
    if b.core[0] not in ("q8", "f32"):  # engine.c quantize: only int4 quantizes at once
        quantize_work(e, b, d)
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
    work = {st: Work() for st in MODEL_STAGES}

    # embed: embedding and PLE rows from flash, the PLE input, the RoPE row
    e = work["embed"]
    embed_position_work(e, b, s)
    if s.has_ple:
        matvec_work(e, b, s, mats["ple_model_proj"], pie_calls)

    charge_spill(work, b)
    one = {st: Work() for st in ("attn", "ffn", "ple")}
    a = one["attn"]
    fmt = b.core[0]
    rmsnorm_work(a, d)
    matvec_input_work(a, b, fmt, d)
    matvec_work(a, b, s, mats["qkv"], pie_calls)
    a.compute(ops=(h + s.n_kv_heads) * (dh // 2) * 6)  # RoPE on the q and k heads
    kv_store_work(a, b, s)
    _attention_core(a, b, s, pos)
    matvec_input_work(a, b, fmt, d)
    matvec_work(a, b, s, mats["attn_proj"], pie_calls)
    a.compute(ops=3 * d)

    fw = one["ffn"]
    rmsnorm_work(fw, d)
    matvec_input_work(fw, b, fmt, d)
    if b.quant_per_matvec:
        quantize_work(fw, b, d)  # gate and up each quantize their (same) input
    matvec_work(fw, b, s, mats["gate"], pie_calls)
    matvec_work(fw, b, s, mats["up"], pie_calls)
    fw.compute(ops=f * 4)  # silu's 1 + e, * up
    chain_work(fw, b, f * DIV_OPS)  # x / (1 + e)
    exp_work(fw, b, b.act_exp, f)
    matvec_input_work(fw, b, fmt, f)
    matvec_work(fw, b, s, mats["down"], pie_calls)
    fw.compute(ops=3 * d)

    if s.has_ple:  # llama2.c has no PLE branch: its stage stays empty
        pw = one["ple"]
        quantize_work(pw, b, d)
        matvec_work(pw, b, s, mats["ple_gate"], pie_calls)
        if b.act_exp == "newlib":
            pw.compute(erff=p)  # priced by Fit.erff_cycles
        else:
            chain_work(pw, b, p * ERFF_OPS)
        pw.compute(ops=p * 5)  # 0.5*v*(1+erf(v*c)) * ple
        quantize_work(pw, b, p)
        matvec_work(pw, b, s, mats["ple_proj"], pie_calls)
        rmsnorm_work(pw, d)
        pw.compute(ops=3 * d)
    for st, wk in one.items():
        work[st].add(wk.scaled(L))

    _head(work["head"], b, s, pie_calls, counts, bound_pie)
    sample_work(work["sample"], b, s)
    charge_port(work, b, "step")
    return work


def charge_spill(work: Mapping[str, Work], b: Build) -> None:
    """Core matrices placed in PSRAM stream from it once per token (or pass):
    per stage as the placement put them (`spill_stages`), or a what-if's
    `core_spill_bytes` on the PLE stage (the last layers' tail, placed last).
    Split across the cores when the build splits its matvecs. Core matrices
    read in place from flash (`flash_stages`) cost their bytes at the flash
    rate."""
    split = b.split_rows is not None
    spills = list(b.spill_stages)
    if b.core_spill_bytes:
        spills.append(("ple", b.core_spill_bytes))
    for st, nbytes in spills:
        work[st].psram(stream_lines(nbytes, b.line), b.line, nbytes, split=split)
    for st, nbytes in b.flash_stages:
        work[st].flash(nbytes, b.line)


def charge_port(work: Mapping[str, Work], b: Build, loop: str, *,
                icache: bool = True) -> None:
    """What a token (or a verify pass) costs around the engine on our port:
    instruction-cache refills when the code it runs outgrows the cache (each
    line once: the working set is cycled through in order, so LRU keeps none
    of it), and llm.py's MicroPython loop (s3.python_loop_s(loop): "step" or
    "pass", counted on the unix port and priced for the S3)."""
    if icache and b.code_bytes > b.icache_bytes:
        misses = cdiv(b.code_bytes, ICACHE_LINE)
        work["icache"].compute(cycles=misses * ICACHE_MISS_S * CPU_HZ)
    if b.python_loop:
        work["python"].compute(cycles=python_loop_s(loop) * CPU_HZ)


def build_work(b: Build, s: Shape = RELEASE, positions: Sequence[int] | None = None,
               *, pie_calls: Mapping[str, int] | None = None, counts: HeadCounts | None = None,
               bound_pie: float | None = None) -> dict[str, Work]:
    """Per-stage cost drivers of one token, averaged over `positions`."""
    positions = list(positions if positions is not None else story_positions())
    if not positions:
        raise ValueError("positions is empty")
    total = {st: Work() for st in MODEL_STAGES}
    for pos in positions:
        one = token_work(b, s, pos, pie_calls=pie_calls, counts=counts, bound_pie=bound_pie)
        for st in MODEL_STAGES:
            total[st].add(one[st])
    return {st: w.scaled(1.0 / len(positions)) for st, w in total.items()}


def predict(b: Build, fit: Fit, s: Shape = RELEASE, positions: Sequence[int] | None = None,
            **kw: object) -> dict[str, float]:
    """Predicted ms per stage (and "total") for one generated token."""
    work = build_work(b, s, positions, **kw)  # type: ignore[arg-type]
    out = {st: 1e3 * stage_seconds(work[st], fit) for st in MODEL_STAGES}
    out["total"] = sum(out[st] for st in MODEL_STAGES)
    return out
