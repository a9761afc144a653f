"""Load the CPython `_llm` the tests exercise, rebuilding it if the C changed.

`pip install -e .` builds `_llm` in place (into build/inplace, beside the
build: firmware/modules holds only the board's own files). A developer who
edits the engine and reruns pytest
must not test the old binary, so `load()` compares the extension's mtime with
every C source and setup.py and rebuilds in place when any is newer. Under
pytest-xdist the workers share one build through a file lock.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "firmware" / "modules"
#: where the in-place build puts `_llm` (setup.py's INPLACE)
EXT_DIR = ROOT / "build" / "inplace"
#: PYTHONPATH for a subprocess that imports the board's Python and `_llm`
PYTHONPATH = os.pathsep.join([str(MODULES), str(EXT_DIR)])
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _sources() -> list[Path]:
    native = ROOT / "native"
    files = [ROOT / "setup.py"]
    for sub in ("engine", "binding", "port", "port/host", "python"):
        files += sorted((native / sub).glob("*.[ch]"))
    return files


def _stale(ext: Path) -> bool:
    if not ext.exists():
        return True
    built = ext.stat().st_mtime
    return any(src.stat().st_mtime > built for src in _sources())


def _build() -> None:
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                            check=False, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building _llm failed:\n{result.stdout}\n{result.stderr}")


def load() -> ModuleType:
    """The `_llm` module, built from the current sources."""
    ext = EXT_DIR / f"_llm{SUFFIX}"
    if _stale(ext):
        import fcntl

        lock_path = ROOT / "build" / "_llm.lock"
        lock_path.parent.mkdir(exist_ok=True)
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if _stale(ext):
                    _build()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    for path in (MODULES, EXT_DIR):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    module = importlib.import_module("_llm")
    loaded = Path(module.__file__ or "")
    if loaded.resolve() != ext.resolve():
        raise RuntimeError(f"imported _llm from {loaded}, expected the in-place build {ext}; "
                           f"uninstall the other copy")
    return module
