"""PIE instruction counts in closed form: our kernels (kernels_pie.c: the
single-vector and the many-columns int4 matvecs, the int8-in-groups matvec)
and esp32-ai's int4 kernels. The host model of the vector unit counts the same (pie_counter;
tests/test_costmodel.py and tests/test_pie_kernels_equal_ref.py hold them equal).
"""

from __future__ import annotations

from .s3 import COLS_RESIDENT_BLOCKS
from .shape import cdiv, n_groups

__all__ = [
    "cols_resident",
    "pie_cols_instructions",
    "pie_matvec_instructions",
    "pie_q8_matvec_instructions",
    "pie_row_instructions",
    "upstream_pie_instructions",
]


def pie_matvec_instructions(rows: int, cols: int, group: int) -> int:
    """PIE instructions of one full llm_matvec_q4_pie call (kernels_pie.c).

    The closed form of what the host model counts (tests/test_pie_kernels_equal_ref.py
    asserts the same): per call the two broadcasts and the activation
    prologue, per group of nb blocks 5 + 2*nb for the -8*sum(x) correction;
    per row ssai, the first block's load/split (4), 6 per further block, the
    last block's 2 MACs, and per group zero.accx + 2 nops + rur.
    """
    n_blocks = cdiv(cols, 32)
    if n_blocks == 0:
        return 0  # a matrix without columns (a model without PLE) runs no kernel
    per_group = n_blocks if group >= cols else group // 32
    groups = [min(per_group, n_blocks - b) for b in range(0, n_blocks, per_group)]
    per_call = 3 + sum(5 + 2 * nb for nb in groups)
    per_row = 1 + 4 + 6 * n_blocks - 4 + 4 * len(groups)
    return per_call + rows * per_row


def pie_q8_matvec_instructions(rows: int, cols: int, group: int) -> int:
    """PIE instructions of one llm_matvec_q8_pie call (kernels_pie.c, int8
    weights in groups, Q8_0): a row is cols rounded up to 32 bytes, 16 int8
    products a ee.vmulas.s8.accx; per group of v 16-byte vectors (v even) the
    zero.accx, the two first loads, 4 per further pair of vectors (a weight
    load and a fused multiply-and-load, twice), the last weight load and two
    multiplies, 2 nops and rur: 2 v + 5. Nothing per call: the codes are
    signed already, so there is no -8 * sum(x) correction as in int4.
    (pie_counter.measure_q8_pie_counts counts the same through the host model;
    tests/test_costmodel.py holds the two equal.)"""
    width = cdiv(cols, 32) * 32
    n_groups_ = 1 if group >= cols else cdiv(width, group)
    return rows * (2 * (width // 16) + 5 * n_groups_)


def pie_row_instructions(cols: int, group: int) -> int:
    """The per-row part of pie_matvec_instructions (a certified head scores
    rows tile by tile, each tile one kernel call)."""
    return pie_matvec_instructions(1, cols, group) - pie_matvec_instructions(0, cols, group)


def cols_resident(cols: int, group: int) -> bool:
    """Rows the many-columns kernel keeps in registers (one group, <= 3 blocks)."""
    return n_groups(cols, group) == 1 and 1 <= cdiv(cols, 32) <= COLS_RESIDENT_BLOCKS


def pie_cols_instructions(rows: int, cols: int, group: int, m: int) -> int:
    """PIE instructions of one llm_matvec_q4_cols_pie call with m columns
    (kernels_pie.c), the closed form of what the host model counts
    (`measure_cols_pie` parses its count, tests/test_costmodel.py holds the
    two equal). Resident rows: per column the -8*sum(x) correction (the -8
    broadcast, zero.accx, first load, 2*nb MACs, 2 nops, rur); per row the mask
    broadcast, ssai and 4 per block to load and split the row once, then per
    column zero.accx, the activation load, 2*nb MACs, 2 nops, rur. Other rows:
    the single-vector kernel once per column."""
    if m < 1:
        raise ValueError(f"{m} columns")
    if not cols_resident(cols, group):
        return m * pie_matvec_instructions(rows, cols, group)
    nb = cdiv(cols, 32)
    return m * (6 + 2 * nb) + rows * (2 + 4 * nb + m * (5 + 2 * nb))


def upstream_pie_instructions(rows: int, cols: int) -> int:
    """esp32-ai's int4 PIE kernels (firmware/esp32_tinystories, head_i4_range and
    i4_range): per row zero.accx, the mask load, 8 PIE instructions per
    32-column block (weight load, andq, vsr.32, andq, two activation loads,
    two MACs) and rur.accx_0; ssai once per call."""
    return 1 + rows * (3 + 8 * cdiv(cols, 32))
