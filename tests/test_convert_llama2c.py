"""llama2.c checkpoints through the converter (mpllm.llama2c_weights, mpllm.convert).

The RoPE row permutation is proved on the fp32 forward; the converted images
are checked against the numpy reference of the quantized model and under the
C engine, and against the fp32 forward of the checkpoint (the quality figure).
"""

from __future__ import annotations

import numpy as np
from conftest import ROOT
from mpllm.formats import llama2c as fmt
from mpllm.llama2c_weights import rope_row_order, split_half_checkpoint
from mpllm.reference.llama2c import F32, Llama2c

DEMO = ROOT / "models" / "llama2c-demo"
SHARED = ROOT.parent / "shared" / "llama2c"


class _SplitHalf(Llama2c):
    """The fp32 forward with the engine's RoPE: (i, i + half) of each head."""

    def _rope(self, v: np.ndarray, pos: int) -> np.ndarray:
        b, n = v.shape
        hs = self.cfg.head_size
        half = hs // 2
        h = v.reshape(b, n // hs, hs)
        ang = F32(pos) * self._freq
        cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
        a, c = h[..., :half], h[..., half:]
        return np.concatenate((a * cos - c * sin, c * cos + a * sin), axis=-1).reshape(b, n)


def _demo() -> fmt.Llama2cCheckpoint:
    return fmt.read_checkpoint((DEMO / "model.bin").read_bytes())


def _logits(model: Llama2c, ids: list[int]) -> np.ndarray:
    cache = model.new_cache(1)
    return np.stack([model.step([t], p, cache)[0] for p, t in enumerate(ids)])


def test_rope_row_order_takes_pair_firsts_then_seconds() -> None:
    assert rope_row_order(4, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_split_half_rope_on_permuted_rows_is_llama2c_rope() -> None:
    """new row j <- old 2j, j + half <- old 2j + 1 within each head: the
    forward with split-half RoPE then equals llama2.c's interleaved one."""
    ck = _demo()
    ids = [1, 340, 341, 261, 329] + list(range(3, 120, 7))
    want = _logits(Llama2c(ck), ids)
    unpermuted = _logits(_SplitHalf(ck), ids)
    assert np.abs(unpermuted - want).max() > 0.1  # the permutation is needed
    ck.layers.update(split_half_checkpoint(ck))
    got = _logits(_SplitHalf(ck), ids)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, float(np.abs(want).max()))
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
