"""Speculative decoding's inputs: what a drafter yields per pass
(`DraftFigures`), how much of the head a pass's positions share
(`UnionRatios`), their defaults as measured on the demo model, and
`SpecInputs`, which holds them. Nothing here runs the engine (spec_measure
does), and nothing here imports drafting.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .shape import VERIFY_MAX

__all__ = [
    "DEFAULT_STUDY",
    "DEFAULT_UNION",
    "REAL_MODEL_STUDY",
    "SPEC_MODES",
    "SPEC_PROMPTS",
    "SPEC_SEEDS",
    "DraftFigures",
    "SpecInputs",
    "UnionRatios",
    "real_model_drafts",
]

#: drafting_study.study's story prompts (its defaults), used for every
#: measurement of the speculative inputs.
SPEC_PROMPTS = ("Once upon a time", "One day, a little girl named Lily", "Tom and his dog",
                "The sun was", "Once upon a time, there was")
#: the sampled runs' seeds (drafting_study.study's defaults): T 0.8, top-k 40
SPEC_SEEDS = (1, 2, 3, 4, 5)
SPEC_MODES = ("greedy", "sampled")


def samplers(mode: str, seeds: Sequence[int]) -> list[tuple[float, int, int]]:
    if mode == "greedy":
        return [(0.0, 0, 0)]
    if mode == "sampled":
        return [(0.8, 40, sd) for sd in seeds]
    raise ValueError(f"unknown mode {mode!r}: greedy or sampled")


@dataclass(frozen=True)
class DraftFigures:
    """One drafter replayed over plainly decoded stories (mpllm.drafting.simulate):
    story tokens per pass and the drafts each pass verifies."""

    drafter: str
    tokens_per_pass: float
    drafted_per_pass: float
    accept_rate: float = 0.0
    passes: int = 0
    story_tokens: int = 0

    @property
    def positions_per_pass(self) -> float:
        """m: the pass's own token plus the drafts it verifies."""
        return 1.0 + self.drafted_per_pass

    @property
    def usable(self) -> bool:
        return (math.isfinite(self.drafted_per_pass) and self.tokens_per_pass >= 1.0
                and 1.0 <= self.positions_per_pass <= VERIFY_MAX)

    @classmethod
    def from_study(cls, name: str, r: Mapping[str, float]) -> DraftFigures:
        """From one drafting_study.study() row. The drafts per pass are its "drafted"
        count when it has one, else accepted / accept_rate, accepted = story
        tokens - passes (each pass emits its accepted drafts and one token)."""
        passes, story = int(r["passes"]), int(r["story_tokens"])
        rate = float(r["accept_rate"])
        if "drafted" in r:
            drafted = float(r["drafted"])
        else:
            accepted = story - passes
            drafted = accepted / rate if rate > 0 else (0.0 if accepted == 0 and
                                                         float(r["tokens_per_pass"]) == 1.0
                                                         else math.nan)
        return cls(name, float(r["tokens_per_pass"]), drafted / passes if passes else math.nan,
                   rate, passes, story)


def _study_row(story_tokens: int, passes: int, drafted: int) -> dict[str, float]:
    """A drafting_study.study() row from its three counts: each pass emits its own
    token and the drafts it accepted, so accepted = story tokens - passes."""
    return {"tokens_per_pass": story_tokens / passes,
            "accept_rate": (story_tokens - passes) / drafted,
            "passes": passes, "drafted": drafted, "story_tokens": story_tokens}


#: drafting_study.study on the demo model (n_tokens 200, table_stories 200,
#: seeds 1-5, the drafts table priced by draft_prices() for the release
#: shape, its shares calibrated, as convert builds it): the figures used
#: when it is not re-run
#: (bench.py --model-s3 re-runs it whenever the engine and demo are here).
DEFAULT_STUDY: dict[str, dict[str, dict[str, float]]] = {
    "greedy": {
        "lookup": _study_row(story_tokens=484, passes=457, drafted=1081),
        "ngram": _study_row(story_tokens=484, passes=154, drafted=363),
        "both": _study_row(story_tokens=484, passes=184, drafted=706),
    },
    "sampled": {
        "lookup": _study_row(story_tokens=2395, passes=2278, drafted=5288),
        "ngram": _study_row(story_tokens=2395, passes=1017, drafted=1898),
        "both": _study_row(story_tokens=2395, passes=1100, drafted=3991),
    },
}


#: The same drafter (the n-gram table convert stores: 200 of the model's own
#: stories, shares calibrated, priced by draft_prices() for the release
#: shape) on a real trained llama2.c model, stories260K by token ids, whose
#: text is about as uncertain as the release model's: drafting_study.measure
#: (`python -m mpllm.costmodel.drafting_study --llama2c stories260K.bin
#: --prices release`; 200 sampled stories, 40 greedy, 200 tokens). The
#: speculative rows' tokens per pass at a real model's acceptance, beside
#: DEFAULT_STUDY's demo figures.
REAL_MODEL_STUDY: dict[str, dict[str, dict[str, float]]] = {
    "greedy": {
        "ngram": _study_row(story_tokens=6987, passes=5436, drafted=2384),
    },
    "sampled": {
        "ngram": _study_row(story_tokens=27676, passes=25092, drafted=5649),
    },
}


def real_model_drafts() -> dict[str, dict[str, DraftFigures]]:
    """REAL_MODEL_STUDY as DraftFigures, per mode and drafter."""
    return {mode: {n: DraftFigures.from_study(n, r) for n, r in rows.items()}
            for mode, rows in REAL_MODEL_STUDY.items()}


@dataclass
class UnionRatios:
    """Per pass of m positions, what the many-positions head scan did relative
    to m single steps over the same positions (the same tokens): tiles fetched
    (the "union" ratio: 1/m when every position needs the same tiles, 1 when
    they share none) and rows scored summed over the positions."""

    tiles: dict[int, float]
    rows: dict[int, float]
    step_tiles: float = math.nan  # mean tiles one step fetched
    step_fraction: float = math.nan  # mean share of head rows one step scored
    n_tiles: int = 0
    passes: dict[int, int] = field(default_factory=dict)
    source: str = "default"

    def at(self, m: int) -> tuple[float, float]:
        """(tiles ratio, rows ratio) at m: m x ratio is interpolated linearly in
        m between the measured m (1 at m = 1), continued along the last two."""
        if m == 1:
            return 1.0, 1.0
        out = []
        for ratios in (self.tiles, self.rows):
            pts = sorted({1: 1.0, **{int(k): k * v for k, v in ratios.items()}}.items())
            if len(pts) == 1:
                out.append(1.0 / m)
                continue
            for (m0, y0), (m1, y1) in itertools.pairwise(pts):
                if m <= m1:
                    break
            y = y0 + (m - m0) * (y1 - y0) / (m1 - m0)
            out.append(max(y, 0.0) / m)
        return out[0], out[1]


#: What measure_union found on the demo model at 9a6b552 (SPEC_PROMPTS x 200
#: tokens, greedy and T 0.8/top-40 x seeds 1-5): its 8-tile head fetches the
#: same tiles at every position, so a pass fetches one step's tiles (greedy
#: exactly; sampled slightly fewer: the one-tile-at-a-time scan has no wave
#: overshoot). Used when it is not re-measured.
DEFAULT_UNION = {
    "greedy": UnionRatios({m: 1.0 / m for m in range(2, VERIFY_MAX + 1)},
                          {m: 1.0 for m in range(2, VERIFY_MAX + 1)}, n_tiles=8,
                          source="default (demo model, measured at 9a6b552)"),
    "sampled": UnionRatios({m: u / m for m, u in zip(range(2, VERIFY_MAX + 1),
                                                     (0.947, 0.952, 0.960, 0.964, 0.971,
                                                      0.978, 0.987), strict=True)},
                           {m: 0.937 for m in range(2, VERIFY_MAX + 1)}, n_tiles=8,
                           source="default (demo model, measured at 9a6b552)"),
}


@dataclass
class SpecInputs:
    """What the speculative builds are computed from: the drafters' tokens and
    drafts per pass and the head's union ratios on the demo model (the
    release model's acceptance cannot be measured here), the release-shaped
    random head's union ratios (shown), the many-columns kernel's PIE counts,
    and optionally an n-gram threshold x draft cap sweep (`adaptive`)."""

    drafts: dict[str, dict[str, DraftFigures]]
    union: dict[str, UnionRatios]
    union_release: dict[str, UnionRatios] = field(default_factory=dict)
    cols_pie: dict[int, float] | None = None
    adaptive: dict[str, list[DraftFigures]] = field(default_factory=dict)
    table: dict[str, object] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    @classmethod
    def default(cls) -> SpecInputs:
        return cls({mode: {n: DraftFigures.from_study(n, r) for n, r in rows.items()}
                    for mode, rows in DEFAULT_STUDY.items()},
                   {k: dataclasses.replace(v) for k, v in DEFAULT_UNION.items()},
                   source={"drafts": "default: drafting_study.study on the demo (200 table "
                                     "stories, release-priced drafts table)",
                           "union": DEFAULT_UNION["greedy"].source,
                           "cols_pie": "closed form (pie_cols_instructions)"})
