"""Generated test models edited to be hard for the engine's speed-ups, then converted."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from mpllm.convert import convert
from mpllm.formats.esp32ai import read_model_bin, write_model_bin
from mpllm.formats.model import QMatrix


def tied_image(tmp_path: Path, model, rows: Iterator[tuple[int, int]],  # type: ignore[no-untyped-def]
               name: str) -> Path:
    """The test model `model` (conftest's ModelFiles) with embedding row dst replaced
    by row src for each pair: exact ties in the (tied) head between those ids."""
    w = read_model_bin(model.model_bin.read_bytes())
    q, s = w.tok_emb.q.copy(), w.tok_emb.scales.copy()
    for src, dst in rows:
        q[dst], s[dst] = q[src], s[src]
    mb = tmp_path / f"{name}.bin"
    write_model_bin(dataclasses.replace(w, tok_emb=QMatrix(q, s, w.tok_emb.group)), mb)
    out = tmp_path / f"{name}.img"
    convert(mb, model.tokenizer_json, out, progress=False)
    return out
