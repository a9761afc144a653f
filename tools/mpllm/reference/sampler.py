"""The engine's sampler (native/engine/sampler.h) mirrored bit for bit.

PCG32 XSH-RR with the engine's seeding, uniforms in (0,1) from the odd
multiples of 2^-24, Gumbel noise -logf(-logf(u)) with the engine's own logf,
and the same candidate set, draw order and tie rules. sampler.h is the one
place that documents the recipe.
"""

from __future__ import annotations

import numpy as np

from .numerics import logf

PCG_MULT = 6364136223846793005
PCG_INC = 1442695040888963407
MAX_TOP_K = 256  # LLM_SAMPLER_MAX_TOP_K
_M64 = (1 << 64) - 1


class Pcg32:
    """PCG32 exactly as llm_rng_* (state and inc are 64-bit unsigned)."""

    def __init__(self, seed: int) -> None:
        if not 0 <= seed <= _M64:
            raise ValueError(f"seed must fit in 64 unsigned bits, got {seed}")
        self.inc = PCG_INC
        self.state = 0
        self.next_u32()
        self.state = (self.state + seed) & _M64
        self.next_u32()

    def next_u32(self) -> int:
        old = self.state
        self.state = (old * PCG_MULT + self.inc) & _M64
        x = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((x >> rot) | (x << ((32 - rot) & 31))) & 0xFFFFFFFF

    def next_u32_array(self, count: int) -> np.ndarray:
        """The next `count` outputs as uint32, same as calling next_u32 count times.

        Vectorized through the LCG's closed form: state_j = a^j s + c(1 + a + ...
        + a^(j-1)) mod 2^64, with numpy's wrapping uint64 arithmetic.
        """
        if count <= 0:
            return np.zeros(0, np.uint32)
        a_pows = np.empty(count, np.uint64)
        a_pows[0] = 1
        with np.errstate(over="ignore"):
            if count > 1:
                a_pows[1:] = np.uint64(PCG_MULT)
                a_pows = np.multiply.accumulate(a_pows, dtype=np.uint64)
            geo = np.concatenate([[np.uint64(0)], np.cumsum(a_pows, dtype=np.uint64)[:-1]])
            old = a_pows * np.uint64(self.state) + np.uint64(self.inc) * geo
            nxt = old[-1] * np.uint64(PCG_MULT) + np.uint64(self.inc)
        self.state = int(nxt)
        x = (((old >> np.uint64(18)) ^ old) >> np.uint64(27)) & np.uint64(0xFFFFFFFF)
        rot = old >> np.uint64(59)
        out = (x >> rot) | ((x << ((np.uint64(32) - rot) & np.uint64(31))) & np.uint64(0xFFFFFFFF))
        return out.astype(np.uint32)


def uniform_from_u32(r: np.ndarray) -> np.ndarray:
    """(float)(((r >> 9) << 1) | 1) * 2^-24, exact in float32."""
    r = np.asarray(r, dtype=np.uint32)
    odd = ((r >> np.uint32(9)) << np.uint32(1)) | np.uint32(1)
    return odd.astype(np.float32) * np.float32(2.0**-24)


def gumbel_from_u32(r: np.ndarray) -> np.ndarray:
    return -logf(-logf(uniform_from_u32(r)))


def _check(temperature: float, top_k: int, seed: int) -> None:
    t = np.float32(temperature)
    if not np.isfinite(t) or t < 0:
        raise ValueError(f"sampler temperature must be finite and >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0 <= seed <= _M64:
        raise ValueError(f"seed must fit in 64 unsigned bits, got {seed}")


def greedy(logits: np.ndarray) -> int:
    """Largest logit, lowest id on ties (the engine's strict '>' scan)."""
    logits = np.asarray(logits, dtype=np.float32)
    if np.isnan(logits).any():
        raise ValueError(f"logit {int(np.flatnonzero(np.isnan(logits))[0])} is NaN")
    return int(np.argmax(logits))


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The k best ids by (logit desc, id asc), returned in ascending id order."""
    n = logits.shape[0]
    order = np.lexsort((np.arange(n), -logits))
    return np.sort(order[:k])


class Sampler:
    """Sampler(temperature, top_k, seed).pick(logits) -> id, like llm_sample."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> None:
        _check(temperature, top_k, seed)
        self.temperature = np.float32(temperature)
        self.top_k = int(top_k)
        self.seed = int(seed)
        self.rng = Pcg32(self.seed)

    @property
    def is_greedy(self) -> bool:
        return self.seed == 0 or self.temperature == 0

    def reset(self) -> None:
        """Reseed: the next pick draws the same numbers as the first did."""
        self.rng = Pcg32(self.seed)

    def pick(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim != 1 or logits.size == 0:
            raise ValueError(f"pick wants a non-empty vector of logits, got shape {logits.shape}")
        n = logits.shape[0]
        if 0 < self.top_k < n and self.top_k > MAX_TOP_K:
            raise ValueError(
                f"top_k {self.top_k} exceeds the supported {MAX_TOP_K} (use 0 for all {n} ids)")
        best = greedy(logits)  # also rejects NaN, as the engine does
        if self.is_greedy:
            return best
        k = n if self.top_k == 0 or self.top_k >= n else self.top_k
        ids = np.arange(n) if k == n else top_k_ids(logits, k)
        if k <= 64:  # the closed form only pays off for long runs
            r = np.array([self.rng.next_u32() for _ in range(k)], dtype=np.uint32)
        else:
            r = self.rng.next_u32_array(k)
        g = gumbel_from_u32(r)
        with np.errstate(over="ignore"):
            v = logits[ids] / self.temperature + g
        assert v.dtype == np.float32
        return int(ids[int(np.argmax(v))])
