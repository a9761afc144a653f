"""PIE kernels (kernels_pie.c through the host model) == scalar references,
bit for bit, plus the instruction counts that feed the cost model.

Drives tests/c/pie_kernels_test.c, built plain (-O2) and with ASan+UBSan.
Run `pytest tests/test_pie_kernels_equal_ref.py -s` to see the instruction-count table.
"""

from __future__ import annotations

import re
from pathlib import Path

import cbuild
import pytest
from mpllm.costmodel import pie_matvec_instructions

SOURCES = [
    cbuild.CTESTS / "pie_kernels_test.c",
    cbuild.ENGINE / "kernels_pie.c",
    cbuild.ENGINE / "kernels_ref.c",
    cbuild.ENGINE / "pie_model.c",
]

# random shapes per run: plain builds are fast, sanitized ones ~10x slower
RANDOM_RUNS = {"plain": [(1, 3000), (20240601, 3000)], "sanitize": [(77, 500)]}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("pie_kernels")
    return cbuild.build_flavours("pie_kernels_test", SOURCES, out)


def compared(stdout: str) -> tuple[int, int]:
    match = re.search(r"compared=(\d+) mismatches=(\d+)", stdout)
    assert match, stdout
    return int(match.group(1)), int(match.group(2))


@pytest.mark.parametrize("flavour", ["plain", "sanitize"])
def test_random_shapes_bit_exact(programs: dict[str, Path], flavour: str) -> None:
    for seed, n in RANDOM_RUNS[flavour]:
        result = cbuild.run(programs[flavour], "random", str(seed), str(n))
        assert result.returncode == 0, result.stdout + result.stderr
        # one matvec and one dot product per case, plus two largest-n dots
        assert compared(result.stdout) == (2 * n + 3, 0)  # + 2 extreme and 1 release-tile s8 case


@pytest.mark.parametrize("flavour", ["plain", "sanitize"])
# extreme: 8 shapes x 5 activation patterns x 4 code patterns; splits: every
# k of rows 300, 37 and 66 (301 + 38 + 67) and every [a, b) of 24 rows (325)
@pytest.mark.parametrize(("mode", "cases"), [("extreme", 160), ("splits", 731)])
def test_fixed_sweeps_bit_exact(programs: dict[str, Path], flavour: str, mode: str,
                                cases: int) -> None:
    result = cbuild.run(programs[flavour], mode)
    assert result.returncode == 0, result.stdout + result.stderr
    assert compared(result.stdout) == (cases, 0)


@pytest.mark.parametrize("mode", ["misaligned-x", "misaligned-w", "misaligned-dot"])
def test_misaligned_buffer_is_caught(programs: dict[str, Path], mode: str) -> None:
    result = cbuild.run(programs["plain"], mode)
    assert result.returncode != 0
    assert "no abort" not in result.stdout
    assert "address not aligned" in result.stderr


def test_instruction_counts(programs: dict[str, Path]) -> None:
    result = cbuild.run(programs["plain"], "counts")
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)
    rows = re.findall(r"^(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)", result.stdout, re.MULTILINE)
    assert len(rows) == 9
    for _name, r, c, _per_tok, total, _per32 in rows:
        # the cost model's closed form is what the host model counts
        assert int(total) == pie_matvec_instructions(int(r), int(c), 128)
    head = next(row for row in rows if row[0] == "head")
    assert float(head[5]) < 7.7  # 23 instructions per 96-column row
    dot = re.search(r"matvec_s8 199x192: (\d+) instructions", result.stdout)
    # per row of 12 vectors: one load + one MAC each, then zero, 2 nops, rur, a last load
    assert dot and int(dot.group(1)) == 199 * (2 * 192 // 16 + 5)


@pytest.mark.parametrize(("flavour", "n"), [("plain", 1500), ("sanitize", 300)])
def test_many_columns_bit_exact(programs: dict[str, Path], flavour: str, n: int) -> None:
    """llm_matvec_q4_cols_pie (several positions in one pass over the weights):
    every column equals the single-vector reference, and keeping a row's weights
    in registers roughly halves the PIE work per column at 8 columns."""
    result = cbuild.run(programs[flavour], "cols", "5", str(n))
    assert result.returncode == 0, result.stdout + result.stderr
    got, bad = compared(result.stdout)
    assert bad == 0 and got > 2 * n  # 1..8 columns per call
    per = {int(m): float(v) for m, v in
           re.findall(r"cols m=(\d+) 128x96: ([\d.]+) PIE instructions", result.stdout)}
    assert sorted(per) == list(range(1, 9))
    assert per[8] < 0.6 * per[1] and all(per[m + 1] < per[m] for m in range(1, 8))


@pytest.mark.parametrize(("flavour", "n"), [("plain", 1500), ("sanitize", 300)])
def test_int8_and_fp32_kernels_bit_exact(programs: dict[str, Path], flavour: str, n: int) -> None:
    """llm_matvec_q8_pie (ee.vmulas.s8.accx through the host model) and the
    scalar fp32 flavour, single and many-columns, equal their references bit
    for bit on random shapes, groups, row ranges and input offsets."""
    result = cbuild.run(programs[flavour], "wide", "11", str(n))
    assert result.returncode == 0, result.stdout + result.stderr
    got, bad = compared(result.stdout)
    assert bad == 0 and got >= 2 * n + 4
