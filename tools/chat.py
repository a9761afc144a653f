"""Write stories with the TinyStories model, on this PC or (as a command) on a board.

    python tools/chat.py --board host "Once upon a time"
    python tools/chat.py                  # interactive chat

Thin wrapper around mpllm.board.chat (also installed as `mpllm-chat`).
"""

from __future__ import annotations

import sys

try:
    # `python tools/chat.py` puts tools/ first on sys.path, so this is the
    # checkout's mpllm, installed or not.
    from mpllm.board.chat import main
except KeyboardInterrupt:  # Ctrl-C while it starts: one line, as main() says it later
    print("interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
