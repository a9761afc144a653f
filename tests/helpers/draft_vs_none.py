"""Default decoding (draft="auto": the image's drafter, paced) against
draft="none" on this PC, by hand: the same ids, and CPU time per token,
paired and interleaved.

Each round writes the same stories both ways (5 prompts, greedy and T 0.8
top-40, N tokens each) in one session per way, so the pacer keeps what it
learned from story to story as llm.generate's does; rounds alternate which way
goes first. Prints, per image, whether the ids are equal and the median,
min and max of default/none over the rounds (CPU time: the machine's other
work moves the clock, not this):

    python tests/helpers/draft_vs_none.py IMAGE [IMAGE ...] [--rounds R] [--tokens N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "tools", ROOT / "firmware" / "modules", ROOT / "build" / "inplace"):
    sys.path.insert(0, str(_p))

import llm  # (the board's module, over the CPython engine)
from llm_session import drafter

#: prompt ids (clamped to the image's vocabulary): no tokenizer needed
PROMPTS = [[1, 300, 301, 302], [1, 400, 401], [1, 320, 330, 340, 350], [1, 290], [1, 310, 311]]
WAYS = ("auto", "none")


def one_round(sessions: dict[str, llm.Session], prompts: list[list[int]], tokens: int,
              order: tuple[str, ...]) -> tuple[dict[str, float], dict[str, list[list[int]]]]:
    """CPU seconds per token and the stories, each way."""
    per_token, stories = {}, {}
    for way in order:
        s = sessions[way]
        model = s.load()
        t0, n, out_all = time.process_time(), 0, []
        for k, p in enumerate(prompts):
            for temperature, top_k, seed in ((0.0, 0, None), (0.8, 40, 7 + k)):
                out: list[int] = []
                list(s.run(p, tokens, temperature, top_k, seed, s.paced(drafter(model, way)),
                           out=out))
                n += len(out)
                out_all.append(out)
        per_token[way] = (time.process_time() - t0) / max(n, 1)
        stories[way] = out_all
    return per_token, stories


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("images", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=100)
    args = ap.parse_args(argv)
    for image in args.images:
        sessions = {}
        for way in WAYS:
            sessions[way] = llm.Session()
            sessions[way].load(str(image))
        vocab = sessions["auto"].load().config()["vocab_out"]
        prompts = [[min(t, vocab - 1) for t in p] for p in PROMPTS]
        ratios, same, last = [], True, {}
        for r in range(args.rounds):
            per_token, stories = one_round(sessions, prompts, args.tokens,
                                           WAYS if r % 2 == 0 else WAYS[::-1])
            same &= stories["auto"] == stories["none"]
            ratios.append(per_token["auto"] / per_token["none"])
            last = per_token
        print(f"{image.name}: ids equal {same}; default/none CPU per token over {args.rounds} "
              f"paired rounds: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f}); default {1e3 * last['auto']:.3f} ms/token", flush=True)
        for s in sessions.values():
            s.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
