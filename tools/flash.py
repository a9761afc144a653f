"""Flash mpllm onto an ESP32-S3 N16R8 (firmware + model image), or prepare the host board.

    python tools/flash.py --board n16r8 --port /dev/ttyACM0
    python tools/flash.py --board n16r8 --dry-run
    python tools/flash.py --board host

Thin wrapper around mpllm.board.flash; `--help` lists every option.
"""

from __future__ import annotations

import sys

# `python tools/flash.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt; before it is in charge, the except below).
try:
    from mpllm.interrupt import run
except KeyboardInterrupt:
    print("flash.py: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    run("mpllm.board.flash:main", "flash.py")
