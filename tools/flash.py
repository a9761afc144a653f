"""Flash mpllm onto an ESP32-S3 N16R8 (firmware + model image), or prepare the host board.

    python tools/flash.py --board n16r8 --port /dev/ttyACM0
    python tools/flash.py --board n16r8 --dry-run
    python tools/flash.py --board host

Thin wrapper around mpllm.board.flash; `--help` lists every option.
"""

from __future__ import annotations

# `python tools/flash.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt).
from mpllm.interrupt import run

if __name__ == "__main__":
    run("mpllm.board.flash:main", "flash.py")
