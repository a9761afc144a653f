"""Flash mpllm onto an ESP32-S3 N16R8 (firmware + model image), or prepare the host board.

    python tools/flash.py --board n16r8 --port /dev/ttyACM0
    python tools/flash.py --board n16r8 --dry-run
    python tools/flash.py --board host

Thin wrapper around mpllm.board.flash; `--help` lists every option.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from mpllm.board.flash import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mpllm.board.flash import main

if __name__ == "__main__":
    sys.exit(main())
