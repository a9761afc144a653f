"""Calibration: the published anchors (`ANCHORS`) and the fit (`fit`) of the
four constants to the four anchors marked fitted, the derived constants
following (see the package docstring, "Calibration").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .builds import BUILDS
from .forward import build_work
from .s3 import (
    CPU_HZ,
    FAST_EXPF_CHAIN_OPS,
    RESEARCH_PLE_MS,
    SOFT_LIBM_CYCLES,
    SOFTMAX_PAIR_CYCLES,
    SOFTMAX_PAIR_OPS,
)
from .shape import RELEASE, STAGES, Shape
from .work import Fit, Work, stage_seconds

__all__ = [
    "ANCHORS",
    "ANCHOR_TOLERANCE",
    "DERIVED_CONSTANTS",
    "FITTED_CONSTANTS",
    "Anchor",
    "fit",
    "fit_stock",
]

#: Tolerance every anchor is held to (tests/test_costmodel.py). Fitted rows are
#: exact by construction.
ANCHOR_TOLERANCE = 0.10


@dataclass(frozen=True)
class Anchor:
    """One published figure: a stage (or "total") of one build."""

    name: str
    build: str
    stage: str
    published_ms: float
    fitted: bool
    source: str


ANCHORS: tuple[Anchor, ...] = (
    Anchor("stock head", "stock", "head", 59.0, True,
           "esp32-ai stock firmware stage profile"),
    Anchor("stock attention", "stock", "attn", 20.0, True, "same profile"),
    Anchor("stock FFN", "stock", "ffn", 6.4, False, "same profile"),
    Anchor("stock PLE", "stock", "ple", 6.4, False, "same profile"),
    Anchor("stock total", "stock", "total", 95.0, False,
           "~10.3 tok/s, 95.0 ms/token (esp32-ai; llm.h: 'inference from 95.0')"),
    Anchor("PIE+int4 total", "pie_int4", "total", 43.3, False,
           "PIE + int4 head/core + logits in SRAM, 22.6 tok/s (esp32-ai)"),
    Anchor("32-byte-line head", "research_line32", "head", 20.8, True,
           "esp32-ai idf_tinystories/sweep/line64.conf: '20.8 ms and 60.6 MiB/s on "
           "32-byte lines'"),
    Anchor("64-byte-line head", "research_line64", "head", 14.6, True,
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
#: The four fitted constants, solved jointly from the four fitted anchors; the
#: anchor that mainly determines each is listed (the others move it a little).
FITTED_CONSTANTS = {
    "c_op": ("stock attention",),
    "overlap": ("stock head",),
    "s_line32": ("32-byte-line head",),
    "s_line64": ("64-byte-line head",),
}
#: Constants derived from the fitted ones and a published sub-stage
#: measurement that is not an anchor.
DERIVED_CONSTANTS = {
    "c_mac_i8": "esp32-ai scalar int8 dot at 24.8 M MAC/s from PSRAM, less s_line32 per byte",
    "chain_cycles": "esp32-ai softmax pass, 1.93 ms for 2,520 pairs, less its ops and libm calls",
    "erff_cycles": "esp32-ai PLE stage, 1.5 ms, less everything but its 768 erff calls",
}


def _anchor_ms(an: Anchor, works: Mapping[str, Mapping[str, Work]], f: Fit) -> float:
    w = works[an.build]
    stages = STAGES if an.stage == "total" else (an.stage,)
    return 1e3 * sum(stage_seconds(w[st], f) for st in stages)


def _derived(f: Fit, ple: Work) -> Fit:
    """Fill in the two constants derived from the fitted four: the cost of a
    dependent float op (from esp32-ai's measured softmax pass) and newlib erff
    (from its measured PLE stage, `ple` = that build's PLE work)."""
    pair = SOFTMAX_PAIR_CYCLES - 2 * SOFT_LIBM_CYCLES - SOFTMAX_PAIR_OPS * f.c_op
    f = dataclasses.replace(f, chain_cycles=float(pair / FAST_EXPF_CHAIN_OPS))
    calls = ple.serial.get("erff", 0.0) + ple.split.get("erff", 0.0)
    rest = stage_seconds(ple, dataclasses.replace(f, erff_cycles=0.0))
    return dataclasses.replace(f, erff_cycles=float((RESEARCH_PLE_MS / 1e3 - rest)
                                                    * CPU_HZ / calls))


def fit(s: Shape = RELEASE, positions: Sequence[int] | None = None,
        anchors: Sequence[Anchor] = ANCHORS) -> Fit:
    """Solve the four fitted constants so that the four anchors marked fitted
    are reproduced exactly (Newton's method on a piecewise-linear system,
    started from a plain additive model), the two derived constants following
    along (`_derived`)."""
    import numpy as np

    fitted = [an for an in anchors if an.fitted]
    if len(fitted) != 4:
        raise ArithmeticError(f"{len(fitted)} fitted anchors for four constants")
    works = {an.build: build_work(BUILDS[an.build], s, positions) for an in fitted}
    ple = build_work(BUILDS["research_qact"], s, positions)["ple"]
    target = np.array([an.published_ms for an in fitted])

    def resid(theta: np.ndarray) -> np.ndarray:
        f = _derived(Fit(*theta), ple)
        return np.array([_anchor_ms(an, works, f) for an in fitted]) - target

    theta = np.array([1.0, 0.5e-6, 0.6e-6, 0.5])
    scale = theta.copy()
    for _ in range(60):
        r = resid(theta)
        if np.max(np.abs(r)) < 1e-9:
            break
        jac = np.empty((4, 4))
        for i in range(4):
            d = np.zeros(4)
            d[i] = 1e-6 * scale[i]
            jac[:, i] = (resid(theta + d) - r) / d[i]
        try:
            theta = theta - np.linalg.solve(jac, r)
        except np.linalg.LinAlgError as e:
            raise ArithmeticError("the fitted anchors do not determine the constants") from e
    else:
        raise ArithmeticError(f"fit did not converge (residuals {resid(theta)} ms)")
    out = _derived(Fit(*(float(v) for v in theta)), ple)
    if (min(out.c_op, out.s_line32, out.s_line64, out.c_mac_i8, out.chain_cycles,
            out.erff_cycles) <= 0 or not 0 <= out.overlap <= 1):
        raise ArithmeticError(f"fit gave non-physical constants {out.as_dict()}")
    return out


def fit_stock(s: Shape = RELEASE, positions: Sequence[int] | None = None) -> Fit:
    """Backwards-compatible name of `fit`."""
    return fit(s, positions)
