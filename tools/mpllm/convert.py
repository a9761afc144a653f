"""Convert an esp32-ai model.bin + tokenizer.json into one mpllm model image.

    python tools/convert.py MODEL.bin TOKENIZER.json -o OUT.img     (or: mpllm-convert)

Steps: validate the tokenizer, read model.bin (its output vocab must equal the
tokenizer size), drop embedding/PLE rows the tokenizer can never produce, bake
the RoPE table, fingerprint the sources, write the image (atomically), then,
unless --drafter-stories 0, let the model write stories on this PC and store
what it wrote as the image's n-gram drafter (speculative decoding's guesses;
needs the host engine `_llm`), read the image back and check it equals what
was meant to be written. Bad input exits with
status 2 and a one-line message, and leaves no output file behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import OutputError, atomic_path, check_output
from .formats.esp32ai import MAGIC_V1, ModelFormatError, read_model_bin
from .formats.head_tiles import MAX_TILE_ROWS, TILE_ROWS
from .formats.image import (
    KIND_NAMES,
    ImageFormatError,
    ImageReport,
    Section,
    read_image,
    write_image,
)
from .formats.model import Config, QMatrix, Weights

#: stories the model writes for its drafter when converting from the command
#: line or flash.py (a few seconds for the demo model)
DRAFTER_STORIES = 200


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

    def size_table(self) -> str:
        return format_size_table(self.sections, self.file_bytes)


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
        if isinstance(x, QMatrix):
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
) -> ConvertReport:
    """Convert; raises ConvertError (a ValueError) with a clear message on bad input.

    progress=True shows a tqdm bar on stderr; a callable receives
    (section_name, bytes_done, bytes_total). tile_rows: rows per tile of the certified
    head (native/engine/head.c); 0 stores no certificate (every row is scored).
    drafter_stories: stories the model writes (on this PC, through `_llm`) for
    the self-distilled n-gram drafter; 0 (the default here, not on the command
    line) stores an empty table: the image decodes the same, without guesses."""
    from .formats.rope import rope_table
    from .formats.tokenizer import load_tokenizer, tokenizer_section

    model_path, tok_path, out = Path(model_bin), Path(tokenizer_json), Path(out)
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
    try:
        tables = load_tokenizer(str(tok_path))
    except (ValueError, KeyError, TypeError) as e:
        msg = str(e)
        raise ConvertError(msg if str(tok_path) in msg else f"{tok_path}: {msg}") from None
    n_tok = int(tables.vocab_size)

    model_bytes = model_path.read_bytes()
    try:
        # A v1 header states its output vocab: compare it ourselves for a clearer message.
        expect = None if model_bytes[:4] == MAGIC_V1 else n_tok
        weights = read_model_bin(model_bytes, vocab_out=expect)
    except ModelFormatError as e:
        raise ConvertError(f"{model_path}: {e}") from None
    cfg = weights.config
    if cfg.vocab_out != n_tok:
        raise ConvertError(
            f"tokenizer size mismatch: {tok_path} has {n_tok} tokens but {model_path}'s "
            f"output vocab is {cfg.vocab_out}; they are not from the same model")
    if not 0 <= tables.eot_id < n_tok:
        raise ConvertError(f"{tok_path}: end-of-text id {tables.eot_id} is outside the "
                           f"vocabulary")

    keep = rows_to_keep(cfg.vocab_in, n_tok)
    trimmed = trim_vocab_rows(weights, keep)
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
    with atomic_path(out) as staging:
        def write(drafts: object = None) -> ImageReport:
            return write_image(staging, trimmed, tokenizer_section=tok_section, rope=rope,
                               source_sha256=fingerprint, eot_id=int(tables.eot_id),
                               vocab_in_source=cfg.vocab_in, progress=callback,
                               tile_rows=tile_rows, drafts=drafts)  # type: ignore[arg-type]
        try:
            report = write()
        finally:
            if bar is not None:
                bar.close()
        if drafter_stories:
            drafts, drafts_seconds = _build_drafter(staging, drafter_stories, progress is True)
            callback = None
            report = write(drafts)
        # Reading the finished file back catches any disagreement between writer and
        # reader before the image goes anywhere near a board.
        try:
            back = read_image(staging)
            differs = _same_weights(trimmed, back.weights)
            if differs is None and back.rope.tobytes() != rope.tobytes():
                differs = "rope"
            if differs is None and back.tokenizer_section != tok_section:
                differs = "tokenizer"
        except ImageFormatError as e:
            differs = f"unreadable ({e})"
        if differs is not None:
            raise AssertionError(f"internal error: image read back differs in {differs}")
    return ConvertReport(out=out, file_bytes=report.file_bytes, config=trimmed.config,
                         vocab_in_source=cfg.vocab_in, rows_dropped=cfg.vocab_in - keep,
                         source_sha256=fingerprint, sections=report.sections,
                         drafts_records=drafts.entries if drafts is not None else 0,
                         drafts_seconds=drafts_seconds)


def _build_drafter(image: Path, n_stories: int, show: bool) -> tuple[object, float]:
    """The n-gram drafter for the image just written (its model writes the
    stories), and the seconds it took."""
    import time

    from .drafting import build_drafts

    try:
        import _llm
    except ImportError:
        raise ConvertError("the n-gram drafter needs the host engine _llm (pip install -e . "
                           "in the repository), or pass --drafter-stories 0") from None
    t0 = time.perf_counter()
    if show:
        from tqdm import tqdm

        with tqdm(total=n_stories, desc="drafter", unit="story", file=sys.stderr,
                  leave=False) as bar:
            table = build_drafts(image, n_stories, llm_module=_llm,
                                 progress=lambda k: bar.update(k - bar.n))
    else:
        table = build_drafts(image, n_stories, llm_module=_llm)
    return table, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="convert",
        description="Convert an esp32-ai model.bin and its tokenizer.json into an mpllm model "
                    "image (the file the engine loads and the flasher writes).")
    ap.add_argument("model_bin", type=Path, help="esp32-ai model.bin")
    ap.add_argument("tokenizer_json", type=Path, help="matching tokenizer.json")
    ap.add_argument("-o", "--out", type=Path, required=True, help="output image file")
    ap.add_argument("--tile-rows", type=int, default=TILE_ROWS, metavar="N",
                    help=f"head rows per certified tile (default {TILE_ROWS}; 0 stores no "
                         "certificate and the engine scores every head row)")
    ap.add_argument("--drafter-stories", type=int, default=DRAFTER_STORIES, metavar="N",
                    help=f"stories the model writes on this PC for its n-gram drafter "
                         f"(speculative decoding's guesses; default {DRAFTER_STORIES}; 0 "
                         "stores none: same stories, no guesses)")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bar and no size table")
    args = ap.parse_args(argv)
    try:
        if not (args.tile_rows == 0 or 1 <= args.tile_rows <= MAX_TILE_ROWS):
            raise ConvertError(f"--tile-rows {args.tile_rows}: must be 0 or 1..{MAX_TILE_ROWS}")
        if args.drafter_stories < 0:
            raise ConvertError(f"--drafter-stories {args.drafter_stories}: must be >= 0")
        rep = convert(args.model_bin, args.tokenizer_json, args.out, progress=not args.quiet,
                      tile_rows=args.tile_rows, drafter_stories=args.drafter_stories)
    except (ConvertError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the output is as it was: atomic_path removed its staging file
        print(f"interrupted; {args.out} was not written", file=sys.stderr)
        return 130
    if not args.quiet:
        cfg = rep.config
        print(f"model: vocab {rep.vocab_in_source} rows -> {cfg.vocab_in} kept "
              f"({rep.rows_dropped} dropped), vocab_out {cfg.vocab_out}, D {cfg.dim}, "
              f"L {cfg.n_layers}, H {cfg.n_heads}, F {cfg.ffn}, P {cfg.ple_dim}, "
              f"S {cfg.seq_len}, group {cfg.group}, "
              f"{'tied' if cfg.tied_head else 'untied'} head")
        print(rep.size_table())
        print(f"fingerprint {rep.source_sha256.hex()}")
        if rep.drafts_records:
            print(f"n-gram drafter: {rep.drafts_records:,} contexts from "
                  f"{args.drafter_stories} stories in {rep.drafts_seconds:.1f} s")
    print(f"wrote {rep.out} ({rep.file_bytes:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
