// mpllm board: ESP32-S3 N8 (8 MiB flash, no PSRAM), e.g. ESP32-S3-DevKitC-1-N8.
#define MICROPY_HW_BOARD_NAME               "mpllm ESP32-S3 N8 (no PSRAM)"
#include "../mpllm_board.h"
