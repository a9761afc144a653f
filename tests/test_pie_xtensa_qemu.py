"""The PIE kernels compiled to real ESP32-S3 instructions (LLM_PIE_NATIVE, as
the firmware builds them) equal their scalar references when run under
Espressif's instruction model (qemu-xtensa -cpu esp32s3, linux-user), and the
engine's mathf gives the host's bits there.

A by-hand check: it needs an xtensa-esp32s3-elf GCC (with libgcc) and a
qemu-xtensa built from Espressif's QEMU with the PIE state allocated in user
mode, neither of which set-up or CI installs (docs/DESIGN-FACTS.md, "The
native kernels under QEMU, by hand", says how to build both). Point MPLLM_XTENSA_CC at the compiler and MPLLM_QEMU_XTENSA at
qemu-xtensa to run it; without them it skips, under CI=true too.

The programs are the host tests' own drivers (tests/c/pie_kernels_test.c,
pie_selftest_main.c, mathf_dump.c eval) linked with the freestanding C subset
in tests/c/freestanding. Every mode runs on the host as well, through the PIE
model, with the same seeds: both must print the same line, the number of
cases, no mismatch and the digest of the reference outputs, so QEMU checked
the host's very cases and the scalar references gave the host's bits on the
S3's FPU.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import cbuild
import numpy as np
import pytest

CC = os.environ.get("MPLLM_XTENSA_CC", "")
QEMU = os.environ.get("MPLLM_QEMU_XTENSA", "")

pytestmark = pytest.mark.skipif(
    not (CC and QEMU),
    reason="by-hand check: set MPLLM_XTENSA_CC (xtensa-esp32s3-elf-gcc) and MPLLM_QEMU_XTENSA "
           "(qemu-xtensa with -cpu esp32s3) to run the native PIE kernels under QEMU "
           "(docs/DESIGN-FACTS.md); CI has neither",
)

FREESTANDING = cbuild.CTESTS / "freestanding"
# The firmware's flags for the engine (native/micropython/micropython.cmake:
# LLM_KERNELS_PIE, LLM_PIE_NATIVE, -ffp-contract=off; ESP-IDF's -mlongcalls and
# the -O2 of CONFIG_COMPILER_OPTIMIZATION_PERF), freestanding on the
# harness's own headers. -Wno-format: xtensa-elf types uint32_t as long, so
# the drivers' %u for it is a format warning, though the same 32 bits.
CROSS_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-format", "-O2", "-g",
               "-mlongcalls", "-ffp-contract=off", "-ffreestanding", "-nostdlib", "-static",
               "-DLLM_KERNELS_PIE", "-DLLM_PIE_NATIVE",
               "-isystem", str(FREESTANDING / "include"), "-I", str(cbuild.ENGINE)]
HARNESS = [FREESTANDING / "start.S", FREESTANDING / "fs_libc.c"]
KERNELS = [cbuild.ENGINE / "kernels_pie.c", cbuild.ENGINE / "kernels_ref.c"]

PROGRAMS = {
    "pie_kernels_test": [cbuild.CTESTS / "pie_kernels_test.c", *KERNELS],
    "pie_selftest": [cbuild.CTESTS / "pie_selftest_main.c", cbuild.ENGINE / "selftest.c",
                     *KERNELS],
    "mathf_dump": [cbuild.CTESTS / "mathf_dump.c", cbuild.ENGINE / "mathf.c"],
}

# (mode, args): random shapes with two seeds, the fixed sweeps, the int8 and
# fp32 kernels (single and _cols) and the int4 _cols kernel
MODES = [
    ("random", ("1", "400")),
    ("random", ("20240601", "400")),
    ("extreme", ()),
    ("splits", ()),
    ("wide", ("1", "300")),
    ("wide", ("99", "300")),
    ("cols", ("1", "300")),
]


def cross_build(name: str, out: Path) -> Path:
    exe = out / f"{name}.xtensa"
    cmd = [CC, *CROSS_FLAGS, *map(str, HARNESS + PROGRAMS[name]), "-o", str(exe), "-lgcc"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, " ".join(cmd) + "\n" + result.stdout + result.stderr
    return exe


def qemu(exe: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([QEMU, "-cpu", "esp32s3", str(exe), *args], capture_output=True,
                          text=True, check=False, timeout=timeout)


@pytest.fixture(scope="module")
def xtensa(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("xtensa")
    return {name: cross_build(name, out) for name in PROGRAMS}


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("xtensa_host")
    return {
        "pie_kernels_test": cbuild.build("pie_kernels_test", [
            cbuild.CTESTS / "pie_kernels_test.c", *KERNELS, cbuild.ENGINE / "pie_model.c"], out),
        "mathf_dump": cbuild.build("mathf_dump", PROGRAMS["mathf_dump"], out),
    }


def summary(stdout: str) -> tuple[int, int, str]:
    match = re.search(r"^compared=(\d+) mismatches=(\d+) digest=([0-9a-f]{16})$", stdout,
                      re.MULTILINE)
    assert match, stdout
    return int(match.group(1)), int(match.group(2)), match.group(3)


def test_native_build_uses_pie_instructions(xtensa: dict[str, Path]) -> None:
    """The kernels really are PIE code (not the host model by mistake)."""
    objdump = Path(CC).with_name(Path(CC).name.replace("gcc", "objdump"))
    dis = subprocess.run([str(objdump), "-d", str(xtensa["pie_kernels_test"])],
                         capture_output=True, text=True, check=True).stdout
    # what kernels_pie.c emits: loads, broadcasts, the nibble split, fused MACs
    used = {"ee.vld.128.ip", "ee.vldbc.8.ip", "ee.andq", "ee.vsr.32", "ee.vmulas.s8.accx",
            "ee.vmulas.s8.accx.ld.ip", "ee.zero.accx", "rur.accx_0"}
    found = set(re.findall(r"\t((?:ee|rur|wur)\.[a-z0-9._]+)", dis))
    assert used <= found, sorted(used - found)
    assert "llm_pie_m_" not in dis


@pytest.mark.parametrize(("mode", "args"), MODES, ids=[f"{m}-{'-'.join(a)}" for m, a in MODES])
def test_kernels_equal_ref_under_qemu(xtensa: dict[str, Path], host: dict[str, Path], mode: str,
                                      args: tuple[str, ...]) -> None:
    ran = qemu(xtensa["pie_kernels_test"], mode, *args)
    print(f"qemu {mode} {' '.join(args)}: {ran.stdout.strip().splitlines()[-1:]}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    on_host = cbuild.run(host["pie_kernels_test"], mode, *args)
    assert on_host.returncode == 0, on_host.stdout + on_host.stderr
    n, bad, digest = summary(ran.stdout)
    assert bad == 0, ran.stderr
    assert n > 0
    assert (n, bad, digest) == summary(on_host.stdout)


def test_selftest_under_qemu(xtensa: dict[str, Path]) -> None:
    """The board self-test on the S3 model: every kernel PASSes, every float
    probe gives the IEEE result; the PIE probes (the points pie_model.h marks
    unverified on silicon) are printed for the record."""
    ran = qemu(xtensa["pie_selftest"])
    print(ran.stdout)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "selftest kernels=pie-native"
    passes = [ln for ln in lines if ln.startswith("PASS ")]
    assert len(passes) == 18 and not [ln for ln in lines if ln.startswith("FAIL")]
    assert re.fullmatch(r"selftest failures=0 probe_differences=\d+", lines[-1])


def _mathf_inputs() -> np.ndarray:
    rng = np.random.default_rng(20240601)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.0, 88.72283935546875,
                        88.7228470, -87.3, -103.97, -104.0, 3.9999998, 4.0, 1e-45, -1e-45,
                        1.1754942e-38, 1.1754944e-38, 3.4028235e38, 0.70710677, 1.4142135],
                       dtype=np.float32)
    return np.concatenate([
        special,
        rng.integers(0, 2**32, 120_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        rng.uniform(-110, 0, 40_000).astype(np.float32),   # softmax arguments
        rng.uniform(-6, 6, 40_000).astype(np.float32),     # GELU's erf
        rng.uniform(0, 2, 20_000).astype(np.float32),      # log near 1
    ])


def test_mathf_bits_equal_host(xtensa: dict[str, Path], host: dict[str, Path],
                               tmp_path: Path) -> None:
    """llm_expf / llm_logf / llm_erff on the S3's FPU (QEMU) == the host, bit
    for bit; any NaN equals any NaN (payloads are free), and how many NaN
    payloads differ is printed."""
    x = _mathf_inputs()
    inp = tmp_path / "in.f32"
    inp.write_bytes(x.tobytes())
    outs = []
    for side in ("host", "qemu"):
        out = tmp_path / f"out-{side}.f32"
        out.write_bytes(b"")  # created here: the freestanding fopen only opens it
        if side == "host":
            ran = cbuild.run(host["mathf_dump"], "eval", str(inp), str(out))
        else:
            ran = qemu(xtensa["mathf_dump"], "eval", str(inp), str(out))
        assert ran.returncode == 0, ran.stdout + ran.stderr
        outs.append(np.fromfile(out, dtype=np.float32).reshape(-1, 3))
    h, q = outs
    assert h.shape == q.shape == (x.size, 3)
    same = (h.view(np.uint32) == q.view(np.uint32)) | (np.isnan(h) & np.isnan(q))
    payloads = int(((h.view(np.uint32) != q.view(np.uint32)) & np.isnan(h) & np.isnan(q)).sum())
    print(f"mathf: {x.size} inputs x 3 functions, {int((~same).sum())} differ, "
          f"{payloads} NaN payloads differ")
    bad = np.argwhere(~same)
    assert bad.size == 0, [(float(x[i]), ["exp", "log", "erf"][j], hex(h.view(np.uint32)[i, j]),
                            hex(q.view(np.uint32)[i, j])) for i, j in bad[:10]]
