# mpllm board: ESP32-S3 with 8 MiB flash and no PSRAM (N8), for small models
# such as llama2.c's stories260K. Built out of tree like MPLLM_N16R8:
#   make -C ports/esp32 BOARD_DIR=<repo>/firmware/boards/MPLLM_N8 \
#        USER_C_MODULES=<repo>/native/micropython/micropython.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../mpllm_board.cmake)

# No sdkconfig.ble (no Bluetooth) and no sdkconfig.spiram_* (no PSRAM).
set(SDKCONFIG_DEFAULTS
    boards/sdkconfig.base
    boards/sdkconfig.240mhz
    ${MPLLM_SDKCONFIG}
    ${MICROPY_BOARD_DIR}/sdkconfig.board
    ${MPLLM_PARTITIONS_FRAGMENT}
)
