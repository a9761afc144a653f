# What every mpllm board freezes: everything the stock esp32 firmware
# freezes, plus the mpllm loop. Each board's manifest.py includes this file,
# so $(BOARD_DIR) below is that board's folder.
include("$(PORT_DIR)/boards/manifest.py")

# The board's Python lives at firmware/modules/ in the repository (two levels
# up from a board's folder): llm.py, the session and the tokenizer under it,
# the co-writing chat, llm_bench.py (what bench.py runs) and llm_serve.py (the
# web chat's engine side).
module("llm.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_session.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_tokenizer.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_chat.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_bench.py", base_path="$(BOARD_DIR)/../../modules")
module("llm_serve.py", base_path="$(BOARD_DIR)/../../modules")
