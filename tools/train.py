"""Train the small demo model committed under models/demo, on CPU, from a
corpus generated here (torch needed: `pip install -e '.[dev]'`).

    python tools/train.py --out models/demo     # models/demo/RECIPE.md has the full command

Thin wrapper around mpllm.training.train.
"""

from __future__ import annotations

import sys

# `python tools/train.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not.
from mpllm.training.train import main

if __name__ == "__main__":
    sys.exit(main())
