"""PIE instruction counts measured by the exact host model of the vector
unit (native/engine/pie_model.c), built with the host C compiler: the
driver count_driver.c (beside this file) for llm_matvec_q4_pie,
llm_matvec_s8_pie and llm_matvec_q8_pie, tests/c/pie_kernels_test.c for the many-columns kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .shape import VERIFY_MAX

__all__ = ["measure_cols_pie", "measure_pie_counts", "measure_q8_pie_counts", "repo_root"]

#: The instruction-counting driver (C source shipped beside this module),
#: built by measure_pie_counts against the engine's kernels and pie_model.c.
_COUNT_DRIVER = Path(__file__).parent / "count_driver.c"


def repo_root() -> Path:
    """The checkout this module runs from."""
    from ..checkout import ROOT

    return ROOT


def _declares(engine: Path, kernel: str) -> bool:
    header = engine / "kernels.h"
    return header.is_file() and re.search(rf"\b{kernel}\s*\(", header.read_text()) is not None


def _has_s8_matvec(engine: Path) -> bool:
    return _declares(engine, "llm_matvec_s8_pie")


def _compiler_for(what: str, sources: list[Path], compiler: str | None) -> str:
    """The C compiler that builds `sources` (`compiler`, else $CC, gcc or cc);
    FileNotFoundError, saying what `what` needs, if a source or the compiler is
    missing."""
    for src in sources:
        if not src.is_file():
            raise FileNotFoundError(f"{what} needs {src} (run from a source checkout)")
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FileNotFoundError(f"{what} needs a C compiler (set CC or install gcc)")
    return cc


def _run_driver(args: list[str], defines: list[str], engine: Path, build_dir: Path | None,
                compiler: str | None) -> list[list[str]]:
    """Build count_driver.c against `engine`'s kernels_pie.c and pie_model.c
    with `defines`, run it on `args` and return its lines, split."""
    sources = [engine / "kernels_pie.c", engine / "pie_model.c"]
    cc = _compiler_for("PIE counters", sources, compiler)
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        driver = Path(tmp) / "pie_count.c"
        driver.write_text(_COUNT_DRIVER.read_text())
        exe = Path(tmp) / "pie_count"
        cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
               *defines, "-I", str(engine), str(driver), *map(str, sources), "-o", str(exe),
               "-lm"]
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"building the PIE counter failed:\n{built.stderr}")
        ran = subprocess.run([str(exe), *args], capture_output=True, text=True, check=False,
                             timeout=300)
        if ran.returncode != 0:
            raise RuntimeError(f"the PIE counter failed:\n{ran.stdout}\n{ran.stderr}")
    return [line.split() for line in ran.stdout.splitlines()]


def measure_pie_counts(
    shapes: Iterable[tuple[int, int, int]],
    *,
    bound_shapes: Iterable[tuple[int, int]] = (),
    engine_dir: Path | None = None,
    build_dir: Path | None = None,
    compiler: str | None = None,
) -> dict[tuple[int, ...], int]:
    """PIE instructions per call, counted by the exact host model of the vector
    unit: llm_matvec_q4_pie for each (rows, cols, group) in `shapes`, and the
    certified head's bound kernel llm_matvec_s8_pie for each (rows, n) in
    `bound_shapes` (only when kernels.h declares it; otherwise those keys are
    absent and the caller keeps BOUND_PIE_PER_TILE).

    Compiles a small driver against native/engine/kernels_pie.c and
    pie_model.c (needs a C compiler: $CC, else gcc or cc). Raises
    FileNotFoundError when the engine sources or a compiler are missing and
    RuntimeError when the build or the run fails."""
    shapes = [tuple(int(v) for v in sh) for sh in shapes]
    engine = engine_dir or repo_root() / "native" / "engine"
    with_s8 = _has_s8_matvec(engine)
    bounds = [tuple(int(v) for v in sh) for sh in bound_shapes] if with_s8 else []
    args = [v for sh in shapes for v in ("q", *map(str, sh))]
    args += [v for sh in bounds for v in ("s", *map(str, sh))]
    lines = _run_driver(args, ["-DCOUNT_S8"] if with_s8 else [], engine, build_dir, compiler)
    out: dict[tuple[int, ...], int] = {}
    for _kind, *vals in lines:
        nums = [int(v) for v in vals]
        out[tuple(nums[:-1])] = nums[-1]
    missing = [sh for sh in [*shapes, *bounds] if sh not in out]
    if missing:
        raise RuntimeError(f"the PIE counter printed nothing for {missing}")
    return out


def measure_q8_pie_counts(
    shapes: Iterable[tuple[int, int, int]],
    *,
    engine_dir: Path | None = None,
    build_dir: Path | None = None,
    compiler: str | None = None,
) -> dict[tuple[int, int, int], int]:
    """PIE instructions of one llm_matvec_q8_pie call (int8 weights in groups)
    for each (rows, cols, group) in `shapes`, counted by the exact host model
    of the vector unit, as measure_pie_counts counts the int4 kernel. Raises
    FileNotFoundError without the sources, a compiler or the kernel (an
    engine older than the int8 format), RuntimeError when the build or the
    run fails."""
    shapes = [(int(r), int(c), int(g)) for r, c, g in shapes]
    engine = engine_dir or repo_root() / "native" / "engine"
    if not _declares(engine, "llm_matvec_q8_pie"):
        raise FileNotFoundError(f"{engine / 'kernels.h'} declares no llm_matvec_q8_pie")
    args = [v for sh in shapes for v in ("e", *map(str, sh))]
    out = {(int(r), int(c), int(g)): int(n)
           for kind, r, c, g, n in _run_driver(args, ["-DCOUNT_Q8"], engine, build_dir, compiler)
           if kind == "e"}
    missing = [sh for sh in shapes if sh not in out]
    if missing:
        raise RuntimeError(f"the PIE counter printed nothing for {missing}")
    return out


def measure_cols_pie(*, root: Path | None = None, build_dir: Path | None = None,
                     compiler: str | None = None) -> dict[int, float]:
    """PIE instructions per row per column of llm_matvec_q4_cols_pie on a 128 x
    96 matrix (the release head's tile, and the width of every resident core
    matrix) for m = 1..8 columns, counted by the exact host model of the
    vector unit: builds tests/c/pie_kernels_test.c as tests/test_pie_kernels_equal_ref.py
    does and parses its "cols m=N 128x96: X PIE instructions per row per
    column" lines. Raises FileNotFoundError without the sources or a compiler,
    RuntimeError when the build or the run fails."""
    base = root or repo_root()
    engine, ctests = base / "native" / "engine", base / "tests" / "c"
    sources = [ctests / "pie_kernels_test.c", engine / "kernels_pie.c",
               engine / "kernels_ref.c", engine / "pie_model.c"]
    cc = _compiler_for("the many-columns PIE count", sources, compiler)
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        exe = Path(tmp) / "pie_kernels_test"
        cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O2",
               "-I", str(engine), "-I", str(base / "native" / "port" / "host"),
               *map(str, sources), "-o", str(exe), "-lm"]
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"building pie_kernels_test failed:\n{built.stderr}")
        # no random cases (N = 0): only the counts of m = 1..8 columns
        ran = subprocess.run([str(exe), "cols", "5", "0"], capture_output=True, text=True,
                             check=False, timeout=120)
    if ran.returncode != 0:
        raise RuntimeError(f"pie_kernels_test cols failed:\n{ran.stdout}\n{ran.stderr}")
    out = {int(m): float(v) for m, v in re.findall(
        r"cols m=(\d+) 128x96: ([\d.]+) PIE instructions per row per column", ran.stdout)}
    if sorted(out) != list(range(1, VERIFY_MAX + 1)):
        raise RuntimeError(f"pie_kernels_test cols printed counts for m = {sorted(out)}")
    return out
