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
    of it is accepted pays for the positions it adds to a verify pass. That
    chance is calibrated (`Calibration`): each guess's share is how often
    such a guess was right on stories its counts did not see.

What drafting would give on a model, every pass priced by the cost model,
is the cost model's: mpllm.costmodel.drafting_study (`python -m
mpllm.costmodel.drafting_study`, docs/speculative-decoding.md). This module
imports neither it nor the converter.
"""

from __future__ import annotations

import dataclasses
import os
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


#: how the table convert stores is made, for caches of converted images: a
#: table made by another rule must be made again
TABLE_RULE = "calibrated-shares-1-pays"
#: the calibration's bins: a context's order, its count (powers of two up to
#: 2^(COUNT_BINS - 1) and more) and its top continuation's share in tenths
COUNT_BINS = 8
SHARE_BINS = 10
#: the stories are cut in this many folds; each fold's guesses are judged by a
#: table counted on the other folds
CAL_FOLDS = 2


def _cal_bin(order: int, total: int, top: int) -> tuple[int, int, int]:
    return (order, min(total.bit_length() - 1, COUNT_BINS - 1),
            min(SHARE_BINS * top // total, SHARE_BINS - 1))


def _best(counts: dict[tuple[int, ...], Counter[int]]) -> dict[tuple[int, ...],
                                                             tuple[int, int, int]]:
    """Each context's (next token the table would guess, total, its count)."""
    out = {}
    for ctx, c in counts.items():
        nxt, k = drafts_table.top_next(c)
        out[ctx] = (nxt, sum(c.values()), k)
    return out


@dataclass
class Calibration:
    """How often a guess from a context of given (order, count, share) was
    right on stories the counts had not seen: the table's shares taken from
    what a guess is worth on this model, not from the counts (which trust a
    context seen a few times far too much on a model as uncertain as real
    text). Cross-fitted: each fold of the stories is guessed by the counts of
    the others, with the drafter's rule (the longest known context guesses)."""

    hits: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    tries: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    folds: int = CAL_FOLDS

    @classmethod
    def cross_fitted(cls, stories: Sequence[Sequence[int]], order: int = drafts_table.ORDER,
                     folds: int = CAL_FOLDS) -> Calibration:
        cal = cls(folds=folds)
        for f in range(folds):
            fit = NgramTable(order)
            for k, s in enumerate(stories):
                if k % folds != f:
                    fit.add(s)
            best = _best(fit.counts)
            for s in stories[f::folds]:
                for i in range(1, len(s)):
                    for n in range(min(order, i), 0, -1):
                        hit = best.get(tuple(s[i - n:i]))
                        if hit is not None:
                            b = _cal_bin(n, hit[1], hit[2])
                            cal.tries[b] += 1
                            cal.hits[b] += hit[0] == s[i]
                            break
        return cal

    def share(self, order: int, total: int, top: int) -> float:
        """The chance a guess is right from a context of this order whose
        counts (over all folds) are total and top: the rate seen in its bin,
        shrunk as hits / (tries + 1), so a bin seldom seen is trusted little.
        The counts are scaled to one fit's share of the stories first, so the
        bin is the one the rate was measured in."""
        scale = max(self.folds - 1, 1) / self.folds if self.folds > 1 else 1.0
        b = _cal_bin(order, max(1, int(total * scale)), max(1, int(top * scale)))
        return self.hits[b] / (self.tries[b] + 1)


@dataclass
class NgramTable:
    """Next-token counts after contexts of 1..order tokens, and the stories
    they were counted from (what `table` turns into the image's drafts
    section)."""

    order: int = drafts_table.ORDER
    counts: dict[tuple[int, ...], Counter[int]] = field(default_factory=dict)
    stories: list[list[int]] = field(default_factory=list)

    def add(self, tokens: Sequence[int]) -> None:
        self.stories.append(list(tokens))
        for i in range(1, len(tokens)):
            for n in range(1, self.order + 1):
                if i - n < 0:
                    break
                ctx = tuple(tokens[i - n:i])
                self.counts.setdefault(ctx, Counter())[tokens[i]] += 1

    @property
    def entries(self) -> int:
        return sum(len(c) for c in self.counts.values())

    def table(self, min_odds: Sequence[float], max_draft: int = drafts_table.MAX_DRAFT,
              *, calibrated: bool = True) -> drafts_table.DraftsTable:
        """The drafts section: each context's most frequent continuation;
        min_odds[k] is what draft k+1 must be worth (costmodel.draft_prices).
        Its share is the calibrated chance that the guess is right (the
        stories cross-fitted: `Calibration`), or with calibrated=False the
        count's share, count / (total + 1) (what convert stored before)."""
        share = Calibration.cross_fitted(self.stories, self.order).share if calibrated else None
        return drafts_table.DraftsTable.from_counts(self.counts, min_odds, max_draft, share)


Sampler = tuple[float, int, int]  # temperature, top_k, seed
#: what the self-distilled table's sampled stories are drawn with
TABLE_SAMPLER = (0.8, 40)
TABLE_FIRST_SEED = 1000


def self_distilled(model: object, prompts: Sequence[Sequence[int]], n_stories: int,
                   n_tokens: int, eot: int | Sequence[int], *, first_seed: int = TABLE_FIRST_SEED,
                   progress: Callable[[int], None] | None = None) -> NgramTable:
    """An n-gram table of what the open model writes: one greedy story per
    prompt, then n_stories sampled ones (T 0.8, top-k 40, seeds first_seed..),
    the prompts taken in turn. progress(k) after each of the n_stories."""
    return distill(ImageStories(model, eot), prompts, n_stories, n_tokens,
                   first_seed=first_seed, progress=progress)


def distill(writer: StoryWriter, prompts: Sequence[Sequence[int]], n_stories: int,
            n_tokens: int, *, first_seed: int = TABLE_FIRST_SEED,
            progress: Callable[[int], None] | None = None) -> NgramTable:
    """`self_distilled` for any StoryWriter."""
    table = NgramTable()
    for s in writer.write([(list(p), (0.0, 0, 0)) for p in prompts], n_tokens):
        table.add(s)
    jobs = [(list(prompts[k % len(prompts)]), (*TABLE_SAMPLER, first_seed + k))
            for k in range(n_stories)]
    for s in writer.write(jobs, n_tokens, progress=progress):
        table.add(s)
    return table


@dataclass(frozen=True)
class Payoff:
    """What a drafter is worth on its model: tokens per pass on stories its
    table did not count, and what such a pass costs in plain steps (its
    drafts priced by min_odds' prices, llm.py's verify loop by the cost
    model's figures: draft_prices.Prices.loop). It pays when a pass yields
    more tokens than it costs steps."""

    tokens_per_pass: float
    pass_steps: float
    #: the drafter measured (stored only when it pays, or when asked to)
    table: drafts_table.DraftsTable = field(default_factory=drafts_table.DraftsTable,
                                            compare=False, repr=False)
    #: the share of head rows the engine scored writing those stories (1.0
    #: without a certified head; None: not measured)
    rows_scored: float | None = None
    #: the tabulated shape whose prices were used (draft_prices.json), and
    #: whether it is the image's own (else the nearest)
    priced_as: str = ""
    priced_exactly: bool = True

    @property
    def pays(self) -> bool:
        return self.tokens_per_pass > self.pass_steps

    def __str__(self) -> str:
        return (f"{self.tokens_per_pass:.2f} tokens per pass, a pass costs "
                f"{self.pass_steps:.2f} steps")


def payoff(counts: NgramTable, prices: Sequence[float], loop: tuple[float, float],
           folds: int = CAL_FOLDS, max_draft: int = drafts_table.MAX_DRAFT) -> Payoff:
    """The drafter `counts` makes, measured on the stories it was counted
    from, held out: each fold of them is drafted by the table (made as
    `NgramTable.table` makes it, at `prices`) counted on the other folds, as
    the board drafts stories the table never saw. loop: draft_prices.Prices.
    loop (a pass of one position, the loop per story token)."""
    total = Study()
    for f in range(folds):
        fit = NgramTable(counts.order)
        for k, s in enumerate(counts.stories):
            if k % folds != f:
                fit.add(s)
        table = fit.table(prices, max_draft)
        # a story's prompt is not kept with it: its first guesses see a shorter context
        total += simulate([([], s) for s in counts.stories[f::folds]], table.draft, max_draft)
    first, per_token = loop
    cost = total.cost(prices) * first + total.story_tokens * per_token
    return Payoff(total.tokens_per_pass, cost / total.passes if total.passes else 0.0)


def build_drafts(image: str | os.PathLike[str], n_stories: int, *, n_tokens: int = 200,
                 llm_module: object | None = None,
                 progress: Callable[[int], None] | None = None
                 ) -> tuple[drafts_table.DraftsTable, Payoff | None]:
    """The drafts section for `image` (what convert stores): the model's own
    stories counted, each guess's share calibrated on those stories
    (`Calibration`), each draft priced for the image's shape on the S3 (the
    cost model's figures as data: draft_prices.json); and what it is worth
    (`payoff`). A drafter that does not pay is left out: the empty table (the
    image decodes the same, step by step). The payoff is None when the context
    holds no verify pass."""
    from .checkout import import_llm
    from .draft_prices import prices_for

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    llm = import_llm()
    with llm_module.Model(os.fspath(image)) as m:  # type: ignore[attr-defined]
        cfg = m.config()
        tok = llm.Tokenizer(m.tokenizer())
        prompts = [tok.encode(p) for p in DEFAULT_PROMPTS]
        # a context too short for a prompt and a verify pass after it has
        # nothing to draft in: the empty table (the image decodes the same)
        prompts = [p for p in prompts if len(p) < cfg["seq_len"]]
        priced = prices_for(cfg)
        if not prompts or priced.draft is None or priced.loop is None:
            return drafts_table.DraftsTable(), None
        # (a llama2.c model's story ends at BOS or EOS: the tokenizer's stop ids)
        writer = ImageStories(m, tok.stop_ids)
        counts = distill(writer, prompts, n_stories, n_tokens, progress=progress)
    prices = list(priced.draft)
    worth = dataclasses.replace(payoff(counts, prices, priced.loop),
                                table=counts.table(prices), rows_scored=writer.rows_scored,
                                priced_as=priced.name, priced_exactly=priced.exact)
    return (worth.table if worth.pays else drafts_table.DraftsTable()), worth


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
    #: passes by the number of guesses they verified
    by_drafted: Counter[int] = field(default_factory=Counter)

    @property
    def tokens_per_pass(self) -> float:
        return self.story_tokens / self.passes if self.passes else 0.0

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def cost(self, prices: Sequence[float]) -> float:
        """The passes' modeled cost in plain steps: a pass verifying d guesses
        costs 1 + prices[0] + ... + prices[d - 1] (costmodel.draft_prices)."""
        cum = [0.0]
        for p in prices:
            cum.append(cum[-1] + p)
        return sum(n * (1.0 + cum[d]) for d, n in self.by_drafted.items())

    def __add__(self, other: Study) -> Study:
        return Study(self.story_tokens + other.story_tokens, self.passes + other.passes,
                     self.drafted + other.drafted, self.accepted + other.accepted,
                     self.by_drafted + other.by_drafted)


def max_draft() -> int:
    """Guesses one verify pass checks at most: llm.MAX_DRAFT (the board's)."""
    from .checkout import import_llm

    return int(import_llm().MAX_DRAFT)


def simulate_each(stories: Iterable[tuple[Sequence[int], Sequence[int]]], drafter: Drafter,
                  max_draft: int | None = None) -> list[Study]:
    """`simulate`, one Study per story."""
    out = []
    if max_draft is None:
        max_draft = globals()["max_draft"]()
    for prompt, story in stories:
        st = Study()
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
            st.by_drafted[len(d)] += 1
            i += a + 1
        st.story_tokens = len(story)
        out.append(st)
    return out


def simulate(stories: Iterable[tuple[Sequence[int], Sequence[int]]], drafter: Drafter,
             max_draft: int | None = None) -> Study:
    """Replay (prompt, story) pairs decoded plainly: at each pass the drafter sees
    the context so far and proposes up to max_draft tokens (never past the
    story's end); the pass keeps the prefix that equals the story and adds the
    one token it computes itself."""
    return sum(simulate_each(stories, drafter, max_draft), Study())


def decode_stories(model: object, prompts: Sequence[Sequence[int]], sampler: Sampler,
                   n_tokens: int, eot: int | Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Plain decoding with an open `_llm.Model`: (prompt, story) per prompt,
    each story stopping at <|endoftext|> (not included; `eot` may list several
    stop ids: llama2.c's BOS and EOS) or after n_tokens."""
    stops = {eot} if isinstance(eot, int) else set(eot)
    out = []
    for prompt in prompts:
        model.reset()  # type: ignore[attr-defined]
        model.sampler(*sampler)  # type: ignore[attr-defined]
        tok = model.prefill(list(prompt))  # type: ignore[attr-defined]
        story: list[int] = []
        limit = min(n_tokens, model.config()["seq_len"] - len(prompt))  # type: ignore[attr-defined]
        while tok not in stops and len(story) < limit:
            story.append(tok)
            if len(story) < limit:
                tok = model.step(tok)  # type: ignore[attr-defined]
        out.append((list(prompt), story))
    return out


# ---- writing stories: an image through _llm, or a llama2.c checkpoint ----------


Job = tuple[list[int], Sampler]  # a prompt and how to continue it


class StoryWriter:
    """A model that continues prompts plainly (greedy at temperature 0)."""

    name: str = "model"
    prompts: list[list[int]]

    def write(self, jobs: Sequence[Job], n_tokens: int,
              progress: Callable[[int], None] | None = None) -> list[list[int]]:
        """Each job's story (the prompt not included), n_tokens at most."""
        raise NotImplementedError


class ImageStories(StoryWriter):
    """An open `_llm.Model`: each job decoded by the engine (decode_stories)."""

    def __init__(self, model: object, eot: int | Sequence[int],
                 prompts: Sequence[Sequence[int]] = (),
                 name: str = "image") -> None:
        self.model, self.eot, self.name = model, eot, name
        self.prompts = [list(p) for p in prompts]
        self.head_rows = self.heads = 0  # summed over the stories (the engine's stats)
        self.vocab = int(model.config()["vocab_out"])  # type: ignore[attr-defined]

    @property
    def rows_scored(self) -> float | None:
        """The share of head rows the engine scored over the stories written
        (what the certified head kept; None before any)."""
        return self.head_rows / (self.heads * self.vocab) if self.heads else None

    def write(self, jobs: Sequence[Job], n_tokens: int,
              progress: Callable[[int], None] | None = None) -> list[list[int]]:
        out = []
        for k, (prompt, smp) in enumerate(jobs):
            out.append(decode_stories(self.model, [prompt], smp, n_tokens, self.eot)[0][1])
            st = self.model.stats()  # type: ignore[attr-defined]  # (each story resets them)
            self.head_rows += st["head_rows"]
            self.heads += st["heads"]
            if progress is not None:
                progress(k + 1)
        return out


if __name__ == "__main__":  # the study's command moved to the cost model, which prices it
    import sys

    sys.exit("python -m mpllm.drafting is now python -m mpllm.costmodel.drafting_study "
             "(the same arguments)")
