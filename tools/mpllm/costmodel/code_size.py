"""The engine code one generated token runs, measured: the functions marked
LLM_HOT in native/engine (hot.h; the esp32 build places them in internal
instruction RAM), compiled with the host compiler into a section of their
own whose size is read back, so a static helper the compiler inlined counts
inside its caller and nothing else counts. The PIE kernels are measured by
the reference kernels that stand for them (`PIE_STAND_INS`): the host cannot
compile the S3's instructions. The figure is what the instruction-cache
charge and the IRAM placement take as the engine's code (s3.CODE_BYTES_ENGINE;
tests/test_costmodel.py holds the two together).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .pie_counter import repo_root

__all__ = ["FORMAT_PATHS", "PIE_STAND_INS", "hot_functions", "measure_engine_code_bytes",
           "measure_format_code_bytes"]

#: the PIE kernels a token runs on the board -> the reference kernel measured
#: in its place (kernels_ref.c; the PIE assembly is of the same order)
PIE_STAND_INS = {"llm_matvec_q4_pie": "llm_matvec_q4_ref",
                 "llm_matvec_s8_pie": "llm_matvec_s8_ref"}

#: The functions an int8 or an fp32 image's token runs besides the int4 path,
#: per source file: none is LLM_HOT (kernels.h: an int4 image never runs them,
#: so the board's IRAM holds only the int4 path), so on the board they run from
#: flash through the instruction cache (engine.c act_in, matvec_other,
#: head_input_other; head.c's dense head; wmat.c's dispatch; the kernel and,
#: for int8, the input's quantization in groups). The int8 kernel is PIE,
#: measured by its reference (as PIE_STAND_INS); the fp32 one is C either way.
FORMAT_PATHS: dict[str, dict[str, tuple[str, ...]]] = {
    "int8": {"engine.c": ("act_in", "matvec_other", "head_input_other"),
             "head.c": ("llm_head_dense", "dense_other"), "wmat.c": ("llm_wmat_matvec",),
             "kernels_ref.c": ("llm_quantize_act_groups", "llm_matvec_q8_ref")},
    "fp32": {"engine.c": ("act_in", "matvec_other", "head_input_other"),
             "head.c": ("llm_head_dense", "dense_other"), "wmat.c": ("llm_wmat_matvec",),
             "kernels_pie.c": ("llm_matvec_f32_pie",)},
}

#: a definition marked hot: "... LLM_HOT [const] type [*]name(" or
#: "type LLM_HOT name(" at the start of a line
_MARKED = re.compile(r"^[^\n;{}]*\bLLM_HOT\b[^\n;{}(]*?\b(\w+)\(", re.MULTILINE)


def _engine_dir(engine_dir: Path | None) -> Path:
    return engine_dir or repo_root() / "native" / "engine"


def hot_functions(engine_dir: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Per engine source file, the functions its definitions mark LLM_HOT."""
    out = {}
    for src in sorted(_engine_dir(engine_dir).glob("*.c")):
        names = tuple(_MARKED.findall(src.read_text()))
        if names:
            out[src.name] = names
    return out


def measure_engine_code_bytes(*, engine_dir: Path | None = None,
                              compiler: str | None = None) -> dict[str, int]:
    """Bytes of the hot code per engine source (the LLM_HOT section of each
    file compiled as the engine is: -O2, C11, no FP contraction), with
    kernels_pie.c's kernels measured by their PIE_STAND_INS. Uses the host
    compiler ($CC, else gcc or cc) and objdump/nm. Raises FileNotFoundError
    without the sources or the tools, RuntimeError when a build fails or a
    stand-in is missing."""
    engine = _engine_dir(engine_dir)
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    objdump, nm = shutil.which("objdump"), shutil.which("nm")
    if not cc or not objdump or not nm:
        raise FileNotFoundError("measuring code sizes needs a C compiler, objdump and nm")
    hot = hot_functions(engine)
    out: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:

        def compiled(source: str) -> Path:
            src = engine / source
            if not src.is_file():
                raise FileNotFoundError(f"code sizes need {src} (run from a source checkout)")
            obj = Path(tmp) / (src.stem + ".o")
            built = subprocess.run([cc, "-std=c11", "-O2", "-ffp-contract=off",
                                    "-ffunction-sections", "-DLLM_HOT_SECTION=\".llm_hot\"",
                                    "-I", str(engine), "-c", str(src), "-o", str(obj)],
                                   capture_output=True, text=True, check=False)
            if built.returncode != 0:
                raise RuntimeError(f"compiling {src} failed:\n{built.stderr}")
            return obj

        for source in hot:
            if source == "kernels_pie.c":
                continue  # measured by its stand-ins below
            headers = subprocess.run([objdump, "-h", str(compiled(source))],
                                     capture_output=True, text=True, check=True).stdout
            out[source] = sum(int(p[2], 16) for p in (ln.split() for ln in headers.splitlines())
                              if len(p) > 2 and p[1] == ".llm_hot")
        listed = subprocess.run([nm, "-S", "-t", "d", "--defined-only",
                                 str(compiled("kernels_ref.c"))],
                                capture_output=True, text=True, check=True).stdout
        sizes = {p[3]: int(p[1]) for p in (ln.split() for ln in listed.splitlines())
                 if len(p) == 4 and p[2] in "tT"}
        for pie, ref in PIE_STAND_INS.items():
            if ref not in sizes:
                raise RuntimeError(f"kernels_ref.c: no function {ref} (the stand-in for {pie})")
            out[f"kernels_pie.c:{pie}"] = sizes[ref]
    return out


def _symbol_bytes(sizes: dict[str, int], name: str) -> int:
    """A function's bytes among nm's text symbols: the name itself, its
    default clone (a multi-versioned function: the one a board would have),
    or the compiler's renamed copy (name.isra.0, name.part.0)."""
    for key in (f"{name}.default", name):
        if key in sizes:
            return sizes[key]
    copies = [v for k, v in sizes.items() if k.startswith(name + ".")]
    if not copies:
        raise RuntimeError(f"no function {name} in the compiled engine")
    return max(copies)


def measure_format_code_bytes(weights: str, *, engine_dir: Path | None = None,
                              compiler: str | None = None) -> int:
    """Bytes of the code an image in `weights` ("int8" or "fp32") runs per
    token beyond the int4 path (FORMAT_PATHS), compiled as
    measure_engine_code_bytes compiles the engine. Raises ValueError for
    another format, FileNotFoundError without the sources or the tools,
    RuntimeError when a build fails or a function is missing."""
    if weights not in FORMAT_PATHS:
        raise ValueError(f"weights {weights!r}: one of {', '.join(FORMAT_PATHS)}")
    engine = _engine_dir(engine_dir)
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    nm = shutil.which("nm")
    if not cc or not nm:
        raise FileNotFoundError("measuring code sizes needs a C compiler and nm")
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for source, names in FORMAT_PATHS[weights].items():
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
            sizes = {p[3]: int(p[1]) for p in (ln.split() for ln in listed.splitlines())
                     if len(p) == 4 and p[2] in "tT"}
            total += sum(_symbol_bytes(sizes, n) for n in names)
    return total
