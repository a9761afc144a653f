"""Drafters for speculative decoding, and how many tokens they would save.

Speculative decoding (the next step after the certified head) feeds several
drafted tokens in one pass over the weights and keeps the longest prefix the
model agrees with. With our sampler that agreement is exact: the token chosen
at each position depends only on the prefix and the seed (the noise stream is
rewound with the position), so a drafted token is accepted exactly when it
equals what plain decoding chooses. The output never changes; the drafter only
decides how many tokens one pass yields.

That makes a drafter's value measurable without the batched engine: decode
stories plainly, then replay them through the drafter (`simulate`). Each pass
emits the accepted drafts plus the one token the pass computes itself, so

    tokens per pass = story tokens / passes >= 1.

Two drafters:
  * `prompt_lookup`: the last n tokens (n = 3, 2, 1) matched earlier in the
    context; propose what followed them there.
  * the image's n-gram table (`NgramTable` counts, `build_drafts` makes the
    section convert stores, `drafts_table` its format and the engine's
    drafting rule): what the model itself writes after 1-3 token contexts,
    counted over stories it generated (self-distilled, so it predicts this
    model, not the training text); a draft grows while the chance that all
    of it is accepted pays for the positions it adds to a verify pass.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .formats import drafts_table

Drafter = Callable[[Sequence[int], int], list[int]]

#: story beginnings the self-distilled table and the study start from
DEFAULT_PROMPTS = ("Once upon a time", "One day, a little girl named Lily", "Tom and his dog",
                   "The sun was", "Once upon a time, there was")



def prompt_lookup(context: Sequence[int], max_len: int, *, max_ngram: int = 3) -> list[int]:
    """Tokens that followed the latest earlier occurrence of the context's last
    n tokens (longest n first), at most max_len of them; [] when none. The
    board's own drafter (firmware/modules/llm.py), used here as it is."""
    from .checkout import import_llm

    return list(import_llm().prompt_lookup(context, max_len, max_ngram))


@dataclass
class NgramTable:
    """Next-token counts after contexts of 1..order tokens (what `table` turns
    into the image's drafts section)."""

    order: int = drafts_table.ORDER
    counts: dict[tuple[int, ...], Counter[int]] = field(default_factory=dict)

    def add(self, tokens: Sequence[int]) -> None:
        for i in range(1, len(tokens)):
            for n in range(1, self.order + 1):
                if i - n < 0:
                    break
                ctx = tuple(tokens[i - n:i])
                self.counts.setdefault(ctx, Counter())[tokens[i]] += 1

    @property
    def entries(self) -> int:
        return sum(len(c) for c in self.counts.values())

    def table(self, min_odds: Sequence[float],
              max_draft: int = drafts_table.MAX_DRAFT) -> drafts_table.DraftsTable:
        """The drafts section: each context's most frequent continuation;
        min_odds[k] is what draft k+1 must be worth (costmodel.draft_prices)."""
        return drafts_table.DraftsTable.from_counts(self.counts, min_odds, max_draft)


def self_distilled(model: object, prompts: Sequence[Sequence[int]], n_stories: int,
                   n_tokens: int, eot: int, *, first_seed: int = 1000,
                   progress: Callable[[int], None] | None = None) -> NgramTable:
    """An n-gram table of what the open model writes: one greedy story per
    prompt, then n_stories sampled ones (T 0.8, top-k 40, seeds first_seed..),
    the prompts taken in turn. progress(k) after each of the n_stories."""
    table = NgramTable()
    for _p, s in decode_stories(model, prompts, (0.0, 0, 0), n_tokens, eot):
        table.add(s)
    for k in range(n_stories):
        for _p, s in decode_stories(model, [prompts[k % len(prompts)]],
                                    (0.8, 40, first_seed + k), n_tokens, eot):
            table.add(s)
        if progress is not None:
            progress(k + 1)
    return table


def build_drafts(image: str | os.PathLike[str], n_stories: int, *, n_tokens: int = 200,
                 llm_module: object | None = None,
                 progress: Callable[[int], None] | None = None) -> drafts_table.DraftsTable:
    """The drafts section for `image` (what convert stores): the model's own
    stories counted, each draft priced by the cost model for the image's
    shape on the S3."""
    from .checkout import import_llm
    from .costmodel.prices import draft_prices
    from .costmodel.shape import Shape

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    llm = import_llm()
    with llm_module.Model(os.fspath(image)) as m:  # type: ignore[attr-defined]
        cfg = m.config()
        tok = llm.Tokenizer(m.tokenizer())
        prompts = [tok.encode(p) for p in DEFAULT_PROMPTS]
        counts = self_distilled(m, prompts, n_stories, n_tokens, int(cfg["eot_id"]),
                                progress=progress)
    return counts.table(draft_prices(Shape.from_config(cfg)))


def both(table: drafts_table.DraftsTable) -> Drafter:
    """Prompt lookup when the context repeats itself, else the table."""
    def draft(context: Sequence[int], max_len: int) -> list[int]:
        return prompt_lookup(context, max_len) or table.draft(context, max_len)
    return draft


@dataclass
class Study:
    story_tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens_per_pass(self) -> float:
        return self.story_tokens / self.passes if self.passes else 0.0

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def max_draft() -> int:
    """Guesses one verify pass checks at most: llm.MAX_DRAFT (the board's)."""
    from .checkout import import_llm

    return int(import_llm().MAX_DRAFT)


def simulate(stories: Iterable[tuple[Sequence[int], Sequence[int]]], drafter: Drafter,
             max_draft: int | None = None) -> Study:
    """Replay (prompt, story) pairs decoded plainly: at each pass the drafter sees
    the context so far and proposes up to max_draft tokens (never past the
    story's end); the pass keeps the prefix that equals the story and adds the
    one token it computes itself."""
    st = Study()
    if max_draft is None:
        max_draft = globals()["max_draft"]()
    for prompt, story in stories:
        story = list(story)
        i = 0
        while i < len(story):
            ctx = list(prompt) + story[:i]
            d = drafter(ctx, min(max_draft, len(story) - i - 1))
            a = 0
            while a < len(d) and d[a] == story[i + a]:
                a += 1
            st.drafted += len(d)
            st.accepted += a
            st.passes += 1
            i += a + 1
        st.story_tokens += len(story)
    return st


def decode_stories(model: object, prompts: Sequence[Sequence[int]], sampler: tuple[float, int, int],
                   n_tokens: int, eot: int) -> list[tuple[list[int], list[int]]]:
    """Plain decoding with an open `_llm.Model`: (prompt, story) per prompt,
    each story stopping at <|endoftext|> (not included) or after n_tokens."""
    out = []
    for prompt in prompts:
        model.reset()  # type: ignore[attr-defined]
        model.sampler(*sampler)  # type: ignore[attr-defined]
        tok = model.prefill(list(prompt))  # type: ignore[attr-defined]
        story: list[int] = []
        limit = min(n_tokens, model.config()["seq_len"] - len(prompt))  # type: ignore[attr-defined]
        while tok != eot and len(story) < limit:
            story.append(tok)
            if len(story) < limit:
                tok = model.step(tok)  # type: ignore[attr-defined]
        out.append((list(prompt), story))
    return out


def study(image: str, *, prompts: Sequence[str] | None = None, n_tokens: int = 200,
          table_stories: int = 40, seeds: Sequence[int] = (1, 2, 3, 4, 5),
          llm_module: object | None = None, prices: Sequence[float] | None = None
          ) -> dict[str, dict[str, dict[str, float]]]:
    """tokens per pass and acceptance of each drafter on `image`, greedy and
    sampled (T 0.8, top-k 40): the n-gram table is built as convert builds
    the image's (build_drafts: table_stories stories the model writes, from
    other seeds than the ones measured, each draft priced by the cost model
    for the image's shape, or by `prices`: costmodel.draft_prices() measures
    the demo's acceptance at the release model's prices)."""
    import time

    from .costmodel.prices import draft_prices
    from .costmodel.shape import Shape

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    from .checkout import import_llm

    llm = import_llm()
    prompts = list(prompts or DEFAULT_PROMPTS)
    with llm_module.Model(image) as m:  # type: ignore[attr-defined]
        tok = llm.Tokenizer(m.tokenizer())
        cfg = m.config()
        eot = cfg["eot_id"]
        ids = [tok.encode(p) for p in prompts]
        # self-distilled: seeds 1000.., never the ones measured below
        t0 = time.perf_counter()
        counts = self_distilled(m, ids, table_stories, n_tokens, eot)
        if prices is None:
            prices = draft_prices(Shape.from_config(cfg))
        table = counts.table(prices)
        build_s = time.perf_counter() - t0
        runs = {"greedy": [(0.0, 0, 0)], "sampled": [(0.8, 40, s) for s in seeds]}
        out: dict[str, dict[str, dict[str, float]]] = {}
        for mode, samplers in runs.items():
            stories = [pair for smp in samplers for pair in decode_stories(m, ids, smp, n_tokens,
                                                                           eot)]
            out[mode] = {}
            for name, d in (("lookup", prompt_lookup), ("ngram", table.draft),
                            ("both", both(table))):
                r = simulate(stories, d)
                out[mode][name] = {"tokens_per_pass": r.tokens_per_pass,
                                   "accept_rate": r.accept_rate, "passes": r.passes,
                                   "drafted": r.drafted, "story_tokens": r.story_tokens}
    out["table"] = {"entries": {"contexts": len(counts.counts), "entries": counts.entries,
                                "records": table.entries, "bytes": len(table.pack()),
                                "build_s": build_s, "stories": table_stories}}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpllm.drafting",
        description="How many tokens per pass each drafter would give on a model image "
                    "(speculative decoding's output equals plain decoding, so this is exact).")
    ap.add_argument("image", help="a converted model image")
    ap.add_argument("--tokens", type=int, default=200, help="story tokens per run")
    ap.add_argument("--table-stories", type=int, default=40,
                    help="stories the model writes to build the n-gram table")
    args = ap.parse_args(argv)
    res = study(args.image, n_tokens=args.tokens, table_stories=args.table_stories)
    t = res.pop("table")["entries"]
    print(f"n-gram table: {t['records']:,} contexts kept ({t['bytes']:,} bytes) from "
          f"{t['stories']} self-generated stories in {t['build_s']:.1f} s")
    print(f"{'mode':<8} {'drafter':<8} {'tokens/pass':>11} {'accepted':>9} {'passes':>7}")
    for mode, rows in res.items():
        for name, r in rows.items():
            print(f"{mode:<8} {name:<8} {r['tokens_per_pass']:>11.2f} {r['accept_rate']:>8.1%} "
                  f"{r['passes']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

