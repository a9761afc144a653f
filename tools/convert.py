"""Convert an esp32-ai model.bin + tokenizer.json into an mpllm model image.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img

Thin wrapper around mpllm.convert (also installed as `mpllm-convert`).
"""

from __future__ import annotations

import sys

# `python tools/convert.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt; before it is in charge, the except below).
try:
    from mpllm.interrupt import run
except KeyboardInterrupt:
    print("convert.py: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    run("mpllm.convert:main", "convert.py")
