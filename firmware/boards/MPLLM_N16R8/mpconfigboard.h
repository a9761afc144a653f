// mpllm board: ESP32-S3 N16R8 (16 MiB flash, 8 MiB octal PSRAM).
#define MICROPY_HW_BOARD_NAME               "mpllm ESP32-S3 N16R8"
#define MICROPY_HW_MCU_NAME                 "ESP32S3"

// mpllm uses no radio (the chat, the web page and the bench reach the board
// over its serial port): without Bluetooth and Wi-Fi their RAM and code stay
// free for the engine, where every KiB of internal SRAM holds weights.
#define MICROPY_PY_BLUETOOTH                (0)
#define MICROPY_PY_NETWORK_WLAN             (0)
#define MICROPY_PY_ESPNOW                   (0)

// Boards of this kind are sold both with the native USB port and with a
// USB-UART bridge; keep the UART REPL so either connector reaches it.
#define MICROPY_HW_ENABLE_UART_REPL         (1)

#define MICROPY_HW_I2C0_SCL                 (9)
#define MICROPY_HW_I2C0_SDA                 (8)
