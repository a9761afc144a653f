"""A board's own A/B report (`bench.py --port PORT --ab --json AB.json`) read
back: the fill/compute overlap fitted from the board's stage times
(`overlap_from_stages`) and the model refitted with it (`refit`).

The model prices a stage as (work.stage_breakdown)

    T = memory + compute + hand-offs - overlap * H,   H = min(M_split, C_split) / 2

where M_split and C_split are the line fills and the compute of the work the
two cores share. Only the overlap is unknown once the rest is priced, so each
stage a board timed with H > 0 (attention and the head) gives one equation
overlap * H = memory + compute + hand-offs - T_measured, and the fit is their
least-squares solution, sum(H (base - T)) / sum(H^2), over the stages of the
greedy and the sampled runs. The work is the board's own: its image's shape,
the positions its runs decoded and the head rows its certified head scored
(counted by the engine). The calibration's overlap (`calibration.fit`,
fitted on esp32-ai's stock head) is replaced; every other constant stays.

A fitted overlap outside [0, 1] is no overlap (the host's stages are not an
S3's): it is reported as fitted and flagged, and the refit prices with it
clamped to [0, 1].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .builds import BUILDS
from .calibration import fit
from .forward import build_work, predict
from .shape import RELEASE, STAGES, Shape, story_positions
from .work import Fit, stage_breakdown

__all__ = ["AB_BUILDS", "AB_KEYS", "AB_SWITCH_KEYS", "ab_overlap", "overlap_from_stages", "refit",
           "refit_summary"]

#: The build whose work prices a mode's runs.
AB_BUILDS = {"greedy": "mpllm-exact-greedy", "sampled": "mpllm-exact-sampled"}
#: The keys of bench.py --ab's JSON (tools/mpllm/board/bench_ab.py writes it).
AB_KEYS = ("kind", "version", "board", "build_info", "config", "memory", "tokens", "rounds",
           "rows_hashed", "runs", "switches", "baseline", "overlap", "measurements")
#: The keys of each entry of its "switches".
AB_SWITCH_KEYS = ("status", "why", "same_output", "off", "on", "ratio", "overlap")


def overlap_from_stages(modes: Mapping[str, Mapping[str, object]],
                        shape: Shape, base: Fit | None = None) -> dict[str, object]:
    """The overlap that best explains a board's stage times. `modes` maps
    "greedy" / "sampled" to {"stage_ms": {stage: ms per token},
    "positions": [positions decoded], "rows_fraction": share of head rows
    scored (None: the build's)}. Returns {"value", "physical", "stages":
    [{mode, stage, measured_ms, base_ms, hideable_ms, implied}]}."""
    f = base or fit()
    num = den = 0.0
    rows = []
    for mode, m in modes.items():
        if mode not in AB_BUILDS:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(AB_BUILDS)}")
        b = BUILDS[AB_BUILDS[mode]]
        fr = m.get("rows_fraction")
        if fr is not None:
            b = dataclasses.replace(b, rows_fraction=float(fr))  # type: ignore[arg-type]
        positions = [int(p) for p in m["positions"]]  # type: ignore[union-attr]
        work = build_work(b, shape, positions)
        stage_ms = m["stage_ms"]
        whole = dataclasses.replace(f, overlap=1.0)
        for st in STAGES:
            bd = stage_breakdown(work[st], f)
            hide = -stage_breakdown(work[st], whole)["overlap"]  # min(M, C) / CORES
            if hide <= 0.0:
                continue
            base_s = bd["memory"] + bd["compute"] + bd["handoffs"]
            t = float(stage_ms[st]) / 1e3  # type: ignore[index]
            num += hide * (base_s - t)
            den += hide * hide
            rows.append({"mode": mode, "stage": st, "measured_ms": 1e3 * t,
                         "base_ms": 1e3 * base_s, "hideable_ms": 1e3 * hide,
                         "implied": (base_s - t) / hide})
    if den == 0.0:
        raise ValueError("no stage with work shared by the two cores: nothing fits the overlap")
    value = num / den
    return {"value": value, "physical": 0.0 <= value <= 1.0, "stages": rows}


def ab_overlap(modes: Mapping[str, Mapping[str, object]],
               config: Mapping[str, object]) -> dict[str, object]:
    """What `bench.py --ab` reports as its overlap (bench_ab.ab_report's
    `overlap`, handed in by bench.py's command line): `overlap_from_stages` on
    the shape of the image the board ran (its Model.config()), with the
    calibration's overlap beside it ("was")."""
    got = overlap_from_stages(modes, Shape.from_config(config))
    return {**got, "was": fit().overlap}


def _modes_of(ab: Mapping[str, object]) -> dict[str, dict[str, object]]:
    base = ab.get("baseline")
    if not isinstance(base, Mapping) or not base:
        raise ValueError("the A/B report has no baseline (every switch off) stage times")
    return {mode: dict(m) for mode, m in base.items()}  # type: ignore[union-attr]


def refit(ab: Mapping[str, object], base: Fit | None = None) -> tuple[Fit, dict[str, object]]:
    """The calibrated constants with the overlap refitted from an A/B report's
    baseline stage times (its every-switch-off runs), and the fit's detail.
    ValueError on a report of another kind or version."""
    if ab.get("kind") != "mpllm-ab" or ab.get("version") != 1:
        raise ValueError(f"not a bench.py --ab report (kind {ab.get('kind')!r}, version "
                         f"{ab.get('version')!r}; expected 'mpllm-ab', 1)")
    missing = [k for k in AB_KEYS if k not in ab]
    if missing:
        raise ValueError(f"the A/B report lacks {', '.join(missing)}")
    f = base or fit()
    shape = Shape.from_config(ab["config"])  # type: ignore[arg-type]
    got = overlap_from_stages(_modes_of(ab), shape, f)
    used = min(1.0, max(0.0, float(got["value"])))  # type: ignore[arg-type]
    return dataclasses.replace(f, overlap=used), {**got, "used": used, "was": f.overlap}


def refit_summary(ab: Mapping[str, object],
                  positions: Sequence[int] | None = None) -> dict[str, object]:
    """What the refit moves: the overlap, and our exact builds' modeled ms per
    token at the release shape (positions 4..203) before and after."""
    before = fit()
    after, detail = refit(ab, before)
    pos = list(positions if positions is not None else story_positions())
    priced = {}
    for mode, name in AB_BUILDS.items():
        b = BUILDS[name]
        priced[mode] = {"before_ms": predict(b, before, RELEASE, pos)["total"],
                        "after_ms": predict(b, after, RELEASE, pos)["total"]}
    return {"board": ab.get("board"), "overlap": detail, "release_ms": priced}
