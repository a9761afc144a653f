# Everything the stock esp32 firmware freezes, plus the mpllm loop.
include("$(PORT_DIR)/boards/manifest.py")

# The board's Python lives at firmware/modules/ in the repository (two levels
# up): llm.py, the tokenizer it imports, the co-writing chat, llm_bench.py (what
# bench.py runs) and llm_serve.py (the web chat's engine side).
module("llm.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_tokenizer.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_chat.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_bench.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_serve.py", base_path="$(BOARD_DIR)/../../modules")
