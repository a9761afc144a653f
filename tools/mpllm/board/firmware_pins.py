"""The versions the firmware is built against: the ONE place (and the boards,
from mpllm.boards).

`tools/flash.py` (via `mpllm.board.flash`) clones and builds exactly these, and the
docs (firmware/README.md) and platformio.ini are checked against them by
tests/test_firmware.py, so a bump here that is not carried over fails CI.
"""

from __future__ import annotations

from ..boards import BOARDS, DEFAULT_BOARD, BoardPins  # noqa: F401 (handed on: mpllm.boards)

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


# The boards themselves live in mpllm.boards (the cost model reads them too);
# here beside the versions, for the flasher, the release and the docs' checks.
BOARD = DEFAULT_BOARD.board
BOARD_DIR = DEFAULT_BOARD.board_dir
FLASH_BYTES = DEFAULT_BOARD.flash_bytes
PSRAM_BYTES = DEFAULT_BOARD.psram_bytes
USER_C_MODULES = "native/micropython/micropython.cmake"
CHIP = "ESP32-S3"
MODEL_PARTITION = "model"
MODEL_SUBTYPE = 0x40
