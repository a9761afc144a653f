# The modules every mpllm board freezes (firmware/boards/manifest.py).
include("$(BOARD_DIR)/../manifest.py")
