"""Convert an esp32-ai model.bin + tokenizer.json into an mpllm model image.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img

Thin wrapper around mpllm.convert (also installed as `mpllm-convert`).
"""

from __future__ import annotations

# `python tools/convert.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt).
from mpllm.interrupt import run

if __name__ == "__main__":
    run("mpllm.convert:main", "convert.py")
