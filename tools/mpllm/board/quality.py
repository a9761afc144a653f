"""Fast mode's quality gate (`bench.py --fast --quality`): a gate on quality,
not on bits, because fast mode is lossy by design.

Both modes read the same held-out demo text, token by token (teacher
forcing: each position sees the true text before it, so one early difference
cannot snowball): the cross-entropy of the text under each mode's logits, and
how often the two modes' greedy choices agree. Fast mode passes when its
cross-entropy is within QUALITY_MAX_NATS of exact mode's.

The held-out text is the demo model's validation split: the stories the
training run generated after its training stories (tools/train.py,
models/demo/train_report.json: corpus.stories(stories + val_stories, seed)),
which the model never trained on.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: fast mode may cost at most this much cross-entropy per token (nats)
QUALITY_MAX_NATS = 0.01
#: positions scored per mode
QUALITY_TOKENS = 2000


@dataclass
class Quality:
    tokens: int
    exact_nats: float  # mean cross-entropy per token, exact mode
    fast_nats: float
    agreement: float  # share of positions where both modes' greedy token is the same

    @property
    def delta_nats(self) -> float:
        return self.fast_nats - self.exact_nats

    @property
    def passed(self) -> bool:
        return abs(self.delta_nats) <= QUALITY_MAX_NATS

    def line(self) -> str:
        return (f"quality (fast vs exact, {self.tokens} held-out tokens): cross-entropy "
                f"{self.exact_nats:.4f} -> {self.fast_nats:.4f} nats/token "
                f"({self.delta_nats:+.4f}, limit +-{QUALITY_MAX_NATS}), greedy agreement "
                f"{self.agreement:.2%}: {'PASS' if self.passed else 'FAIL'}")


def held_out_texts(report: Path) -> list[str]:
    """The validation stories of the training run `report` describes."""
    from ..training import corpus

    args = json.loads(report.read_text())["args"]
    n, val = int(args["stories"]), int(args["val_stories"])
    return corpus.stories(n + val, int(args["seed"]))[n:]


def _scores(model: object, stories: Sequence[Sequence[int]], n_tokens: int
            ) -> tuple[list[float], list[int]]:
    """-log p(next true token) and the greedy choice at each position."""
    import numpy as np

    nats: list[float] = []
    greedy: list[int] = []
    for ids in stories:
        model.reset()  # type: ignore[attr-defined]
        model.sampler(0.0, 0, 0)  # type: ignore[attr-defined]
        nxt = model.prefill(list(ids[:1]))  # type: ignore[attr-defined]
        for i in range(1, len(ids)):
            logits = np.frombuffer(model.logits(), "<f4").astype(np.float64)  # type: ignore[attr-defined]
            top = logits.max()
            nats.append(float(top + math.log(np.exp(logits - top).sum()) - logits[ids[i]]))
            greedy.append(int(nxt))
            if len(nats) >= n_tokens:
                return nats, greedy
            nxt = model.step(ids[i])  # type: ignore[attr-defined]
    return nats, greedy


def measure(image: str | os.PathLike[str], report: Path, *, n_tokens: int = QUALITY_TOKENS,
            llm_module: object | None = None) -> Quality:
    """Exact and fast mode over the first n_tokens positions of the held-out text."""
    from ..checkout import import_llm

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    llm = import_llm()
    runs = {}
    for fast in (False, True):
        with llm_module.Model(os.fspath(image), fast=fast) as m:  # type: ignore[attr-defined]
            tok = llm.Tokenizer(m.tokenizer())
            seq_len, eot = m.config()["seq_len"], m.config()["eot_id"]
            stories = [(tok.encode(t) + [eot])[:seq_len] for t in held_out_texts(report)]
            runs[fast] = _scores(m, stories, n_tokens)
    (en, eg), (fn, fg) = runs[False], runs[True]
    if len(en) < n_tokens:
        raise ValueError(f"the held-out text has only {len(en)} positions, {n_tokens} asked")
    same = sum(a == b for a, b in zip(eg, fg, strict=True))
    return Quality(len(en), sum(en) / len(en), sum(fn) / len(fn), same / len(eg))
