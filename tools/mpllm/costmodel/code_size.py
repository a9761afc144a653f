"""The engine code one generated token runs, measured: the host compiler's
.text sizes (nm -S) of the functions on a token's path
(`ENGINE_TOKEN_FUNCTIONS`), the figure the instruction-cache charge takes as
the engine's share (s3.CODE_BYTES_ENGINE; tests/test_costmodel.py holds the
two together).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .pie_counter import repo_root

__all__ = ["ENGINE_TOKEN_FUNCTIONS", "measure_engine_code_bytes"]

#: Per engine source, the functions a generated token runs (a step of the
#: exact sampled build: the forward pass, attention, the certified head and
#: its waves, the kernels, the exp/erf/log routines, the candidate sampler).
#: kernels_ref.c's kernels stand for the PIE ones, whose assembly is of the
#: same order.
ENGINE_TOKEN_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "engine.c": ("forward", "attention_heads", "select_next", "llm_step", "matvec_rows",
                 "rmsnorm"),
    "head.c": ("llm_head_certify", "wave_ranges", "sift_down", "run_wave"),
    "kernels_ref.c": ("llm_matvec_q4_ref", "llm_quantize_act", "llm_matvec_s8_ref"),
    "mathf.c": ("llm_erff4", "llm_expf4", "llm_logf"),
    "sampler.c": ("llm_sample_candidates", "llm_candidates_offer", "llm_rng_gumbel",
                  "llm_rng_uniform", "llm_rng_next"),
}


def measure_engine_code_bytes(*, engine_dir: Path | None = None,
                              compiler: str | None = None) -> dict[str, int]:
    """Bytes of each function in ENGINE_TOKEN_FUNCTIONS, compiled as the
    engine is (-O2, C11, no FP contraction) with the host compiler ($CC, else
    gcc or cc) and read with nm. Raises FileNotFoundError without the sources
    or the tools, RuntimeError when a build fails or a function is missing."""
    engine = engine_dir or repo_root() / "native" / "engine"
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    nm = shutil.which("nm")
    if not cc or not nm:
        raise FileNotFoundError("measuring code sizes needs a C compiler and nm")
    out: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source, names in ENGINE_TOKEN_FUNCTIONS.items():
            src = engine / source
            if not src.is_file():
                raise FileNotFoundError(f"code sizes need {src} (run from a source checkout)")
            obj = Path(tmp) / (src.stem + ".o")
            built = subprocess.run([cc, "-std=c11", "-O2", "-ffp-contract=off",
                                    "-ffunction-sections", "-I", str(engine), "-c", str(src),
                                    "-o", str(obj)], capture_output=True, text=True, check=False)
            if built.returncode != 0:
                raise RuntimeError(f"compiling {src} failed:\n{built.stderr}")
            listed = subprocess.run([nm, "-S", "-t", "d", "--defined-only", str(obj)],
                                    capture_output=True, text=True, check=True).stdout
            sizes = {}
            for line in listed.splitlines():
                parts = line.split()
                if len(parts) == 4 and parts[2] in "tT":
                    sizes[parts[3]] = int(parts[1])
            for name in names:
                if name not in sizes:
                    raise RuntimeError(f"{source}: no function {name} (renamed? update "
                                       "ENGINE_TOKEN_FUNCTIONS)")
                out[name] = sizes[name]
    return out
