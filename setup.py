"""Builds the CPython `_llm` extension; everything else is in pyproject.toml.

    pip install -e .                      scalar reference kernels (default)
    MPLLM_KERNELS=pie-emu pip install -e .  PIE kernels run through pie.h's
                                          exact host model (slow; for testing)

The engine's sources come from native/engine/sources.txt, the one list every
build compiles. Build outputs stay under build/: an in-place build (`pip
install -e .`, or `python setup.py build_ext --inplace` as tests/helpers/engine_ext.py
runs it) puts `_llm` in build/inplace/ and the egg-info in build/, not in
firmware/modules beside the board's Python, the folder the firmware freezes.
pyproject.toml maps `_llm` to build/inplace/ for the editable install's finder.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
ENGINE = Path("native/engine")
PORT_HOST = Path("native/port/host")
BINDING = Path("native/binding")

#: native/engine/sources.txt: the one list of the portable engine's sources
ENGINE_SOURCES = [line.strip() for line in (ROOT / ENGINE / "sources.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#")]
PIE_SOURCES = ["kernels_pie.c", "pie_model.c"]
#: _llm.selftest(): the PIE kernels through the host model against the reference
SELFTEST_SOURCES = [*PIE_SOURCES, "selftest.c"]

FLAGS = ["-O3", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-std=c11"]

BUILD = ROOT / "build"
#: where an in-place build puts `_llm` (tools/mpllm/checkout.py's ENGINE_BUILD,
#: pyproject.toml's package-dir for `_llm`; tests/test_build_outputs.py holds
#: the three equal)
INPLACE = BUILD / "inplace"


class BuildExtInBuild(build_ext):
    """build_ext whose in-place copy goes to INPLACE instead of the folder of
    the top-level modules (firmware/modules)."""

    def _get_inplace_equivalent(self, build_py, ext):  # type: ignore[no-untyped-def]
        inplace_file, regular_file = super()._get_inplace_equivalent(build_py, ext)
        INPLACE.mkdir(parents=True, exist_ok=True)
        return str(INPLACE / Path(inplace_file).name), regular_file


def _kernels() -> tuple[list[str], list[tuple[str, str | None]]]:
    choice = os.environ.get("MPLLM_KERNELS", "ref").strip() or "ref"
    if choice == "ref":
        return [], []
    if choice == "pie-emu":
        missing = [s for s in PIE_SOURCES if not (ROOT / ENGINE / s).is_file()]
        if missing:
            raise SystemExit(f"MPLLM_KERNELS=pie-emu needs {', '.join(missing)} in "
                             f"{ENGINE}, which this checkout does not have")
        return [], [("LLM_KERNELS_PIE", None)]
    raise SystemExit(f"MPLLM_KERNELS={choice!r}: expected 'ref' or 'pie-emu'")


pie_sources, pie_defines = _kernels()

BUILD.mkdir(exist_ok=True)  # egg_info's egg_base must exist
setup(
    cmdclass={"build_ext": BuildExtInBuild},
    options={"egg_info": {"egg_base": str(BUILD.relative_to(ROOT))}},
    ext_modules=[
        Extension(
            "_llm",
            sources=[str(ENGINE / s) for s in ENGINE_SOURCES + SELFTEST_SOURCES]
            + pie_sources
            + [str(PORT_HOST / "port_host.c"), str(BINDING / "llm_bind.c"),
               "native/python/mod_llm.c", "native/python/mod_llm_call.c"],
            include_dirs=[str(ENGINE), str(PORT_HOST), str(BINDING), "native/python"],
            define_macros=[("LLM_PORT_NAME", '"host"'), *pie_defines],
            depends=[str(p.relative_to(ROOT))
                     for d in (ENGINE, BINDING, PORT_HOST, PORT_HOST.parent, Path("native/python"))
                     for p in sorted((ROOT / d).glob("*.h"))],
            extra_compile_args=FLAGS,
        )
    ],
)
