"""Bytes per region (flash/fast/bulk) as the engine accounts them
(native/engine/engine.c): per stage and token, per run, per verify pass;
checked against the engine's counters (`check_bytes`, `check_pass_bytes`),
with the placement report read into regions (`placement_from_memory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .s3 import TILE_ROWS
from .shape import (
    PREFILL_BATCH,
    REGIONS,
    STAGES,
    Shape,
    cdiv,
    matrices,
    matrix_row_bytes,
    one_group_a_row,
    ple_record_bytes,
)

__all__ = [
    "check_bytes",
    "engine_stage_bytes",
    "head_eval_bytes",
    "pass_region_bytes",
    "placement_from_memory",
    "run_region_bytes",
]


def engine_stage_bytes(s: Shape, pos: int, placement: Mapping[str, str] | None = None,
                       *, head: bool = False, head_mode: str = "dense",
                       head_rows: float | None = None, head_ids: bool = True,
                       head_id_reads: float | None = None,
                       kv_dots: bool = True, k_dots: bool = False, weights: bool = True,
                       kv_rows_read: int | None = None) -> dict[str, dict[str, float]]:
    """Bytes the engine (native/engine/engine.c) charges per stage and region
    for one token at `pos`; with `head`, one head evaluation as well
    (`head_eval_bytes`).

    `placement` maps "core", "head", "ids", "tiles", "logits", "kv", "norms" to
    a region (default: the board plan: core, tiles and norms "fast"; head,
    ids, logits and KV "bulk"), and "head_scales" to how the head's rows keep
    their scales (`head_eval_bytes`)."""
    pl = {"core": "fast", "kv": "bulk", "norms": "fast"}
    pl.update(placement or {})
    out = {st: dict.fromkeys(REGIONS, 0.0) for st in STAGES}
    for m in matrices(s):
        if m.name == "head" or not weights:  # weights: once per pass (several prompt tokens)
            continue
        out[m.stage][pl["core"]] += m.rows * matrix_row_bytes(s, m.cols) * m.per_token
    d, L = s.dim, s.n_layers
    out["embed"]["flash"] += matrix_row_bytes(s, d)  # embedding row
    out["embed"]["flash"] += ple_record_bytes(s)
    out["embed"]["flash"] += s.head_dim * 4  # this position's RoPE row
    # each cache row written and each read (engine.c store_kv, kv_row_bytes):
    # V as int16 dots + the position's scale, K as floats or (k_dots) as
    # int16 dots too, with the RoPE row of every k rebuilt from its dots (in
    # flash; rows that do not fit int16 stay floats: none in a checked run),
    # or both as floats in plain mode (kv_dots False); kv_dim wide (GQA)
    kvd = s.kv_dim
    k_dots = kv_dots and k_dots
    row = (2 if k_dots else 4) * kvd + 2 * kvd + 4 if kv_dots else 8 * kvd
    rows_read = pos + 1 if kv_rows_read is None else kv_rows_read
    out["attn"][pl["kv"]] += L * (1 + rows_read) * row
    if k_dots:
        out["attn"]["flash"] += L * rows_read * s.head_dim * 4
    # every rmsnorm charges its weights: the shared PLE-input norm once per layer slice;
    # each layer's attn_norm, ffn_norm and (with PLE) ple_norm
    out["embed"][pl["norms"]] += L * s.ple_dim * 4
    for st in ("attn", "ffn", "ple") if s.has_ple else ("attn", "ffn"):
        out[st][pl["norms"]] += L * d * 4
    if head:
        out["head"][pl["norms"]] += d * 4
        for r, v in head_eval_bytes(s, pl, mode=head_mode, rows=head_rows,
                                    ids=head_ids, id_reads=head_id_reads).items():
            out["head"][r] += v
    return out


def head_eval_bytes(s: Shape, placement: Mapping[str, str] | None = None, *, mode: str,
                    rows: float | None = None, ids: bool = True,
                    id_reads: float | None = None) -> dict[str, float]:
    """Bytes one head evaluation charges, per region (engine.c charge_head):
    the scored rows with their fp32 scales, and 2 bytes per token id read
    (`id_reads`, the engine's head_ids; default one per row, as the dense
    head reads them: the certified head reads only the ids of rows that could
    enter its candidate list); a certified evaluation adds the whole tile
    index (int8 box mid+half over the padded columns + an f32 tile scale per
    tile), a dense one (plain mode, top_k 0) the logits buffer written by the
    head and read by the sampler.

    placement["head_scales"]: "fp16" when the head is the copy staged in its
    certificate's tile order (engine_open.c: each row's one scale kept as the
    2-byte fp16 it is; by either route, the dense one too), "f32" when its
    rows are the image's (id order, 4-byte scales). Default: the board plan,
    where a head of one int4 group a row has its certificate and is staged."""
    pl = {"head": "bulk", "ids": "bulk", "tiles": "fast", "logits": "bulk",
          "head_scales": "fp16" if one_group_a_row(s) else "f32"}
    pl.update(placement or {})
    out = dict.fromkeys(REGIONS, 0.0)
    rb = matrix_row_bytes(s, s.dim)
    if pl["head_scales"] == "fp16":
        if not one_group_a_row(s):
            raise ValueError("fp16 head scales: only a head of one int4 group a row is staged so")
        rb -= 2  # the row's one f32 scale (4 bytes) as fp16
    elif pl["head_scales"] != "f32":
        raise ValueError(f"head_scales {pl['head_scales']!r}: fp16 or f32")
    if mode == "dense":
        rows = float(s.vocab_out) if rows is None else rows
        out[pl["logits"]] += s.vocab_out * 2 * 4
    elif mode == "certified":
        if rows is None:
            raise ValueError("a certified head evaluation needs the rows it scored")
        cp = cdiv(s.dim, 32) * 32
        out[pl["tiles"]] += s.n_tiles * (2 * cp + 4)
    else:
        raise ValueError(f"unknown head mode {mode!r}: dense or certified")
    out[pl["head"]] += rows * rb
    if ids:
        out[pl["ids"]] += (rows if id_reads is None else id_reads) * 2
    return out


def prompt_pass(pos: int, n_prompt: int) -> dict[str, object]:
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
                     head_id_reads: float | None = None,
                     kv_dots: bool = True) -> dict[str, int]:
    """Region totals the engine reports after prefill(n_prompt tokens) and
    n_steps step() calls from position 0 (one head evaluation per call).
    `head_rows` is the engine's total of head rows scored (default: all rows
    of every evaluation, the dense head), `head_id_reads` its total of token
    ids read (stats()["head_ids"]; default one per row scored)."""
    tot = dict.fromkeys(REGIONS, 0.0)
    for pos in range(n_prompt + n_steps):
        for st in engine_stage_bytes(s, pos, placement, kv_dots=kv_dots,
                                     **prompt_pass(pos, n_prompt)).values():  # type: ignore[arg-type]
            for r, b in st.items():
                tot[r] += b
    heads = n_steps + 1
    rows = float(heads * s.vocab_out) if head_rows is None else float(head_rows)
    pl = {"norms": "fast", **(placement or {})}
    tot[pl["norms"]] += heads * s.dim * 4
    per_eval = head_eval_bytes(s, placement, mode=head_mode, rows=0.0, ids=head_ids)
    with_rows = head_eval_bytes(s, placement, mode=head_mode, rows=rows, ids=head_ids,
                                id_reads=head_id_reads)
    for r in REGIONS:
        tot[r] += heads * per_eval[r] + (with_rows[r] - per_eval[r])
    return {r: round(v) for r, v in tot.items()}


def check_bytes(measured_totals: Mapping[str, int], s: Shape, n_prompt: int, n_steps: int,
                placement: Mapping[str, str] | None = None, *, head_mode: str = "dense",
                head_rows: float | None = None, head_ids: bool = True,
                head_id_reads: float | None = None,
                kv_dots: bool = True) -> dict[str, int]:
    """Analytic region totals for the same run; raises ValueError naming the
    regions where the engine's counters disagree with the formulas."""
    expect = run_region_bytes(s, n_prompt, n_steps, placement, head_mode=head_mode,
                              head_rows=head_rows, head_ids=head_ids,
                              head_id_reads=head_id_reads, kv_dots=kv_dots)
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
    # the certificate's tables are staged exactly when the head's rows are, in
    # their tile order with fp16 scales (engine_open.c stage_head)
    pl["head_scales"] = "fp16" if "head_tiles" in by_name else "f32"
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


def pass_region_bytes(s: Shape, pos: int, m: int, placement: Mapping[str, str] | None = None,
                      *, rows_read: float = 0.0, head_ids: bool = True,
                      id_reads: float | None = None, kv_dots: bool = True) -> dict[str, float]:
    """Bytes the engine charges per region for one llm_verify pass of m
    positions at pos (m >= 2, the many-positions head scan): the weights and
    the cache rows 0..pos+m-1 once, each position's flash rows, norms, cache
    row written and tile boxes, and `rows_read` head rows (with their scales
    and `id_reads` token ids, default one per row) once."""
    tot = dict.fromkeys(REGIONS, 0.0)
    for c in range(m):
        kw: dict[str, object] = ({"kv_rows_read": pos + m} if c == 0
                                 else {"weights": False, "kv_rows_read": 0})
        for regs in engine_stage_bytes(s, pos + c, placement, kv_dots=kv_dots,
                                       **kw).values():  # type: ignore[arg-type]
            for r, v in regs.items():
                tot[r] += v
    pl = {"norms": "fast", **(placement or {})}
    tot[pl["norms"]] += m * s.dim * 4
    per_eval = head_eval_bytes(s, placement, mode="certified", rows=0.0, ids=head_ids)
    rows = head_eval_bytes(s, placement, mode="certified", rows=rows_read, ids=head_ids,
                           id_reads=id_reads)
    for r in REGIONS:
        tot[r] += m * per_eval[r] + (rows[r] - per_eval[r])
    return tot


def check_pass_bytes(delta: Mapping[str, int], s: Shape, pos: int, m: int, tiles: int,
                      placement: Mapping[str, str], head_ids: bool, id_reads: int) -> None:
    """The engine's bytes for one pass equal pass_region_bytes with the head
    rows it read and the `id_reads` token ids (its head_ids): a whole number
    of rows, within the tiles it fetched."""
    base = pass_region_bytes(s, pos, m, placement, head_ids=head_ids, id_reads=id_reads)
    per_row = head_eval_bytes(s, placement, mode="certified", rows=1.0, ids=head_ids, id_reads=0)
    empty = head_eval_bytes(s, placement, mode="certified", rows=0.0, ids=head_ids, id_reads=0)
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


def formula_per_token(s: Shape, positions: Sequence[int], placement: Mapping[str, str] | None,
                       **head: object) -> dict[str, float]:
    tot = dict.fromkeys(REGIONS, 0.0)
    for pos in positions:
        for regs in engine_stage_bytes(s, pos, placement, head=True, **head).values():  # type: ignore[arg-type]
            for r, v in regs.items():
                tot[r] += v / len(positions)
    return tot
