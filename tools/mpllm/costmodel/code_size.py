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

__all__ = ["PIE_STAND_INS", "hot_functions", "measure_engine_code_bytes"]

#: the PIE kernels a token runs on the board -> the reference kernel measured
#: in its place (kernels_ref.c; the PIE assembly is of the same order)
PIE_STAND_INS = {"llm_matvec_q4_pie": "llm_matvec_q4_ref",
                 "llm_matvec_s8_pie": "llm_matvec_s8_ref"}

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
