"""What each drafter would give on a model, modeled on the S3: the drafting
study (`python -m mpllm.costmodel.drafting_study`, docs/speculative-decoding.md).

It replays a model's own plainly decoded stories (an image through `_llm`,
or a llama2.c checkpoint through mpllm.reference.llama2c) through each
drafter of mpllm.drafting (`measure`, `study`) and prices every pass with
the cost model (`pass_ms`). It lives in the cost model because it prices:
mpllm.drafting itself (what convert runs) imports neither this nor the
cost model, and this module may import convert (the demo converted for a
study) without a circle.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..drafting import (
    DEFAULT_PROMPTS,
    Drafter,
    ImageStories,
    Job,
    StoryWriter,
    Study,
    both,
    decode_stories,
    distill,
    prompt_lookup,
    self_distilled,
    simulate,
    simulate_each,
)

__all__ = ["Figure", "Llama2cStories", "figure", "main", "measure", "measured_stories", "study"]


class Llama2cStories(StoryWriter):
    """A llama2.c checkpoint run by mpllm.reference.llama2c: every story starts
    at BOS and stops before the next BOS (llama2.c's run.c stops there).
    Jobs of one sampler and prompt length run as one batch, seeded by the
    first job's seed: the same jobs give the same stories."""

    BATCH = 100

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from ..reference.llama2c import BOS, Llama2c

        self.model = Llama2c(path)
        self.name = os.path.basename(os.fspath(path))
        self.prompts = [[BOS]]
        self.eot = BOS

    def write(self, jobs: Sequence[Job], n_tokens: int,
              progress: Callable[[int], None] | None = None) -> list[list[int]]:
        out: list[list[int] | None] = [None] * len(jobs)
        groups: dict[tuple[float, int, int], list[int]] = {}
        for k, (prompt, (t, top, _seed)) in enumerate(jobs):
            groups.setdefault((t, top, len(prompt)), []).append(k)
        done = 0
        for (t, top, _n), ks in groups.items():
            for at in range(0, len(ks), self.BATCH):
                part = ks[at:at + self.BATCH]
                stories = self.model.generate([jobs[k][0] for k in part], n_tokens,
                                              temperature=t, top_k=top, seed=jobs[part[0]][1][2],
                                              stop=self.eot)
                for k, st in zip(part, stories, strict=True):
                    out[k] = st
                done += len(part)
                if progress is not None:
                    progress(done)
        return [s for s in out if s is not None]


# ---- measuring: tokens per pass and modeled cost, with their spread -------------

#: the measured runs: sampled at T 0.8, top-k 40 (seeds 1.., prompts in turn);
#: greedy from each prompt followed by OPENING tokens the model samples at T 1
#: (seeds GREEDY_FIRST_SEED..), so greedy runs are many different stories
MEASURED_SAMPLER = (0.8, 40)
OPENING = 4
GREEDY_FIRST_SEED = 2000
BOOTSTRAP = 2000


def measured_stories(writer: StoryWriter, mode: str, n: int, n_tokens: int
                     ) -> list[tuple[list[int], list[int]]]:
    """The (prompt, story) pairs one mode is measured on: n sampled stories,
    or n greedy ones after the model's own openings."""
    prompts = writer.prompts
    if mode == "sampled":
        jobs = [(prompts[k % len(prompts)], (*MEASURED_SAMPLER, 1 + k)) for k in range(n)]
    elif mode == "greedy":
        opening = [(prompts[k % len(prompts)], (1.0, 0, GREEDY_FIRST_SEED + k))
                   for k in range(n)]
        heads = writer.write(opening, OPENING)
        jobs = [(p + h, (0.0, 0, 0)) for (p, _), h in zip(opening, heads, strict=True)]
    else:
        raise ValueError(f"mode {mode!r}: greedy or sampled")
    return list(zip([p for p, _ in jobs], writer.write(jobs, n_tokens), strict=True))


@dataclass
class Figure:
    """One drafter on one mode's stories: the totals, and each figure's
    bootstrap standard error over the stories."""

    total: Study
    cost: float  # modeled cost per token, in plain steps
    plain_ms: float  # modeled ms of a plain step (a pass of one position)
    stories: int
    se: dict[str, float]

    @property
    def ms_per_token(self) -> float:
        return self.cost * self.plain_ms

    def to_json(self) -> dict[str, float]:
        t = self.total
        return {"tokens_per_pass": t.tokens_per_pass, "tokens_per_pass_se": self.se["tpp"],
                "accept_rate": t.accept_rate, "passes": t.passes, "drafted": t.drafted,
                "story_tokens": t.story_tokens, "stories": self.stories,
                "cost_vs_plain": self.cost, "cost_vs_plain_se": self.se["cost"],
                "ms_per_token": self.ms_per_token, "ms_per_token_se": self.se["cost"] *
                self.plain_ms, "plain_ms": self.plain_ms}


def figure(each: Sequence[Study], prices: Sequence[float], plain_ms: float,
           seed: int = 0) -> Figure:
    """Totals over the stories and the bootstrap standard error (stories
    resampled with replacement) of tokens per pass and cost per token."""
    import numpy as np

    tok = np.array([s.story_tokens for s in each], float)
    passes = np.array([s.passes for s in each], float)
    cost = np.array([s.cost(prices) for s in each], float)
    idx = np.random.default_rng(seed).integers(0, len(each), (BOOTSTRAP, len(each)))
    bt, bp, bc = tok[idx].sum(1), passes[idx].sum(1), cost[idx].sum(1)
    total = sum(each, Study())
    return Figure(total, float(cost.sum() / tok.sum()), plain_ms, len(each),
                  {"tpp": float(np.std(bt / bp)), "cost": float(np.std(bc / bt))})


def measure(writer: StoryWriter, *, prices: Mapping[str, Sequence[float]],
            plain_ms: Mapping[str, float], table_stories: int = 200, n_tokens: int = 200,
            stories: Mapping[str, int] | None = None, drafters: Sequence[str] | None = None,
            log: Callable[[str], None] | None = None) -> dict[str, object]:
    """Per mode (greedy, sampled) and drafter, the figures on `writer`'s
    model: "ngram" is the table convert stores (shares calibrated),
    "ngram raw" the same counts with the counts' shares (before
    calibration), "lookup" prompt lookup, "both" lookup else ngram. The
    table is built as build_drafts builds it (its stories from seeds
    TABLE_FIRST_SEED.., never the measured ones) and priced by
    prices["sampled"]; each mode's cost is priced by prices[mode] and
    plain_ms[mode]."""
    import time

    say = log or (lambda _m: None)
    stories = dict(stories or {"greedy": 40, "sampled": 200})
    drafters = list(drafters or ("ngram raw", "ngram", "lookup", "both"))
    t0 = time.perf_counter()
    say(f"{writer.name}: writing {table_stories} stories for the n-gram table")
    counts = distill(writer, writer.prompts, table_stories, n_tokens)
    tables = {"ngram": counts.table(prices["sampled"]),
              "ngram raw": counts.table(prices["sampled"], calibrated=False)}
    build_s = time.perf_counter() - t0
    make: dict[str, Drafter] = {"ngram": tables["ngram"].draft,
                                "ngram raw": tables["ngram raw"].draft,
                                "lookup": prompt_lookup, "both": both(tables["ngram"])}
    out: dict[str, object] = {"model": writer.name, "table": {
        "stories": table_stories, "contexts": tables["ngram"].entries,
        "bytes": len(tables["ngram"].pack()), "build_s": build_s}}
    for mode, n in stories.items():
        say(f"{writer.name}: writing {n} {mode} stories to measure")
        pairs = measured_stories(writer, mode, n, n_tokens)
        out[mode] = {name: figure(simulate_each(pairs, make[name]), prices[mode],
                                  plain_ms[mode]) for name in drafters}
    return out


def study(image: str, *, prompts: Sequence[str] | None = None, n_tokens: int = 200,
          table_stories: int = 40, seeds: Sequence[int] = (1, 2, 3, 4, 5),
          llm_module: object | None = None, prices: Sequence[float] | None = None
          ) -> dict[str, dict[str, dict[str, float]]]:
    """tokens per pass and acceptance of each drafter on `image`, greedy and
    sampled (T 0.8, top-k 40): the n-gram table is built as convert builds
    the image's (build_drafts: table_stories stories the model writes, from
    other seeds than the ones measured, its shares calibrated on them, each
    draft priced by the cost model
    for the image's shape, or by `prices`: costmodel.draft_prices() measures
    the demo's acceptance at the release model's prices)."""
    import time

    from .prices import draft_prices
    from .shape import Shape

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    from ..checkout import import_llm

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


def _demo_image(tmp: str) -> str:
    """The repository's demo model converted into tmp (no table: measure
    builds its own)."""
    from ..checkout import DEMO_DIR
    from ..convert import convert

    out = os.path.join(tmp, "demo.img")
    convert(DEMO_DIR / "model.bin", DEMO_DIR / "tokenizer.json", out, progress=False)
    return out


def _prices(shape: object, label: str) -> tuple[dict[str, list[float]], dict[str, float], str]:
    from .prices import pass_ms

    prices, plain = {}, {}
    for mode in ("greedy", "sampled"):
        ms = pass_ms(shape, build=f"mpllm-spec-{mode}")  # type: ignore[arg-type]
        prices[mode] = [(ms[k] - ms[k - 1]) / ms[0] for k in range(1, len(ms))]
        plain[mode] = ms[0]
    note = (f"priced for {label} (modeled S3): a plain step {plain['sampled']:.2f} ms sampled, "
            f"{plain['greedy']:.2f} ms greedy; guesses 1-{len(prices['sampled'])} add "
            + " ".join(f"{x:.3f}" for x in prices["sampled"]) + " of it")
    return prices, plain, note


def _print(res: Mapping[str, object]) -> None:
    t = res["table"]  # type: ignore[index]
    print(f"{res['model']}: n-gram table from {t['stories']} of its own stories: "  # type: ignore[index]
          f"{t['contexts']:,} contexts ({t['bytes']:,} bytes) in {t['build_s']:.1f} s")  # type: ignore[index]
    print(HEADER)
    for mode in ("greedy", "sampled"):
        for name, f in res[mode].items():  # type: ignore[attr-defined]
            j = f.to_json()
            print(f"  {mode:<8} {name:<10} {j['tokens_per_pass']:5.2f} ± {j['tokens_per_pass_se']:.2f}"
                  f" {j['accept_rate']:6.1%} {j['passes']:7,} {j['story_tokens']:7,} "
                  f"{j['stories']:4}  {j['cost_vs_plain']:5.3f} ± {j['cost_vs_plain_se']:.3f}"
                  f"  {j['ms_per_token']:6.2f} ± {j['ms_per_token_se']:.2f}")


HEADER = (f"  {'mode':<8} {'drafter':<10} {'tok/pass':>12} {'kept':>6} {'passes':>7} "
          f"{'tokens':>7} {'stor':>4}  {'cost vs plain':>13}  {'ms/token (modeled)':>15}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpllm.costmodel.drafting_study",
        description="Tokens per pass of each drafter on a model's own plainly decoded stories "
                    "(speculative decoding writes exactly the plain story, so replaying them is "
                    "exact), with bootstrap standard errors over the stories, and what that "
                    "costs per token by the S3 cost model's pass prices. Drafters: ngram (the "
                    "table convert stores: shares calibrated on held-out stories), ngram raw "
                    "(the same counts trusted as counted: before calibration), lookup, both.")
    ap.add_argument("image", nargs="?",
                    help="a converted model image (default: the repository's demo model, "
                         "converted into a temporary directory)")
    ap.add_argument("--llama2c", metavar="BIN",
                    help="also measure a llama2.c checkpoint (legacy format, by token ids: "
                         "mpllm.reference.llama2c runs it), e.g. stories260K.bin")
    ap.add_argument("--prices", choices=("image", "release"), default="image",
                    help="price guesses for the image's own shape (what convert stores) or for "
                         "the release shape (docs/performance.md's figures); a llama2.c model is always "
                         "priced at the release shape (its acceptance stands in for the release "
                         "model's on real text)")
    ap.add_argument("--tokens", type=int, default=200, help="story tokens per run (default 200)")
    ap.add_argument("--table-stories", type=int, default=200,
                    help="stories the model writes to build the n-gram table (default 200, as "
                         "convert)")
    ap.add_argument("--stories", type=int, default=200,
                    help="sampled stories measured (T 0.8, top-k 40; default 200)")
    ap.add_argument("--greedy-stories", type=int, default=40,
                    help="greedy stories measured (default 40)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    for flag in ("tokens", "table_stories", "stories", "greedy_stories"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, not {getattr(args, flag)}")
    if args.llama2c and not os.path.isfile(args.llama2c):
        ap.error(f"--llama2c {args.llama2c}: no such file")
    if args.image and not os.path.isfile(args.image):
        ap.error(f"{args.image}: no such image")
    import json
    import tempfile

    import _llm

    from ..checkout import import_llm
    from .shape import RELEASE, Shape

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    llm = import_llm()
    kw = {"table_stories": args.table_stories, "n_tokens": args.tokens,
          "stories": {"greedy": args.greedy_stories, "sampled": args.stories}, "log": log}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        image = args.image or _demo_image(tmp)
        name = os.path.basename(args.image) if args.image else "demo"
        with _llm.Model(image) as m:
            cfg = m.config()
            shape = RELEASE if args.prices == "release" else Shape.from_config(cfg)
            prices, plain, note = _prices(shape, "the release shape" if args.prices == "release"
                                          else f"{name}'s shape")
            print(note)
            tok = llm.Tokenizer(m.tokenizer())
            writer = ImageStories(m, int(cfg["eot_id"]), [tok.encode(p) for p in DEFAULT_PROMPTS],
                                  name)
            results.append((note, measure(writer, prices=prices, plain_ms=plain, **kw)))
    _print(results[0][1])
    if args.llama2c:
        prices, plain, note = _prices(RELEASE, "the release shape")
        results.append((note, measure(Llama2cStories(args.llama2c), prices=prices,
                                      plain_ms=plain, **kw)))
        if note != results[0][0]:
            print(note)
        _print(results[-1][1])
    print("speculative (ngram, modeled) vs plain, per token:")
    for mode, label in (("greedy", "greedy"), ("sampled", "sampled T 0.8 top-40")):
        parts = []
        for _note, res in results:
            f = res[mode]["ngram"]  # type: ignore[index]
            parts.append(f"at {res['model']}'s {f.total.tokens_per_pass:.2f} tokens/pass "
                         f"{f.ms_per_token:.2f} ± {f.se['cost'] * f.plain_ms:.2f} ms "
                         f"(plain {f.plain_ms:.2f})")
        print(f"  {label}: " + "; ".join(parts))
    if args.json:
        data = [{"prices": note, **{k: ({n: f.to_json() for n, f in v.items()}  # type: ignore[attr-defined]
                                         if k in ("greedy", "sampled") else v)
                                     for k, v in res.items()}} for note, res in results]
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
