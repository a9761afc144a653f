"""Rounding a size or an offset up to a multiple: the one Python helper for it, as
llm_align_up is the C side's (native/engine/align_up.h says why 16 bytes, 32 columns
and 64 bytes). A module of its own because every format module uses it, head_tiles
and drafts_table included, which image.py imports."""

from __future__ import annotations

__all__ = ["align_up"]


def align_up(n: int, to: int) -> int:
    """n rounded up to a multiple of `to` (> 0)."""
    return -(-n // to) * to
