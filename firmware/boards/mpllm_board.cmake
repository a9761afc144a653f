# What every mpllm board's mpconfigboard.cmake shares; each includes this file
# first (MICROPY_BOARD_DIR is then that board's folder), then sets its own
# SDKCONFIG_DEFAULTS ending in ${MPLLM_PARTITIONS_FRAGMENT}.
set(IDF_TARGET esp32s3)

# The sdkconfig settings every mpllm board shares (ESP-IDF code no token runs
# moved out of internal RAM); each board lists it before its own sdkconfig.board.
set(MPLLM_SDKCONFIG ${CMAKE_CURRENT_LIST_DIR}/sdkconfig.mpllm)

# The esp32 port concatenates the sdkconfig files verbatim, so a path inside
# them cannot be made absolute with a CMake variable; the partition table path
# is written to a generated fragment instead (ESP-IDF accepts an absolute path).
set(MPLLM_PARTITIONS_FRAGMENT ${CMAKE_BINARY_DIR}/sdkconfig.mpllm_partitions)
file(WRITE ${MPLLM_PARTITIONS_FRAGMENT}
    "CONFIG_PARTITION_TABLE_CUSTOM_FILENAME=\"${MICROPY_BOARD_DIR}/partitions.csv\"\n")

set(MICROPY_FROZEN_MANIFEST ${MICROPY_BOARD_DIR}/manifest.py)
