"""The web chat: write a story together with the model in a browser.

    python tools/serve.py --board host          # then open http://127.0.0.1:8000/
    python tools/serve.py --port /dev/ttyACM0   # a board over USB serial
    python tools/serve.py --board host --load-test

Thin wrapper around mpllm.web.cli (also installed as `mpllm-serve`).
"""

from __future__ import annotations

import sys

# `python tools/serve.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt; before it is in charge, the except below).
try:
    from mpllm.interrupt import run
except KeyboardInterrupt:
    print("serve.py: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    run("mpllm.web.cli:main", "serve.py", repeat=True)  # (asyncio takes Ctrl-C)
