"""Train the small demo model committed under models/demo, on CPU, from a
corpus generated here (torch needed: `pip install -e '.[dev]'`).

    python tools/train.py --out models/demo     # models/demo/RECIPE.md has the full command

Thin wrapper around mpllm.training.train.
"""

if __name__ == "__main__":
    from _launch import launch

    launch("mpllm.training.train:main", "train.py")
