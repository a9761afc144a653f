"""Internal SRAM: what the placement plan needs (`sram_plan`) and what is left
of what is free at boot.
"""

from __future__ import annotations

from collections.abc import Iterable

from .s3 import TILE_ROWS
from .shape import RELEASE, Shape, _cdiv, matrices, n_groups, q4_row_bytes

__all__ = [
    "ENGINE_STRUCT_BYTES",
    "SRAM_CACHE_BYTES",
    "SRAM_FREE_AT_BOOT",
    "SRAM_LARGEST_BLOCK",
    "SRAM_TOTAL_BYTES",
    "sram_plan",
]

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
