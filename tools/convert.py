"""Convert a model and its tokenizer into an mpllm model image: an esp32-ai
model.bin with its tokenizer.json, or a llama2.c checkpoint with llama2.c's
tokenizer.bin.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img
    python tools/convert.py MODEL.bin TOKENIZER.bin -o OUT.img      (a llama2.c checkpoint)

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
