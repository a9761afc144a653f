"""The ESP32-S3 boards mpllm is built for: their flash, PSRAM and model
partition (`BOARDS`), the memory the engine may place blocks in on each
(`MEMORY`, measured on the emulated boards), where an image lives there
(`where_it_lives`: the engine's own plan, `_llm.plan`, against that memory),
and the stages their engine times a token by: the one place of these facts,
read by the product (convert.py's where-it-lives table, flash.py), the board
tools (flashing, measuring) and the cost model (which prices the same boards
and stages), so none reaches into another for them. Placement itself is
decided once, in C (native/engine/engine_open.c llm_plan_open, its context
by native/binding/llm_bind.c fitting_context): nothing here repeats its rules.

`mpllm.board.firmware_pins` hands the boards on beside the firmware's pinned
versions (tools/flash.py, the release and the docs' checks read them there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BOARDS",
    "DEFAULT_BOARD",
    "FAST_RESERVE_BYTES",
    "FAST_RESERVE_NO_PSRAM_BYTES",
    "MEMORY",
    "MP_GC_INITIAL_HEAP_BYTES",
    "N8_FREE_AT_REPL",
    "N8_LEFT_FREE_AFTER_OPEN",
    "SRAM_FREE_AT_BOOT",
    "SRAM_LARGEST_BLOCK",
    "STAGES",
    "BoardMemory",
    "BoardPins",
    "MiB",
    "is_core",
    "where_it_lives",
]

#: The stages the engine times per token (native/engine/llm.h's llm_stage, in
#: its order): the keys of a Model's stats()["stage_ms"], what a bench measures
#: and what the cost model prices.
STAGES = ("embed", "attn", "ffn", "ple", "head", "sample")


@dataclass(frozen=True)
class BoardPins:
    """One board definition under firmware/boards/."""

    name: str  # what --board takes
    board: str  # MicroPython's BOARD (the build folder is build-<board>)
    board_dir: str  # from the repository root
    flash_bytes: int
    psram_bytes: int  # 0: the board has none (the engine lives in internal SRAM)
    model_bytes: int  # the model partition
    default_model: str  # what flash.py writes without --model/--image (mpllm.models)
    what: str  # for help texts and the README

    @property
    def label(self) -> str:
        """N16R8, N8: how the module is sold."""
        return self.board.removeprefix("MPLLM_")


MiB = 1024 * 1024
BOARDS = {b.name: b for b in (
    BoardPins("n16r8", "MPLLM_N16R8", "firmware/boards/MPLLM_N16R8", 16 * MiB, 8 * MiB, 13 * MiB,
              "release", "ESP32-S3 N16R8: 16 MB flash, 8 MB octal PSRAM (the release model)"),
    BoardPins("n8", "MPLLM_N8", "firmware/boards/MPLLM_N8", 8 * MiB, 0, 5 * MiB,
              "stories260k", "ESP32-S3 N8 without PSRAM, e.g. ESP32-S3-DevKitC-1-N8: 8 MB flash "
              "(small models: llama2.c's stories260K, the demos)"),
)}
# The default board, the one the release is built for.
DEFAULT_BOARD = BOARDS["n16r8"]

#: Internal RAM free at the REPL, measured on the emulated board: our firmware
#: (MicroPython v1.28.0, IDF 5.5.3, the N16R8 board with no radio: Bluetooth,
#: Wi-Fi and ESP-NOW off; the engine's token code in IRAM and the ESP-IDF code
#: of firmware/boards/sdkconfig.mpllm out of it) under Espressif's esp32s3
#: system model with 8 MB octal PSRAM, esp32.idf_heap_info(esp32.HEAP_DATA)
#: summed over the internal regions: 334,031 B, the largest block 258,048 B.
#: (Before: 280,463 B with Bluetooth and Wi-Fi linked in, the audit of issue
#: 21; 334,623 B without the radios, before the IRAM moves, which about
#: cancel.) The emulated firmware was built offline with stand-ins for some
#: IDF submodules (lwip, mbedtls, nimble): a real build's figure may differ by
#: a few KiB.
SRAM_FREE_AT_BOOT = 334031
SRAM_LARGEST_BLOCK = 258048
#: The same on the board without PSRAM (MPLLM_N8: no radio, the same 16 KB
#: instruction cache and IRAM moves as the N16R8, MicroPython's first heap
#: 40 KiB; the emulated machine with no PSRAM device): 297,932 B free at the
#: REPL, the largest block 253,952 B, MicroPython's heap already taken from
#: it. (Before: 273,356 B with the port's 64 KiB first heap, of which 11 to
#: 16 KiB were in use after a story; 258,612 B with a 32 KB instruction cache
#: and the engine's code in flash.)
N8_FREE_AT_REPL = 297932
#: What the engine could not have of that, measured on the same board: free
#: at the REPL less what Model.memory() placed in internal SRAM (263,252 B)
#: when Model() opened stories260K (group 64, certified head) at its default
#: context, 91, every weight in internal SRAM. It holds the port's worker task
#: (its 4 KiB stack and state), the 16 KiB reserve, which must stay one block
#: (FAST_RESERVE_NO_PSRAM_BYTES), and free pieces smaller than the engine's
#: next block (29,156 B were free after the open, the largest block 18,432).
#: What the engine may use on this board is taken from it.
N8_LEFT_FREE_AFTER_OPEN = 297932 - 263252
#: Internal RAM the port keeps back from the engine's FAST placements
#: (native/port/esp32/port_esp32.h LLM_ESP32_FAST_RESERVE: ESP-IDF's own
#: internal reserve on a board with PSRAM, CONFIG_SPIRAM_MALLOC_RESERVE_INTERNAL).
FAST_RESERVE_BYTES = 32 * 1024
#: The same on a board without PSRAM (LLM_ESP32_FAST_RESERVE_NO_PSRAM), where
#: no such ESP-IDF reserve exists: see port_esp32.h for what it was sized on.
FAST_RESERVE_NO_PSRAM_BYTES = 16 * 1024
#: MicroPython's first GC heap area on the ESP32-S3: 64 KiB, taken by malloc at
#: boot (micropython v1.28 ports/esp32/mpconfigport.h MICROPY_GC_INITIAL_HEAP_SIZE;
#: main.c MP_PLAT_ALLOC_HEAP). With PSRAM that malloc lands there; without it the
#: heap is internal SRAM, and it grows there on demand (MICROPY_GC_SPLIT_HEAP_AUTO).
MP_GC_INITIAL_HEAP_BYTES = 64 * 1024


@dataclass(frozen=True)
class BoardMemory:
    """An S3 board's memory as the engine's placement sees it."""

    name: str
    label: str
    #: PSRAM the engine's BULK blocks may take (0: none on the board)
    psram_bytes: int
    #: internal RAM free at the REPL (before llm.load())
    internal_free: int
    internal_source: str

    #: what the engine leaves free once open, measured, if more than the
    #: port's reserve (a reserve kept in one block leaves pieces unused)
    left_free: int = 0

    @property
    def fast_reserve(self) -> int:
        """What the port keeps free of the engine (port_esp32.c: by PSRAM)."""
        return FAST_RESERVE_BYTES if self.psram_bytes else FAST_RESERVE_NO_PSRAM_BYTES

    @property
    def engine_room(self) -> int:
        """Internal RAM the engine's placements may take on this board."""
        return self.internal_free - max(self.fast_reserve, self.left_free)

    def plan_memory(self) -> dict[str, object]:
        """This memory as _llm.plan's keywords: FAST internal SRAM, BULK
        PSRAM (served from internal SRAM on a board without it). No block
        overhead: the room is what the engine's blocks took on the board
        (N8_LEFT_FREE_AFTER_OPEN), the heap's own bytes already outside it."""
        return {"fast": self.engine_room, "bulk": self.psram_bytes,
                "bulk_is_fast": not self.psram_bytes, "block_overhead": 0}


MEMORY: dict[str, BoardMemory] = {
    "n16r8": BoardMemory(
        "n16r8", "N16R8 (8 MB PSRAM)", BOARDS["n16r8"].psram_bytes - MP_GC_INITIAL_HEAP_BYTES,
        SRAM_FREE_AT_BOOT,
        "measured on the emulated board (sram.SRAM_FREE_AT_BOOT, no radio); PSRAM: "
        "8 MB less MicroPython's first 64 KiB heap area"),
    "n8": BoardMemory(
        "n8", "N8 (no PSRAM)", BOARDS["n8"].psram_bytes, N8_FREE_AT_REPL,
        "measured on the emulated board (the N8 firmware without PSRAM: "
        "esp32.idf_heap_info at the REPL, MicroPython's heap already in it; what the "
        "engine left free once open, sram.N8_LEFT_FREE_AFTER_OPEN, kept back)",
        N8_LEFT_FREE_AFTER_OPEN),
}

#: _llm.plan's regions as a board names them
_REGION = {"fast": "sram", "flash": "flash"}


def is_core(name: str) -> bool:
    """A core matrix of the engine's placement (Model.memory() names): the
    PLE projection and every layer's matrices, not its norms."""
    return name == "ple_model_proj" or (name[:1] == "L" and "." in name
                                        and not name.endswith("norm"))


def where_it_lives(plan: Callable[..., dict[str, object]], image: bytes,
                   board: BoardMemory) -> str:
    """One line: the context Model() opens `image` with on `board` with no
    context asked and where the core matrices, the head and the KV cache go
    there, or that it does not open: `plan` is _llm.plan (the engine's open
    run dry, its own context choice: context=None) against the board's
    memory (BoardMemory.plan_memory)."""
    p = plan(image, context=None, **board.plan_memory())
    if not p["opens"]:
        return "does not open"
    bulk = "psram" if board.psram_bytes else "sram"
    where = {str(n): {**_REGION, "bulk": bulk}[str(r)]
             for n, r, _b in p["blocks"]}  # type: ignore[attr-defined]
    core = sorted({r for n, r in where.items() if is_core(n)})
    return (f"context {p['context']}: core {'+'.join(core)}, head {where['head']}, "
            f"KV {where['kv_cache']}")
