"""What a draft position costs (`draft_prices`), what the verify loop adds
(`verify_loop_steps`) and what a plain step costs with and without the
certified head (`head_step_ms`): the figures the converter needs of the cost
model (the drafts table's min_odds; whether the drafter and the certificate
pay). The converter reads them as data, tools/mpllm/draft_prices.json, which
`python -m mpllm.costmodel.prices --write` writes from these functions
(`tabulate`) for the shapes the tools know (`TABULATED`); tests/
test_costmodel.py checks that the committed file equals what they give now.
Imports only the package's low modules.
"""

from __future__ import annotations

import dataclasses

from .builds import BUILDS, SPEC_BUILD_MODE
from .calibration import fit
from .passes import Passes
from .s3 import python_loop_s
from .shape import RELEASE, VERIFY_MAX, Shape, story_positions
from .spec_inputs import SpecInputs

__all__ = ["HEAD_ROWS", "TABULATED", "draft_prices", "head_step_ms", "pass_ms", "tabulate",
           "verify_loop_steps", "verify_starts"]


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


def _llama2c(name: str, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, ffn: int,
             vocab: int, seq_len: int) -> list[tuple[str, Shape]]:
    """A llama2.c shape as convert.py writes it (int4 groups of one head row,
    its default: dim rounded up to 32) at each weight format it may choose."""
    from ..formats.align import align_up

    group = align_up(dim, 32)
    return [(f"{name} {w}", Shape(dim=dim, n_layers=n_layers, n_heads=n_heads,
                                  n_kv_heads=n_kv_heads, ffn=ffn, ple_dim=0, vocab_out=vocab,
                                  seq_len=seq_len, group=group, weights=w))
            for w in ("int4", "int8", "fp32")]


#: The shapes draft_prices.json holds: the images of the models the tools know
#: by name (mpllm.models: the demos as convert.py writes them, the release
#: model, llama2.c's stories260K and stories15M at each weight format) and
#: stories42M (llama.SHAPES). Any other shape is priced as the nearest.
TABULATED: list[tuple[str, Shape]] = [
    ("release", RELEASE),
    ("demo", Shape(dim=96, n_layers=6, n_heads=4, ffn=66, ple_dim=128, vocab_out=1500,
                   seq_len=256, group=128)),
    *_llama2c("llama2c-demo", 64, 5, 8, 4, 172, 512, 256),
    *_llama2c("stories260k", 64, 5, 8, 4, 172, 512, 512),
    *_llama2c("stories15m", 288, 6, 6, 6, 768, 32000, 256),
    *_llama2c("stories42m", 512, 8, 8, 8, 1376, 32000, 1024),
]
#: the rows fractions head_step_ms is tabulated at (the converter interpolates)
HEAD_ROWS = [k / 50 for k in range(51)]


def tabulate() -> dict[str, object]:
    """draft_prices.json's content: each TABULATED shape's draft prices, verify
    loop steps and head step ms (at HEAD_ROWS), and the shortest context
    with a verify pass."""
    from ..formats.drafts_table import MAX_DRAFT

    shapes = []
    for name, s in TABULATED:
        has_pass = bool(verify_starts(s))
        cert = [head_step_ms(s, r)[0] for r in HEAD_ROWS]
        shapes.append({
            "name": name,
            "shape": {"dim": s.dim, "n_layers": s.n_layers, "n_heads": s.n_heads,
                      "n_kv_heads": s.n_kv_heads, "ffn": s.ffn, "ple_dim": s.ple_dim,
                      "vocab_out": s.vocab_out, "seq_len": s.seq_len, "group": s.group,
                      "weights": s.weights},
            "min_seq_len": story_positions()[0] + MAX_DRAFT + 1,
            "draft": draft_prices(s) if has_pass else None,
            "loop": list(verify_loop_steps(s)) if has_pass else None,
            "head": {"rows": HEAD_ROWS, "cert_ms": cert,
                     "dense_ms": head_step_ms(s, 1.0)[1]},
        })
    return {"written_by": "python -m mpllm.costmodel.prices --write (mpllm.costmodel.prices."
                          "tabulate): do not edit",
            "build": "mpllm-spec-sampled", "shapes": shapes}


def tabulated_text() -> str:
    """tabulate() as the file holds it."""
    import json

    return json.dumps(tabulate(), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..draft_prices import DATA

    ap = argparse.ArgumentParser(prog="python -m mpllm.costmodel.prices",
                                 description="The converter's figures of the cost model "
                                             f"(draft prices, verify loop, head step) as data: {DATA.name}")
    ap.add_argument("--write", action="store_true", help=f"write {DATA} (else print it)")
    args = ap.parse_args(argv)
    text = tabulated_text()
    if args.write:
        DATA.write_text(text)
        print(f"wrote {DATA} ({len(text):,} bytes)")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
