# mpllm board: ESP32-S3 with 16 MiB flash and 8 MiB octal PSRAM (N16R8).
# Built out of tree:
#   make -C ports/esp32 BOARD_DIR=<repo>/firmware/boards/MPLLM_N16R8 \
#        USER_C_MODULES=<repo>/native/micropython/micropython.cmake
set(IDF_TARGET esp32s3)

# The esp32 port concatenates these files verbatim, so a path inside them
# cannot be made absolute with a CMake variable; the partition table path is
# written to a generated fragment instead (ESP-IDF accepts an absolute path).
set(MPLLM_PARTITIONS_FRAGMENT ${CMAKE_BINARY_DIR}/sdkconfig.mpllm_partitions)
file(WRITE ${MPLLM_PARTITIONS_FRAGMENT}
    "CONFIG_PARTITION_TABLE_CUSTOM_FILENAME=\"${MICROPY_BOARD_DIR}/partitions.csv\"\n")

# No sdkconfig.ble: mpllm uses no Bluetooth (MICROPY_PY_BLUETOOTH 0 in
# mpconfigboard.h), which leaves NimBLE's internal RAM to the engine.
set(SDKCONFIG_DEFAULTS
    boards/sdkconfig.base
    boards/sdkconfig.240mhz
    boards/sdkconfig.spiram_sx
    boards/sdkconfig.spiram_oct
    ${MICROPY_BOARD_DIR}/sdkconfig.board
    ${MPLLM_PARTITIONS_FRAGMENT}
)

set(MICROPY_FROZEN_MANIFEST ${MICROPY_BOARD_DIR}/manifest.py)
