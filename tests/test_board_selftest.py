"""The board self-test (native/engine/selftest.c) run on the host through the
PIE model: every kernel PASSes, every PIE probe matches the model's
prediction printed beside it, and every float probe prints the IEEE-754
result, which numpy recomputes here from the printed operand bits.
"""

from __future__ import annotations

import re

import cbuild
import numpy as np
import pytest

SOURCES = [
    cbuild.CTESTS / "pie_selftest_main.c",
    cbuild.ENGINE / "selftest.c",
    cbuild.ENGINE / "kernels_pie.c",
    cbuild.ENGINE / "kernels_ref.c",
    cbuild.ENGINE / "pie_model.c",
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("pie_selftest")
    runs = {}
    for flavour, kw in [("plain", {}), ("sanitize", {"opt": "-O1", "sanitize": True})]:
        program = cbuild.build(f"pie_selftest_{flavour}", SOURCES, out, **kw)
        result = cbuild.run(program)
        assert result.returncode == 0, result.stdout + result.stderr
        runs[flavour] = result.stdout
    return runs


def ieee(op: str, a: int, b: int) -> int:
    fa = np.array([a], dtype=np.uint32).view(np.float32)[0]
    fb = np.array([b], dtype=np.uint32).view(np.float32)[0]
    with np.errstate(all="ignore"):
        r = {"+": lambda: fa + fb, "-": lambda: fa - fb, "*": lambda: fa * fb,
             "/": lambda: fa / fb, "s": lambda: np.sqrt(fa)}[op]()
    return int(np.array([r], dtype=np.float32).view(np.uint32)[0])


@pytest.mark.parametrize("flavour", ["plain", "sanitize"])
def test_selftest_output(outputs: dict[str, str], flavour: str) -> None:
    lines = outputs[flavour].splitlines()
    assert lines[0] == "selftest kernels=pie-emu"
    assert lines[-1] == "selftest failures=0 probe_differences=0"
    passes = [ln for ln in lines if ln.startswith("PASS ")]
    # 13 int4 / dot cases, 4 int8 and 1 fp32
    assert len(passes) == 18 and not [ln for ln in lines if ln.startswith("FAIL")]
    assert {ln.split()[1] for ln in passes} == {"matvec_q4_pie", "matvec_q4_cols_pie",
                                                "matvec_q8_pie", "matvec_f32_pie",
                                                "matvec_s8_pie"}

    probes = [ln for ln in lines if ln.startswith("PROBE ")]
    names = " ".join(ln.split()[1] for ln in probes)
    for topic in ["rur.accx_1", "srs.accx_2^38", "vmul.s8", "accx_negative_rail", "vadds.s8"]:
        assert topic in names
    for ln in probes:
        m = re.fullmatch(r"PROBE (\S+) got=(0x[0-9a-f]{8}) model=(0x[0-9a-f]{8}) SAME", ln)
        assert m and m.group(2) == m.group(3), ln

    floats = [ln for ln in lines if ln.startswith("FLOAT ")]
    assert {ln.split()[1] for ln in floats} == {"+", "-", "*", "/", "s"}
    subnormal = 0
    for ln in floats:
        m = re.fullmatch(r"FLOAT (\S) a=0x(\w{8}) b=0x(\w{8}) got=0x(\w{8}) expect=0x(\w{8}) SAME",
                         ln)
        assert m, ln
        op, a, b, got, expect = m.group(1), *(int(g, 16) for g in m.groups()[1:])
        assert expect == ieee(op, a, b), f"{ln}: numpy says 0x{ieee(op, a, b):08x}"
        assert got == expect
        subnormal += (a & 0x7F800000) == 0 or (expect & 0x7F800000) == 0
    assert subnormal >= 3, "the probes must exercise subnormal inputs and results"
