"""Bands: every headline figure as low / mid / high from the plausible ranges
of its three dominant unknowns (`BAND_UNKNOWNS`), each taken at its fast end
for "low" and its slow end for "high":

  rows      the share of head rows the certified head scores on the real
            release head (not available here): greedy, esp32-ai's published
            8,427-8,749 rows; sampled (top-40), from the published greedy low
            (a top-40 certificate never needs fewer rows than greedy's) to the
            published greedy high times the largest top-40/greedy ratio the
            engine measured (demo model, release-shaped random head)
  overlap   how much of the split work's line fills the other core's compute
            hides: from complete (1.0: esp32-ai's head scan ran at 84 of the
            bus's 85.3 MiB/s) through the fitted share to as far below it
  sram      how much of the core sits in internal SRAM: the whole plan (low),
            the placement the emulated board measured (mid), 64 KiB more of
            the core in PSRAM than measured (high: a real board whose radio
            stacks or a larger reserve take that much more internal RAM)

A build whose figure does not depend on an unknown (esp32-ai's builds have
published rows and known placements) keeps its mid value for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .builds import Build
from .s3 import RELEASE_GREEDY_RANGE
from .sram import measured_core_regions, more_in_psram, spill_by_stage
from .work import Fit

__all__ = [
    "BAND_UNKNOWNS",
    "DEMO_TOPK_RATIO",
    "RANDOM_TOPK_RATIO",
    "SAMPLED_RATIOS_DEFAULT",
    "Band",
    "band",
    "band_ends",
]

BAND_UNKNOWNS = ("rows", "overlap", "sram")
#: the SRAM fit's slow end: this much more of the core in PSRAM than the
#: emulated board measured (a real board whose ESP-IDF and MicroPython keep
#: more internal RAM: the port's reserve was this size before it was sized)
SRAM_BAND_EXTRA_BYTES = 64 * 1024
#: top-40/greedy rows ratios for the sampled band's high end where the report
#: is given no measurement of its own: what the engine measured on the demo model (65.13 /
#: 61.60 %) and on the release-shaped random head (86.45 / 77.83 %)
#: (measure_fractions, 3 prompts x 200 steps, seeds 1-5)
DEMO_TOPK_RATIO = 65.13 / 61.60
RANDOM_TOPK_RATIO = 86.45 / 77.83
SAMPLED_RATIOS_DEFAULT = (DEMO_TOPK_RATIO, RANDOM_TOPK_RATIO)


@dataclass(frozen=True)
class Band:
    """One unknown's range for one build: (fast end, mid, slow end)."""

    rows: tuple[float, float, float] | None
    overlap: tuple[float, float, float]
    sram: tuple[tuple[tuple[str, int], ...], ...] | None


def _rows(b: Build, sampled_ratios: tuple[float, ...]) -> tuple[float, float, float] | None:
    if b.head != "certified" or not b.python_loop:  # esp32-ai's rows are published
        return None
    lo, hi = RELEASE_GREEDY_RANGE
    if b.sampler == "cand-topk":
        return lo, b.rows_fraction, min(1.0, max(hi * max(sampled_ratios, default=1.0),
                                                 b.rows_fraction))
    return min(lo, b.rows_fraction), b.rows_fraction, max(hi, b.rows_fraction)


def band_ends(b: Build, f: Fit, *, sampled_ratios: tuple[float, ...] = SAMPLED_RATIOS_DEFAULT
              ) -> Band:
    """The three unknowns' ranges for build `b` priced with fit `f`."""
    overlap = (1.0, f.overlap, max(0.0, 2 * f.overlap - 1.0))
    sram = None
    if b.spill_stages:  # ours: placed as the emulated board measured
        measured = measured_core_regions()
        worse = more_in_psram(measured, SRAM_BAND_EXTRA_BYTES)
        sram = ((), b.spill_stages, tuple(sorted(spill_by_stage(worse).items())))
    return Band(_rows(b, sampled_ratios), overlap, sram)


def band(b: Build, f: Fit, price: Callable[[Build, Fit], float], *,
         sampled_ratios: tuple[float, ...] = SAMPLED_RATIOS_DEFAULT
         ) -> tuple[dict[str, float], dict[str, dict[str, object]]]:
    """({"low", "mid", "high"} ms, each end's inputs) of build `b`:
    `price(build, fit)` with every unknown at its fast end, its mid and its
    slow end."""
    ends = band_ends(b, f, sampled_ratios=sampled_ratios)
    ms: dict[str, float] = {}
    inputs: dict[str, dict[str, object]] = {}
    for i, key in enumerate(("low", "mid", "high")):
        bb = b
        if ends.rows is not None:
            bb = dataclasses.replace(bb, rows_fraction=ends.rows[i])
        if ends.sram is not None:
            bb = dataclasses.replace(bb, spill_stages=ends.sram[i])
        ms[key] = price(bb, dataclasses.replace(f, overlap=ends.overlap[i]))
        inputs[key] = {"rows_fraction": None if ends.rows is None else ends.rows[i],
                       "overlap": ends.overlap[i],
                       "core_psram_bytes": (sum(n for _, n in ends.sram[i])
                                            if ends.sram is not None else None)}
    return ms, inputs
