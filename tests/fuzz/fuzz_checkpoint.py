"""Coverage-guided fuzzer (atheris) for the llama2.c checkpoint reader
(mpllm.formats.llama2c: read_header, read_checkpoint) and what the converter
does with a checkpoint it accepts (mpllm.llama2c_weights.to_weights), on any
bytes as a model.bin.

For every input: each step either succeeds or raises its own error with a
one-line message (CheckpointError; ValueError for a weight no fp16 scale
holds), never anything else and never a numpy warning (an overflow that
warns before the clean error, as a v2 file's huge scales once did, is a
finding: warnings are errors here). A file the reader accepts has the header
read_header reported, a config inside the engine's limits
(mpllm.formats.limits), finite weights of the header's shapes, and, for v1
(plain f32), exactly its bytes again when written back; its engine Weights
have the checkpoint's config.

Seeds (tests/fuzz/corpus/checkpoint/): tiny v0, v1 and v2 checkpoints,
shared and unshared heads, as `seeds()` below makes them.

Target "checkpoint" of tests/fuzz/fuzzrun.py (its runs, the corpus, how a
failure is replayed).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzrun  # also puts tools/ on sys.path
import numpy as np

with atheris.instrument_imports(include=["mpllm.formats.llama2c", "mpllm.llama2c_weights",
                                         "mpllm.quantize"]):
    from mpllm.formats import limits, llama2c
    from mpllm.llama2c_weights import to_weights


def _check(data: bytes) -> None:
    try:
        head = llama2c.read_header(data)
    except llama2c.CheckpointError as e:
        fuzzrun.one_line(e)
        head = None
    try:
        ck = llama2c.read_checkpoint(data)
    except llama2c.CheckpointError as e:
        fuzzrun.one_line(e)
        return
    if head is None or (head.version, head.config, head.group_size) != (
            ck.version, ck.config, ck.group_size):
        raise AssertionError(f"read_header said {head}, read_checkpoint read "
                             f"{(ck.version, ck.config, ck.group_size)}")
    c = ck.config
    if not (c.dim <= limits.MAX_DIM and c.hidden_dim <= limits.MAX_FFN
            and c.n_layers <= limits.MAX_LAYERS and c.seq_len <= limits.MAX_SEQ_LEN
            and c.vocab_size <= limits.MAX_TOKENS and c.head_dim <= limits.MAX_HEAD_DIM):
        raise AssertionError(f"accepted a config past the engine's limits: {c}")
    for name, shape in [("wq", (c.n_layers, c.dim, c.dim)), ("w2", (c.n_layers, c.dim,
                                                                     c.hidden_dim))]:
        if ck.layers[name].shape != shape or not np.isfinite(ck.layers[name]).all():
            raise AssertionError(f"{name}: shape {ck.layers[name].shape}, want {shape}")
    if ck.version == 1 and llama2c.checkpoint_bytes(ck, 1)[llama2c.V1_HEADER_BYTES:] != \
            data[llama2c.V1_HEADER_BYTES:]:
        raise AssertionError("a v1 checkpoint written back differs from its file")
    try:
        w = to_weights(ck)
    except ValueError as e:  # a weight too large for an fp16 scale
        fuzzrun.one_line(e)
        return
    if (w.config.dim, w.config.n_layers, w.config.vocab_out) != (c.dim, c.n_layers,
                                                                 c.vocab_size):
        raise AssertionError(f"Weights of config {w.config} from {c}")


def test_one_input(data: bytes) -> None:
    # numpy's default: a warning on overflow, division by zero and invalid
    # values (what a user would see printed), none on underflow
    with warnings.catch_warnings(), np.errstate(all="warn", under="ignore"):
        warnings.simplefilter("error")
        _check(data)


def seeds() -> dict[str, bytes]:
    """The committed seeds: tiny checkpoints of every version."""
    rng = np.random.default_rng(1)
    out = {}
    for shared in (True, False):
        cfg = llama2c.Llama2cConfig(dim=4, hidden_dim=6, n_layers=1, n_heads=2, n_kv_heads=1,
                                    vocab_size=3, seq_len=3, shared_classifier=shared)

        def w(*shape: int) -> np.ndarray:
            return rng.normal(0, 0.5, shape).astype(np.float32)

        layers = {n: w(1, *cfg.matrix_shape(n)) for n in llama2c.LAYER_MATRICES}
        ck = llama2c.Llama2cCheckpoint(0, cfg, w(3, 4), 1 + w(1, 4), 1 + w(1, 4), 1 + w(4),
                                       layers, None if shared else w(3, 4))
        tag = "shared" if shared else "untied"
        for version in (0, 1, 2):
            out[f"v{version}-{tag}"] = llama2c.checkpoint_bytes(ck, version, group_size=2)
    return out


if __name__ == "__main__":
    fuzzrun.atheris_fuzz(test_one_input)
