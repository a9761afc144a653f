# Everything the stock esp32 firmware freezes, plus the mpllm loop.
include("$(PORT_DIR)/boards/manifest.py")

# llm.py lives at firmware/modules/ in the repository (two levels up).
module("llm.py", base_path="$(BOARD_DIR)/../../modules")
