"""This checkout: where the host tools find its files, and the board's own
Python (firmware/modules: `llm`, `llm_bench`, ...) and the engine `_llm`
(built into build/inplace) imported on the PC. One definition of each path."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE_MODULES = ROOT / "firmware" / "modules"
#: where `pip install -e .` and `python setup.py build_ext --inplace` put the
#: CPython `_llm` (setup.py's INPLACE): not firmware/modules, the folder the
#: firmware freezes, which holds only the board's own files
ENGINE_BUILD = ROOT / "build" / "inplace"
#: what a checkout without an install puts on sys.path for the board's Python
BOARD_PATHS = (FIRMWARE_MODULES, ENGINE_BUILD)
NATIVE = ROOT / "native"
MODELS = ROOT / "models"
DEMO_DIR = MODELS / "demo"


class NotBuilt(ImportError):
    """A board module cannot be imported; the message says what to run."""


def add_board_paths() -> None:
    """The board's Python and the in-place `_llm` importable from this checkout."""
    for path in reversed(BOARD_PATHS):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def board_module(name: str) -> ModuleType:
    """A module of firmware/modules (`llm`, `llm_bench`, or the engine `_llm`),
    from an install or from this checkout: the board's own code, run on the PC."""
    try:
        return importlib.import_module(name)
    except ImportError:
        # A checkout without `pip install -e .` (or a build made with
        # `python setup.py build_ext --inplace`) keeps them in BOARD_PATHS.
        add_board_paths()
        try:
            return importlib.import_module(name)
        except ImportError as e:
            what = "the C engine `_llm` is not built" if name == "_llm" else f"no {name}"
            raise NotBuilt(f"{what} ({e}): run `pip install -e .` in {ROOT}") from None


def import_llm() -> ModuleType:
    """The `llm` module, with its engine `_llm` importable."""
    board_module("_llm")
    return board_module("llm")
