"""Write stories with the TinyStories model, on this PC or (as a command) on a board.

    python tools/chat.py --board host "Once upon a time"
    python tools/chat.py                  # interactive chat

Thin wrapper around mpllm.board.chat (also installed as `mpllm-chat`).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from mpllm.board.chat import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mpllm.board.chat import main

if __name__ == "__main__":
    sys.exit(main())
