// What every mpllm board's mpconfigboard.h shares (each includes this file).
#define MICROPY_HW_MCU_NAME                 "ESP32S3"

// mpllm uses no radio (the chat, the web page and the bench reach the board
// over its serial port): without Bluetooth and Wi-Fi their RAM and code stay
// free for the engine, where every KiB of internal SRAM holds weights.
#define MICROPY_PY_BLUETOOTH                (0)
#define MICROPY_PY_NETWORK_WLAN             (0)
#define MICROPY_PY_ESPNOW                   (0)

// These boards are sold with the native USB port and a USB-UART bridge (or
// either); keep the UART REPL so every connector reaches it.
#define MICROPY_HW_ENABLE_UART_REPL         (1)

#define MICROPY_HW_I2C0_SCL                 (9)
#define MICROPY_HW_I2C0_SDA                 (8)
