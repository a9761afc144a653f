"""The ESP32-S3 boards mpllm is built for, and the stages their engine times a
token by: the one place of these facts, read by the board tools (flashing,
measuring) and by the cost model (which prices the same boards and stages),
so neither reaches into the other for them.

`mpllm.board.firmware_pins` hands the boards on beside the firmware's pinned
versions (tools/flash.py, the release and the docs' checks read them there).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BOARDS", "DEFAULT_BOARD", "STAGES", "BoardPins", "MiB"]

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
