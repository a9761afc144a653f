"""Convert a model and its tokenizer into one mpllm model image.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img     (or: mpllm-convert)
    python tools/convert.py MODEL.bin TOKENIZER.bin -o OUT.img      (a llama2.c checkpoint)

Two families: the esp32-ai model.bin (magic "PLE") with its tokenizer.json,
and llama2.c checkpoints (legacy v0, v1 fp32, v2 Q8_0; mpllm.formats.llama2c)
with llama2.c's tokenizer.bin, in the weight format --weights names
(mpllm.llama2c_weights: every matrix int4 in groups of --group, int8 in groups
(Q8_0) or fp32; the norms float32, q/k rows permuted for the engine's RoPE).
--weights auto (the default) tries int4, int8, fp32 in that order, measures
each one's teacher-forced greedy agreement with the checkpoint's fp32 forward
(mpllm.llama2c_weights.quality, needs the host engine `_llm`) and keeps the
first that reaches AUTO_AGREEMENT, else the best; the table of what it tried
(agreement, mean |logit difference|, bytes, where the model lives on each
board by the cost model's placement) is printed and stored in the image's
"weights" section.

Steps: validate the tokenizer, read the model (its output vocab must equal the
tokenizer size), drop embedding/PLE rows the tokenizer can never produce, bake
the RoPE table, fingerprint the sources, write the image (atomically), then,
unless --drafter-stories 0, let the model write stories on this PC and store
what it wrote as the image's n-gram drafter (speculative decoding's guesses;
needs the host engine `_llm`) when it pays: its tokens per pass on those
stories (held out) against what a pass costs by the cost model
(mpllm.drafting.payoff; else the drafter is left out, and the output says
so), read the image back and check it equals what
was meant to be written. Bad input exits with status 2 and a one-line
message, and leaves no output file behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .atomic import OutputError, atomic_path, check_output
from .formats.esp32ai import MAGIC_V1, ModelFormatError, read_model_bin
from .formats.head_tiles import MAX_TILE_ROWS, TILE_ROWS, certifiable
from .formats.image import (
    BLOCK_COLS,
    KIND_NAMES,
    MATRIX_KINDS,
    ImageFormatError,
    ImageReport,
    Section,
    TriedFormat,
    WeightsChoice,
    read_image,
    write_image,
)
from .formats.llama2c import MAGIC as LLAMA2C_MAGIC
from .formats.llama2c import (
    CheckpointError,
    Llama2cCheckpoint,
    is_checkpoint,
    load_tokenizer_bin,
    read_checkpoint,
    read_header,
)
from .formats.model import (
    WEIGHT_FORMATS,
    Config,
    F32Matrix,
    Q8Matrix,
    QMatrix,
    Weights,
    weight_format,
)
from .formats.tokenizer import TokenizerFormatError, TokenizerTables
from .llama2c_weights import QUALITY_POSITIONS

if TYPE_CHECKING:
    from .drafting import Payoff
    from .formats.drafts_table import DraftsTable

#: stories the model writes for its drafter when converting from the command
#: line or flash.py (a few seconds for the demo model)
DRAFTER_STORIES = 200
#: --weights: a format, or auto (llama2.c checkpoints: measured, smallest first)
WEIGHTS_CHOICES = ("auto", *WEIGHT_FORMATS)
#: auto keeps the smallest format whose greedy agreement reaches this share
AUTO_AGREEMENT = 0.85


class ConvertError(ValueError):
    """The inputs cannot be converted (message says why)."""


@dataclass
class ConvertReport:
    out: Path
    file_bytes: int
    config: Config  # of the image (vocab_in = rows kept)
    vocab_in_source: int
    rows_dropped: int
    source_sha256: bytes
    sections: list[Section]
    drafts_records: int = 0  # contexts in the n-gram drafter (0: none built)
    drafts_seconds: float = 0.0
    #: why the drafter was left out ("": kept, or none built): what it measured
    #: on the converter's stories and what a pass costs (drafting.Payoff)
    drafter_left_out: str = ""
    #: why the certified head was left out ("": kept, or the image has none):
    #: the share of rows it scored on the drafter's stories and a step's
    #: modeled cost with and without it
    head_left_out: str = ""
    #: the tabulated shape the drafts and the head were priced as when the
    #: image's own has no prices in draft_prices.json ("": its own, or none built)
    priced_as: str = ""
    family: str = "esp32ai"  # "esp32ai" (model.bin + tokenizer.json) or "llama2c"
    checkpoint_version: int = -1  # llama2.c's file version (0, 1, 2); -1 for esp32ai
    certified_head: bool = False  # the image has head tiles (formats.head_tiles)
    #: the image's weight format and what the converter measured choosing it
    weights: str = "int4"
    choice: WeightsChoice = dataclasses.field(default_factory=WeightsChoice)
    #: per format tried: where the model lives on each S3 board (board -> line)
    boards: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    #: int8 images: their matrices' groups in words (int8_groups(); "" otherwise)
    int8_groups: str = ""
    #: formats auto left out unmeasured: their image bytes, over fit_bytes
    too_big: dict[str, int] = dataclasses.field(default_factory=dict)
    fit_bytes: int | None = None

    def size_table(self) -> str:
        return format_size_table(self.sections, self.file_bytes)

    def weights_table(self) -> str:
        """The formats the converter measured: agreement, mean |logit
        difference|, bytes, where the model lives on each board; the chosen
        one marked."""
        if not self.choice.tried:
            return f"weights: {self.weights} (quality not measured)"
        boards = sorted({b for per in self.boards.values() for b in per})
        lines = [(f"weights: teacher-forced greedy agreement with the fp32 forward over "
                 f"{self.choice.positions} positions (auto keeps the smallest >= "
                 f"{100 * AUTO_AGREEMENT:.0f} %, else the best); bytes: the image measured, "
                 "before the drafter and the certified head were settled"),
                 f"  {'format':<7} {'agree':>7} {'mean|diff|':>10} {'bytes':>11}  "
                 + "  ".join(f"{b:<50}" for b in boards)]
        for t in self.choice.tried:
            mark = "*" if t.kind == self.choice.chosen else " "
            where = self.boards.get(t.name, {})
            lines.append(f"{mark} {t.name:<7} {100 * t.agreement:>6.1f}% {t.mean_abs_diff:>10.3g} "
                         f"{t.bytes:>11,}  " + "  ".join(f"{where.get(b, '?'):<50}"
                                                         for b in boards))
        for name, size in self.too_big.items():
            lines.append(f"  {name:<7} {'-':>7} {'-':>10} {size:>11,}  not measured: over the "
                         f"board's model partition ({self.fit_bytes:,} bytes)")
        return "\n".join(lines).rstrip()


def source_fingerprint(model_bytes: bytes, tokenizer_bytes: bytes) -> bytes:
    """sha256(sha256(model.bin) || sha256(tokenizer.json)), as the image header stores it."""
    return hashlib.sha256(hashlib.sha256(model_bytes).digest()
                          + hashlib.sha256(tokenizer_bytes).digest()).digest()


def rows_to_keep(vocab_in: int, tokenizer_size: int) -> int:
    """Embedding/PLE rows the image keeps: every id the tokenizer can produce.

    A tokenizer only produces ids below its size, so rows at or above it are dead weight
    (image_format.h). Rows the tokenizer does use are never dropped."""
    return min(vocab_in, tokenizer_size)


def trim_vocab_rows(weights: Weights, n_rows: int) -> Weights:
    """A copy of `weights` with only the first n_rows embedding and PLE rows."""
    cfg = weights.config
    if n_rows == cfg.vocab_in:
        return weights  # (a llama2.c model has no PLE table to take rows of)
    if not cfg.vocab_out <= n_rows <= cfg.vocab_in:
        raise ValueError(f"cannot keep {n_rows} rows: need vocab_out {cfg.vocab_out} <= rows "
                         f"<= vocab_in {cfg.vocab_in}")
    new_cfg = dataclasses.replace(cfg, vocab_in=n_rows)

    def take(m: QMatrix) -> QMatrix:
        return QMatrix(np.ascontiguousarray(m.q[:n_rows]),
                       np.ascontiguousarray(m.scales[:n_rows]), m.group)

    return Weights(config=new_cfg, tok_emb=take(weights.tok_emb),
                   ple_model_proj=weights.ple_model_proj, ple_proj_norm=weights.ple_proj_norm,
                   ple_table=take(weights.ple_table), layers=weights.layers,
                   out_norm=weights.out_norm, head=weights.head)


def _kind_group(name: str) -> str:
    # "L3.qkv" -> "L*.qkv": per-layer sections are summed per kind so the table stays short.
    if name.startswith("L") and "." in name and name[1:name.index(".")].isdigit():
        return "L*." + name.split(".", 1)[1]
    return name


def format_size_table(sections: list[Section], file_bytes: int) -> str:
    groups: dict[str, list[Section]] = {}
    for s in sections:
        groups.setdefault(_kind_group(s.name), []).append(s)
    payload = sum(s.size for s in sections)
    overhead = file_bytes - payload
    lines = [f"{'section':<18} {'kind':<9} {'count':>5} {'bytes':>12} {'share':>7}"]
    for name, ss in groups.items():
        size = sum(s.size for s in ss)
        lines.append(f"{name:<18} {KIND_NAMES.get(ss[0].kind, '?'):<9} {len(ss):>5} "
                     f"{size:>12,} {100 * size / file_bytes:>6.2f}%")
    lines.append(f"{'header+table+pad':<18} {'':<9} {'':>5} {overhead:>12,} "
                 f"{100 * overhead / file_bytes:>6.2f}%")
    lines.append(f"{'total':<18} {'':<9} {len(sections):>5} {file_bytes:>12,} "
                 f"({file_bytes / 1e6:.3f} MB, {file_bytes / 2**20:.3f} MiB)")
    return "\n".join(lines)


def _raw(m: Q8Matrix | F32Matrix) -> tuple[object, ...]:
    """An int8 or fp32 matrix's exact contents."""
    if isinstance(m, F32Matrix):
        return (np.asarray(m.w, "<f4").tobytes(),)
    return (m.q.tobytes(), np.asarray(m.scales, "<f4").tobytes(), m.group)


def _same_weights(a: Weights, b: Weights) -> str | None:
    """Name of the first tensor that differs, or None."""
    def tensors(w: Weights) -> dict[str, object]:
        d: dict[str, object] = {"embed": w.tok_emb, "ple_model_proj": w.ple_model_proj,
                                "ple_proj_norm": w.ple_proj_norm, "ple_rows": w.ple_table,
                                "out_norm": w.out_norm, "head": w.head}
        for i, layer in enumerate(w.layers):
            for k, v in layer.__dict__.items():
                d[f"L{i}.{k}"] = v
        return d

    ta, tb = tensors(a), tensors(b)
    if a.config != b.config:
        return "config"
    for k, x in ta.items():
        y = tb[k]
        if isinstance(x, (Q8Matrix, F32Matrix)):
            if type(x) is not type(y) or _raw(x) != _raw(y):  # type: ignore[arg-type]
                return k
        elif isinstance(x, QMatrix):
            if not (isinstance(y, QMatrix) and x.group == y.group
                    and np.array_equal(x.q, y.q)
                    and x.scales.tobytes() == np.asarray(y.scales, np.float16).tobytes()):
                return k
        elif x is None or y is None:
            if x is not y:
                return k
        elif np.asarray(x, np.float32).tobytes() != np.asarray(y, np.float32).tobytes():
            return k
    return None


def convert(
    model_bin: str | os.PathLike[str],
    tokenizer_json: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    progress: bool | Callable[[str, int, int], None] = True,
    tile_rows: int = TILE_ROWS,
    drafter_stories: int = 0,
    drafter_always: bool = False,
    group: int | None = None,
    weights: str = "auto",
    quality_positions: int = QUALITY_POSITIONS,
    fit_bytes: int | None = None,
) -> ConvertReport:
    """Convert; raises ConvertError (a ValueError) with a clear message on bad input.

    progress=True shows a tqdm bar on stderr; a callable receives
    (section_name, bytes_done, bytes_total). tile_rows: rows per tile of the certified
    head (native/engine/head.c); 0 stores no certificate (every row is scored).
    drafter_stories: stories the model writes (on this PC, through `_llm`) for
    the self-distilled n-gram drafter; 0 (the default here, not on the command
    line) stores an empty table: the image decodes the same, without guesses.
    A drafter that does not pay (drafting.payoff) is left out the same way
    (the report's drafter_left_out says why), unless drafter_always (tests
    that exercise drafting on models too small for it to pay).
    group: the int4 group a llama2.c checkpoint is quantized to (a multiple of
    32; None: mpllm.llama2c_weights.default_group, one scale per row of the
    head, which the certified head needs); an esp32-ai model.bin keeps the
    group it was quantized with.
    weights: a llama2.c checkpoint's weight format (WEIGHTS_CHOICES; auto:
    measured, see the module doc); an esp32-ai model keeps its int4 (auto or
    int4). quality_positions: positions each format's quality is measured
    over (0: none, which auto cannot do without). fit_bytes: the model
    partition of the board the image is for (flash.py): auto leaves out, unmeasured,
    a format whose image is larger (the report's too_big says which), and
    refuses when none fits."""
    from .formats.rope import rope_table
    from .formats.tokenizer import tokenizer_section

    model_path, tok_path, out = Path(model_bin), Path(tokenizer_json), Path(out)
    if weights not in WEIGHTS_CHOICES:
        raise ConvertError(f"weights {weights!r}: one of {', '.join(WEIGHTS_CHOICES)}")
    if quality_positions < 0:
        raise ConvertError(f"quality_positions {quality_positions}: must be >= 0")
    if group is not None and (group <= 0 or group % BLOCK_COLS):
        raise ConvertError(f"group {group}: must be a positive multiple of {BLOCK_COLS}")
    for p, what in ((model_path, "model"), (tok_path, "tokenizer")):
        if not p.is_file():
            raise ConvertError(f"{what} file not found: {p}")
    try:  # the output first: a bad -o fails at once, not after the work
        check_output(out)
    except OutputError as e:
        raise ConvertError(str(e)) from None
    if out.resolve() in (model_path.resolve(), tok_path.resolve()):
        raise ConvertError(f"output {out} would overwrite an input file")

    tok_bytes = tok_path.read_bytes()
    model_bytes = model_path.read_bytes()
    if is_checkpoint(tok_bytes):  # (read as a tokenizer, its first "token" is absurd)
        raise ConvertError(
            f"{tok_path} is a llama2.c checkpoint, not a tokenizer"
            + (f", and {model_path} is a tokenizer.bin: the model comes first (convert.py "
               "MODEL.bin TOKENIZER.bin -o OUT)" if _is_tokenizer_bin(model_bytes) else ""))
    llama = _is_llama2c(model_bytes, tok_bytes)
    if llama:  # the header first (its sizes against the engine's limits): nothing heavy yet
        try:
            read_header(model_bytes, str(model_path))
        except CheckpointError as e:
            raise ConvertError(str(e)) from None
    tables = _read_tokenizer(tok_path, tok_bytes, llama)
    n_tok = int(tables.vocab_size)
    version = -1
    if llama:
        try:
            ck = read_checkpoint(model_bytes, str(model_path))
        except CheckpointError as e:
            raise ConvertError(str(e)) from None
        if ck.config.vocab_size != n_tok:
            raise ConvertError(
                f"tokenizer size mismatch: {tok_path} has {n_tok} tokens but {model_path}'s "
                f"vocabulary is {ck.config.vocab_size}; they are not from the same model")
        from .llama2c_weights import to_weights

        version = ck.version
        if weights == "auto" and quality_positions == 0:
            raise ConvertError("--weights auto measures each format's quality: it needs "
                               "--quality-positions > 0 (or name a format: --weights int4, "
                               "int8 or fp32)")
        formats = WEIGHT_FORMATS if weights == "auto" else (weights,)
        try:
            candidates = {f: to_weights(ck, group, f) for f in formats}
        except ValueError as e:  # a weight too large for an fp16 scale
            raise ConvertError(f"{model_path}: {e}") from None
        model = candidates[formats[0]]
    else:
        if weights not in ("auto", "int4"):
            raise ConvertError(f"--weights {weights}: an esp32-ai model keeps the int4 weights "
                               "it was trained and quantized with (its model.bin has no float "
                               "weights to make int8 or fp32 from); use --weights int4 or auto")
        try:
            # A v1 header states its output vocab: compare it ourselves for a clearer message.
            expect = None if model_bytes[:4] == MAGIC_V1 else n_tok
            model = read_model_bin(model_bytes, vocab_out=expect)
        except ModelFormatError as e:
            raise ConvertError(f"{model_path}: {e}") from None
        candidates = {"int4": model}
    cfg = model.config
    if cfg.vocab_out != n_tok:
        raise ConvertError(
            f"tokenizer size mismatch: {tok_path} has {n_tok} tokens but {model_path}'s "
            f"output vocab is {cfg.vocab_out}; they are not from the same model")
    if not 0 <= tables.eot_id < n_tok:
        raise ConvertError(f"{tok_path}: end-of-text id {tables.eot_id} is outside the "
                           f"vocabulary")

    keep = rows_to_keep(cfg.vocab_in, n_tok)
    trimmed = trim_vocab_rows(model, keep)
    try:
        tok_section = tokenizer_section(tables)
    except ValueError as e:
        raise ConvertError(f"{tok_path}: {e}") from None
    rope = rope_table(trimmed.config)
    fingerprint = source_fingerprint(model_bytes, tok_bytes)

    bar = None
    callback: Callable[[str, int, int], None] | None
    if progress is True:
        from tqdm import tqdm

        def callback(name: str, done: int, total: int) -> None:
            nonlocal bar
            if bar is None:  # created on the first call, when the total is known
                bar = tqdm(total=total, unit="B", unit_scale=True, desc="convert",
                           file=sys.stderr, leave=False)
            bar.set_postfix_str(name, refresh=False)
            bar.update(done - bar.n)
    else:
        callback = progress or None
    # Write beside the target, verify, then rename: on any failure an existing file at
    # `out` is left exactly as it was.
    if drafter_stories < 0:
        raise ConvertError(f"drafter_stories must be >= 0, not {drafter_stories}")
    drafts = None
    drafts_seconds = 0.0
    left_out = head_left_out = priced_as = ""
    choice, boards = WeightsChoice(), {}
    too_big: dict[str, int] = {}
    with atomic_path(out) as staging:
        def write(w: Weights, drafts: object = None,
                  choice: WeightsChoice | None = None) -> ImageReport:
            return write_image(staging, w, tokenizer_section=tok_section, rope=rope,
                               source_sha256=fingerprint, eot_id=int(tables.eot_id),
                               vocab_in_source=cfg.vocab_in, progress=callback,
                               tile_rows=tile_rows, drafts=drafts,  # type: ignore[arg-type]
                               weights_choice=choice)
        try:
            report = write(trimmed)
        finally:
            if bar is not None:
                bar.close()
        callback = None
        if llama and quality_positions:
            trimmed, choice, boards, too_big = _choose_weights(
                staging, {f: trim_vocab_rows(w, keep) for f, w in candidates.items()}, ck,
                quality_positions, report, write, fit_bytes)
            report = write(trimmed, choice=choice)
        if drafter_stories:
            drafts, worth, drafts_seconds = _build_drafter(staging, drafter_stories,
                                                           progress is True)
            if worth is not None and not worth.priced_exactly:
                priced_as = worth.priced_as
            if worth is not None and not worth.pays:
                left_out = str(worth)
                if drafter_always:
                    drafts, left_out = worth.table, ""
            if (worth is not None and worth.rows_scored is not None and tile_rows > 0
                    and certifiable(trimmed.output_head()) is None):
                head_left_out = _head_left_out(trimmed, worth.rows_scored)
                if head_left_out:
                    tile_rows = 0  # (write() reads it): every row scored, no certificate
            report = write(trimmed, drafts, choice)
        if choice.chosen:
            # the chosen format's row is of the image as written, not as measured:
            # with the certified head left out (the head tiles gone) the core and
            # the KV cache find more room (stories260K at int4: 89 positions on
            # the N8, not 87)
            boards[MATRIX_KINDS[choice.chosen]] = where_on_boards(staging.read_bytes())
        # Reading the finished file back catches any disagreement between writer and
        # reader before the image goes anywhere near a board.
        try:
            back = read_image(staging)
            differs = _same_weights(trimmed, back.weights)
            if differs is None and back.rope.tobytes() != rope.tobytes():
                differs = "rope"
            if differs is None and back.tokenizer_section != tok_section:
                differs = "tokenizer"
            if differs is None and back.weights_choice != choice:
                differs = "weights choice"
        except ImageFormatError as e:
            differs = f"unreadable ({e})"
        if differs is not None:
            raise AssertionError(f"internal error: image read back differs in {differs}")
    return ConvertReport(out=out, file_bytes=report.file_bytes, config=trimmed.config,
                         vocab_in_source=cfg.vocab_in, rows_dropped=cfg.vocab_in - keep,
                         source_sha256=fingerprint, sections=report.sections,
                         drafts_records=drafts.entries if drafts is not None else 0,
                         drafts_seconds=drafts_seconds, drafter_left_out=left_out,
                         head_left_out=head_left_out, priced_as=priced_as,
                         family="llama2c" if llama else "esp32ai", checkpoint_version=version,
                         certified_head=tile_rows > 0
                         and certifiable(trimmed.output_head()) is None,
                         weights=weight_format(trimmed.layers[0].qkv), choice=choice,
                         boards=boards, int8_groups=int8_groups(trimmed), too_big=too_big,
                         fit_bytes=fit_bytes)


def int8_groups(w: Weights) -> str:
    """The groups of an image's int8 matrices in words, for the formats line:
    "in groups of 32" when every one has the converter's own
    (quantize.int8_group), else also which keep a v2 checkpoint's own codes in
    its group (llama2c_weights.own_int8: where the engine takes that group).
    "" when no matrix is int8."""
    from .quantize import int8_group

    mats = {"embed": w.tok_emb, "head": w.head} | {
        name: getattr(w.layers[0], name) for name in ("qkv", "attn_proj", "gate", "up", "down")}
    own: dict[int, list[str]] = {}
    ours = False
    for name, m in mats.items():
        if not isinstance(m, Q8Matrix):
            continue
        if int(m.group) == int8_group(m.cols):
            ours = True
        else:
            own.setdefault(int(m.group), []).append(name)
    if not own:
        return "in groups of 32" if ours else ""
    return ("in groups of " + ", of ".join(f"{g} ({', '.join(names)}: the checkpoint's own "
                                            "codes)" for g, names in sorted(own.items()))
            + (", the rest in groups of 32" if ours else ""))


def where_on_boards(image: bytes) -> dict[str, str]:
    """Where `image` lives on each S3 board (board -> line): the engine's own
    plan of it on the board's memory (boards.where_it_lives), or that it does
    not fit the board's model partition."""
    from .boards import BOARDS, MEMORY, MiB, where_it_lives
    from .checkout import board_module

    plan = board_module("_llm").plan
    return {b: where_it_lives(plan, image, board) if len(image) <= BOARDS[b].model_bytes else
            # where it would live is moot: flash.py refuses the image
            f"does not fit its {BOARDS[b].model_bytes / MiB:g} MiB model partition"
            for b, board in MEMORY.items()}


def _choose_weights(
    staging: Path, candidates: dict[str, Weights], ck: Llama2cCheckpoint, positions: int,
    first: ImageReport, write: Callable[[Weights], ImageReport], fit_bytes: int | None = None,
) -> tuple[Weights, WeightsChoice, dict[str, dict[str, str]], dict[str, int]]:
    """Measure the candidates in order (each written to `staging`; the first
    already is, as `first`), stopping at the first whose greedy agreement
    reaches AUTO_AGREEMENT; the chosen weights (else the best agreement,
    ties to the smaller), the choice record, where each lives on the
    boards (the engine's plan of each candidate's image) and the bytes of
    those left out unmeasured because their image is over `fit_bytes`."""
    from .checkout import NotBuilt, board_module
    from .llama2c_weights import quality

    try:
        _llm = board_module("_llm")  # an install's, else this checkout's build
    except NotBuilt:
        raise ConvertError("measuring the weight formats needs the host engine _llm (pip "
                           "install -e . in the repository), or pass --quality-positions 0 "
                           "with --weights int4, int8 or fp32") from None
    tried: list[TriedFormat] = []
    boards: dict[str, dict[str, str]] = {}
    too_big: dict[str, int] = {}
    chosen = ""
    for k, (fmt, w) in enumerate(candidates.items()):
        rep = first if k == 0 else write(w)
        if fit_bytes is not None and rep.file_bytes > fit_bytes:
            too_big[fmt] = rep.file_bytes  # (the formats after it are larger still)
            continue
        q = quality(staging, ck, _llm, positions)
        # as the image stores them (f32), so the record reads back equal
        tried.append(TriedFormat(KIND_OF[fmt], float(np.float32(q.greedy_agree)),
                                 float(np.float32(q.mean_abs)), rep.file_bytes))
        boards[fmt] = where_on_boards(staging.read_bytes())
        if q.greedy_agree >= AUTO_AGREEMENT:
            chosen = fmt
            break
    if not tried:
        raise ConvertError(
            "no weight format fits the board's model partition (" + f"{fit_bytes:,}"
            + " bytes): " + ", ".join(f"{f} {b:,} bytes" for f, b in too_big.items()))
    if not chosen:  # none reached it: the best (the first of equals: the smallest)
        chosen = max(tried, key=lambda t: t.agreement).name
    choice = WeightsChoice(KIND_OF[chosen], min(positions, ck.config.seq_len), tuple(tried))
    return candidates[chosen], choice, boards, too_big


def _priced_shape(w: Weights) -> dict[str, object]:
    """These weights' shape as draft_prices.prices_for reads it (the engine's config keys)."""
    c = w.config
    return {"dim": c.dim, "n_layers": c.n_layers, "n_heads": c.n_heads, "n_kv_heads": c.kv_heads,
            "ffn": c.ffn, "ple_dim": c.ple_dim, "vocab_out": c.vocab_out, "seq_len": c.seq_len,
            "group": c.group, "weights": weight_format(w.layers[0].qkv)}


def _head_left_out(w: Weights, rows_scored: float) -> str:
    """Why the certified head is left out ("": it saves time): a plain step
    with it, scoring `rows_scored` of the rows (measured on the converter's
    stories), costs no less than with the dense head (the S3 cost model's
    figures as data: draft_prices.json)."""
    from .draft_prices import prices_for

    cert, dense = prices_for(_priced_shape(w)).head_step_ms(rows_scored)
    if cert < dense:
        return ""
    return (f"it scored {100 * rows_scored:.1f} % of its rows on the drafter's stories; a step "
            f"costs {cert:.2f} ms with it, {dense:.2f} ms without (modeled S3)")


#: --weights name -> the section kind of its matrices
KIND_OF = {name: kind for kind, name in MATRIX_KINDS.items()}


def _is_llama2c(model_bytes: bytes, tokenizer_bytes: bytes) -> bool:
    """Whether the model file is a llama2.c checkpoint: "ak42" (v1, v2), or no
    magic and either a legacy v0 header of seven sizes a llama2.c model can
    have or llama2.c's tokenizer.bin beside it (so that a damaged v0 header is
    blamed on the header, not on the tokenizer). Every esp32-ai model.bin
    starts with a "PLE" magic; any other file goes to the esp32-ai reader,
    which names the magic it found."""
    if model_bytes[:4] == struct.pack("<I", LLAMA2C_MAGIC):
        return True
    if model_bytes[:3] == MAGIC_V1[:3]:
        return False
    return is_checkpoint(model_bytes) or _is_tokenizer_bin(tokenizer_bytes)


def _is_tokenizer_bin(data: bytes) -> bool:
    from .formats.llama2c import read_tokenizer_bin

    try:
        read_tokenizer_bin(data)
    except TokenizerFormatError:
        return False
    return True


def _read_tokenizer(path: Path, data: bytes, llama2c: bool) -> TokenizerTables:
    """The tokenizer's tables: tokenizer.bin for a llama2.c model, tokenizer.json
    for an esp32-ai one; each the wrong way round gets its own message."""
    from .formats.tokenizer import parse_tokenizer_json

    if llama2c and data.lstrip()[:1] == b"{":
        raise ConvertError(f"{path} is a tokenizer.json; a llama2.c checkpoint needs "
                           "llama2.c's tokenizer.bin")
    if not llama2c and _is_tokenizer_bin(data):
        raise ConvertError(f"{path} is a llama2.c tokenizer.bin; an esp32-ai model.bin needs "
                           "its tokenizer.json")
    try:
        if llama2c:
            return load_tokenizer_bin(path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerFormatError(f"{path} is not UTF-8: {e}") from None
        return parse_tokenizer_json(text, where=str(path))
    except (ValueError, KeyError, TypeError) as e:
        msg = str(e)
        raise ConvertError(msg if str(path) in msg else f"{path}: {msg}") from None


def _build_drafter(image: Path, n_stories: int, show: bool
                   ) -> tuple[DraftsTable, Payoff | None, float]:
    """The n-gram drafter for the image just written (its model writes the
    stories; empty when it does not pay), what it is worth (drafting.Payoff)
    and the seconds it took."""
    import time

    from .checkout import NotBuilt, board_module
    from .drafting import build_drafts

    try:
        _llm = board_module("_llm")  # an install's, else this checkout's build
    except NotBuilt:
        raise ConvertError("the n-gram drafter needs the host engine _llm (pip install -e . "
                           "in the repository), or pass --drafter-stories 0") from None
    t0 = time.perf_counter()
    if show:
        from tqdm import tqdm

        with tqdm(total=n_stories, desc="drafter", unit="story", file=sys.stderr,
                  leave=False) as bar:
            table, worth = build_drafts(image, n_stories, llm_module=_llm,
                                        progress=lambda k: bar.update(k - bar.n))
    else:
        table, worth = build_drafts(image, n_stories, llm_module=_llm)
    return table, worth, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="convert",
        description="Convert an esp32-ai model.bin and its tokenizer.json, or a llama2.c "
                    "checkpoint (v0, v1 or v2) and its tokenizer.bin, into an mpllm model "
                    "image (the file the engine loads and the flasher writes).")
    ap.add_argument("model_bin", type=Path,
                    help="esp32-ai model.bin, or a llama2.c checkpoint (model.bin)")
    ap.add_argument("tokenizer_json", type=Path, metavar="tokenizer",
                    help="the model's tokenizer.json (esp32-ai) or tokenizer.bin (llama2.c)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="output image file")
    ap.add_argument("--tile-rows", type=int, default=TILE_ROWS, metavar="N",
                    help=f"head rows per certified tile (default {TILE_ROWS}; 0 stores no "
                         "certificate and the engine scores every head row)")
    ap.add_argument("--drafter-stories", type=int, default=DRAFTER_STORIES, metavar="N",
                    help=f"stories the model writes on this PC for its n-gram drafter "
                         f"(speculative decoding's guesses; default {DRAFTER_STORIES}; 0 "
                         "stores none: same stories, no guesses). The drafter is kept only "
                         "where it pays on those stories, the certified head only where it "
                         "saves time there; the output says what was left out and why")
    ap.add_argument("--group", type=int, metavar="N",
                    help=f"llama2.c checkpoints: the int4 group (a multiple of {BLOCK_COLS}; "
                         f"default: dim rounded up to {BLOCK_COLS}, one scale per head row, "
                         "as the certified head needs; 32 quantizes finer and scores every "
                         "head row); an esp32-ai model keeps its own")
    ap.add_argument("--weights", choices=WEIGHTS_CHOICES, default="auto",
                    help="llama2.c checkpoints: the matrices' format: int4 (groups of --group), "
                         "int8 (groups of 32, a row's last group what is left of it: "
                         "llama2.c's runq.c Q8_0; a v2 checkpoint's own codes), fp32 (run.c's numbers), or auto (default: "
                         "the smallest whose greedy agreement with the fp32 forward reaches "
                         f"{100 * AUTO_AGREEMENT:.0f} %%, else the best; needs the host engine "
                         "_llm); an esp32-ai model keeps its int4")
    ap.add_argument("--quality-positions", type=int, default=QUALITY_POSITIONS, metavar="N",
                    help="llama2.c checkpoints: positions each format's quality is measured "
                         "over (the engine against the fp32 forward; needs the host engine "
                         f"_llm; default {QUALITY_POSITIONS}, 0: none, with a named --weights)")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bar, no size table and no quality figure")
    args = ap.parse_args(argv)
    try:
        if not (args.tile_rows == 0 or 1 <= args.tile_rows <= MAX_TILE_ROWS):
            raise ConvertError(f"--tile-rows {args.tile_rows}: must be 0 or 1..{MAX_TILE_ROWS}")
        if args.drafter_stories < 0:
            raise ConvertError(f"--drafter-stories {args.drafter_stories}: must be >= 0")
        if args.quality_positions < 0:
            raise ConvertError(f"--quality-positions {args.quality_positions}: must be >= 0")
        if args.group is not None and (args.group <= 0 or args.group % BLOCK_COLS):
            raise ConvertError(f"--group {args.group}: must be a positive multiple of "
                               f"{BLOCK_COLS}")
        rep = convert(args.model_bin, args.tokenizer_json, args.out, progress=not args.quiet,
                      tile_rows=args.tile_rows, drafter_stories=args.drafter_stories,
                      group=args.group, weights=args.weights,
                      quality_positions=args.quality_positions)
    except (ConvertError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the output is as it was: atomic_path removed its staging file
        print(f"interrupted; {args.out} was not written", file=sys.stderr)
        return 130
    if not args.quiet:
        cfg = rep.config
        source = ("esp32-ai model" if rep.family == "esp32ai"
                  else f"llama2.c checkpoint v{rep.checkpoint_version}")
        print(f"{source}: vocab {rep.vocab_in_source} rows -> {cfg.vocab_in} kept "
              f"({rep.rows_dropped} dropped), vocab_out {cfg.vocab_out}, D {cfg.dim}, "
              f"L {cfg.n_layers}, H {cfg.n_heads}, KV {cfg.kv_heads}, F {cfg.ffn}, "
              f"P {cfg.ple_dim}, S {cfg.seq_len}, "
              # the int4 group: an int8 or fp32 image has none (the formats line
              # below says its groups)
              + (f"group {cfg.group}, " if rep.weights == "int4" else "")
              + f"{'tied' if cfg.tied_head else 'untied'} head")
        print(rep.size_table())
        if rep.family == "llama2c":
            cert = ("the certified head" if rep.certified_head else
                    "no certified head: it would not save time here, see below"
                    if rep.head_left_out else
                    "no certified head: it needs an int4 head with one scale per row")
            fmt = {"int4": f"int4, {cfg.group} columns per fp16 scale",
                   "int8": f"int8 {rep.int8_groups} with f32 scales",
                   "fp32": "fp32"}[rep.weights]
            print(f"formats: every matrix {fmt} ({cert}); norms f32 (D values each); q/k "
                  "rows in split-half RoPE order")
            print(rep.weights_table())
        print(f"fingerprint {rep.source_sha256.hex()}")
        if rep.drafts_records:
            print(f"n-gram drafter: {rep.drafts_records:,} contexts from "
                  f"{args.drafter_stories} stories in {rep.drafts_seconds:.1f} s")
        if rep.drafter_left_out:
            print(f"drafter left out: {rep.drafter_left_out}")
        if rep.head_left_out:
            print(f"certified head left out: {rep.head_left_out}")
        if rep.priced_as:
            print(f"priced as {rep.priced_as}'s shape: the nearest that tools/mpllm/"
                  "draft_prices.json holds (python -m mpllm.costmodel.prices --write adds "
                  "shapes)")
    print(f"wrote {rep.out} ({rep.file_bytes:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
