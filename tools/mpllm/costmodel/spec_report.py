"""The report's speculative builds: one build in verify passes, per generated
token (`spec_entry`), the drafter that minimises it (`_best_draft`), the
speculative builds themselves (`spec_builds`) and their what-ifs
(`spec_variants`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from .bands import SAMPLED_RATIOS_DEFAULT, band
from .builds import BUILDS, SPEC, SPEC_BUILD_MODE, Build
from .passes import Passes
from .s3 import python_loop_s
from .shape import MODEL_STAGES, VERIFY_MAX

__all__ = ["spec_entry", "story_token_loop_ms"]


def story_token_loop_ms(b: Build) -> float:
    """llm.py's loop per story token when decoding in verify passes (its
    per-pass share is in the pass: passes.pass_work), ms on the S3."""
    return 1e3 * python_loop_s("token") if b.python_loop else 0.0
from .spec_inputs import DraftFigures, SpecInputs, UnionRatios
from .sram import MEASURED_CORE_BULK_KIB
from .work import HeadCounts, stage_breakdown, stage_seconds


def _pass_mix(m: float) -> dict[int, float]:
    """Passes of floor(m) and ceil(m) positions with mean m."""
    m = min(max(m, 1.0), float(VERIFY_MAX))
    lo = math.floor(m)
    a = m - lo
    return {lo: 1.0} if a < 1e-12 or lo == VERIFY_MAX else {lo: 1.0 - a, lo + 1: a}


def spec_entry(b: Build, passes: Passes, draft: DraftFigures, union: UnionRatios,
                positions: Sequence[int], *, by_m: bool = False) -> dict[str, object]:
    """One speculative build, in _build_entry's schema (per generated token:
    the pass's time / tokens per pass) plus the pass itself."""
    if not draft.usable:
        raise ValueError(f"drafter {draft.drafter}: no usable drafts per pass ({draft})")
    f, s = passes.f, passes.s
    mix = _pass_mix(draft.positions_per_pass)

    def blend(starts_for: object) -> dict[str, object]:
        stages = dict.fromkeys(MODEL_STAGES, 0.0)
        bd = {st: dict.fromkeys(("memory", "compute", "overlap", "handoffs"), 0.0)
              for st in MODEL_STAGES}
        handoffs = psram = tiles = rows = 0.0
        for m, wt in mix.items():
            starts = starts_for(m)  # type: ignore[operator]
            work = passes.work(b, m, union, starts)
            for st in MODEL_STAGES:
                stages[st] += wt * 1e3 * stage_seconds(work[st], f)
                for k, v in stage_breakdown(work[st], f).items():
                    bd[st][k] += wt * 1e3 * v
            handoffs += wt * sum(w.handoffs for w in work.values())
            psram += wt * sum(w.bytes.get("psram", 0.0) for w in work.values())
            head = passes.head(b, m, union) or HeadCounts.from_fraction(b, s, b.rows_fraction)
            tiles += wt * head.tiles
            rows += wt * head.rows
        return {"stages": stages, "breakdown": bd, "handoffs": handoffs, "psram": psram,
                "tiles": tiles, "rows": rows}

    avg = blend(lambda m: positions)
    end = blend(lambda m: [s.seq_len - m])  # the pass ending at the last position
    tpp = draft.tokens_per_pass
    loop = story_token_loop_ms(b)
    per_tok = {st: v / tpp + (loop if st == "python" else 0.0)
               for st, v in avg["stages"].items()}  # type: ignore[attr-defined]
    total = sum(per_tok.values())
    one = HeadCounts.from_fraction(b, s, b.rows_fraction)
    out: dict[str, object] = {
        "label": b.label, "total_ms": total, "stages": per_tok, "tok_s": 1e3 / total,
        "positions": [positions[0], positions[-1]],
        "handoffs_per_token": avg["handoffs"] / tpp,  # type: ignore[operator]
        "breakdown_ms": {st: {k: v / tpp for k, v in d.items()}
                         for st, d in avg["breakdown"].items()},  # type: ignore[attr-defined]
        "psram_bytes_per_token": avg["psram"] / tpp,  # type: ignore[operator]
        "at_255": {"total_ms": sum(end["stages"].values()) / tpp + loop,  # type: ignore[attr-defined]
                   "stages": {st: v / tpp + (loop if st == "python" else 0.0)
                              for st, v in end["stages"].items()}},  # type: ignore[attr-defined]
        "rows_fraction": b.rows_fraction,
        "tokens_per_pass": tpp, "positions_per_pass": draft.positions_per_pass,
        "drafted_per_pass": draft.drafted_per_pass, "drafter": draft.drafter,
        "accept_rate": draft.accept_rate,
        "pass_ms": sum(avg["stages"].values()),  # type: ignore[attr-defined]
        "pass_stages": avg["stages"], "pass_breakdown_ms": avg["breakdown"],
        "pass_mix": {str(m): wt for m, wt in mix.items()},
        "head_tiles_per_pass": avg["tiles"], "head_rows_per_pass": avg["rows"],
        "head_tiles_per_step": one.tiles,
        "union_ratio": avg["tiles"] / (draft.positions_per_pass * one.tiles),  # type: ignore[operator]
        "union_source": union.source,
    }
    if by_m:
        out["pass_ms_by_m"] = {str(m): passes.ms(b, m, union, positions)
                               for m in range(1, VERIFY_MAX + 1)}
    return out


def _best_draft(b: Build, passes: Passes, drafts: Mapping[str, DraftFigures],
                union: UnionRatios, positions: Sequence[int]
                ) -> tuple[DraftFigures, dict[str, dict[str, float]]]:
    """The drafter with the lowest modelled ms/token, and every drafter's figure."""
    table: dict[str, dict[str, float]] = {}
    for name, d in drafts.items():
        if not d.usable:
            continue
        e = spec_entry(b, passes, d, union, positions)
        table[name] = {"total_ms": float(e["total_ms"]),  # type: ignore[arg-type]
                       "tokens_per_pass": d.tokens_per_pass,
                       "positions_per_pass": d.positions_per_pass,
                       "accept_rate": d.accept_rate}
    if not table:
        raise ValueError("no usable drafter figures")
    best = min(table, key=lambda n: table[n]["total_ms"])
    return drafts[best], table


def spec_builds(ours: Mapping[str, Build], passes: Passes, spec: SpecInputs,
                 positions: Sequence[int], *,
                 sampled_ratios: tuple[float, ...] = SAMPLED_RATIOS_DEFAULT
                 ) -> tuple[dict[str, Build], dict[str, dict[str, object]]]:
    """The speculative builds: our exact builds (their rows fractions) in
    verify passes, each with the best drafter measured for its mode, and its
    band (the same three unknowns, its tokens per pass held)."""
    builds: dict[str, Build] = {}
    entries: dict[str, dict[str, object]] = {}
    for name in SPEC:
        mode = SPEC_BUILD_MODE[name]
        exact = ours["mpllm-exact-" + mode]
        b = dataclasses.replace(BUILDS[name], rows_fraction=exact.rows_fraction)
        union = spec.union[mode]
        best, table = _best_draft(b, passes, spec.drafts[mode], union, positions)
        e = spec_entry(b, passes, best, union, positions, by_m=True)
        e["drafters"] = table
        e["band"], e["band_inputs"] = band(
            b, passes.f, lambda bb, ff, best=best, union=union: float(spec_entry(  # type: ignore[misc]
                bb, passes.with_fit(ff), best, union, positions)["total_ms"]),
            sampled_ratios=sampled_ratios)
        builds[name], entries[name] = b, e
    return builds, entries


def spec_variants(speculative: Mapping[str, Build], entries: Mapping[str, Mapping[str, object]],
                   passes: Passes, spec: SpecInputs, positions: Sequence[int],
                   sram: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """What-ifs of the speculative builds (none of them exists as such)."""
    out: dict[str, dict[str, object]] = {}

    def add(key: str, b: Build, draft: DraftFigures, union: UnionRatios, note: str) -> None:
        e = spec_entry(b, passes, draft, union, positions)
        out[key] = {"total_ms": e["total_ms"], "stages": e["stages"],
                    "rows_fraction": e["rows_fraction"], "tokens_per_pass": e["tokens_per_pass"],
                    "positions_per_pass": e["positions_per_pass"], "pass_ms": e["pass_ms"],
                    "note": note}

    for name in SPEC:
        mode = SPEC_BUILD_MODE[name]
        b, union = speculative[name], spec.union[mode]
        best = spec.drafts[mode][str(entries[name]["drafter"])]
        short = ("fast " if b.kv == "int8-fast" else "") + "spec " + mode
        add(f"{short}, the whole plan in SRAM", dataclasses.replace(b, spill_stages=()), best,
            union, f"no core in PSRAM (the measured placement streams {MEASURED_CORE_BULK_KIB} KiB once per pass)")
        if mode != "sampled":
            continue
        for other, d in spec.drafts[mode].items():
            if other != best.drafter and d.usable:
                add(f"{short}, drafter {other}", b, d, union,
                    f"{d.tokens_per_pass:.2f} tokens/pass, m {d.positions_per_pass:.2f}")
        add(f"{short}, batch buffers in internal SRAM", dataclasses.replace(b, batch="sram"),
            best, union, "positions 1..7's buffers and the scan's scratch in SRAM (~110 KiB "
            "the plan does not have)")
        add(f"{short}, head scan on one core", dataclasses.replace(b, many_split=False),
            best, union, "llm_head_certify_many without its two lanes (one core scans every tile)")
        nosh = UnionRatios({k: 1.0 for k in range(2, VERIFY_MAX + 1)}, union.rows,
                           source="no sharing")
        add(f"{short}, no tile shared between positions", b, best, nosh,
            "pessimistic bound: a pass fetches m steps' tiles (capped at all 199)")
        rel = spec.union_release.get(mode)
        if rel is not None and rel.tiles:
            add(f"{short}, the release-shaped random head's union", b, best, rel,
                "union and rows ratios measured on the release-shaped random model")
    for mode, rows in spec.adaptive.items():
        name = f"mpllm-spec-{mode}"
        base, union = speculative[name], spec.union[mode]
        usable = [d for d in rows if d.usable]
        if not usable:
            continue
        whatifs = [("", base)]
        if mode == "sampled":
            whatifs += [(" + batch buffers in SRAM", dataclasses.replace(base, batch="sram")),
                        (" + batch buffers in SRAM, head scan on one core",
                         dataclasses.replace(base, batch="sram", many_split=False))]
        for extra, b in whatifs:
            d = min(usable, key=lambda x, b=b: float(spec_entry(b, passes, x, union,
                                                                 positions)["total_ms"]))
            add(f"spec {mode}, adaptive draft{extra}", b, d, union,
                f"the n-gram threshold and cap the model picks, {d.drafter}: "
                f"{d.tokens_per_pass:.2f} tokens/pass, m {d.positions_per_pass:.2f}")
            out[f"spec {mode}, adaptive draft{extra}"]["drafter"] = d.drafter
    return out
