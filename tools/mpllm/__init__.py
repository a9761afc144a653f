"""mpllm host tools: convert the esp32-ai model, run the reference numerics,
build and flash the firmware, benchmark the board."""

__version__ = "0.1.0"
