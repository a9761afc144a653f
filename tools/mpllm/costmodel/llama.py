"""llama2.c's TinyStories shapes on the S3's two boards: the shapes
(`SHAPES`), the boards (`S3_BOARDS`: the N16R8 with 8 MB of PSRAM, the N8
without), where the engine puts every block on each (`placement`: the
engine's own open run dry, _llm.plan, on a seeded random image of the shape,
costmodel.plans) and the modeled
ms/token of exact greedy and exact sampled decoding, dense and certified
head, each as a low / mid / high band (`shape_report`).

Nothing here is fitted. The prices are the release model's fit
(calibration.fit: three constants from three stages of esp32-ai's stock
build) and s3's published or measured figures; every llama2.c figure is a
held-out prediction (no llama2.c model has been timed on an S3 here).

What the engine does with a llama2.c image (native/engine/engine_open.c,
native/engine/engine.c), and so what the builds here assume:
  * int4 weights in groups of `group` (convert.py's default: one group a row,
    the dim rounded up to 32; --group 32 is finer). V (and K with
    set_k_dots) is cached as exact int16 dots only when the qkv rows are one
    scale group (engine_open.c place_kv_cache: kv_dots), and the head is
    certified only when its rows are one group (stage_head: certified): at
    group 32 a 64-wide model has two groups a row, so V is cached as floats
    and the head is dense. convert.py's default, the padded width (64 for
    stories260K), makes both possible: the "one group a row" rows below.
  * The KV cache holds n_kv_heads x head_dim (kv_dim) a position and layer,
    for the context the engine was opened with (llm_open_with, Model(...,
    context=N); a Shape's seq_len here): per position and layer a K row of
    floats (or, with set_k_dots, int16 dots) and a V row of int16 dots, float-
    wide when some V row could give dots too wide for int16 (engine_open.c
    v_can_widen, on the image's codes: `v_as_dots` asks the engine), and a
    scale per position; plain mode then places the float V later
    (llm_set_plain: "kv_values").
  * int8 (Q8_0 groups) and fp32 images (convert.py --weights; auto chooses by
    measured quality, CONVERT_FORMATS) cache K and V as floats and score
    every head row (no certificate: it needs int4 rows of one group); their
    matvecs run on the calling core (engine.c matvec_other, head.c
    dense_other), from code outside IRAM (s3.CODE_BYTES_FORMATS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from ..boards import MEMORY, BoardMemory, is_core  # the boards' memory: one place
from .builds import BUILDS, OUR_FORMATS, Build
from .calibration import fit
from .forward import matvec_work, predict
from .plans import engine_plan, whole_plan
from .reporting import port_charges
from .s3 import (
    CODE_BYTES_FORMATS,
    ICACHE_BYTES_N8,
    ICACHE_BYTES_OURS,
    ICACHE_LINE,
    TILE_ROWS,
    python_loop_s,
)
from .shape import (
    MODEL_STAGES,
    Shape,
    cdiv,
    matrices,
    one_group_a_row,
    story_positions,
)
from .sram import (
    SRAM_TOTAL_BYTES,
    core_matrix_bytes,
)
from .work import Fit, Work, stage_seconds

__all__ = [
    "CONVERT_FORMATS",
    "PUBLIC_PORTS",
    "PUBLIC_PORTS_TOK_S",
    "S3_BOARDS",
    "SHAPES",
    "SMALL_HEAD_ROWS",
    "Board",
    "default_context",
    "fitting_context",
    "internal_placement",
    "llama_build",
    "opening_context",
    "placement",
    "shape_report",
    "shape_table",
    "v_as_dots",
    "weights_bytes",
]

#: llama2.c's TinyStories checkpoints (karpathy/llama2.c README, model.py
#: ModelArgs; stories260K: dim 64, 5 layers, 8 heads, 4 kv heads, hidden 172,
#: vocab 512, seq_len 512), int4 in groups of 32 (convert.py --group 32);
#: _variants prices convert.py's default (one group a row) beside it.
SHAPES: dict[str, Shape] = {
    "stories260k": Shape(dim=64, n_layers=5, n_heads=8, n_kv_heads=4, ffn=172, ple_dim=0,
                         vocab_out=512, seq_len=512, group=32),
    "stories15m": Shape(dim=288, n_layers=6, n_heads=6, ffn=768, ple_dim=0, vocab_out=32000,
                        seq_len=256, group=32),
    "stories42m": Shape(dim=512, n_layers=8, n_heads=8, ffn=1376, ple_dim=0, vocab_out=32000,
                        seq_len=1024, group=32),
}

#: The weight formats convert.py offers a shape's checkpoint, its choice
#: first (--weights auto: the smallest format whose teacher-forced greedy
#: agreement with the fp32 forward over 256 positions is >= 85 %, else the
#: best): (format, agreement, mean |logit difference|), as it measured them on
#: llama2.c's stories260K (the tests' ../shared/llama2c/stories260K.bin
#: converted with its defaults: Model.config()["weights_choice"] holds int8
#: and int4, test_costmodel holds them equal; auto stops at int8, so fp32's
#: figure is --weights fp32's). shape_report prices each; a shape not listed
#: is priced at int4 only.
CONVERT_FORMATS: dict[str, tuple[tuple[str, float, float], ...]] = {
    "stories260k": (("int8", 0.8828125, 0.318), ("int4", 0.23828125, 3.15),
                    ("fp32", 1.0, 6.37e-06)),
}

#: The public llama2.c ports on microcontrollers, stories260K with fp32
#: weights, as issue 22 gives them: (port, where, tok/s). "~" figures as given.
PUBLIC_PORTS: tuple[tuple[str, str, float], ...] = (
    ("DaveBben/esp32-llm", "ESP32-S3 with 2 MB PSRAM", 19.1),
    ("BruceLM", "ESP32-S3 (~20)", 20.0),
    ("pico_llama", "RP2350", 19.0),
    ("a WebSocket port", "ESP32-S3 (~33)", 33.0),
)
PUBLIC_PORTS_TOK_S = (17.0, 33.0)


#: Share of head rows the certified head scores on a small llama2.c head, as a
#: band (fast end, mid, slow end). Not measured: no llama2.c head with a
#: certificate exists here. A 512-row head is 4 tiles of 128 rows; the
#: release head's published 33-35 % comes from 199 tiles, where most tiles'
#: bounds fall below the winner's score; with 4 tiles one or two can be
#: skipped at best, so 60-100 % (the issue's suggestion), mid 80 %.
SMALL_HEAD_ROWS = (0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Board(BoardMemory):
    """An S3 board as the placement needs it: its memory (mpllm.boards, the
    facts the product reads too) and its instruction cache."""

    icache_bytes: int = field(kw_only=True)


#: The boards' memory (mpllm.boards.MEMORY) with their instruction caches.
S3_BOARDS: dict[str, Board] = {
    name: Board(**{f.name: getattr(m, f.name) for f in fields(m)}, icache_bytes=icache)
    for name, m, icache in (("n16r8", MEMORY["n16r8"], ICACHE_BYTES_OURS),
                            ("n8", MEMORY["n8"], ICACHE_BYTES_N8))
}


_one_group_a_row = one_group_a_row

#: the engine's regions as a board names them (BULK: PSRAM, or internal SRAM
#: on a board without it)
_WHERE = {"fast": "sram", "flash": "flash"}


def _tps(tok_s: float) -> str:
    """tok/s as the reports print it: whole numbers, but one decimal below 10
    (stories15M's 3.9 read as 4/4/4)."""
    return f"{tok_s:.1f}" if tok_s < 10 else f"{tok_s:.0f}"


def _image_seq_len(s: Shape) -> int:
    """The seq_len of the image `s` is planned on: its llama2.c model's
    (SHAPES) when `s` is one at a shorter context (Model(context=N) of that
    image), else its own."""
    for base in SHAPES.values():
        if dataclasses.replace(base, seq_len=s.seq_len, group=s.group, weights=s.weights) == s:
            return max(base.seq_len, s.seq_len)
    return s.seq_len


def _certified(s: Shape, certified: bool) -> bool:
    """Whether `s`'s image carries a certificate: only an int4 head of one
    scale group a row can (image.py write_image, engine_open.c stage_head)."""
    return certified and s.weights == "int4" and _one_group_a_row(s)


def _plan(s: Shape, board: BoardMemory, *, certified: bool,
          context: int | None = -1) -> dict[str, object]:
    """_llm.plan of `s`'s image on `board` at s.seq_len positions (context
    -1), or at `context` (None: the one Model() chooses)."""
    n = _image_seq_len(s)
    ctx = (0 if s.seq_len == n else s.seq_len) if context == -1 else context
    return engine_plan(s, board, certified=_certified(s, certified), context=ctx, seq_len=n)


def _whole(s: Shape, *, certified: bool, plain: bool = False) -> dict[str, object]:
    """The engine's blocks of `s` with no memory limit (every one in RAM but
    what is always read in place: the embedding, the RoPE table)."""
    n = _image_seq_len(s)
    return whole_plan(s, certified=_certified(s, certified), seq_len=n, plain=plain,
                      context=0 if s.seq_len == n else s.seq_len)


def v_as_dots(s: Shape) -> bool:
    """Whether the engine caches `s`'s V rows as int16 dots: plain mode then
    places their float copy later ("kv_values"); it does not when the rows
    are several scale groups or some row could outgrow int16 dots
    (engine_open.c v_can_widen, on the image's own codes)."""
    return any(b[0] == "kv_values" for b in _whole(s, certified=False, plain=True)["blocks"])  # type: ignore[attr-defined]


def weights_bytes(s: Shape) -> int:
    """The bytes of the weights the engine stages in RAM when it can (the
    core matrices, the norms, the head): what the report calls the weights."""
    return sum(int(b) for n, _r, b in _whole(s, certified=False)["blocks"]  # type: ignore[attr-defined]
               if n in ("head", "norms") or is_core(str(n)))


def placement(s: Shape, board: BoardMemory, *, certified: bool = False) -> dict[str, object]:
    """Where the engine puts every block of `s` on `board`: its own open run
    dry (_llm.plan of a seeded random image of the shape, plans.shape_image)
    against the board's memory (BoardMemory.plan_memory), at s.seq_len
    positions. Returns the blocks with their regions ("sram", "psram",
    "flash"; "none" for every block of a model that does not open), whether
    it opens (if not, "fails_at": what found no memory, as the engine says),
    what is left, whether the head is staged certified and V cached as dots."""
    p = _plan(s, board, certified=certified)
    where = {**_WHERE, "bulk": "psram" if board.psram_bytes else "sram"}
    opens = bool(p["opens"])
    whole = _whole(s, certified=certified)["blocks"]
    # what the engine reads in place whatever the memory (the embedding, a
    # tied head's rows with it, the RoPE table) is no placement: left out
    in_place = {str(n) for n, r, _b in whole if r == "flash"}  # type: ignore[attr-defined]
    if opens:
        blocks = [{"name": n, "bytes": int(b), "region": where[str(r)]}
                  for n, r, b in p["blocks"] if n not in in_place]  # type: ignore[attr-defined]
    else:  # the engine places nothing: what it asks for, placed nowhere
        blocks = [{"name": n, "bytes": int(b), "region": "none"}
                  for n, _r, b in whole if n not in in_place]  # type: ignore[attr-defined]
    by_region: dict[str, int] = {}
    for blk in blocks:
        by_region[str(blk["region"])] = by_region.get(str(blk["region"]), 0) + int(blk["bytes"])
    return {"board": board.name, "opens": opens,
            "fails_at": str(p["why"]).removeprefix("out of memory: no memory for "),
            "blocks": blocks, "by_region": by_region,
            "internal_left": board.engine_room - (by_region.get("sram", 0) if opens else 0),
            "psram_left": (board.psram_bytes - by_region.get("psram", 0)
                           if board.psram_bytes else None),
            "internal_for_engine": board.engine_room,
            "certified": any(b["name"] == "head_tiles" for b in blocks),
            "head_in_place": opens and _region_of_blocks(blocks, "head") == "flash",
            "v_as_dots": v_as_dots(s)}


def _region_of_blocks(blocks: list[dict[str, object]], name: str) -> str:
    return next(str(b["region"]) for b in blocks if b["name"] == name)


def internal_placement(s: Shape, board: BoardMemory, *,
                       certified: bool = False) -> dict[str, object]:
    """Every block the engine asks for in internal SRAM but the optional
    batch and what it always reads in place (what a board without PSRAM
    needs to hold the model), whether or not it fits: "short_by" is how many
    bytes more than the engine may use it takes (0 if it fits)."""
    blocks = [{"name": n, "bytes": int(b), "region": "sram"}
              for n, r, b in _whole(s, certified=certified)["blocks"]  # type: ignore[attr-defined]
              if r != "flash" and n != "batch"]
    need = sum(int(b["bytes"]) for b in blocks)
    avail = board.engine_room
    return {"board": board.name, "opens": need <= avail, "fails_at": "", "blocks": blocks,
            "by_region": {"sram": need}, "internal_left": avail - need, "psram_left": None,
            "internal_for_engine": avail, "short_by": max(0, need - avail),
            "certified": any(b["name"] == "head_tiles" for b in blocks),
            "head_in_place": False, "v_as_dots": v_as_dots(s)}


def _longest(s: Shape, board: BoardMemory, certified: bool, in_ram: bool) -> int:
    """The longest context that the engine's plan opens on `board` (with
    every weight in RAM if `in_ram`: nothing spilled); 0 if none does."""
    def ok(n: int) -> bool:
        p = _plan(dataclasses.replace(s, seq_len=n), board, certified=certified)
        return bool(p["opens"]) and (not in_ram or p["spilled"] == 0)
    lo, hi = 0, s.seq_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fitting_context(s: Shape, board: BoardMemory, *, certified: bool = False) -> int:
    """The longest context (seq_len) at which the model opens on `board` with
    every weight in RAM (none read from flash for want of it); 0 if none."""
    return _longest(s, board, certified, True)


def opening_context(s: Shape, board: BoardMemory, *, certified: bool = False) -> int:
    """The longest context at which the model opens on `board` at all
    (weights that find no RAM read in place from flash); 0 if none does."""
    return _longest(s, board, certified, False)


def default_context(s: Shape, board: BoardMemory, *, certified: bool = False) -> int:
    """The context Model() opens `s`'s image with on `board` with none asked
    (the engine's own choice, llm_bind.c open_fitting); 0 if none opens."""
    return int(_plan(s, board, certified=certified, context=None)["context"])  # type: ignore[call-overload]


NEED_CONTEXTS = (128, 256, 512)


def _region_of(p: dict[str, object], name: str) -> str:
    return next(str(b["region"]) for b in p["blocks"] if b["name"] == name)  # type: ignore[union-attr]


def llama_build(s: Shape, board: Board, p: dict[str, object], *, sampled: bool,
                certified: bool, rows_fraction: float = SMALL_HEAD_ROWS[1]) -> Build:
    """Our exact build (BUILDS' mpllm-exact-*) on a llama2.c shape, placed as
    `p` says: the core's PSRAM and flash bytes per stage, the KV cache and
    head where they went, the board's instruction cache; V cached as dots
    only when qkv rows are one group; a dense head goes through the logits
    and the sampler's full pass (engine.c select_next), as the engine does."""
    base = BUILDS["mpllm-exact-sampled" if sampled else "mpllm-exact-greedy"]
    core = core_matrix_bytes(s)
    spill: dict[str, int] = {}
    flash: dict[str, int] = {}
    for blk in p["blocks"]:  # type: ignore[attr-defined]
        if blk["name"] in core and blk["region"] in ("psram", "flash"):
            into = spill if blk["region"] == "psram" else flash
            st = core[blk["name"]][0]
            into[st] = into.get(st, 0) + int(blk["bytes"])

    def tier(name: str) -> str:
        r = _region_of(p, name)
        if r not in ("sram", "psram", "flash"):
            raise ValueError(f"{name} has no memory in this placement ({r}): nothing to price")
        return r

    cert = certified and bool(p["certified"])
    kw: dict[str, object] = {
        "name": f"{base.name}@{board.name}", "spill_stages": tuple(sorted(spill.items())),
        "flash_stages": tuple(sorted(flash.items())), "kv_tier": tier("kv_cache"),
        "head_tier": tier("head"), "icache_bytes": board.icache_bytes,
        "v_bytes": 2 if p["v_as_dots"] else 4,
        # the image's weight format: every matrix, the head too (convert.py)
        "core": (OUR_FORMATS[s.weights], "sram"), "head_fmt": OUR_FORMATS[s.weights],
        "code_bytes": base.code_bytes + CODE_BYTES_FORMATS[s.weights],
    }
    if cert:
        kw.update(rows_fraction=rows_fraction, label=base.label + ", certified head")
    else:
        kw.update(head="dense", logits="psram" if tier("logits") == "psram" else "sram",
                  sampler="topk-full" if sampled else "argmax-nancheck",
                  label=base.label + ", dense head")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def _band(b: Build, s: Shape, f: Fit, positions: Sequence[int]) -> dict[str, float]:
    """low / mid / high ms from the three unknowns that move a llama2.c
    figure: the head rows (certified: SMALL_HEAD_ROWS), the overlap of split
    line fills with compute (as bands.band_ends), and the instruction cache
    (mid and high: the whole path refetched each token once it outgrows the
    cache, the model's rule; low: only the lines beyond the cache)."""
    rows = SMALL_HEAD_ROWS if b.head == "certified" else (None, None, None)
    overlap = (1.0, f.overlap, max(0.0, 2 * f.overlap - 1.0))
    # int8 and fp32 images: their matvecs are scalar work (fp32: all of it),
    # priced at C_OP, fitted on the stock build's attention, fp32 dot products
    # with one accumulator; the fp32 kernel's eight independent lanes may issue
    # faster, down to one op a cycle (low); the high end mirrors it
    c_op = (f.c_op,) * 3 if s.weights == "int4" else (1.0, f.c_op, 2 * f.c_op - 1.0)
    out = {}
    for i, key in enumerate(("low", "mid", "high")):
        bb = b if rows[i] is None else dataclasses.replace(b, rows_fraction=rows[i])
        if key == "low" and bb.code_bytes > bb.icache_bytes:
            bb = dataclasses.replace(bb, code_bytes=bb.code_bytes - bb.icache_bytes,
                                     icache_bytes=0)
        out[key] = predict(bb, dataclasses.replace(f, overlap=overlap[i], c_op=c_op[i]), s,
                           positions)["total"]
    return out


def _variants(s: Shape, name: str = "") -> list[tuple[str, Shape]]:
    """The shape at its own group, and as convert.py writes it by default,
    one scale group a row (the padded width), where that differs; where
    convert.py's formats are known (CONVERT_FORMATS), its choice first, then
    the others, each labelled with its format and quality; whether V is
    cached as int16 dots is the engine's (v_as_dots)."""
    wide = cdiv(s.dim, 32) * 32
    formats = CONVERT_FORMATS.get(name)
    int4 = f"int4, convert.py --weights int4 --group {s.group}" if formats else \
        f"convert.py --group {s.group}"
    out = [(f"group {s.group} ({int4})", s)]
    if not _one_group_a_row(s):
        label = (f"group {wide} (convert.py's default, one group a row: V as int16 dots, "
                 "certified head possible)") if v_as_dots(dataclasses.replace(s, group=wide)) else (
            f"group {wide} (convert.py's default, one group a row: V as floats, its rows "
            "can outgrow int16 dots; a certificate, unused once the head is read in place)")
        out.append((label, dataclasses.replace(s, group=wide)))
    if not formats:
        return out
    quality = {fmt: f"greedy agreement {100 * a:.1f} %, mean |logit diff| {d:.3g}"
               for fmt, a, d in formats}
    # int4 was measured at convert.py's default group (one group a row)
    label = (f"group {wide} (int4, --weights int4 at convert.py's default group, one group "
             f"a row: V as int16 dots, certified head possible; {quality['int4']})")
    out = [out[0], (label, dataclasses.replace(s, group=wide))]
    others = []
    for k, (fmt, _, _) in enumerate(formats):
        if fmt == "int4":
            continue
        how = "convert.py's default, --weights auto" if k == 0 else f"--weights {fmt}"
        grouped = " in groups of 32 (Q8_0; a 172-wide input's last of 12)" if fmt == "int8" else ""
        others.append((f"{fmt}{grouped} ({how}; {quality[fmt]})",
                       dataclasses.replace(s, weights=fmt, group=wide)))
    return (others + out) if formats[0][0] != "int4" else (out + others)


def _format_what_ifs(name: str, pos: Sequence[int], f: Fit) -> list[dict[str, object]]:
    """What would move an int8 or fp32 figure on the N16R8 (sampled, the
    dense head): its blocks in internal SRAM that the engine cannot put there
    (what-ifs, not placements), and what its matvecs alone cost on one core,
    the floor no placement lowers."""
    out: list[dict[str, object]] = []
    board = S3_BOARDS["n16r8"]
    for fmt, _, _ in CONVERT_FORMATS.get(name, ()):
        if fmt == "int4":
            continue
        s = dataclasses.replace(SHAPES[name], weights=fmt, group=cdiv(SHAPES[name].dim, 32) * 32)
        b = llama_build(s, board, placement(s, board), sampled=True, certified=False)
        kernel = Work()
        for m in matrices(s):
            one = Work()
            matvec_work(one, b, s, m, None)
            kernel.add(one.scaled(m.per_token))
        kernel.lines, kernel.flash_bytes = {}, 0.0  # compute only
        ifs = {"as placed": b, "core in internal SRAM": dataclasses.replace(b, spill_stages=()),
               "core, KV cache and head in internal SRAM": dataclasses.replace(
                   b, spill_stages=(), kv_tier="sram", head_tier="sram", logits="sram")}
        out.append({"weights": fmt, "board": board.name,
                    "tok_s": {k: 1e3 / predict(v, f, s, pos)["total"] for k, v in ifs.items()},
                    "matvec_compute_ms": 1e3 * stage_seconds(kernel, f)})
    return out


def shape_report(name: str, positions: Sequence[int] | None = None) -> dict[str, object]:
    """Every board x group variant x head x decoding mode of shape `name`:
    placement, per-stage ms (mid), band, tok/s; JSON-ready."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: one of {', '.join(SHAPES)}")
    s0 = SHAPES[name]
    pos = list(positions if positions is not None else story_positions())
    f = fit()
    rows: list[dict[str, object]] = []
    places: list[dict[str, object]] = []
    weights = weights_bytes(s0)
    not_priced: list[str] = []
    for board in S3_BOARDS.values():
        if not board.psram_bytes and weights > SRAM_TOTAL_BYTES:
            not_priced.append(f"{board.label}: not priced: the weights alone are {weights:,} B, "
                              f"more than the S3's {SRAM_TOTAL_BYTES // 1024} KB of internal SRAM")
            continue
        for vlabel, s in _variants(s0, name):
            for certified in (False, True):
                if certified and not _one_group_a_row(s):
                    continue
                p = placement(s, board, certified=certified)
                fits_at = fitting_context(s, board, certified=certified)
                opens_at = opening_context(s, board, certified=certified)
                what_if = ""
                if not board.psram_bytes:
                    # priced with every block in internal SRAM; `p` says if it fits
                    priced = internal_placement(s, board, certified=certified)
                    what_if = "everything in internal SRAM"
                else:
                    priced = p
                needs = {} if board.psram_bytes else {
                    n: sum(int(b["bytes"]) for b in internal_placement(
                        dataclasses.replace(s, seq_len=n), board,
                        certified=certified)["blocks"])  # type: ignore[attr-defined]
                    for n in NEED_CONTEXTS if n <= s.seq_len}
                places.append({"board": board.name, "variant": vlabel,
                               "what_if": what_if,
                               "fitting_context": fits_at, "opening_context": opens_at,
                               "internal_needs": needs,
                               "priced_opens": priced["opens"],
                               "short_by": priced.get("short_by"),
                               **{k: v for k, v in p.items() if k != "blocks"},
                               # the head asked for (p's: the route it opens with)
                               "certified": certified, "blocks": p["blocks"]})
                if board.psram_bytes and not priced["opens"]:
                    kv = next(int(b["bytes"]) for b in priced["blocks"]  # type: ignore[attr-defined]
                              if b["name"] == "kv_cache")
                    not_priced.append(
                        f"{board.label}, {vlabel}, {'certified' if certified else 'dense'} head: "
                        f"not priced: it does not open even with the head read from flash "
                        f"(KV cache {kv:,} B)")
                    continue
                # (placement priced, what-if label, shape, positions); a board
                # without PSRAM is also priced as the engine really places the
                # model: at the context Model() opens by default when the
                # seq_len finds no memory (the binding's open_fitting:
                # default_context), at the fastest (the longest with every
                # weight in RAM: nothing read from flash; Model(context=N)),
                # and at the longest that opens (Model(context=N)), the core
                # that finds no RAM read in place from flash
                pricings = [(priced, what_if, s, pos)]
                vweights = weights_bytes(s)
                if not board.psram_bytes and vweights > SRAM_TOTAL_BYTES:
                    # wholly in internal SRAM is no what-if for weights larger than
                    # it: only the engine's own placement below is priced
                    pricings = []
                    if not certified:
                        not_priced.append(
                            f"{board.label}, {vlabel.split(' (')[0]}: everything in internal "
                            f"SRAM not priced: the weights alone are {vweights:,} B, more than "
                            f"the S3's {SRAM_TOTAL_BYTES // 1024} KB of internal SRAM")
                contexts: list[tuple[int, str]] = []
                if not board.psram_bytes and not p["opens"]:
                    default = default_context(s, board, certified=certified)
                    contexts.append((default, "by default" + (", the fastest"
                                                             if default == fits_at else "")))
                    if fits_at not in (0, default):
                        contexts.append((fits_at, "the fastest, asked for"))
                    if opens_at not in (default, fits_at):
                        contexts.append((opens_at, "the longest, asked for"))
                for ctx, how in contexts:
                    if not pos[0] < ctx < s.seq_len:
                        continue
                    s_ctx = dataclasses.replace(s, seq_len=ctx)
                    at = [x for x in pos if x < ctx]
                    label = (f"as the engine places it at context {ctx}, {how} "
                             f"(positions {at[0]}..{at[-1]})")
                    pricings.append((placement(s_ctx, board, certified=certified), label, s_ctx, at))
                for priced, what_if, s_p, pos_p in pricings:
                    for sampled in (False, True):
                        rows.append(_row(s_p, board, vlabel, priced, what_if, pos_p, f,
                                         sampled=sampled, certified=certified,
                                         opens=bool(p["opens"] or s_p is not s),
                                         fails_at=str(p["fails_at"]) if s_p is s else ""))
    return {
        "shape": name, "dims": dataclasses.asdict(s0), "positions": [pos[0], pos[-1]],
        "fit": f.as_dict(), "fitted": False,
        "fitted_on": [],
        "held_out": ("every figure: the constants were fitted on esp32-ai's stock build "
                     "(calibration.FITTED_CONSTANTS) and nothing on a llama2.c model"),
        "python_loop_ms": python_loop_s("step") * 1e3,
        "icache_line": ICACHE_LINE,
        "placements": places, "rows": rows,
        "public_ports": [{"port": n, "where": w, "tok_s": t} for n, w, t in PUBLIC_PORTS],
        "public_range_tok_s": list(PUBLIC_PORTS_TOK_S),
        "boards": {k: dataclasses.asdict(v) for k, v in S3_BOARDS.items()},
        "small_head_rows": list(SMALL_HEAD_ROWS),
        "weights_bytes": weights,
        "not_priced": not_priced,
        "format_what_ifs": _format_what_ifs(name, pos, f),
        "formats": [{"weights": w, "agreement": a, "mean_abs_logit_diff": d,
                     "default": k == 0} for k, (w, a, d) in enumerate(CONVERT_FORMATS.get(name, ()))],
    }


def _row(s: Shape, board: Board, vlabel: str, priced: dict[str, object], what_if: str,
         pos: Sequence[int], f: Fit, *, sampled: bool, certified: bool, opens: bool,
         fails_at: str) -> dict[str, object]:
    """One priced row of shape_report: a board, variant, head and mode."""
    b = llama_build(s, board, priced, sampled=sampled, certified=certified)
    ms = predict(b, f, s, pos)
    band = _band(b, s, f, pos)
    return {
        "board": board.name, "board_label": board.label, "variant": vlabel,
        "group": s.group, "weights": s.weights,
        "head": "certified" if certified else "dense",
        "mode": "sampled (T 0.8, top-40)" if sampled else "greedy",
        "opens": opens, "fails_at": fails_at, "what_if": what_if,
        "priced_opens": priced["opens"], "seq_len": s.seq_len,
        "positions": [pos[0], pos[-1]],
        "charges": [{"charge": str(c["charge"]).replace("measured placement", "placement"),
                     "total_ms": c["total_ms"]}
                    for c in port_charges(b, f, s, pos, None, None, (1.0, 1.0))],
        "stages": {st: ms[st] for st in MODEL_STAGES}, "total_ms": ms["total"],
        "band": band, "tok_s": 1e3 / ms["total"],
        "tok_s_band": {"low": 1e3 / band["high"], "mid": 1e3 / band["mid"],
                       "high": 1e3 / band["low"]},
        "rows_fraction": (list(SMALL_HEAD_ROWS) if certified else None),
        "kv": b.kv_tier, "head_rows_in": b.head_tier,
        "core_psram_bytes": sum(n for _, n in b.spill_stages),
        "core_flash_bytes": sum(n for _, n in b.flash_stages),
        "v_cached_as": "int16 dots" if b.v_bytes == 2 else "floats",
        "head_from_flash": b.head_tier == "flash",
    }


def _placed_summary(rep: dict[str, object]) -> list[str]:
    """One line per board without PSRAM, variant and head: sampled tok/s
    (mid, band) at each context the engine was priced at as it places the
    model (by default, the fastest, the longest)."""
    out: list[str] = []
    seen: dict[tuple[str, str, str], list[str]] = {}
    for r in rep["rows"]:  # type: ignore[attr-defined]
        what = str(r["what_if"])
        if not what.startswith("as the engine places it") or not str(r["mode"]).startswith(
                "sampled"):
            continue
        how = what.split(", ", 1)[1].split(" (positions")[0]
        seen.setdefault((r["board_label"], r["variant"].split(" (")[0], r["head"]), []).append(
            f"context {r['seq_len']} ({how}) {_tps(r['tok_s'])} tok/s "
            f"({_tps(r['tok_s_band']['low'])}-{_tps(r['tok_s_band']['high'])})")
    for (board, variant, head), parts in seen.items():
        out.append(f"{board}, {variant}, {head} head, sampled, as the engine places it: "
                   + "; ".join(parts))
    return out + ([""] if out else [])


def shape_table(rep: dict[str, object]) -> str:
    """The report as text: placements, then per board and variant a table of
    stages x (head, mode)."""
    d = rep["dims"]
    lines = [
        (f"ESP32-S3 cost model, llama2.c {rep['shape']} (dim {d['dim']}, {d['n_layers']} "  # type: ignore[index]
         f"layers, {d['n_heads']} heads, {d['n_kv_heads']} kv heads, hidden {d['ffn']}, "  # type: ignore[index]
         f"vocab {d['vocab_out']:,}, seq_len {d['seq_len']}), per generated token, positions "  # type: ignore[index]
         f"{rep['positions'][0]}..{rep['positions'][1]}"),  # type: ignore[index]
        ("held out: nothing was fitted on a llama2.c model; the prices are the release fit "
         "(C_OP, overlap, erff on esp32-ai's stock build) and s3's published/measured figures; "
         f"llm.py's loop {rep['python_loop_ms']:.2f} ms/token (s3.PY_LOOP_*)"),
        "",
    ]
    for b in S3_BOARDS.values():
        lines.append(f"board {b.label}: {b.internal_free:,} B internal free at the REPL "
                     f"({b.internal_source}); the engine may use {b.engine_room:,} B of it "
                     f"(the port's reserve: {b.fast_reserve // 1024} KiB); instruction cache "
                     f"{b.icache_bytes // 1024} KB")
    lines.append("")
    for p in rep["placements"]:  # type: ignore[attr-defined]
        where = ", ".join(f"{r} {n:,} B" for r, n in sorted(p["by_region"].items()))
        state = ("opens" if p["opens"] else f"does NOT open (no memory for {p['fails_at']})")
        left = f"internal left {p['internal_left']:,} B"
        if p["psram_left"] is not None:
            left += f", PSRAM left {p['psram_left']:,} B"
        short = ("" if not p["short_by"] else f"; everything in internal SRAM needs "
                 f"{p['short_by']:,} B more than the engine may use")
        lines.append(f"placement {p['board']}, {p['variant']}, "
                     f"{'certified' if p['certified'] else 'dense'} head: {state}; {where}; "
                     f"{left}{short}; context that fits with the core in RAM: "
                     f"{p['fitting_context']}; that opens (the core's overflow read from "
                     f"flash): {p['opening_context']}")
        if p["internal_needs"]:
            lines.append(
                "  wholly in internal SRAM (all but the optional batch; Model(context=N)) "
                "needs " + ", ".join(f"{b:,} B at context {n}"
                                      for n, b in p["internal_needs"].items())
                + f" against {p['internal_for_engine']:,} B the engine may use (the board's "
                "free RAM at the REPL as above, less the reserve)")
        big = sorted((blk for blk in p["blocks"]), key=lambda x: -x["bytes"])[:4]
        lines.append("  largest: " + ", ".join(f"{x['name']} {x['bytes']:,} B ({x['region']})"
                                                for x in big))
    lines.append("")
    groups: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for r in rep["rows"]:  # type: ignore[attr-defined]
        groups.setdefault((r["board_label"], r["variant"], r["what_if"]), []).append(r)
    w = 22
    for (board, variant, what_if), rs in groups.items():
        lines.append(f"{board}, {variant}" + (f" [{what_if}]" if what_if else "")
                     + ("" if rs[0]["opens"] else f" -- does NOT open as the engine places it "
                        f"(no memory for {rs[0]['fails_at']})")
                     + ("" if rs[0]["priced_opens"] else ": priced as if it fit"))
        lines.append(f"{'stage':<10}" + "".join(f"{r['head'] + ', ' + r['mode'][:7]:>{w}}"
                                                 for r in rs))
        for st in MODEL_STAGES:
            lines.append(f"{st:<10}" + "".join(f"{r['stages'][st]:>{w}.3f}" for r in rs))
        lines.append(f"{'total':<10}" + "".join(f"{r['total_ms']:>{w}.3f}" for r in rs))
        lines.append(f"{'band ms':<10}" + "".join(
            f"{r['band']['low']:.2f}-{r['band']['high']:.2f}".rjust(w) for r in rs))
        lines.append(f"{'tok/s':<10}" + "".join(
            f"{_tps(r['tok_s_band']['low'])}/{_tps(r['tok_s'])}/{_tps(r['tok_s_band']['high'])}"
            .rjust(w)
            for r in rs) + "   (low/mid/high)")
        lines.append(f"{'KV, head':<10}" + "".join(f"{r['kv'] + ', ' + r['head_rows_in']:>{w}}"
                                                    for r in rs))
        for r in rs:
            lines.append(f"  {r['head']}, {r['mode']}: " + ", ".join(
                f"{c['charge']} {c['total_ms']:.2f}" for c in r["charges"]) + " ms")
        lines.append("")
    lines += _placed_summary(rep)
    for fmt in rep.get("formats", ()):  # type: ignore[attr-defined]
        lines.append(f"weights {fmt['weights']}: greedy agreement {100 * fmt['agreement']:.1f} %, "
                     f"mean |logit diff| {fmt['mean_abs_logit_diff']:.3g} (convert.py, 256 "
                     "positions)" + (": convert.py's default (--weights auto)"
                                     if fmt["default"] else ""))
    for wi in rep.get("format_what_ifs", ()):  # type: ignore[attr-defined]
        lines.append(f"what-if, {wi['weights']} on the {wi['board'].upper()}, dense, sampled "
                     "(internal SRAM holds none of these at once with the rest): "
                     + "; ".join(f"{k} {v:.0f} tok/s" for k, v in wi["tok_s"].items())
                     + f"; its matvecs alone {wi['matvec_compute_ms']:.2f} ms a token on one "
                     "core, whatever the placement")
    lines += rep["not_priced"]  # type: ignore[arg-type]
    if any(r["head"] == "certified" for r in rep["rows"]):  # type: ignore[attr-defined]
        lines.append("certified head rows: " + "/".join(f"{100 * x:.0f}" for x in SMALL_HEAD_ROWS)
                     + f" % (low/mid/high; not measured: {d['vocab_out']:,} rows are "  # type: ignore[index]
                     f"{cdiv(d['vocab_out'], TILE_ROWS)} tiles of {TILE_ROWS})")  # type: ignore[index]
    lo, hi = PUBLIC_PORTS_TOK_S
    lines.append(f"public llama2.c ports, stories260K fp32 ({lo:.0f}-{hi:.0f} tok/s, as issue 22 "
                 "gives them): " + "; ".join(f"{n} {t:g} tok/s ({w})" for n, w, t in PUBLIC_PORTS))
    return "\n".join(lines)
