"""Measuring the speculative inputs on the host engine: drafting
(drafting_study.study, and other n-gram thresholds and caps), the head's
union ratios of verify passes against steps (each pass's bytes checked
against the pass formulas), and all of them together (`measure_spec`).
With drafting_study, the package's users of mpllm.drafting, imported where
it is used.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

from .engine_bytes import check_pass_bytes, placement_from_memory
from .pie_counter import measure_cols_pie
from .prices import draft_prices
from .shape import REGIONS, VERIFY_MAX, Shape
from .spec_inputs import (
    SPEC_MODES,
    SPEC_PROMPTS,
    SPEC_SEEDS,
    DraftFigures,
    SpecInputs,
    UnionRatios,
    samplers,
)

__all__ = ["measure_adaptive", "measure_drafting", "measure_spec", "measure_union"]


def measure_drafting(image: object, *, table_stories: int = 200, n_tokens: int = 200,
                     seeds: Sequence[int] = SPEC_SEEDS, llm_module: object | None = None
                     ) -> tuple[dict[str, dict[str, DraftFigures]], dict[str, object]]:
    """drafting_study.study on `image` (the demo model): per mode and drafter
    the tokens and drafts per pass; and the n-gram table's size."""
    from . import drafting_study

    res = drafting_study.study(os.fspath(image), n_tokens=n_tokens,  # type: ignore[arg-type]
                               prices=draft_prices(),
                               table_stories=table_stories, seeds=seeds, llm_module=llm_module)
    table = dict(res.pop("table").get("entries", {}))  # type: ignore[union-attr]
    drafts = {mode: {n: DraftFigures.from_study(n, r) for n, r in rows.items()}
              for mode, rows in res.items()}
    return drafts, table


def _encode_prompts(m: object, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    vocab = int(m.config()["vocab_out"])  # type: ignore[attr-defined]
    if all(not isinstance(p, str) for p in prompts):
        return [[int(t) % vocab for t in p] for p in prompts]  # type: ignore[union-attr]
    from ..checkout import import_llm

    tok = import_llm().Tokenizer(m.tokenizer())  # type: ignore[attr-defined]
    return [tok.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def measure_union(image: object, *, llm_module: object | None = None,
                  prompts: Sequence[str | Sequence[int]] = SPEC_PROMPTS, n_tokens: int = 200,
                  seeds: Sequence[int] = SPEC_SEEDS, ms: Iterable[int] = range(2, VERIFY_MAX + 1),
                  modes: Sequence[str] = SPEC_MODES) -> dict[str, UnionRatios]:
    """Per mode, the head's union and rows ratios of verify passes against
    single steps on `image`: each prompt's story is decoded by step() (its
    per-step head_tiles and head_rows recorded), then fed again in passes of m
    of its own tokens (Model.verify: every draft right, so every position's
    head input is the step's); the pass must return the story's next tokens,
    and its bytes must equal the pass formulas (`pass_region_bytes`)."""
    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    ms = sorted({int(k) for k in ms})
    if not ms or ms[0] < 2 or ms[-1] > VERIFY_MAX:
        raise ValueError(f"m in 2..{VERIFY_MAX}, not {ms}")
    out: dict[str, UnionRatios] = {}
    with llm_module.Model(os.fspath(image)) as mdl:  # type: ignore[attr-defined]
        cfg = mdl.config()
        s = Shape.from_config(cfg)
        eot, seq = int(cfg["eot_id"]), int(cfg["seq_len"])
        ids = _encode_prompts(mdl, prompts)
        memory = [tuple(x) for x in mdl.memory()]
        placement = placement_from_memory(memory)
        has_ids = any(name == "head_ids" for name, _, _ in memory)
        # a story and its passes per bar step (at a terminal: a minute in all)
        bar = tqdm(total=sum(len(list(samplers(m, seeds))) for m in modes) * len(ids),
                   desc="union ratios", unit="story", file=sys.stderr, leave=False, disable=None)
        for mode in modes:
            sums = {k: [0, 0, 0, 0, 0] for k in ms}  # pass tiles, step tiles, rows, rows, passes
            steps = step_tiles = step_rows = 0
            for smp in samplers(mode, seeds):
                for prompt in ids:
                    mdl.reset()
                    mdl.sampler(*smp)
                    story = [mdl.prefill(prompt)]
                    tiles: list[int] = []
                    rows: list[int] = []
                    while (story[-1] != eot and len(story) < n_tokens
                           and len(prompt) + len(story) < seq):
                        a = mdl.stats()
                        story.append(mdl.step(story[-1]))
                        z = mdl.stats()
                        tiles.append(z["head_tiles"] - a["head_tiles"])
                        rows.append(z["head_rows"] - a["head_rows"])
                    if story[-1] == eot:
                        story.pop()
                        tiles, rows = tiles[:len(story) - 1], rows[:len(story) - 1]
                    steps += len(tiles)
                    step_tiles += sum(tiles)
                    step_rows += sum(rows)
                    for k in ms:
                        mdl.reset()
                        mdl.sampler(*smp)
                        if mdl.prefill(prompt) != story[0]:
                            raise RuntimeError("prefill changed between two runs")
                        i = 0
                        while i + k <= len(tiles):
                            a = mdl.stats()
                            pos = mdl.pos()
                            got = mdl.verify(story[i:i + k])
                            z = mdl.stats()
                            if list(got) != story[i + 1:i + k + 1]:
                                raise RuntimeError(f"verify of {k} at {pos} returned {list(got)}, "
                                                   f"steps {story[i + 1:i + k + 1]}")
                            if z.get("v_wide", 0) != a.get("v_wide", 0):
                                raise ValueError("V rows cached as floats: the byte formulas "
                                                 "assume none")
                            pt = z["head_tiles"] - a["head_tiles"]
                            check_pass_bytes({r: z["bytes"][r] - a["bytes"][r] for r in REGIONS},
                                              s, pos, k, pt, placement, has_ids,
                                              z["head_ids"] - a["head_ids"])
                            acc = sums[k]
                            acc[0] += pt
                            acc[1] += sum(tiles[i:i + k])
                            acc[2] += z["head_rows"] - a["head_rows"]
                            acc[3] += sum(rows[i:i + k])
                            acc[4] += 1
                            i += k
                    bar.update(1)
            out[mode] = UnionRatios(
                {k: v[0] / v[1] for k, v in sums.items() if v[1]},
                {k: v[2] / v[3] for k, v in sums.items() if v[3]},
                step_tiles=step_tiles / steps if steps else math.nan,
                step_fraction=step_rows / steps / s.vocab_out if steps else math.nan,
                n_tiles=s.n_tiles, passes={k: v[4] for k, v in sums.items()},
                source=(f"engine verify vs step on {Path(os.fspath(image)).name} "  # type: ignore[arg-type]
                        f"({s.n_tiles} tiles): {len(ids)} prompts x {n_tokens} tokens"
                        + (f" x seeds {list(seeds)}" if mode == "sampled" else "")
                        + ", bytes checked equal to the pass formulas"))
        bar.close()
    return out


def measure_adaptive(image: object, *, llm_module: object | None = None,
                     table_stories: int = 200, n_tokens: int = 200,
                     seeds: Sequence[int] = SPEC_SEEDS,
                     odds: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                     caps: Sequence[int] = tuple(range(1, VERIFY_MAX)),
                     ) -> dict[str, list[DraftFigures]]:
    """The self-distilled n-gram drafter with other (constant) thresholds on
    the chance that a whole draft is accepted (the drafts table's min_odds)
    and draft caps, replayed over the same stories as
    drafting_study.study (its table built the same way: drafting.self_distilled),
    beside the table convert stores ("ngram priced": draft_prices()): the
    cost model picks the threshold and cap that minimise ms/token."""
    from .. import drafting

    if llm_module is None:
        import _llm as llm_module  # type: ignore[no-redef]
    out: dict[str, list[DraftFigures]] = {}
    with llm_module.Model(os.fspath(image)) as mdl:  # type: ignore[attr-defined]
        eot = int(mdl.config()["eot_id"])
        ids = _encode_prompts(mdl, SPEC_PROMPTS)
        table = drafting.self_distilled(mdl, ids, table_stories, n_tokens, eot)
        # each simulated threshold and cap per bar step (at a terminal: two minutes in all)
        bar = tqdm(total=len(SPEC_MODES) * (1 + len(odds) * len(caps)), desc="drafter sweep",
                   unit="setting", file=sys.stderr, leave=False, disable=None)
        for mode in SPEC_MODES:
            stories = [pair for smp in samplers(mode, seeds)
                       for pair in drafting.decode_stories(mdl, ids, smp, n_tokens, eot)]
            r = drafting.simulate(stories, table.table(draft_prices()).draft)
            rows = [DraftFigures("ngram priced", r.tokens_per_pass, r.drafted / r.passes,
                                 r.accept_rate, r.passes, r.story_tokens)]
            bar.update(1)
            for x in odds:
                for cap in caps:
                    t = table.table([x] * cap, cap)
                    r = drafting.simulate(stories, t.draft, max_draft=cap)
                    rows.append(DraftFigures(f"ngram odds>={x:.2f} cap {cap}",
                                             r.tokens_per_pass, r.drafted / r.passes,
                                             r.accept_rate, r.passes, r.story_tokens))
                    bar.update(1)
            out[mode] = rows
        bar.close()
    return out


def measure_spec(demo_image: object, release_image: object | None = None, *,
                 llm_module: object | None = None, table_stories: int = 200,
                 n_tokens: int = 200, seeds: Sequence[int] = SPEC_SEEDS,
                 adaptive: bool = True, cols: bool = True,
                 progress: Callable[[str], None] = lambda what: None) -> SpecInputs:
    """Every speculative input measured: drafting on the demo model, the
    union ratios on the demo (and on a release-shaped image, fewer runs), the
    many-columns PIE counts (when a compiler is here), the adaptive sweep.
    progress(what) is told each step as it starts (they take seconds each)."""
    spec = SpecInputs.default()
    progress(f"drafting: {table_stories} stories for the n-gram table, then the drafters "
             f"over {len(seeds)} seeds")
    drafts, table = measure_drafting(demo_image, table_stories=table_stories,
                                     n_tokens=n_tokens, seeds=seeds, llm_module=llm_module)
    spec.drafts, spec.table = drafts, table
    spec.source["drafts"] = (f"drafting_study.study on the demo: {n_tokens} tokens, "
                             f"{table_stories} table stories, seeds {list(seeds)}")
    progress("the head rows a verify pass scores (union ratios), demo model")
    spec.union = measure_union(demo_image, llm_module=llm_module, n_tokens=n_tokens, seeds=seeds)
    spec.source["union"] = spec.union["sampled"].source
    if release_image is not None:
        progress("union ratios, release-shaped image")
        spec.union_release = measure_union(release_image, llm_module=llm_module,
                                           prompts=SPEC_PROMPTS[:2], n_tokens=min(n_tokens, 100),
                                           seeds=tuple(seeds)[:2], ms=(2, 4, 8))
        spec.source["union_release"] = spec.union_release["sampled"].source
    if cols:
        progress("PIE instruction counts of the many-columns kernels (compiles a C test)")
        try:
            spec.cols_pie = measure_cols_pie()
            spec.source["cols_pie"] = ("tests/c/pie_kernels_test.c cols through pie_model.c's "
                                       "counters")
        except (FileNotFoundError, RuntimeError) as e:
            spec.source["cols_pie"] = f"closed form (not measured: {e})"
    if adaptive:
        progress("n-gram thresholds x draft caps sweep (--no-adaptive skips it)")
        spec.adaptive = measure_adaptive(demo_image, llm_module=llm_module,
                                         table_stories=table_stories, n_tokens=n_tokens,
                                         seeds=seeds)
        spec.source["adaptive"] = (f"n-gram thresholds x caps over the same stories "
                                   f"({table_stories} table stories)")
    return spec
