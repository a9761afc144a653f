"""Speculative decoding: one verification pass of m positions (llm_verify)
as work per stage (`pass_work`, `pass_build_work`): every weight read once,
the KV cache once per layer, the many-positions head scan (`PassHead`),
positions 1..m-1's batch buffers in PSRAM; and `Passes`, which caches the
work and ms of such passes for the report and for draft_prices.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from . import shape
from .builds import Build
from .forward import (
    chain_work,
    charge_port,
    charge_spill,
    embed_position_work,
    exp_work,
    fast_query_work,
    head_id_reads,
    kv_read_work,
    kv_store_work,
    quantize_work,
    rmsnorm_work,
    sample_work,
    token_work,
)
from .pie import cols_resident, pie_cols_instructions, pie_matvec_instructions, pie_row_instructions
from .s3 import (
    BOUND_OPS_PER_TILE,
    BOUND_PIE_PER_TILE,
    CAND_OPS_PER_ROW,
    DIV_OPS,
    ERFF_OPS,
    FAXPY_OPS,
    FDOT_OPS,
    HEAD_SCALE_WIDEN_CALL_OPS,
    HEAD_SCALE_WIDEN_ROW_OPS,
    HEAP_OPS_PER_CMP,
    K_REBUILD_OPS,
    ROW_OPS_PIE,
    TILE_ROWS,
)
from .shape import MODEL_STAGES, VERIFY_MAX, Shape, cdiv, q4_row_bytes, stream_lines
from .spec_inputs import UnionRatios
from .work import Fit, HeadCounts, Work, scale_memory, stage_seconds

__all__ = [
    "BATCH_VECTOR_TRANSFERS",
    "MANY_POP_HEAP_LINES",
    "SCORE_LINE_TRANSFERS",
    "PassHead",
    "Passes",
    "pass_build_work",
    "pass_work",
]

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


def _matvec_pass(w: Work, b: Build, s: Shape, mat: shape.Mat, m: int,
                 pie_calls: Mapping[str, int] | None,
                 cols_pie: Mapping[int, float] | None) -> None:
    """One matrix for the m positions of a pass (engine.c matvec_rows): the
    weights read once, the many-columns kernel for resident rows, the
    single-vector kernel once per column for the others."""
    if b.kernels != "pie" or b.core[0] != "int4":
        raise ValueError(f"{b.name}: passes are modelled for our int4 PIE kernels")
    rows, cols = mat.rows, mat.cols
    ng = shape.n_groups(cols, s.group)
    nbytes = rows * q4_row_bytes(cols) + rows * ng * 4
    split = b.split_rows is not None and rows >= b.split_rows
    if split:
        w.handoff(1, b.handoff_s)
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
    recomputed from its int16 dots once for all positions (and each K row
    rebuilt and rotated, with its RoPE row from flash), split by heads across
    the two cores (one hand-off)."""
    if not (b.kv.startswith("fp32") or b.kv == "int8-fast") or \
            b.attn_split not in ("heads", "none"):
        raise ValueError(f"{b.name}: passes are modelled for fp32 K rows or fast mode's int8 "
                         "cache, split by heads")
    h, dh = s.n_heads, s.head_dim
    last = pos + m - 1
    if b.kv == "int8-fast":
        sp = b.attn_split == "heads"
        w.handoff(sp, b.handoff_s)
        kv_read_work(w, b, s, last, split=sp)  # once: the lines stay cached for the m queries
        for c in range(m):
            fast_query_work(w, b, s, pos + c + 1, split=sp)
        return
    pairs = h * sum(pos + c + 1 for c in range(m))
    sp = b.attn_split == "heads" and pos >= b.attn_split_min_pos
    if sp:
        w.handoff(1, b.handoff_s)
    kv_read_work(w, b, s, last, split=sp)
    w.compute(split=sp, ops=pairs * (FDOT_OPS * dh + 4))
    w.compute(split=sp, ops=pairs * 4)
    exp_work(w, b, b.softmax_exp, pairs, split=sp)
    w.compute(split=sp, ops=pairs * FAXPY_OPS * dh)
    if b.v_bytes != 4:
        w.compute(split=sp, ops=(last + 1) * h * dh * 4)
    if b.k_bytes != 4:
        w.compute(split=sp, ops=(last + 1) * s.kv_dim * K_REBUILD_OPS)
        w.flash((last + 1) * dh * 4, b.line)
    w.compute(split=sp, ops=m * h * dh * 2)
    chain_work(w, b, m * h * dh * DIV_OPS, split=sp)


def _scored_row_pie(n: float, s: Shape, cols_pie: Mapping[int, float] | None) -> float:
    """PIE instructions per fetched head row scored for n positions (n may be
    a mean): the single-vector kernel's row for one, the many-columns kernel's
    row for several, linear between whole n (the count is linear in n)."""
    d, g = s.dim, s.group

    def at(k: int) -> float:
        if k <= 1:
            return float(pie_row_instructions(d, g))
        nb = cdiv(d, 32)
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
        rmsnorm_work(w, d)
        quantize_work(w, b, d)
    bp = bound_pie if bound_pie is not None else BOUND_PIE_PER_TILE
    # bounds per position, the key (largest bound) kept beside them
    w.compute(pie=m * nt * bp, ops=m * (nt * BOUND_OPS_PER_TILE + 2 * d + 2 * nt))
    w.sram(m * nt * (2 * cdiv(d, 16) * 16 + 4))
    log_n = math.log2(max(nt, 2))
    pops = nt if b.many_split else ph.tiles + 1  # the lanes need every tile in order
    w.compute(ops=HEAP_OPS_PER_CMP * (2 * nt + pops * 2 * log_n)
              + pops * m * 3 + ph.tiles * m * 3)  # lowest floor, then each position's test
    rows_read = ph.tiles * TILE_ROWS
    n_bar = ph.rows / rows_read if rows_read else 1.0
    nb = cdiv(d, 32)
    split = b.many_split
    w.compute(split=split, pie=rows_read * _scored_row_pie(n_bar, s, cols_pie)
              + ph.tiles * n_bar * (6 + 2 * nb),
              ops=ph.rows * (ROW_OPS_PIE + CAND_OPS_PER_ROW))
    if b.sampler == "cand-topk":
        k = b.top_k
        inserts = k * (1.0 + math.log(max(ph.rows / m / k, 1.0)))
        w.compute(split=split, ops=m * inserts * (k / 2) * 3)
    if split:
        w.handoff(1, b.handoff_s)
        k = b.top_k if b.sampler == "cand-topk" else 1
        w.compute(ops=m * k * (k / 2) * 3)  # lane 1's lists offered into lane 0's
    scale_b = b.head_scale_bytes
    if scale_b == 2:  # each fetched tile's fp16 scales widened once for its positions
        w.compute(split=split, ops=ph.tiles * (TILE_ROWS * HEAD_SCALE_WIDEN_ROW_OPS
                                               + HEAD_SCALE_WIDEN_CALL_OPS))
    row_bytes = q4_row_bytes(d)
    tile_lines = (stream_lines(TILE_ROWS * row_bytes, b.line)
                  + stream_lines(TILE_ROWS * scale_b, b.line))
    # a row's id is read once for the positions it could enter (s3.HEAD_ID_READS
    # per position, each read a line, at most the rows' id lines)
    id_lines, id_reads = ph.tiles * stream_lines(TILE_ROWS * 2, b.line), float(rows_read)
    if b.ids_for_entrants:
        id_reads = min(id_reads, m * head_id_reads(b))
        id_lines = min(id_lines, id_reads)
    w.psram(ph.tiles * tile_lines + id_lines, b.line,
            rows_read * (row_bytes + scale_b) + id_reads * 2, split=split)


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

    act = lines(cdiv(widest, 32) * 32)
    cp = cdiv(d, 32) * 32
    att_split = b.attn_split == "heads"
    for c in range(1, m):
        # embed: x, its quantized copy, the PLE inputs and table row (written)
        charge("embed", BATCH_VECTOR_TRANSFERS * (lines(4 * d) + act + 2 * lines(4 * L * p)))
        # per layer: x, xb, xb2, att, qkv, the quantized input, max/den
        charge("attn", L * BATCH_VECTOR_TRANSFERS * (4 * lines(4 * d) + lines(4 * (d + 2 * s.kv_dim))
                                                     + act + 1))
        charge("attn", L * SCORE_LINE_TRANSFERS * h * shape.lines_touched(0, 4 * (pos + c + 1), line),
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
        work = token_work(b, s, pos, pie_calls=pie_calls, bound_pie=bound_pie)
        # llm.py's loop: a pass's share instead of a step's (per token: spec_entry)
        work["python"] = Work()
        charge_port(work, b, "pass", icache=False)
        return work
    ph = head or PassHead.from_union(b, s, b.rows_fraction, m, 1.0, 1.0)
    d, L, f, p, h, dh = s.dim, s.n_layers, s.ffn, s.ple_dim, s.n_heads, s.head_dim
    mats = {mt.name: mt for mt in shape.matrices(s)}
    work = {st: Work() for st in MODEL_STAGES}

    e = work["embed"]
    for _ in range(m):
        embed_position_work(e, b, s)
    if s.has_ple:
        _matvec_pass(e, b, s, mats["ple_model_proj"], m, pie_calls, cols_pie)
    charge_spill(work, b)  # the core in PSRAM streams once per pass

    one = {st: Work() for st in ("attn", "ffn", "ple")}
    a = one["attn"]
    for _ in range(m):
        rmsnorm_work(a, d)
        quantize_work(a, b, d)
        a.compute(ops=(h + s.n_kv_heads) * (dh // 2) * 6)  # RoPE on the q and k heads
        kv_store_work(a, b, s)
        quantize_work(a, b, d)
        a.compute(ops=3 * d)
    _matvec_pass(a, b, s, mats["qkv"], m, pie_calls, cols_pie)
    _attention_pass(a, b, s, pos, m)
    _matvec_pass(a, b, s, mats["attn_proj"], m, pie_calls, cols_pie)

    fw = one["ffn"]
    for _ in range(m):
        rmsnorm_work(fw, d)
        quantize_work(fw, b, d)
        if b.quant_per_matvec:
            quantize_work(fw, b, d)
        fw.compute(ops=f * 4)
        chain_work(fw, b, f * DIV_OPS)
        exp_work(fw, b, b.act_exp, f)
        quantize_work(fw, b, f)
        fw.compute(ops=3 * d)
    for name in ("gate", "up", "down"):
        _matvec_pass(fw, b, s, mats[name], m, pie_calls, cols_pie)

    pw = one["ple"]
    for _ in range(m if s.has_ple else 0):  # llama2.c: no PLE stage
        quantize_work(pw, b, d)
        if b.act_exp == "newlib":
            pw.compute(erff=p)
        else:
            chain_work(pw, b, p * ERFF_OPS)
        pw.compute(ops=p * 5)
        quantize_work(pw, b, p)
        rmsnorm_work(pw, d)
        pw.compute(ops=3 * d)
    for name in ("ple_gate", "ple_proj") if s.has_ple else ():
        _matvec_pass(pw, b, s, mats[name], m, pie_calls, cols_pie)
    for st, wk in one.items():
        work[st].add(wk.scaled(L))

    _head_many(work["head"], b, s, m, ph, cols_pie, bound_pie)
    for _ in range(m):
        sample_work(work["sample"], b, s)
    _batch_buffers(work, b, s, pos, m, ph)
    charge_port(work, b, "pass")  # per pass; per story token: spec_entry
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
    total = {st: Work() for st in MODEL_STAGES}
    for pos in starts:
        one = pass_work(b, s, pos, m, head=head, pie_calls=pie_calls, bound_pie=bound_pie,
                        cols_pie=cols_pie)
        for st in MODEL_STAGES:
            total[st].add(one[st])
    return {st: w.scaled(1.0 / len(starts)) for st, w in total.items()}


class Passes:
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

    def with_fit(self, f: Fit) -> Passes:
        """The same passes priced with other constants (the work is shared)."""
        other = copy.copy(self)
        other.f = f
        return other

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
            self._memo[key] = scale_memory(w, *self.scale) if self.scale != (1.0, 1.0) else w
        return self._memo[key]

    def ms(self, b: Build, m: int, union: UnionRatios, starts: Sequence[int]) -> float:
        w = self.work(b, m, union, starts)
        return sum(1e3 * stage_seconds(w[st], self.f) for st in MODEL_STAGES)
