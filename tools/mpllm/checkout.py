"""This checkout: where the host tools find its files, and the board's own
Python (firmware/modules: `llm`, `llm_bench`, and the engine `_llm` built
there) imported on the PC. One definition of each path."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FIRMWARE_MODULES = ROOT / "firmware" / "modules"
NATIVE = ROOT / "native"
MODELS = ROOT / "models"
DEMO_DIR = MODELS / "demo"


class NotBuilt(ImportError):
    """A board module cannot be imported; the message says what to run."""


def board_module(name: str) -> ModuleType:
    """A module of firmware/modules (`llm`, `llm_bench`, or the engine `_llm`),
    from an install or from this checkout: the board's own code, run on the PC."""
    try:
        return importlib.import_module(name)
    except ImportError:
        # A checkout without `pip install -e .` (or a build made with
        # `python setup.py build_ext --inplace`) keeps them in firmware/modules.
        if str(FIRMWARE_MODULES) not in sys.path:
            sys.path.insert(0, str(FIRMWARE_MODULES))
        try:
            return importlib.import_module(name)
        except ImportError as e:
            what = "the C engine `_llm` is not built" if name == "_llm" else f"no {name}"
            raise NotBuilt(f"{what} ({e}): run `pip install -e .` in {ROOT}") from None


def import_llm() -> ModuleType:
    """The `llm` module, with its engine `_llm` importable."""
    board_module("_llm")
    return board_module("llm")
