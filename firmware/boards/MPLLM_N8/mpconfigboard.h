// mpllm board: ESP32-S3 N8 (8 MiB flash, no PSRAM), e.g. ESP32-S3-DevKitC-1-N8.
#define MICROPY_HW_BOARD_NAME               "mpllm ESP32-S3 N8 (no PSRAM)"
#include "../mpllm_board.h"

// MicroPython's first heap: 40 KiB, not the port's 64 (ports/esp32/mpconfigport.h).
// Without PSRAM it is internal SRAM the model's KV cache could use: with the
// model open and a story, the chat and a file written, 15 to 18 KiB of it are
// in use (emulated N8), and the heap still grows on demand into the block the
// port keeps whole (port_esp32.h LLM_ESP32_FAST_RESERVE_NO_PSRAM). The 24 KiB
// it gives back hold 24 more positions of stories260K's context.
#define MICROPY_GC_INITIAL_HEAP_SIZE        (40 * 1024)
