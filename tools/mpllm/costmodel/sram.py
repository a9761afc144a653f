"""Internal SRAM: what the placement plan needs (`sram_plan`) and what is left
of what is free at boot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..boards import (
    FAST_RESERVE_BYTES,
    FAST_RESERVE_NO_PSRAM_BYTES,
    N8_FREE_AT_REPL,
    N8_LEFT_FREE_AFTER_OPEN,
    SRAM_FREE_AT_BOOT,
    SRAM_LARGEST_BLOCK,
)
from .s3 import TILE_ROWS
from .shape import RELEASE, Mat, Shape, cdiv, matrices, matrix_row_bytes

__all__ = [
    "ENGINE_STRUCT_BYTES",
    "FAST_RESERVE_BYTES",
    "FAST_RESERVE_NO_PSRAM_BYTES",
    "MEASURED_CORE_BULK_KIB",
    "MEASURED_PLACEMENT",
    "N8_FREE_AT_REPL",
    "N8_LEFT_FREE_AFTER_OPEN",
    "SRAM_CACHE_BYTES",
    "SRAM_FREE_AT_BOOT",
    "SRAM_LARGEST_BLOCK",
    "SRAM_TOTAL_BYTES",
    "core_matrix_bytes",
    "measured_core_regions",
    "more_in_psram",
    "spill_by_stage",
    "sram_plan",
]

#: ESP32-S3 internal SRAM: 512 KB (Espressif ESP32-S3 datasheet); the
#: instruction and data caches take 16 KB + 32 KB of it at the sizes configured
#: here (s3.ICACHE_BYTES_OURS; sdkconfig.board's data cache).
SRAM_TOTAL_BYTES = 512 * 1024
SRAM_CACHE_BYTES = (16 + 32) * 1024
# The boards' memory (free at the REPL, the port's reserves) is a board fact:
# mpllm.boards, which the product reads too, holds it.
#: What the engine placed on that emulated board after llm.load() of a
#: release-shaped image (Model.memory(); issue 21): the engine's internal
#: region, the core matrices in it and in PSRAM, and what was left free (the
#: lowest internal free seen afterwards, through a story, the chat, a file
#: write and soft resets: 33,019 B). The FAST core matrices are named; every
#: other core matrix went to PSRAM (L4, L5). The cost model takes its
#: placement from this, not from the plan. (Before: 208,780 B FAST with
#: 176,600 B of core in PSRAM with the radios; 262,244 B and 123,168 B
#: without them, under a 64 KiB reserve.)
MEASURED_PLACEMENT: dict[str, object] = {
    "engine_fast_bytes": 295396,
    "core_fast_bytes": 219968,
    "core_bulk_bytes": 90016,
    "head_tiles_fast_bytes": 39008,
    "left_free_bytes": 33151,
    "free_at_repl_bytes": SRAM_FREE_AT_BOOT,
    "largest_block_bytes": SRAM_LARGEST_BLOCK,
    "fast_core": ("ple_model_proj", "L0.*", "L1.*", "L2.*", "L3.*"),
    "source": ("emulated board (our firmware without radios under Espressif's esp32s3 system "
               "model, IDF 5.5.3, 8 MB octal PSRAM): Model.memory() after llm.load() of a "
               "release-shaped image"),
}
#: The core in PSRAM as the report words it.
MEASURED_CORE_BULK_KIB = round(int(MEASURED_PLACEMENT["core_bulk_bytes"]) / 1024)  # type: ignore[call-overload]
#: The engine's own state struct in FAST, as the host port reports it
#: (`_llm.Model.memory()` "engine", certified-head engine): 8,296 B at the
#: release shape, about 7,200 at stories260K's (fewer layers and sections),
#: before the weight formats' matvec inputs (int8 in groups, floats) added
#: 664 B to both; one figure between them for every shape.
ENGINE_STRUCT_BYTES = 7700 + 664


def _r16(n: int) -> int:
    return cdiv(n, 16) * 16


def core_matrix_bytes(s: Shape = RELEASE) -> dict[str, tuple[str, int]]:
    """Every core matrix the engine places, by its placement name
    ("ple_model_proj", "L3.qkv", ...): (stage, bytes as staged: int4 rows +
    fp32 scales), in the order the engine places them (engine_open.c: the PLE
    projection, then layer by layer qkv, attn_proj, gate, up, down, ple_gate,
    ple_proj)."""
    core = [m for m in matrices(s) if m.name != "head"]

    def entry(m: Mat) -> tuple[str, int]:
        return m.stage, m.rows * matrix_row_bytes(s, m.cols)

    out = {m.name: entry(m) for m in core if m.per_token == 1}
    for layer in range(s.n_layers):
        out.update({f"L{layer}.{m.name}": entry(m) for m in core if m.per_token != 1})
    return out


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name == p or (p.endswith(".*") and name.startswith(p[:-1])) for p in patterns)


def measured_core_regions(s: Shape = RELEASE) -> dict[str, str]:
    """The measured placement (MEASURED_PLACEMENT) as a region per core
    matrix; checked against its byte totals."""
    fast = MEASURED_PLACEMENT["fast_core"]
    regions = {name: "fast" if _matches(name, fast) else "bulk"  # type: ignore[arg-type]
               for name in core_matrix_bytes(s)}
    if s == RELEASE:
        got = {r: sum(b for n, (_, b) in core_matrix_bytes(s).items() if regions[n] == r)
               for r in ("fast", "bulk")}
        want = {"fast": MEASURED_PLACEMENT["core_fast_bytes"],
                "bulk": MEASURED_PLACEMENT["core_bulk_bytes"]}
        if got != want:
            raise ValueError(f"measured placement names {got} but reports {want} bytes")
    return regions


def more_in_psram(regions: Mapping[str, str], extra: int, s: Shape = RELEASE) -> dict[str, str]:
    """`regions` with at least `extra` more bytes of core in PSRAM: the FAST
    matrices placed last go first (the engine places in matrices() order,
    layer by layer)."""
    out = dict(regions)
    moved = 0
    for name, (_, nbytes) in reversed(list(core_matrix_bytes(s).items())):
        if moved >= extra:
            break
        if out.get(name) == "fast":
            out[name] = "bulk"
            moved += nbytes
    return out


def spill_by_stage(regions: Mapping[str, str], s: Shape = RELEASE) -> dict[str, int]:
    """Core bytes in PSRAM per stage, for a placement (name -> region)."""
    out: dict[str, int] = {}
    for name, (stage, nbytes) in core_matrix_bytes(s).items():
        if regions.get(name, "fast") != "fast":
            out[stage] = out.get(stage, 0) + nbytes
    return out


#: head.h LLM_HEAD_WAVE_TILES: row chunks a wave of the dense head scores
HEAD_WAVE_TILES = 8
#: sizeof(llm_candidates) (sampler.h): two counts, LLM_SAMPLER_MAX_TOP_K (256)
#: floats and ids
CANDIDATES_BYTES = 8 + 256 * 4 * 2


def head_scratch_bytes(s: Shape, *, certified: bool) -> int:
    """head.c llm_head_scratch_bytes: [xq | |xq|], tile bounds (int and float),
    the heap, and the values buffer: a dense wave's chunks, or, when larger,
    the certified route's two lanes (a tile's values each, the second lane's
    candidate list, the tile order). Without tiles: chunks of 128 rows."""
    cp = cdiv(s.dim, 32) * 32
    nt, rows = (s.n_tiles, TILE_ROWS) if certified else (0, 128)
    values = max(_r16(4 * HEAD_WAVE_TILES * rows),
                 _r16(4 * 2 * rows) + _r16(CANDIDATES_BYTES) + _r16(2 * nt))
    return _r16(2 * cp) + 2 * _r16(4 * nt) + _r16(2 * nt) + values


def sram_plan(s: Shape = RELEASE, *,
              memory: Iterable[tuple[str, str, int]] | None = None) -> dict[str, object]:
    """Internal SRAM the placement plan asks for against what is free at the
    REPL (`SRAM_FREE_AT_BOOT`, measured on the emulated board) less the port's
    reserve (`FAST_RESERVE_BYTES`). With `memory` (the engine's placement
    report on a release-shaped image) the plan is exactly what the engine put
    in FAST; otherwise it is computed: core matrices, norms, the head's tile
    index, activations (with the certified head's scratch), the engine state.
    "measured" is what the emulated board's engine really placed."""
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
        nt, cp = s.n_tiles, cdiv(d, 32) * 32
        items["core matrices (int4 + fp32 scales)"] = sum(
            b for _, b in core_matrix_bytes(s).values())
        items["norm weights"] = ((3 if s.has_ple else 2) * L * d + p + d) * 4
        items["head tile index (boxes + scales)"] = nt * (2 * cp + 4)
        # x, xb, xb2, qkv, att, hb, hb2 (max(F, P)), ple, trow, scores [H][S], two
        # quantized inputs; the head's [xq | |xq|], bounds, heap, wave and values;
        # the V cache's per-position "wide" flags and the dots' unit scales
        act = (3 * d + (d + 2 * s.kv_dim) + d + 2 * max(s.ffn, p) + 2 * L * p
               + s.n_heads * s.seq_len) * 4
        act += 2 * _r16(4 * s.n_heads) + _r16(L * s.seq_len) + _r16(4 * d)
        scratch = head_scratch_bytes(s, certified=True) + 40 * 8
        items["activations + head scratch"] = _r16(act) + 2 * _r16(cp) + scratch
        items["engine"] = ENGINE_STRUCT_BYTES
        source = "computed from the shape (no placement report given)"
    need = sum(items.values())
    free = SRAM_FREE_AT_BOOT - FAST_RESERVE_BYTES - need
    return {"items": items, "need_bytes": need, "free_at_boot_bytes": SRAM_FREE_AT_BOOT,
            "reserve_bytes": FAST_RESERVE_BYTES,
            "left_free_bytes": free, "core_spill_bytes": max(0, -free),
            "largest_block_bytes": SRAM_LARGEST_BLOCK, "plan_source": source,
            "measured": {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in MEASURED_PLACEMENT.items()},
            "sources": ("ESP32-S3 datasheet: 512 KB internal SRAM; 16 KB I + 32 KB D cache "
                        "taken from it (sdkconfig); free at the REPL and the engine's "
                        "placement: " + str(MEASURED_PLACEMENT["source"]) + "; the port "
                        f"keeps LLM_ESP32_FAST_RESERVE ({FAST_RESERVE_BYTES // 1024} KiB) back")}
