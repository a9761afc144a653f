"""The versions and board facts the firmware is built against: the ONE place.

`tools/flash.py` (via `mpllm.board.flash`) clones and builds exactly these, and the
docs (firmware/README.md) and platformio.ini are checked against them by
tests/test_firmware.py, so a bump here that is not carried over fails CI.
"""

from __future__ import annotations

from dataclasses import dataclass

# MicroPython release whose esp32 port we build; its esp32 README names the
# ESP-IDF below as the recommended one (it also lists v5.3 and v5.4.0-v5.4.2).
MICROPYTHON_TAG = "v1.28.0"
MICROPYTHON_GIT = "https://github.com/micropython/micropython.git"
ESP_IDF_VERSION = "v5.5.1"

# PlatformIO has no framework-espidf package for 5.5.1: platform 6.12.0 ships
# ESP-IDF 5.5.0, the nearest one. The on-device tests only exercise the C
# engine and basic IDF services, which do not change across 5.5.x patches.
PLATFORMIO_PLATFORM = "espressif32 @ 6.12.0"
PLATFORMIO_ESP_IDF = "v5.5.0"



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
BOARD = DEFAULT_BOARD.board
BOARD_DIR = DEFAULT_BOARD.board_dir
FLASH_BYTES = DEFAULT_BOARD.flash_bytes
PSRAM_BYTES = DEFAULT_BOARD.psram_bytes
USER_C_MODULES = "native/micropython/micropython.cmake"
CHIP = "ESP32-S3"
MODEL_PARTITION = "model"
MODEL_SUBTYPE = 0x40
