"""What a draft position costs (`draft_prices`): the one figure
mpllm.drafting (and through it the converter: the drafts table's min_odds)
takes from the cost model. Imports only the package's low modules, none
that import drafting.
"""

from __future__ import annotations

import dataclasses

from .builds import BUILDS, SPEC_BUILD_MODE
from .calibration import fit
from .passes import Passes
from .s3 import python_loop_s
from .shape import RELEASE, VERIFY_MAX, Shape, story_positions
from .spec_inputs import SpecInputs

__all__ = ["draft_prices", "head_step_ms", "pass_ms", "verify_loop_steps"]


def verify_starts(s: Shape) -> list[int]:
    """The story positions (every 10th) where a verify pass of VERIFY_MAX
    positions fits the context of shape `s`: where pass_ms prices one (none:
    a context too short to draft in)."""
    return [p for p in story_positions() if p + VERIFY_MAX <= s.seq_len][::10]


def pass_ms(s: Shape = RELEASE, *, build: str = "mpllm-spec-sampled",
            rows_fraction: float | None = None) -> list[float]:
    """Modeled ms of a verify pass of m = 1..VERIFY_MAX positions on the S3
    for shape `s` over the story positions (every 10th start), with the
    default union ratios; m = 1 is a plain step."""
    b = BUILDS[build]
    if rows_fraction is not None:
        b = dataclasses.replace(b, rows_fraction=rows_fraction)
    sp = SpecInputs.default()
    passes = Passes(fit(), s, pie_calls=None, bound_pie=None, cols_pie=sp.cols_pie,
                     scale=(1.0, 1.0))
    union = sp.union[SPEC_BUILD_MODE[build]]
    starts = verify_starts(s)
    if not starts:
        raise ValueError(f"a context of {s.seq_len} positions holds no verify pass of "
                         f"{VERIFY_MAX} after a story's prompt: nothing to price")
    return [passes.ms(b, m, union, starts) for m in range(1, VERIFY_MAX + 1)]


def draft_prices(s: Shape = RELEASE, *, build: str = "mpllm-spec-sampled",
                 rows_fraction: float | None = None) -> list[float]:
    """What draft k (k = 1..VERIFY_MAX-1) adds to a verify pass, as a fraction
    of one plain step: (pass(k+1 positions) - pass(k)) / pass(1) (`pass_ms`).
    The converter writes these as the drafts table's min_odds: a guess is
    proposed only while the chance that it and every guess before it are
    accepted pays for its position."""
    ms = pass_ms(s, build=build, rows_fraction=rows_fraction)
    return [(ms[k] - ms[k - 1]) / ms[0] for k in range(1, VERIFY_MAX)]


def verify_loop_steps(s: Shape = RELEASE, *, build: str = "mpllm-spec-sampled"
                      ) -> tuple[float, float]:
    """What decoding in verify passes costs beyond its drafts, in plain steps
    of shape `s` (a step with llm.py's step loop): (a pass of one position,
    with llm.py's per-pass loop; llm.py's loop per story token in verify
    passes). A drafter pays only when its tokens per pass outweigh these: on
    a small model the loop is most of a step."""
    b = BUILDS[build]
    first = pass_ms(s, build=build)[0]
    loop = (lambda kind: 1e3 * python_loop_s(kind)) if b.python_loop else (lambda _k: 0.0)
    step = first - loop("pass") + loop("step")
    return first / step, loop("token") / step


def head_step_ms(s: Shape, rows_fraction: float, *, build: str = "mpllm-spec-sampled"
                 ) -> tuple[float, float]:
    """Modeled ms of a plain step on the S3 for shape `s` with the certified
    head scoring `rows_fraction` of the rows, and with the dense head (every
    row, no bounds): whether the certificate saves time on this model."""
    b = BUILDS[build]
    sp = SpecInputs.default()
    passes = Passes(fit(), s, pie_calls=None, bound_pie=None, cols_pie=sp.cols_pie,
                     scale=(1.0, 1.0))
    union, starts = sp.union[SPEC_BUILD_MODE[build]], (verify_starts(s)
                                                    or [p for p in story_positions() if p < s.seq_len])
    cert = dataclasses.replace(b, head="certified", rows_fraction=rows_fraction)
    dense = dataclasses.replace(b, head="dense", rows_fraction=1.0)
    return passes.ms(cert, 1, union, starts), passes.ms(dense, 1, union, starts)
