"""MicroPython's unix port built with our `_llm` (USER_C_MODULES=native), for the
tests that run the real binding: under MICROPY_DIR, a MicroPython checkout;
without it those tests skip. `unix_port()` builds (incrementally, one build at a
time) and returns the binary; `run_mp` runs a script on it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from locking import locked
from mpllm.board import firmware_pins as pins

ROOT = Path(__file__).resolve().parents[2]
MICROPY_DIR = os.environ.get("MICROPY_DIR")

#: unix port builds: the default one (Ctrl-C raises from the signal handler,
#: MICROPY_ASYNC_KBD_INTR), the GIL build (Ctrl-C is a pending exception) and
#: one with 32-bit floats (as on the board)
VARIANTS = {"default": [], "gil": ["MICROPY_PY_THREAD=1", "MICROPY_PY_THREAD_GIL=1"],
            "f32": ["CFLAGS_EXTRA=-DMICROPY_FLOAT_IMPL=MICROPY_FLOAT_IMPL_FLOAT"]}
#: and the coverage build, the one unix build whose exit runs gc_sweep_all(),
#: which is what a soft reset on the board runs: every finaliser
BUILDS = {**VARIANTS, "coverage": ["VARIANT=coverage"]}


def build_unix(mp: Path, variant: str = "default") -> Path:
    """Build (incrementally) the unix port with our module; returns the binary.
    Options avoid the submodules a bare checkout lacks (berkeley-db, mbedtls)
    and the frozen micropython-lib manifest; STRIP= keeps the symbols and
    debug information that python_loop --count tells the engine by."""
    port = mp / "ports" / "unix"
    # one build directory per checkout: make keeps objects newer than their
    # sources, so another checkout with older files would silently reuse them
    build = "build-mpllm-test-" + hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]
    if variant != "default":
        build += "-" + variant
    # MPLLM_TEST_HOOKS: SIGINT forced at named points of the binding (MPLLM_TEST_SIGINT)
    base = ["make", "-C", str(port), f"BUILD={build}", "FROZEN_MANIFEST=",
            "MICROPY_PY_BTREE=0", "MICROPY_PY_SSL=0", "STRIP=",
            f"USER_C_MODULES={ROOT / 'native'}",
            "MPLLM_TEST_HOOKS=1", *BUILDS[variant]]
    mpy_cross = mp / "mpy-cross"
    if not (mpy_cross / "build" / "mpy-cross").exists():
        r = subprocess.run(["make", "-C", str(mpy_cross), "-j2"], capture_output=True,
                           text=True, check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([*base, "-j2"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # micropython.mk renames the program (see there): micropython/ holds our objects
    return port / build / "micropython-llm"


def unix_port(variant: str = "default") -> Path:
    """The unix port's binary with `_llm` (build `variant`); skips the test when
    MICROPY_DIR is not set, fails it when MICROPY_DIR is not a checkout."""
    if not MICROPY_DIR:
        pytest.skip("MICROPY_DIR is not set: point it at a MicroPython "
                    f"{pins.MICROPYTHON_TAG} checkout to build the unix port with _llm")
    mp = Path(MICROPY_DIR)
    if not (mp / "ports" / "unix" / "Makefile").is_file():
        pytest.fail(f"MICROPY_DIR={mp} is not a MicroPython checkout")
    # one build at a time: pytest-xdist workers share the build directory
    with locked(mp / "ports" / "unix" / ".mpllm-test-build.lock"):
        return build_unix(mp, variant)


def run_mp(exe: Path, code: str, tmp_path: Path, **env_extra: str) -> str:
    """Run `code` as a script on the unix port `exe` (firmware/modules on its path);
    its stdout, the run having exited 0."""
    script = tmp_path / "script.py"
    script.write_text(code)
    env = dict(os.environ, MICROPYPATH=f"{ROOT / 'firmware' / 'modules'}:.frozen", **env_extra)
    r = subprocess.run([str(exe), str(script)], capture_output=True, text=True, env=env,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout
