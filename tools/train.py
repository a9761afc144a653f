"""Train the small demo model committed under models/demo, on CPU, from a
corpus generated here (torch needed: `pip install -e '.[dev]'`).

    python tools/train.py --out models/demo     # models/demo/RECIPE.md has the full command

Thin wrapper around mpllm.training.train.
"""

from __future__ import annotations

import sys

# `python tools/train.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt; before it is in charge, the except below).
try:
    from mpllm.interrupt import run
except KeyboardInterrupt:
    print("train.py: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    run("mpllm.training.train:main", "train.py")
