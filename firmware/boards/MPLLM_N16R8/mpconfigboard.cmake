# mpllm board: ESP32-S3 with 16 MiB flash and 8 MiB octal PSRAM (N16R8).
# Built out of tree:
#   make -C ports/esp32 BOARD_DIR=<repo>/firmware/boards/MPLLM_N16R8 \
#        USER_C_MODULES=<repo>/native/micropython/micropython.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../mpllm_board.cmake)

# No sdkconfig.ble: mpllm uses no Bluetooth (MICROPY_PY_BLUETOOTH 0 in
# mpconfigboard.h), which leaves NimBLE's internal RAM to the engine.
set(SDKCONFIG_DEFAULTS
    boards/sdkconfig.base
    boards/sdkconfig.240mhz
    boards/sdkconfig.spiram_sx
    boards/sdkconfig.spiram_oct
    ${MPLLM_SDKCONFIG}
    ${MICROPY_BOARD_DIR}/sdkconfig.board
    ${MPLLM_PARTITIONS_FRAGMENT}
)
