"""Tests of the ESP32-S3 PIE host model (native/engine/pie_model.c, pie.h).

The C program tests/c/pie_model_test.c checks every modelled instruction
against hand-computed expectations; here it is built plain and under
ASan+UBSan, its abort paths are exercised, the assembler immediate ranges are
checked to fail at compile time on the host, and the native (inline asm)
flavour of pie.h is preprocessed and its assembler text checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import cbuild
import pytest

SOURCES = [cbuild.CTESTS / "pie_model_test.c", cbuild.ENGINE / "pie_model.c"]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("pie_model")
    return cbuild.build_flavours("pie_model_test", SOURCES, out)


@pytest.mark.parametrize("flavour", ["plain", "sanitize"])
def test_model_checks_pass(programs: dict[str, Path], flavour: str) -> None:
    result = cbuild.run(programs[flavour])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    oks = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    # every check of the program ran (a silently skipped group would drop this)
    assert len(oks) == 55, result.stdout
    for needle in [
        "vld.128.ip increments the unmasked pointer",
        "ACCX saturates at -2^39",
        "srs.accx -7 >> 1 = -4 (floor: no rounding)",
        "srs.accx saturates the result to 32 bits, ACCX keeps the shifted value",
        "vmul.s8 SAR=4: low byte of (product >> SAR), arithmetic shift",
        "vzip.8: qs0 = a0 b0 .. a7 b7, qs1 = a8 b8 .. a15 b15",
        "vcmp.lt.s8 + vzip.8 sign-extends int8 lanes to int16",
        "model state is per thread (one core per thread)",
    ]:
        assert f"ok {needle}" in result.stdout


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("misaligned", "ee.vld.128.ip: address not aligned"),
        ("misaligned-mac", "ee.vmulas.s8.accx.ld.ip: address not aligned"),
        ("misaligned-vst", "ee.vst.128.ip: address not aligned"),
        ("sar32", "ee.vsr.32: SAR >= 32 is not modelled"),
    ],
)
def test_model_debug_stops(programs: dict[str, Path], mode: str, message: str) -> None:
    result = cbuild.run(programs["plain"], mode)
    assert result.returncode != 0
    assert "no abort" not in result.stdout
    assert message in result.stderr


# (statement, compiles): immediates at and just past the assembler's limits.
IMMEDIATE_CASES = [
    ("EE_VLD_128_IP(0, p, 2032);", True),
    ("EE_VLD_128_IP(0, p, -2048);", True),
    ("EE_VLD_128_IP(0, p, 2048);", False),
    ("EE_VLD_128_IP(0, p, -2064);", False),
    ("EE_VLD_128_IP(0, p, 8);", False),
    ("EE_VST_128_IP(0, d, 2048);", False),
    ("EE_VMULAS_S8_ACCX_LD_IP(0, p, 496, 1, 2);", True),
    ("EE_VMULAS_S8_ACCX_LD_IP(0, p, -512, 1, 2);", True),
    ("EE_VMULAS_S8_ACCX_LD_IP(0, p, 512, 1, 2);", False),
    ("EE_VMULAS_S8_ACCX_LD_IP(0, p, -528, 1, 2);", False),
    ("EE_VMULAS_S16_ACCX_LD_IP(0, p, 24, 1, 2);", False),
    ("EE_VLDBC_8_IP(0, p, 127);", True),
    ("EE_VLDBC_8_IP(0, p, 128);", False),
    ("EE_VLDBC_16_IP(0, p, 254);", True),
    ("EE_VLDBC_16_IP(0, p, 3);", False),
    ("EE_VLDBC_32_IP(0, p, -512);", True),
    ("EE_VLDBC_32_IP(0, p, 510);", False),
    ("EE_ANDQ(8, 0, 1);", False),
    ("EE_ANDQ(0, -1, 1);", False),
    ("SSAI(31);", True),
    ("SSAI(32);", False),
    ("EE_MOVI_32_A(0, v, 3);", True),
    ("EE_MOVI_32_A(0, v, 4);", False),
    ("EE_SRS_ACCX(s, v, 1);", False),
]


@pytest.mark.parametrize(("statement", "compiles"), IMMEDIATE_CASES)
def test_immediate_ranges_fail_on_host(tmp_path: Path, statement: str, compiles: bool) -> None:
    src = tmp_path / "imm.c"
    src.write_text(
        '#include "pie.h"\n'
        "void f(const signed char *p, unsigned char *d, unsigned v, int s);\n"
        "void f(const signed char *p, unsigned char *d, unsigned v, int s) {\n"
        f"    {statement}\n"
        "    (void)p; (void)d; (void)v; (void)s;\n"
        "}\n"
    )
    cmd = ["gcc", *cbuild.BASE_FLAGS, "-fsyntax-only", "-I", str(cbuild.ENGINE), str(src)]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if compiles:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, f"{statement} compiled"
        assert "PIE immediate out of the assembler" in result.stderr or (
            "PIE q register must be a literal 0..7" in result.stderr
        ), result.stderr


# Operand shapes of the native flavour's assembler text, per mnemonic.
Q = r"q[0-7]"
AR = r"%[0-9]"
IMM = r"-?\d+"
NATIVE_SYNTAX = {
    "ee.vld.128.ip": rf"{Q}, {AR}, {IMM}",
    "ee.vld.128.xp": rf"{Q}, {AR}, {AR}",
    "ee.vst.128.ip": rf"{Q}, {AR}, {IMM}",
    "ee.vst.128.xp": rf"{Q}, {AR}, {AR}",
    "ee.vldbc.8": rf"{Q}, {AR}",
    "ee.vldbc.8.ip": rf"{Q}, {AR}, {IMM}",
    "ee.vldbc.16": rf"{Q}, {AR}",
    "ee.vldbc.16.ip": rf"{Q}, {AR}, {IMM}",
    "ee.vldbc.32": rf"{Q}, {AR}",
    "ee.vldbc.32.ip": rf"{Q}, {AR}, {IMM}",
    "ee.zero.accx": r"",
    "ee.zero.qacc": r"",
    "ee.zero.q": Q,
    "mv.qr": rf"{Q}, {Q}",
    "ee.vmulas.s8.accx": rf"{Q}, {Q}",
    "ee.vmulas.s8.accx.ld.ip": rf"{Q}, {AR}, {IMM}, {Q}, {Q}",
    "ee.vmulas.s8.accx.ld.xp": rf"{Q}, {AR}, {AR}, {Q}, {Q}",
    "ee.vmulas.s16.accx": rf"{Q}, {Q}",
    "ee.vmulas.s16.accx.ld.ip": rf"{Q}, {AR}, {IMM}, {Q}, {Q}",
    "ee.vmulas.s16.accx.ld.xp": rf"{Q}, {AR}, {AR}, {Q}, {Q}",
    "ee.srs.accx": rf"{AR}, {AR}, 0",
    "rur.accx_0": AR,
    "rur.accx_1": AR,
    "wur.accx_0": AR,
    "wur.accx_1": AR,
    "rur.sar_byte": AR,
    "wur.sar_byte": AR,
    "ee.movi.32.a": rf"{Q}, {AR}, [0-3]",
    "ee.movi.32.q": rf"{Q}, {AR}, [0-3]",
    "ee.andq": rf"{Q}, {Q}, {Q}",
    "ee.orq": rf"{Q}, {Q}, {Q}",
    "ee.xorq": rf"{Q}, {Q}, {Q}",
    "ee.notq": rf"{Q}, {Q}",
    "ee.vsl.32": rf"{Q}, {Q}",
    "ee.vsr.32": rf"{Q}, {Q}",
    "ee.vmul.s8": rf"{Q}, {Q}, {Q}",
    "ee.vzip.8": rf"{Q}, {Q}",
    "ee.vunzip.8": rf"{Q}, {Q}",
    "ee.vcmp.lt.s8": rf"{Q}, {Q}, {Q}",
    "ee.vadds.s8": rf"{Q}, {Q}, {Q}",
    "ee.src.q": rf"{Q}, {Q}, {Q}",
    "wsr.sar": AR,
    "ssai": r"\d+",
    "nop": r"",
}

# one use of every pie.h macro, preprocessed in native mode
EVERY_MACRO = """
#include "pie.h"
void every(const signed char *p, unsigned char *d, int ad, unsigned v, int s);
void every(const signed char *p, unsigned char *d, int ad, unsigned v, int s) {
    EE_VLD_128_IP(0, p, -16); EE_VLD_128_XP(1, p, ad); EE_VST_128_IP(2, d, 32);
    EE_VST_128_XP(3, d, ad); EE_VLDBC_8(4, p); EE_VLDBC_16(4, p); EE_VLDBC_32(4, p);
    EE_VLDBC_8_IP(5, p, 1); EE_VLDBC_16_IP(5, p, 2); EE_VLDBC_32_IP(5, p, -4);
    EE_ZERO_ACCX(); EE_ZERO_QACC(); EE_ZERO_Q(6); MV_QR(7, 6);
    EE_VMULAS_S8_ACCX(0, 1); EE_VMULAS_S8_ACCX_LD_IP(2, p, 16, 0, 1);
    EE_VMULAS_S8_ACCX_LD_XP(2, p, ad, 0, 1); EE_VMULAS_S16_ACCX(0, 1);
    EE_VMULAS_S16_ACCX_LD_IP(2, p, -512, 0, 1); EE_VMULAS_S16_ACCX_LD_XP(2, p, ad, 0, 1);
    EE_SRS_ACCX(s, v, 0); RUR_ACCX_0(v); RUR_ACCX_1(v); WUR_ACCX_0(v); WUR_ACCX_1(v);
    RUR_SAR_BYTE(v); WUR_SAR_BYTE(v); EE_MOVI_32_A(1, v, 3); EE_MOVI_32_Q(1, v, 0);
    EE_ANDQ(0, 1, 2); EE_ORQ(0, 1, 2); EE_XORQ(0, 1, 2); EE_NOTQ(0, 1);
    EE_VSL_32(0, 1); EE_VSR_32(0, 1); EE_VMUL_S8(0, 1, 2); EE_VZIP_8(0, 1);
    EE_VUNZIP_8(0, 1); EE_VCMP_LT_S8(0, 1, 2); EE_VADDS_S8(0, 1, 2); EE_SRC_Q(0, 1, 2);
    WSR_SAR(v); SSAI(31); NOP();
}
"""


def asm_texts(path: Path) -> list[str]:
    cmd = ["gcc", "-E", "-P", "-std=c11", "-DLLM_PIE_NATIVE", "-D__XTENSA__",
           "-I", str(cbuild.ENGINE), str(path)]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "llm_pie_m_" not in result.stdout, "native build still calls the host model"
    groups = re.findall(r"__asm__ volatile\(((?:\s*\"(?:[^\"\\]|\\.)*\")+)", result.stdout)
    return ["".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", g)) for g in groups]


def test_native_flavour_emits_exact_assembler_syntax(tmp_path: Path) -> None:
    """Preprocess as the S3 build would; every asm text must be one instruction
    in the assembler's syntax, and every modelled mnemonic must have one."""
    every = tmp_path / "every.c"
    every.write_text(EVERY_MACRO)
    seen = set()
    for path in [every, cbuild.ENGINE / "kernels_pie.c", cbuild.ENGINE / "selftest.c"]:
        texts = asm_texts(path)
        assert texts, path
        for asm in texts:
            mnemonic, _, operands = asm.partition(" ")
            assert mnemonic in NATIVE_SYNTAX, f"unexpected instruction text {asm!r}"
            assert re.fullmatch(NATIVE_SYNTAX[mnemonic], operands), f"bad operands {asm!r}"
            seen.add(mnemonic)
    assert seen == set(NATIVE_SYNTAX), f"never emitted: {set(NATIVE_SYNTAX) - seen}"
    modelled = set(re.findall(r'X\(\w+, "([\w.]+)"\)',
                              (cbuild.ENGINE / "pie_model.h").read_text()))
    assert modelled == set(NATIVE_SYNTAX)
