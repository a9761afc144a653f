"""Train the small demo model committed under models/demo, on CPU, from a
corpus generated here (torch needed: `pip install -e '.[dev]'`).

    python tools/train.py --out models/demo     # models/demo/RECIPE.md has the full command

Thin wrapper around mpllm.training.train.
"""

from __future__ import annotations

# `python tools/train.py` puts tools/ first on sys.path, so this is the checkout's
# mpllm, installed or not. Ctrl-C is one line from here on, the imports
# included (mpllm.interrupt).
from mpllm.interrupt import run

if __name__ == "__main__":
    run("mpllm.training.train:main", "train.py")
