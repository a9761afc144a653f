// mpllm board: ESP32-S3 N16R8 (16 MiB flash, 8 MiB octal PSRAM).
#define MICROPY_HW_BOARD_NAME               "mpllm ESP32-S3 N16R8"
#include "../mpllm_board.h"
