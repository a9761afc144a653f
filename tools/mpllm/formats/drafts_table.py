"""The image's "drafts" section: a self-distilled n-gram table for speculative
decoding (native/engine/image_format.h, KIND_DRAFTS, is the specification).

For every context of 1..3 tokens the model itself wrote, the table keeps the
most frequent next token and its share, shrunk towards zero for contexts seen
rarely: share = floor(65535 * count(next) / (count(ctx) + 1)), so a context
seen once claims 1/2, not certainty. A draft grows while the product of the
shares stays at or above min_odds[k], the price of one more position in a
verify pass as a fraction of a plain step (from the cost model): a guess is
worth verifying only when the tokens it is expected to save pay for it.

`DraftsTable.draft` mirrors the engine's `llm_draft` (native/engine/drafter.c)
integer for integer; tests/test_ngram_drafter_engine.py holds the two to the same tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .align import align_up

ORDER = 3  # LLM_IMAGE_DRAFTS_ORDER
MAX_DRAFT = 7  # LLM_IMAGE_DRAFTS_MAX
ONE = 0xFFFF  # share and odds units: 65535 is certainty
HEADER = struct.Struct(f"<{ORDER}II{MAX_DRAFT + 1}H")
assert HEADER.size == 32


class DraftsError(ValueError):
    """A drafts payload that does not follow image_format.h."""


def top_next(counts: Mapping[int, int]) -> tuple[int, int]:
    """The next token a context's counts guess and its count: the most
    frequent, ties to the smaller id."""
    return max(counts.items(), key=lambda kv: (kv[1], -kv[0]))


@dataclass
class DraftsTable:
    """records[n-1]: {context of n tokens: (next token, share)}."""

    max_draft: int = 0
    min_odds: tuple[int, ...] = (0,) * (MAX_DRAFT + 1)
    records: list[dict[tuple[int, ...], tuple[int, int]]] = field(
        default_factory=lambda: [{} for _ in range(ORDER)])

    @classmethod
    def from_counts(cls, counts: Mapping[tuple[int, ...], Mapping[int, int]],
                    min_odds: Sequence[float], max_draft: int = MAX_DRAFT,
                    share: Callable[[int, int, int], float] | None = None) -> DraftsTable:
        """The table of next-token counts after each context (1..ORDER tokens);
        min_odds[k]: the confidence draft k+1 needs, as a fraction (0..1).
        share(order, total, count of the most frequent next token): the chance
        that a guess from such a context is right (default count / (total + 1));
        a context is kept even when that chance is nil (stored as 1/65535), so
        it still hides the shorter contexts inside it, exactly as when it pays."""
        if not 0 <= max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be 0..{MAX_DRAFT}, not {max_draft}")
        if len(min_odds) < max_draft:
            raise ValueError(f"{len(min_odds)} thresholds for {max_draft} drafts")
        odds = [min(ONE, max(0, round(ONE * float(x)))) for x in min_odds[:max_draft]]
        t = cls(max_draft, tuple(odds + [0] * (MAX_DRAFT + 1 - max_draft)))
        for ctx, c in counts.items():
            if not 1 <= len(ctx) <= ORDER or not c:
                continue
            total = sum(c.values())
            nxt, k = top_next(c)
            if share is None:
                units = ONE * k // (total + 1)
                if units < 1:
                    continue
            else:
                units = min(ONE, max(1, int(ONE * share(len(ctx), total, k))))
            t.records[len(ctx) - 1][tuple(ctx)] = (nxt, units)
        return t

    @property
    def entries(self) -> int:
        return sum(len(r) for r in self.records)

    def draft(self, context: Sequence[int], max_len: int) -> list[int]:
        """What llm_draft proposes after `context` (at most max_len tokens)."""
        tail = list(context[-ORDER:])
        odds, out = ONE, []
        while len(out) < min(max_len, self.max_draft):
            hit = None
            for n in range(min(ORDER, len(tail)), 0, -1):
                hit = self.records[n - 1].get(tuple(tail[len(tail) - n:]))
                if hit is not None:
                    break
            if hit is None:
                break
            odds = odds * hit[1] // ONE
            if odds < self.min_odds[len(out)]:
                break
            out.append(hit[0])
            tail.append(hit[0])
        return out

    def pack(self) -> bytes:
        head = HEADER.pack(*(len(r) for r in self.records), self.max_draft, *self.min_odds)
        parts = [head]
        for n, recs in enumerate(self.records, 1):
            body = b"".join(struct.pack(f"<{n + 2}H", *ctx, nxt, share)
                            for ctx, (nxt, share) in sorted(recs.items()))
            parts.append(body + bytes(align_up(len(body), 16) - len(body)))
        return b"".join(parts)

    @classmethod
    def unpack(cls, payload: bytes | memoryview, vocab_out: int) -> DraftsTable:
        """Parse and check a payload as the engine's loader does."""
        p = bytes(payload)
        if len(p) < HEADER.size:
            raise DraftsError(f"drafts: {len(p)} bytes, too small for its header")
        *counts, max_draft = HEADER.unpack_from(p)[:ORDER + 1]
        min_odds = HEADER.unpack_from(p)[ORDER + 1:]
        if max_draft > MAX_DRAFT:
            raise DraftsError(f"drafts: max_draft {max_draft} exceeds {MAX_DRAFT}")
        if any(min_odds[max_draft:]):
            raise DraftsError("drafts: min_odds past max_draft is not zero")
        want = HEADER.size + sum(align_up(c * (n + 2) * 2, 16) for n, c in enumerate(counts, 1))
        if len(p) != want:
            raise DraftsError(f"drafts: {len(p)} bytes, layout needs {want}")
        t = cls(max_draft, tuple(min_odds))
        at = HEADER.size
        for n, c in enumerate(counts, 1):
            prev = None
            for r in range(c):
                *ctx, nxt, share = struct.unpack_from(f"<{n + 2}H", p, at + r * (n + 2) * 2)
                if max(*ctx, nxt) >= vocab_out:
                    raise DraftsError(f"drafts: {n}-token record {r} holds a token outside the "
                                      f"vocabulary of {vocab_out}")
                if share == 0:
                    raise DraftsError(f"drafts: {n}-token record {r} has share 0")
                if prev is not None and tuple(ctx) <= prev:
                    raise DraftsError(f"drafts: {n}-token record {r} is not after record "
                                      f"{r - 1}")
                prev = tuple(ctx)
                t.records[n - 1][prev] = (nxt, share)
            used = c * (n + 2) * 2
            if any(p[at + used:at + align_up(used, 16)]):
                raise DraftsError("drafts: padding is not zero")
            at += align_up(used, 16)
        return t


EMPTY = DraftsTable().pack()
