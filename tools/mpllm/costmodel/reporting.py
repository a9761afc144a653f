"""The report: every anchor's build and ours predicted (`report`), the table
and JSON (`Report`), the what-ifs of our builds (`_variants`) and the
plot (`plot`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from .bands import (
    BAND_UNKNOWNS,
    DEMO_TOPK_RATIO,
    RANDOM_TOPK_RATIO,
    SAMPLED_RATIOS_DEFAULT,
    band,
)
from .builds import (
    BUILDS,
    FAST_TARGET_MS,
    OURS,
    SPEC,
    SPEC_BUILD_MODE,
    SPEC_TARGET_MS,
    UPSTREAM,
    Build,
)
from .calibration import (
    ANCHORS,
    DERIVED_CONSTANTS,
    FITTED_CONSTANTS,
    PINNED_CONSTANTS,
    Anchor,
    anchor_stages,
    fit,
)
from .engine_bytes import formula_per_token, placement_from_memory
from .forward import build_work
from .host import HeadFractions, Measured
from .passes import Passes
from .s3 import (
    CODE_BYTES_ENGINE,
    HANDOFF_S,
    HANDOFF_SEMAPHORE_S,
    HANDOFF_SPIN_S,
    ICACHE_BYTES_OURS,
    PY_LOOP_COUNTS,
    PY_LOOP_WALL_STEP_S,
    python_loop_s,
)
from .shape import MODEL_STAGES, RELEASE, STAGES, Shape, story_positions
from .spec_inputs import SpecInputs
from .spec_report import spec_builds, spec_variants
from .sram import MEASURED_CORE_BULK_KIB, MEASURED_PLACEMENT, sram_plan
from .work import Fit, HeadCounts, Work, scale_memory, stage_breakdown, stage_seconds

__all__ = ["EXACT_TARGETS_MS", "Report", "anchor_reuse", "bus_split", "hiding_needed",
           "overlap_needed", "plot", "report"]

#: the issue's targets (ms/token, modeled): build -> (mid at most, high at most)
EXACT_TARGETS_MS = {"mpllm-exact-sampled": (12.0, 13.3), "mpllm-exact-greedy": (11.5, None)}


@dataclass
class Report:
    fit: Fit
    anchors: list[dict[str, object]]
    builds: dict[str, dict[str, object]]
    variants: dict[str, dict[str, object]]
    fractions: HeadFractions
    sram: dict[str, object]
    measured: Measured | None
    positions: list[int]
    spec: SpecInputs | None = None
    #: our exact builds with the port's charges added one at a time (`port_charges`)
    charges: dict[str, list[dict[str, object]]] = dataclasses.field(default_factory=dict)

    @property
    def predictions(self) -> dict[str, dict[str, float]]:
        """build -> stage/total -> ms (every build in the report)."""
        return {n: {**b["stages"], "total": b["total_ms"]}  # type: ignore[dict-item]
                for n, b in self.builds.items()}

    def table(self) -> str:
        f = self.fit
        lines = [
            ("ESP32-S3 N16R8 cost model, per generated token, positions "
             f"{self.positions[0]}..{self.positions[-1]}"),
            (f"pinned (published bus rates): PSRAM line fill {f.s_line32 * 1e6:.3f} us/32 B = "
             f"{f.psram_bps(32) / 2**20:.1f} MiB/s, {f.s_line64 * 1e6:.3f} us/64 B = "
             f"{f.psram_bps(64) / 2**20:.1f} MiB/s"),
            (f"fitted (jointly, on the stock build): C_OP {f.c_op:.3f} cycles/op (stock "
             f"attention), two-core overlap {f.overlap:.2f} (stock head), newlib erff "
             f"{f.erff_cycles:.0f} cycles (stock PLE)"),
            (f"derived: C_MAC_I8 {f.c_mac_i8:.2f} cycles (24.8 M MAC/s scalar dot), dependent "
             f"float op {f.chain_cycles:.2f} cycles (softmax 1.93 ms); hand-off "
             f"{HANDOFF_S * 1e6:.0f} us (esp32-ai, task notify), "
             f"{HANDOFF_SEMAPHORE_S * 1e6:.1f} us (ours, semaphores)"),
            (f"ours on the board: llm.py loop {python_loop_s('step') * 1e3:.2f} ms/token "
             f"({PY_LOOP_COUNTS['step'][0]:,} instructions and {PY_LOOP_COUNTS['step'][1]:.0f} "
             f"data-cache misses counted on the unix port; its wall clock scaled by pystones: "
             f"{PY_LOOP_WALL_STEP_S * 1e3:.2f} ms), code through a "
             f"{ICACHE_BYTES_OURS // 1024} KB instruction cache, core placed as the emulated "
             f"board measured ({MEASURED_PLACEMENT['core_bulk_bytes']:,} B of it in PSRAM)"),
            "",
            f"{'anchor':<24} {'published':>9} {'predicted':>9} {'error':>7}  role",
        ]
        for a in self.anchors:
            role = (f"fitted: {', '.join(a['fitted_on'])}" if a["fitted"] else "held out"
                    if a["held_out"] else f"contains fitted {', '.join(a['reuses'])}")
            lines.append(f"{a['name']:<24} {a['published_ms']:>7.1f}ms {a['predicted_ms']:>7.2f}ms "
                         f"{100 * a['error']:>+6.1f}%  {role}")
        lines += ["", "upstream builds (predicted ms/token):"]
        lines.append(f"{'build':<32}" + "".join(f"{st:>7}" for st in STAGES)
                     + f"{'total':>8}{'band (low-high)':>17}")
        for name in UPSTREAM:
            b = self.builds[name]
            bd = b["band"]
            lines.append(f"{BUILDS[name].label:<32}"
                         + "".join(f"{b['stages'][st]:>7.2f}" for st in STAGES)
                         + f"{b['total_ms']:>8.2f}{bd['low']:>9.2f}-{bd['high']:.2f}")
        lines += ["", "mpllm (ours), before -> after, ms/token:"]
        hdr = f"{'stage':<9}" + "".join(f"{BUILDS[n].label:>21}" for n in OURS)
        lines.append(hdr)
        rows_line = f"{'rows':<9}"
        for n in OURS:
            fr = self.builds[n].get("rows_fraction")
            rows_line += f"{'dense 100 %' if fr is None else f'{100 * fr:.1f} % of rows':>21}"
        lines.append(rows_line)
        for st in (*MODEL_STAGES, "total"):
            lines.append(f"{st:<9}" + "".join(
                f"{self.predictions[n][st]:>21.2f}" for n in OURS))
        lines.append(f"{'band':<9}" + "".join(
            f"{self._band_text(n):>21}" for n in OURS))
        lines.append(f"{'tok/s':<9}" + "".join(
            f"{1e3 / self.predictions[n]['total']:>21.1f}" for n in OURS))
        lines.append(f"{'hand-offs':<9}" + "".join(
            f"{self.builds[n]['handoffs_per_token']:>21.1f}" for n in OURS))
        lines.append(f"{'pos 255':<9}" + "".join(
            f"{self.builds[n]['at_255']['total_ms']:>21.2f}" for n in OURS))
        lines += ["", "variants (ms/token, total):"]
        for name, v in self.variants.items():
            lines.append(f"  {name:<58} {v['total_ms']:>6.2f}  ({v['note']})")
        lines += ["", "what the board's port adds (exact builds, mid, ms/token):"]
        for name, steps in self.charges.items():
            lines.append(f"  {BUILDS[name].label}: " + ", ".join(
                f"{s['charge']} {s['total_ms']:.2f}" for s in steps))
        lines += self._spec_table()
        lines += [""] + [self.target_line(n) for n in EXACT_TARGETS_MS]
        if "mpllm-spec-sampled" in self.builds:
            lines.append(self.spec_target_line())
        sr = self.sram
        ms = sr["measured"]
        lines.append(f"SRAM: the plan needs {sr['need_bytes'] / 1024:.1f} KiB; "
                     f"{sr['free_at_boot_bytes'] / 1024:.1f} KiB free at the REPL (emulated "
                     f"board) less the {sr['reserve_bytes'] / 1024:.0f} KiB reserve -> "
                     f"{sr['left_free_bytes'] / 1024:+.1f} KiB; measured: the engine got "
                     f"{ms['engine_fast_bytes']:,} B, core {ms['core_fast_bytes']:,} B in SRAM "
                     f"and {ms['core_bulk_bytes']:,} B in PSRAM (used by the model)")
        return "\n".join(lines)

    def _band_text(self, name: str) -> str:
        bd = self.builds[name]["band"]
        return f"{bd['low']:.1f}-{bd['high']:.1f}"

    def target_line(self, name: str) -> str:
        """One of the issue's exact targets against the build's band (met or
        not), then what the bus alone takes and the share of the rest that
        would have to hide behind it: for the build, with the whole plan in
        SRAM and with every lever in hand."""
        mid_max, high_max = EXACT_TARGETS_MS[name]
        bd = self.builds[name]["band"]
        ok = bd["mid"] <= mid_max and (high_max is None or bd["high"] <= high_max)
        want = f"mid <= {mid_max:g}" + ("" if high_max is None else f", high <= {high_max:g}")
        line = (f"target: {BUILDS[name].label} mid {bd['mid']:.2f} ms (band {bd['low']:.2f}-"
                f"{bd['high']:.2f}) ({want}: {'met' if ok else 'NOT met'})")
        bus = cast(Mapping[str, float], self.builds[name]["bus"])
        kib = cast(float, self.builds[name]["psram_bytes_per_token"]) / 1024
        mode = "greedy" if BUILDS[name].sampler == "cand-greedy" else "sampled"
        needs = [f"mid {mid_max:g} needs {self._need_text(bus, mid_max)}"]
        for what in ("the whole plan in SRAM", "every lever in hand"):
            v = self.variants[f"{mode}, {what}"]
            needs.append(f"with {what} "
                         + self._need_text(cast(Mapping[str, float], v["bus"]), mid_max))
        return (f"{line}\n  the bus: line fills ({kib:.0f} KiB from PSRAM) and flash reads "
                f"{bus['bus_ms']:.2f} ms at the pinned rates (a lower bound: the bus alone)"
                f"\n  compute, loop and hand-offs {bus['other_ms']:.2f} ms: "
                f"{100 * bus['hidden_ms'] / bus['other_ms']:.0f} % hidden behind line fills "
                f"(the two-core overlap, fitted {self.fit.overlap:.2f}); " + "; ".join(needs))

    def _need_text(self, bus: Mapping[str, float], target_ms: float) -> str:
        """The share of the rest to hide, the overlap that hides it, and the
        token at the ideal overlap (1.00: all that two cores can hide)."""
        ideal = bus["bus_ms"] + bus["other_ms"] - bus["hidden_ms"] / self.fit.overlap
        return (f"{100 * hiding_needed(bus, target_ms):.0f} % (an overlap of "
                f"{overlap_needed(bus, target_ms, self.fit.overlap):.2f}; {ideal:.2f} ms at "
                f"1.00)")

    def spec_target_line(self) -> str:
        """The speculative target (sampled, <= SPEC_TARGET_MS): met, or by how much not."""
        b = self.builds["mpllm-spec-sampled"]
        ms, tpp, m = b["total_ms"], b["tokens_per_pass"], b["positions_per_pass"]
        bd = b["band"]
        head = (f"speculative exact sampled {ms:.2f} ms/token (band {bd['low']:.2f}-"
                f"{bd['high']:.2f}; {b['drafter']}, {tpp:.2f} tokens/pass, m {m:.2f})")
        if ms <= SPEC_TARGET_MS:
            line = f"target: {head} (<= {SPEC_TARGET_MS:g}: met)"
        else:
            need = b["pass_ms"] / SPEC_TARGET_MS  # type: ignore[operator]
            line = (f"target: {head} (<= {SPEC_TARGET_MS:g}: NOT met, {ms - SPEC_TARGET_MS:.2f} "
                    f"ms = {100 * (ms / SPEC_TARGET_MS - 1):.0f} % over; this pass would need "
                    f"{need:.2f} tokens/pass)")
        ad = self.variants.get("spec sampled, adaptive draft")
        if ad is not None:
            ams = float(ad["total_ms"])  # type: ignore[arg-type]
            line += (f"; adaptive draft length ({ad['drafter']}): {ams:.2f} ms ("
                     + ("met" if ams <= SPEC_TARGET_MS else
                        f"NOT met, {ams - SPEC_TARGET_MS:.2f} ms over") + ")")
        fb = self.builds.get("mpllm-fast-sampled")
        if fb is not None:
            fms = float(fb["total_ms"])  # type: ignore[arg-type]
            line += (f"\ntarget: fast (lossy) sampled {fms:.2f} ms/token (speculative, "
                     f"{fb['tokens_per_pass']:.2f} tokens/pass) (<= {FAST_TARGET_MS:g}: "
                     + ("met" if fms <= FAST_TARGET_MS else
                        f"NOT met, {fms - FAST_TARGET_MS:.2f} ms = "
                        f"{100 * (fms / FAST_TARGET_MS - 1):.0f} % over; this pass would need "
                        f"{float(fb['pass_ms']) / FAST_TARGET_MS:.2f} tokens/pass") + ")")
        return line

    def _spec_table(self) -> list[str]:
        names = [n for n in SPEC if n in self.builds]
        if not names:
            return []
        bs = [self.builds[n] for n in names]
        w = 32
        out = ["", ("speculative decoding, verify passes of m positions (drafting and head "
                    "sharing measured on the demo model):"),
               f"{'':<20}" + "".join(f"{BUILDS[n].label:>{w}}" for n in names)]

        def row(label: str, vals: Iterable[str]) -> None:
            out.append(f"{label:<20}" + "".join(f"{v:>{w}}" for v in vals))

        row("drafter", (str(b["drafter"]) for b in bs))
        row("tokens / pass", (f"{b['tokens_per_pass']:.2f}" for b in bs))
        row("m = drafted + 1", (f"{b['positions_per_pass']:.2f}" for b in bs))
        row("head rows / step", (f"{100 * b['rows_fraction']:.1f} %" for b in bs))
        row("head tiles / pass", (f"{b['head_tiles_per_pass']:.1f} (union {b['union_ratio']:.2f})"
                                  for b in bs))
        out.append("one pass (ms):")
        for st in MODEL_STAGES:
            row(f"  {st}", (f"{b['pass_stages'][st]:.2f}" for b in bs))
        row("  pass total", (f"{b['pass_ms']:.2f}" for b in bs))
        row("  hand-offs", (f"{b['handoffs_per_token'] * b['tokens_per_pass']:.1f}" for b in bs))
        out.append("per generated token (ms):")
        for st in (*MODEL_STAGES, "total"):
            row(f"  {st}", (f"{(b['total_ms'] if st == 'total' else b['stages'][st]):.2f}"
                            for b in bs))
        row("  band", (f"{b['band']['low']:.2f}-{b['band']['high']:.2f}" for b in bs))
        row("  tok/s", (f"{b['tok_s']:.1f}" for b in bs))
        row("  pos 255", (f"{b['at_255']['total_ms']:.2f}" for b in bs))
        for n, b in zip(names, bs, strict=True):
            by_m = b.get("pass_ms_by_m", {})
            out.append(f"pass ms by m ({BUILDS[n].label}): "
                       + ", ".join(f"{m} {v:.1f}" for m, v in by_m.items()))
            out.append(f"drafters ({SPEC_BUILD_MODE[n]}): " + "; ".join(
                f"{d} {v['total_ms']:.2f} ms ({v['tokens_per_pass']:.2f} tok/pass, m "
                f"{v['positions_per_pass']:.2f})" for d, v in b.get("drafters", {}).items()))
        if self.spec is not None:
            out.append("union (pass tiles / m steps' tiles, shown as m x ratio; rows ratio):")
            for label, table in (("demo", self.spec.union),
                                 ("release-shaped random", self.spec.union_release)):
                for mode, u in table.items():
                    out.append(f"  {label} {mode} ({u.n_tiles} tiles): " + ", ".join(
                        f"m{m} {m * v:.3f}/{u.rows.get(m, math.nan):.3f}"
                        for m, v in sorted(u.tiles.items())))
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "builds": self.builds,
            "anchors": self.anchors,
            "fit": self.fit.as_dict(),
            "fitted_constants": {k: list(v) for k, v in FITTED_CONSTANTS.items()},
            "pinned_constants": PINNED_CONSTANTS,
            "derived_constants": DERIVED_CONSTANTS,
            "band_unknowns": list(BAND_UNKNOWNS),
            "positions": [self.positions[0], self.positions[-1]],
            "head_fractions": {**dataclasses.asdict(self.fractions),
                               "topk_ratio": self.fractions.topk_ratio,
                               "sampled": self.fractions.sampled},
            "variants": self.variants,
            # the exact sampled build's PSRAM traffic, bytes per generated token
            "psram_bytes_per_token": self.builds["mpllm-exact-sampled"]["psram_bytes_per_token"],
            "charges": self.charges,
            "sram": self.sram,
            "assumptions": {n: list(b.assumptions) for n, b in BUILDS.items()},
            "measured": None if self.measured is None else dataclasses.asdict(self.measured),
            "speculative": None if self.spec is None else _finite(
                {**dataclasses.asdict(self.spec), "target_ms": SPEC_TARGET_MS,
                 "modes": SPEC_BUILD_MODE}),
        }


def _finite(x: object) -> object:
    """JSON-safe: non-finite floats as None, keys as strings."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _build_entry(b: Build, f: Fit, s: Shape, positions: Sequence[int],
                 *, counts: HeadCounts | None = None, pie_calls: Mapping[str, int] | None = None,
                 bound_pie: float | None = None, scale: tuple[float, float] = (1.0, 1.0),
                 sampled_ratios: tuple[float, ...] = SAMPLED_RATIOS_DEFAULT
                 ) -> dict[str, object]:
    works: dict[tuple[Build, tuple[int, ...]], dict[str, Work]] = {}

    def work_of(bb: Build, pos: Sequence[int]) -> dict[str, Work]:
        key = (bb, tuple(pos))
        if key not in works:
            w = build_work(bb, s, pos, pie_calls=pie_calls, counts=counts, bound_pie=bound_pie)
            works[key] = scale_memory(w, *scale) if scale != (1.0, 1.0) else w
        return works[key]

    def one(bb: Build, ff: Fit, pos: Sequence[int]) -> dict[str, float]:
        work = work_of(bb, pos)
        return {st: 1e3 * stage_seconds(work[st], ff) for st in MODEL_STAGES}

    stages = one(b, f, positions)
    work = work_of(b, positions)
    breakdown = {st: stage_breakdown(work[st], f) for st in MODEL_STAGES}
    total = sum(stages.values())
    st255 = one(b, f, [min(255, s.seq_len - 1)])
    ms, inputs = band(b, f, lambda bb, ff: sum(one(bb, ff, positions).values()),
                      sampled_ratios=sampled_ratios)
    out: dict[str, object] = {
        "label": b.label, "total_ms": total, "stages": stages, "tok_s": 1e3 / total,
        "positions": [positions[0], positions[-1]],
        "handoffs_per_token": sum(w.handoffs for w in work.values()),
        "breakdown_ms": {st: {k: 1e3 * v for k, v in parts.items()}
                         for st, parts in breakdown.items()},
        "psram_bytes_per_token": sum(w.bytes.get("psram", 0.0) for w in work.values()),
        "bus": bus_split(breakdown),
        "at_255": {"total_ms": sum(st255.values()), "stages": st255},
        "band": ms, "band_inputs": inputs,
    }
    if b.head == "certified":
        c = counts or HeadCounts.from_fraction(b, s, b.rows_fraction)
        out["rows_fraction"] = c.rows / s.vocab_out
        out["head_tiles"] = c.tiles
        out["head_waves"] = c.waves
    return out


def bus_split(breakdown: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """A token's seconds (per stage: stage_breakdown) split the way the bus
    sees them, in ms: "bus_ms", the line fills and flash reads at the pinned
    rates, which no overlap shortens (a lower bound: the bus alone);
    "other_ms", compute, the loop and hand-offs; "hidden_ms",
    the part of other_ms the build hides behind line fills (its two-core
    overlap). total = bus + other - hidden."""
    def total(key: str) -> float:
        return 1e3 * sum(b[key] for b in breakdown.values())
    return {"bus_ms": total("memory"), "other_ms": total("compute") + total("handoffs"),
            "hidden_ms": -total("overlap")}


def hiding_needed(bus: Mapping[str, float], target_ms: float) -> float:
    """The share of a build's other_ms (compute, loop, hand-offs) that must be
    hidden behind its line fills for the token to take target_ms: above 1 no
    overlap can reach it, the bus alone takes longer."""
    return (bus["bus_ms"] + bus["other_ms"] - target_ms) / bus["other_ms"]


def overlap_needed(bus: Mapping[str, float], target_ms: float, fitted: float) -> float:
    """The two-core overlap (Fit.overlap: the share of the ideal a build
    achieves, fitted on the stock head) at which a build priced at `fitted`
    would take target_ms: its hidden time is linear in the overlap. Above 1
    the two cores cannot get there by overlap alone."""
    return fitted * (bus["bus_ms"] + bus["other_ms"] - target_ms) / bus["hidden_ms"]


def _same_work(a: Work, b: Work) -> bool:
    """Two stages with the same cost drivers (to 1e-9): one of them priced
    again is no prediction of the other."""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)

    def close(x: object, y: object) -> bool:
        if isinstance(x, dict) and isinstance(y, dict):
            keys = set(x) | set(y)
            return all(close(x.get(k, 0.0), y.get(k, 0.0)) for k in keys)
        return math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12)  # type: ignore[arg-type]

    return close(da, db)


def anchor_reuse(anchors: Sequence[Anchor] = ANCHORS,
                 positions: Sequence[int] | None = None) -> dict[str, list[str]]:
    """Per anchor, the fitted anchors whose stage work its figure contains
    (checked from the work, not from the names: a build identical in a stage
    to a fitted one reuses it)."""
    pos = list(positions if positions is not None else story_positions())
    works = {n: build_work(BUILDS[n], RELEASE, pos) for n in {an.build for an in anchors}}
    fitted = [(an, works[an.build][an.stage]) for an in anchors if an.fitted]
    out: dict[str, list[str]] = {}
    for an in anchors:
        out[an.name] = sorted({fa.name for st in anchor_stages(an) for fa, fw in fitted
                               if fa.name != an.name and _same_work(works[an.build][st], fw)})
    return out


def report(measured: Measured | None = None, fractions: HeadFractions | None = None,
           s: Shape = RELEASE, positions: Sequence[int] | None = None,
           spec: SpecInputs | None = None,
           progress: Callable[[str], None] = lambda what: None) -> Report:
    """Fit on the fitted anchors, predict every anchor's build from its own
    configuration and our builds before/after. `measured` (from measure_host
    on a release-shaped image) supplies our bytes (as a checked scale on the
    formulas) and PIE counts; `fractions` the certified head's rows fractions;
    `spec` (measure_spec, default SpecInputs.default()) the speculative
    builds' drafting, union ratios and many-columns PIE counts. progress(what)
    is told each part as it starts (the whole takes half a minute)."""
    pos = list(positions if positions is not None else story_positions())
    progress("pricing: the fit and upstream's builds")
    f = fit()
    fr = fractions or HeadFractions()
    builds: dict[str, dict[str, object]] = {}
    for name in UPSTREAM:
        builds[name] = _build_entry(BUILDS[name], f, RELEASE, story_positions())
    anchors = []
    reuse = anchor_reuse()
    for an in ANCHORS:
        got = builds[an.build]["total_ms"] if an.stage == "total" else \
            builds[an.build]["stages"][an.stage]  # type: ignore[index]
        anchors.append({"name": an.name, "build": an.build, "stage": an.stage,
                        "published_ms": an.published_ms, "predicted_ms": got,
                        "error": (got - an.published_ms) / an.published_ms,
                        "fitted": an.fitted, "fitted_on": list(an.fitted_on),
                        "held_out": not an.fitted and not reuse[an.name],
                        "reuses": reuse[an.name], "source": an.source})
    pie_calls = measured.pie_per_call if measured and measured.pie_per_call else None
    bound_pie = measured.bound_pie_per_tile if measured else None
    scale = (1.0, 1.0)
    if measured is not None:
        placement = placement_from_memory(measured.memory) if measured.memory else None
        rows = (measured.head_rows_fraction or 1.0) * s.vocab_out
        formula = formula_per_token(s, measured.positions, placement,
                                     head_mode=measured.head_mode, head_rows=rows,
                                     head_ids=measured.head_ids,
                                     head_id_reads=measured.head_id_reads)
        scale = (measured.region_bytes["bulk"] / formula["bulk"] if formula["bulk"] else 1.0,
                 measured.region_bytes["flash"] / formula["flash"] if formula["flash"] else 1.0)
    sampled_fraction = fr.sampled if fr.sampled is not None else fr.greedy
    ours = {"mpllm-before-greedy": BUILDS["mpllm-before-greedy"],
            "mpllm-before-sampled": BUILDS["mpllm-before-sampled"],
            "mpllm-exact-greedy": dataclasses.replace(BUILDS["mpllm-exact-greedy"],
                                                      rows_fraction=fr.greedy),
            "mpllm-exact-sampled": dataclasses.replace(BUILDS["mpllm-exact-sampled"],
                                                       rows_fraction=sampled_fraction)}
    random_ratio = _ratio(fr.random_topk, fr.random_greedy)
    ratios = (fr.topk_ratio if fr.topk_ratio is not None else DEMO_TOPK_RATIO,
              random_ratio if random_ratio is not None else RANDOM_TOPK_RATIO)
    progress("pricing: our builds")
    for name, b in ours.items():
        builds[name] = _build_entry(b, f, s, pos, pie_calls=pie_calls, bound_pie=bound_pie,
                                    scale=scale, sampled_ratios=ratios)
    builds["mpllm-exact-sampled"]["rows_fraction_source"] = (
        "greedy x demo top-40/greedy" if fr.sampled is not None
        else "greedy fraction (no demo top-40 measurement: engine without head_rows)")
    sram = sram_plan(s, memory=measured.memory if measured and measured.memory else None)
    progress("pricing: the variants (each lever alone and together)")
    variants = _variants(ours, f, s, pos, fr, sram, pie_calls, bound_pie, measured)
    sp = spec or SpecInputs.default()
    passes = Passes(f, s, pie_calls=pie_calls, bound_pie=bound_pie, cols_pie=sp.cols_pie,
                     scale=scale)
    progress("pricing: the speculative builds")
    speculative, spec_entries = spec_builds(ours, passes, sp, pos, sampled_ratios=ratios)
    builds.update(spec_entries)
    progress("pricing: the speculative variants")
    variants.update(spec_variants(speculative, spec_entries, passes, sp, pos, sram))
    charges = {n: port_charges(ours[n], f, s, pos, pie_calls, bound_pie, scale)
               for n in ("mpllm-exact-greedy", "mpllm-exact-sampled")}
    return Report(f, anchors, builds, variants, fr, sram, measured, pos, sp, charges)


def port_charges(b: Build, f: Fit, s: Shape, pos: Sequence[int], pie_calls: Mapping[str, int] | None,
             bound_pie: float | None, scale: tuple[float, float]) -> list[dict[str, object]]:
    """Build `b` with what the board's port charges added one at a time (the
    engine alone: free hand-offs, its core all in SRAM, no instruction-cache
    refills, no Python loop; then each of ours; a charge may be 0)."""
    bare = dataclasses.replace(b, python_loop=False, icache_bytes=b.code_bytes,
                               spill_stages=(), handoff_s=0.0)
    steps = [("engine alone", bare),
             ("+ semaphore hand-off", dataclasses.replace(bare, handoff_s=b.handoff_s)),
             ("+ measured placement", dataclasses.replace(bare, handoff_s=b.handoff_s,
                                                          spill_stages=b.spill_stages)),
             ("+ instruction cache", dataclasses.replace(b, python_loop=False)),
             ("+ MicroPython loop", b)]
    out = []
    for label, bb in steps:
        w = build_work(bb, s, pos, pie_calls=pie_calls, bound_pie=bound_pie)
        if scale != (1.0, 1.0):
            w = scale_memory(w, *scale)
        out.append({"charge": label,
                    "total_ms": sum(1e3 * stage_seconds(w[st], f) for st in MODEL_STAGES)})
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _variants(ours: Mapping[str, Build], f: Fit, s: Shape, pos: Sequence[int],
              fr: HeadFractions, sram: Mapping[str, object],
              pie_calls: Mapping[str, int] | None, bound_pie: float | None,
              measured: Measured | None) -> dict[str, dict[str, object]]:
    """Our after-builds at other rows fractions and with the changes that
    would move them (each a what-if, not a build that exists)."""
    out: dict[str, dict[str, object]] = {}

    def add(key: str, b: Build, note: str, counts: HeadCounts | None = None) -> None:
        e = _build_entry(b, f, s, pos, pie_calls=pie_calls, bound_pie=bound_pie, counts=counts)
        out[key] = {"total_ms": e["total_ms"], "stages": e["stages"],
                    "rows_fraction": e.get("rows_fraction"), "bus": e["bus"], "band": e["band"],
                    "note": note}

    g, t = ours["mpllm-exact-greedy"], ours["mpllm-exact-sampled"]
    lo, hi = fr.greedy_range
    add("greedy at 33.2 % rows (8,427 published)", dataclasses.replace(g, rows_fraction=lo),
        "published range, low")
    add("greedy at 34.5 % rows (8,749 published)", dataclasses.replace(g, rows_fraction=hi),
        "published range, high")
    for key, label in (("demo", "demo model"), ("random", "release-shaped random head")):
        for kind, b in (("greedy", g), ("topk", t)):
            val = getattr(fr, f"{key}_{kind}")
            if val is not None:
                add(f"{'greedy' if kind == 'greedy' else 'sampled'} at the {label}'s "
                    f"{100 * val:.1f} %", dataclasses.replace(b, rows_fraction=val),
                    f"engine-measured on the {label}")
    # the placement: the model uses the emulated board's measured one; the
    # whole plan in SRAM is what the plan asks for
    add("greedy, the whole plan in SRAM", dataclasses.replace(g, spill_stages=()),
        f"no core in PSRAM (the measured placement has {MEASURED_CORE_BULK_KIB} KiB there)")
    add("sampled, the whole plan in SRAM", dataclasses.replace(t, spill_stages=()),
        f"no core in PSRAM (the measured placement has {MEASURED_CORE_BULK_KIB} KiB there)")
    # what each exact change of the after-build is worth: the build without it
    add("sampled with the engine's code in flash", dataclasses.replace(
        t, code_bytes=t.code_bytes + CODE_BYTES_ENGINE),
        "no LLM_HOT placement: a token's engine code through the 16 KB instruction cache "
        "(the IRAM it takes, left to the core, not counted)")
    add("sampled with a spinning hand-off", dataclasses.replace(t, handoff_s=HANDOFF_SPIN_S),
        "two counters in internal SRAM, no scheduler (tried; not the port: firmware/README.md)")
    # every known lever at once, the loop gone too: what is left is the bus
    # and the overlap the model fitted (the targets' "bus" lines say why)
    for mode, b in (("greedy", g), ("sampled", t)):
        add(f"{mode}, every lever in hand", dataclasses.replace(
            b, spill_stages=(), handoff_s=HANDOFF_SPIN_S, python_loop=False),
            "the whole plan in SRAM, a spinning hand-off and no MicroPython loop at all")
    add("greedy without the int16 V cache (fp32 V)", dataclasses.replace(g, v_bytes=4),
        "V rows as floats: twice the V traffic, no recompute")
    for mode, b in (("greedy", g), ("sampled", t)):
        add(f"{mode} with the int16 K cache (set_k_dots)", dataclasses.replace(b, k_bytes=2),
            "K rows as int16 dots, rebuilt and RoPE re-applied when read: half the K line "
            "fills, 11 ops an element and a RoPE row from flash per cached row and layer")
    add("fast (lossy) sampled, no drafting", dataclasses.replace(t, kv="int8-fast", v_bytes=1),
        "fast mode's int8 KV cache, one position per pass")
    add("greedy without the four-wide exp/erf/div", dataclasses.replace(g, chain_interleave=1),
        "one element at a time: every dependent float op waits for the previous one")
    add("greedy with 16-byte-aligned KV rows", dataclasses.replace(g, kv_offset=None),
        "KV rows not on line boundaries: a 384-byte row touches 7 lines 3 times in 4")
    add("greedy, every scored row's token id read", dataclasses.replace(g, ids_for_entrants=False),
        "the head before it read ids only for rows that could enter the candidate list")
    add("greedy, waves of 16 tiles", dataclasses.replace(g, wave_tiles=16),
        "the head in waves of 16 tiles after the first instead of its two lanes; same rows "
        "assumed (pruning between waves lost is not modelled)")
    add("sampled, the head in waves of 8 tiles", dataclasses.replace(t, wave_tiles=8),
        "the head before its two lanes: a hand-off per wave of 8 tiles after the first; the "
        "same rows assumed (the lanes scored 0.97x the rows on the demo model at top-40, "
        "1.02x on a random release-shaped head)")
    return out


def plot(rep: Report, path: str | os.PathLike[str]) -> Path:
    """Stacked bars: predicted ms per stage for each build, published totals
    as markers. Written through a temporary file, then renamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..atomic import atomic_path

    names = [*UPSTREAM, *OURS, *(n for n in SPEC if n in rep.builds)]
    preds = rep.predictions
    published = {a["build"]: a["published_ms"] for a in rep.anchors if a["stage"] == "total"}
    fig, ax = plt.subplots(figsize=(11, 5))
    bottom = [0.0] * len(names)
    labels = [textwrap.fill(BUILDS[n].label, 14) for n in names]
    for st in MODEL_STAGES:
        vals = [preds[n][st] for n in names]
        ax.bar(labels, vals, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, n in enumerate(names):
        pub = published.get(n)
        if pub is not None:
            ax.plot([i - 0.4, i + 0.4], [pub, pub], "k--", lw=1.2)
        bd = rep.builds[n]["band"]
        ax.errorbar([i], [bd["mid"]], yerr=[[bd["mid"] - bd["low"]], [bd["high"] - bd["mid"]]],
                    fmt="none", ecolor="black", capsize=3, lw=1)
        ax.annotate(f"{bd['low']:.1f}-{bd['high']:.1f}", (i, bd["high"]),
                    textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_ylabel("ms/token on the S3, modeled (bar: band; dashed: published)")
    ax.set_title("mpllm cost model: per-stage time per generated token")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out
