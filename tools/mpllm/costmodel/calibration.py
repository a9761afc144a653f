"""Calibration: the published anchors (`ANCHORS`) and the fit (`fit`) of the
three constants to the three anchors marked fitted, the derived constant
following (see the package docstring, "Calibration").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .builds import BUILDS
from .forward import build_work
from .s3 import (
    FAST_EXPF_CHAIN_OPS,
    SOFT_LIBM_CYCLES,
    SOFTMAX_PAIR_CYCLES,
    SOFTMAX_PAIR_OPS,
)
from .shape import MODEL_STAGES, RELEASE, Shape
from .work import Fit, Work, stage_seconds

__all__ = [
    "ANCHORS",
    "ANCHOR_TOLERANCE",
    "DERIVED_CONSTANTS",
    "FITTED_CONSTANTS",
    "PINNED_CONSTANTS",
    "Anchor",
    "anchor_stages",
    "fit",
    "fit_stock",
]

#: Tolerance every anchor is held to (tests/test_costmodel.py). Fitted rows are
#: exact by construction.
ANCHOR_TOLERANCE = 0.10


@dataclass(frozen=True)
class Anchor:
    """One published figure: a stage (or "total") of one build. `fitted_on`
    names the constants a fitted anchor fixes (empty: held out)."""

    name: str
    build: str
    stage: str
    published_ms: float
    fitted: bool
    source: str
    fitted_on: tuple[str, ...] = ()


ANCHORS: tuple[Anchor, ...] = (
    Anchor("stock head", "stock", "head", 59.0, True,
           "esp32-ai stock firmware stage profile", ("overlap",)),
    Anchor("stock attention", "stock", "attn", 20.0, True, "same profile", ("c_op",)),
    Anchor("stock FFN", "stock", "ffn", 6.4, False, "same profile"),
    Anchor("stock PLE", "stock", "ple", 6.4, True, "same profile", ("erff_cycles",)),
    Anchor("stock total", "stock", "total", 95.0, False,
           "~10.3 tok/s, 95.0 ms/token (esp32-ai; llm.h: 'inference from 95.0')"),
    Anchor("PIE+int4 total", "pie_int4", "total", 43.3, False,
           "PIE + int4 head/core + logits in SRAM, 22.6 tok/s (esp32-ai)"),
    Anchor("32-byte-line head", "research_line32", "head", 20.8, False,
           "esp32-ai idf_tinystories/sweep/line64.conf: '20.8 ms and 60.6 MiB/s on "
           "32-byte lines'"),
    Anchor("64-byte-line head", "research_line64", "head", 14.6, False,
           "line64.conf: '14.6 ms/token for 1.26 MiB, i.e. 86.3 MiB/s'"),
    Anchor("64-byte-line total", "research_line64", "total", 25.0, False,
           "line64.conf: 40.01 tok/s; esp32_tinystories.ino: 'The head is 14.6 ms of "
           "a 25.0 ms token'"),
    Anchor("certified head total", "research_cert", "total", 16.2, False,
           "esp32_tinystories.ino CERT_SEED/EXP-124 and llm.h EXP-130: 61.5-61.96 tok/s, "
           "33.2 % of rows"),
    Anchor("no libm lrintf total", "research_qact", "total", 15.0, False,
           "llm.h EXP-130 QACT=1: 66.64/67.14 tok/s"),
    Anchor("final lossy total", "research_final", "total", 13.3, False,
           "action_bench.h: '13.3 ms/token, 75 tok/s'"),
    Anchor("final lossy head", "research_final", "head", 5.4, False,
           "action_bench.h: 'The output head is 41% of a token (5.4 of 13.3 ms)', "
           "34.5 % of rows"),
)
#: The three fitted constants, solved jointly from the three fitted anchors
#: (each anchor's `fitted_on`; the anchor that mainly determines each
#: constant, the others move it a little). All three are stages of the stock
#: build, which no held-out anchor shares.
FITTED_CONSTANTS = {c: tuple(an.name for an in ANCHORS if c in an.fitted_on)
                    for c in ("c_op", "overlap", "erff_cycles")}
#: Constants pinned to a published measurement (never fitted) or derived from
#: the fitted ones and a published sub-stage measurement that is not an anchor.
PINNED_CONSTANTS = {
    "s_line64": "PSRAM bus, 85.3 MiB/s on 64-byte lines (esp32-ai 9965f5ec action_bench.h)",
    "s_line32": "PSRAM ceiling, 60.7 MiB/s on 32-byte lines (9965f5ec sweep/line64.conf)",
}
DERIVED_CONSTANTS = {
    "c_mac_i8": "esp32-ai scalar int8 dot at 24.8 M MAC/s from PSRAM, less s_line32 per byte",
    "chain_cycles": "esp32-ai softmax pass, 1.93 ms for 2,520 pairs, less its ops and libm calls",
}


def _anchor_ms(an: Anchor, works: Mapping[str, Mapping[str, Work]], f: Fit) -> float:
    w = works[an.build]
    stages = MODEL_STAGES if an.stage == "total" else (an.stage,)
    return 1e3 * sum(stage_seconds(w[st], f) for st in stages)


def anchor_stages(an: Anchor) -> tuple[str, ...]:
    """The stages an anchor's figure sums."""
    return MODEL_STAGES if an.stage == "total" else (an.stage,)


def _derived(f: Fit) -> Fit:
    """Fill in the cost of a dependent float op (from esp32-ai's measured
    softmax pass) from the fitted c_op."""
    pair = SOFTMAX_PAIR_CYCLES - 2 * SOFT_LIBM_CYCLES - SOFTMAX_PAIR_OPS * f.c_op
    return dataclasses.replace(f, chain_cycles=float(pair / FAST_EXPF_CHAIN_OPS))


def _theta_fit(theta: Sequence[float]) -> Fit:
    c_op, overlap, erff = (float(v) for v in theta)
    return _derived(Fit(c_op, overlap=overlap, erff_cycles=erff))


def fit(s: Shape = RELEASE, positions: Sequence[int] | None = None,
        anchors: Sequence[Anchor] = ANCHORS) -> Fit:
    """Solve the three fitted constants (c_op, overlap, newlib erff) so that
    the three anchors marked fitted are reproduced exactly (Newton's method
    on a piecewise-linear system), the line fills pinned and the dependent
    float op following along (`_derived`)."""
    import numpy as np

    fitted = [an for an in anchors if an.fitted]
    if len(fitted) != 3:
        raise ArithmeticError(f"{len(fitted)} fitted anchors for three constants")
    works = {an.build: build_work(BUILDS[an.build], s, positions) for an in fitted}
    target = np.array([an.published_ms for an in fitted])

    def resid(theta: np.ndarray) -> np.ndarray:
        f = _theta_fit(theta)
        return np.array([_anchor_ms(an, works, f) for an in fitted]) - target

    theta = np.array([1.0, 0.5, 250.0])
    scale = theta.copy()
    for _ in range(60):
        r = resid(theta)
        if np.max(np.abs(r)) < 1e-9:
            break
        jac = np.empty((3, 3))
        for i in range(3):
            d = np.zeros(3)
            d[i] = 1e-6 * scale[i]
            jac[:, i] = (resid(theta + d) - r) / d[i]
        try:
            theta = theta - np.linalg.solve(jac, r)
        except np.linalg.LinAlgError as e:
            raise ArithmeticError("the fitted anchors do not determine the constants") from e
    else:
        raise ArithmeticError(f"fit did not converge (residuals {resid(theta)} ms)")
    out = _theta_fit(theta)
    if (min(out.c_op, out.c_mac_i8, out.chain_cycles, out.erff_cycles) <= 0
            or not 0 <= out.overlap <= 1):
        raise ArithmeticError(f"fit gave non-physical constants {out.as_dict()}")
    return out


def fit_stock(s: Shape = RELEASE, positions: Sequence[int] | None = None) -> Fit:
    """Backwards-compatible name of `fit`."""
    return fit(s, positions)
