# Everything the stock esp32 firmware freezes, plus the mpllm loop.
include("$(PORT_DIR)/boards/manifest.py")

# llm.py (and llm_bench.py, what bench.py runs on the board) live at
# firmware/modules/ in the repository (two levels up).
module("llm.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_bench.py", base_path="$(BOARD_DIR)/../../modules")
