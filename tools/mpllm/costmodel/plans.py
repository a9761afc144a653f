"""The engine's own placement of a llama2.c shape the cost model prices
without a checkpoint: a seeded random image of that shape, weight format and
group (certified head or not) is built once and cached, and `_llm.plan` (the
engine's open run dry: native/engine/engine_open.c llm_plan_open) says where
every block goes on a board and at which context Model() opens it. No rule
of the placement is repeated here.

Random weights are enough: the plan reads the image's header, its sections'
sizes and checksums, the head's certificate (checked against its rows) and
the V rows' codes (engine_open.c v_can_widen: whether int16 dots can hold
them). The weights are drawn as a trained checkpoint's are spread (normal
rows) and quantized as convert.py quantizes a llama2.c checkpoint
(llama2c_weights.to_weights), so a row's codes are what a real one's are:
a 64-wide row's V dots fit int16, a 288- or 512-wide row's can outgrow them
(a normal row of 288 int4 codes holds ~540 |codes|, past the 258 that
127 x |codes| <= 32767 allows), as on the published stories15M."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..boards import BoardMemory
from .shape import Shape

__all__ = ["engine_plan", "shape_image", "whole_plan"]

#: the seed of every shape's random weights (the same shape, the same bytes)
SEED = 260

#: the vocabulary's first pieces: llama2.c's <unk>, BOS, EOS and byte pieces
_SPECIAL = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]


def _vocab(n: int) -> tuple[list[bytes], list[float]]:
    """n distinct llama2.c pieces (the tokenizer section is read in place
    from flash: its texts move no block of the plan)."""
    texts = _SPECIAL + [f"t{i}".encode() for i in range(n - len(_SPECIAL))]
    return texts, [0.0] * len(_SPECIAL) + [-float(i) for i in range(n - len(_SPECIAL))]


def _checkpoint(s: Shape) -> Any:
    """A llama2.c checkpoint of shape `s`, float32 weights drawn from a
    normal spread (rows of norm ~1, norms near 1), shared classifier as in
    llama2.c's TinyStories models."""
    from ..formats import llama2c

    cfg = llama2c.Llama2cConfig(dim=s.dim, hidden_dim=s.ffn, n_layers=s.n_layers,
                                n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                                vocab_size=s.vocab_out, seq_len=s.seq_len,
                                shared_classifier=True)
    rng = np.random.default_rng(SEED)

    def w(std: float, *shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    layers = {name: w(1.0 / np.sqrt(cfg.matrix_shape(name)[1]), cfg.n_layers,
                      *cfg.matrix_shape(name))
              for name in llama2c.LAYER_MATRICES}
    return llama2c.Llama2cCheckpoint(0, cfg, w(0.1, cfg.vocab_size, cfg.dim),
                                     1 + w(0.1, cfg.n_layers, cfg.dim),
                                     1 + w(0.1, cfg.n_layers, cfg.dim), 1 + w(0.1, cfg.dim),
                                     layers, None)


def _cache_dir() -> Path:
    from ..image_cache import default_cache_dir

    return default_cache_dir() / "plan-images"


#: what writes a shape's image (beside the shape, seed and format version):
#: an edit to any of them writes the images again
_WRITERS = ("formats/image.py", "formats/head_tiles.py", "formats/tokenizer.py",
            "formats/llama2c.py", "quantize.py", "llama2c_weights.py", "costmodel/plans.py")


def _key(s: Shape, certified: bool) -> str:
    from ..formats.image import VERSION

    fields = dataclasses.asdict(s) | {"certified": certified, "seed": SEED, "image": VERSION}
    h = hashlib.sha256(repr(sorted(fields.items())).encode())
    root = Path(__file__).resolve().parents[1]
    for name in _WRITERS:
        h.update((root / name).read_bytes())
    return h.hexdigest()[:16]


@cache
def shape_image(s: Shape, *, certified: bool) -> bytes:
    """The image of a seeded random llama2.c checkpoint of shape `s` (its
    dims, seq_len, weight format and group) as convert.py writes it, with a
    certificate on the head if `certified` (an int4 head of one group a row;
    else none: the engine scores every row). Cached on disk by everything it
    depends on, and in memory."""
    path = _cache_dir() / f"{_key(s, certified)}.img"
    if path.is_file():
        return path.read_bytes()
    from ..formats import llama2c
    from ..formats.head_tiles import TILE_ROWS
    from ..formats.image import write_image
    from ..formats.rope import rope_table
    from ..formats.tokenizer import tokenizer_section
    from ..llama2c_weights import to_weights

    weights = to_weights(_checkpoint(s), s.group, s.weights)
    tables = llama2c.tokenizer_tables(*_vocab(s.vocab_out))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write_image(tmp, weights, tokenizer_section=tokenizer_section(tables),
                    rope=rope_table(weights.config), source_sha256=bytes(32),
                    eot_id=tables.eot_id, tile_rows=TILE_ROWS if certified else 0)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path.read_bytes()


def _llm() -> Any:
    from ..checkout import board_module

    return board_module("_llm")


@cache
def _planned(s: Shape, certified: bool, context: int | None, plain: bool,
             memory: tuple[tuple[str, object], ...]) -> dict[str, object]:
    """_llm.plan of shape_image(s): the same bytes and arguments give the
    same plan (a dry run allocates nothing), so each is asked once; its
    checksums read the whole image, which is what a plan costs."""
    image = shape_image(s, certified=certified)
    return dict(_llm().plan(image, context=context, plain=plain, **dict(memory)))


def engine_plan(s: Shape, board: BoardMemory, *, certified: bool, context: int | None = 0,
                plain: bool = False, seq_len: int | None = None) -> dict[str, object]:
    """_llm.plan of `s`'s image (shape_image, built at `seq_len`, default
    s.seq_len) against `board`'s memory (BoardMemory.plan_memory): context 0
    the image's seq_len, N positions, None the context Model() chooses."""
    return dict(_planned(dataclasses.replace(s, seq_len=seq_len or s.seq_len), certified,
                         context, plain, tuple(sorted(board.plan_memory().items()))))


def whole_plan(s: Shape, *, certified: bool, context: int = 0, plain: bool = False,
               seq_len: int | None = None) -> dict[str, object]:
    """_llm.plan of `s`'s image with no memory limit, every block in
    internal SRAM (bulk served from it): what each block the engine asks for
    weighs, the head staged, at `context` (in plain mode if `plain`)."""
    unlimited = {"fast": 1 << 40, "bulk": 0, "bulk_is_fast": True, "block_overhead": 0}
    return dict(_planned(dataclasses.replace(s, seq_len=seq_len or s.seq_len), certified,
                         context, plain, tuple(sorted(unlimited.items()))))
