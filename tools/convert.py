"""Convert an esp32-ai model.bin + tokenizer.json into an mpllm model image.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img

Thin wrapper around mpllm.convert (also installed as `mpllm-convert`).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from mpllm.convert import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mpllm.convert import main

if __name__ == "__main__":
    sys.exit(main())
