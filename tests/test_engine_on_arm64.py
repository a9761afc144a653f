"""The engine on ARM64 (a Mac with Apple silicon, a Raspberry Pi): built by a
cross compiler with its NEON lanes (simd.h) and run under qemu-user, it
writes the same ids and the same bits of every logits vector as the x86-64
build of the board's scalar loops (LLM_NO_SIMD): greedy, sampled, plain and
with K as dots, on both families and every weight format. The x86-64 vector
build is held to the same scalar build by tests/test_engine_on_pie_kernels.py,
so the three hosts and the board's loops agree bit for bit.

qemu-user runs the ARM64 instructions one by one in software, the NEON ones
included: what it checks is the engine's arithmetic on that instruction set,
not its speed.
"""

from __future__ import annotations

from pathlib import Path

import cbuild
import pytest
import setup_dev
from conftest import need_tool

MODES = [(), ("0.8", "40", "7"), ("1.0", "0", "3"), ("0.8", "40", "7", "plain"),
         ("0", "0", "0", "k_dots")]
IMAGES = [("tiny", 60), ("small", 64), ("llama2c_tied", 64), ("llama2c_int8", 64),
          ("llama2c_fp32", 64), ("llama2c_mixed", 64), ("stories260k_fp32", 200),
          ("stories260k_int8", 200), ("stories260k_int4", 200)]


@pytest.fixture(scope="module")
def arm64() -> tuple[str, str]:
    return need_tool(setup_dev.arm64_tools)


def _image(request: pytest.FixtureRequest, name: str) -> Path:
    if name.startswith("stories260k_"):
        return request.getfixturevalue("stories260k_images")[name.removeprefix("stories260k_")]
    return request.getfixturevalue("engine_image")(name)


@pytest.mark.parametrize(("name", "steps"), IMAGES)
def test_arm64_engine_writes_the_scalar_engines_bits(request: pytest.FixtureRequest,
                                                     arm64: tuple[str, str], name: str,
                                                     steps: int) -> None:
    cc, qemu = arm64
    image = _image(request, name)
    neon = cbuild.engine_run(pie=False, cross=cc)
    scalar = cbuild.engine_run(pie=False, simd=False)
    for mode in MODES:
        want = cbuild.run(scalar, str(image), str(steps), *mode, timeout=600)
        got = cbuild.run(Path(qemu), str(neon), str(image), str(steps), *mode, timeout=600)
        assert want.returncode == 0 and got.returncode == 0, want.stderr + got.stderr
        assert "kernels=ref" in got.stdout, got.stdout
        assert cbuild.ids_and_hash(got.stdout) == cbuild.ids_and_hash(want.stdout), (name, mode)


def test_the_arm64_build_has_neon_lanes(arm64: tuple[str, str], tmp_path: Path) -> None:
    """The engine the test above runs is the vector build: with the same
    compiler and flags, simd.h turns its lanes on (LLM_SIMD 1, NEON), and off
    with LLM_NO_SIMD (the build it is compared with, on x86-64)."""
    cc, qemu = arm64
    probe = tmp_path / "lanes.c"
    probe.write_text('#include <stdio.h>\n#include "simd.h"\n'
                     'int main(void) { printf("LLM_SIMD %d\\n", LLM_SIMD); return 0; }\n')
    said = {}
    for name, defines in (("neon", {}), ("scalar", {"LLM_NO_SIMD": ""})):
        exe = cbuild.build(f"lanes_{name}", [probe], tmp_path, defines=defines, compiler=cc,
                           extra=["-static"])
        said[name] = cbuild.run(Path(qemu), str(exe)).stdout.strip()
    assert said == {"neon": "LLM_SIMD 1", "scalar": "LLM_SIMD 0"}
