"""Build outputs stay out of firmware/modules, the folder the firmware freezes.

`pip install -e .` is run here the way pip runs it (setuptools' PEP 660 hooks, on a copy
of the checkout): the built `_llm` lands in build/inplace and the egg-info in build/,
firmware/modules keeps exactly the board's own files, the board's manifest still freezes
every one of them, and the editable install imports `_llm` from build/inplace and `llm`
from firmware/modules.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import engine_ext
import pytest
from board_manifest import frozen_modules
from mpllm import checkout
from mpllm.board import firmware_pins as pins

ROOT = Path(__file__).resolve().parent.parent
# what an editable build needs of the checkout (no models, no tests)
NEEDED = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "native", "tools",
          "firmware")

HOOKS = """
import os
from setuptools import build_meta as backend
os.makedirs("out/meta")
os.makedirs("out/wheel")
backend.get_requires_for_build_editable()
backend.prepare_metadata_for_build_editable("out/meta")
print(backend.build_editable("out/wheel"))
"""

IMPORTS = """
import site, sys
site.addsitedir(sys.argv[1])
import _llm, llm
print(_llm.__file__)
print(llm.__file__)
"""


def tracked(*paths: str) -> list[str]:
    r = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are not known")
    return r.stdout.split()


@pytest.fixture(scope="module")
def editable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the checkout after `pip install -e .`'s build, and the wheel."""
    repo = tmp_path_factory.mktemp("checkout")
    for rel in tracked(*NEEDED):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    r = subprocess.run([sys.executable, "-c", HOOKS], cwd=repo, capture_output=True,
                       text=True, check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return repo, repo / "out" / "wheel" / r.stdout.split()[-1]


def test_editable_build_leaves_firmware_modules_as_tracked(editable) -> None:  # type: ignore[no-untyped-def]
    repo, _wheel = editable
    board = sorted(Path(p).name for p in tracked("firmware/modules"))
    assert sorted(p.name for p in (repo / "firmware" / "modules").iterdir()) == board
    assert list((repo / "build" / "inplace").glob("_llm*")), "no _llm in build/inplace"
    # (out/ stands for pip's own temporary folders)
    egg_infos = [p.relative_to(repo).as_posix() for p in repo.rglob("*.egg-info")]
    assert [p for p in egg_infos if not p.startswith("out/")] == ["build/mpllm.egg-info"]


def test_the_manifest_still_freezes_every_board_module(editable) -> None:  # type: ignore[no-untyped-def]
    repo, _wheel = editable
    want = sorted(Path(p).name for p in tracked("firmware/modules") if p.endswith(".py"))
    assert "llm.py" in want
    for board in pins.BOARDS.values():
        assert frozen_modules(repo / board.board_dir) == want, board.name


def test_the_editable_install_imports_the_engine_from_build(editable, tmp_path) -> None:  # type: ignore[no-untyped-def]
    repo, wheel = editable
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site_dir)
    # -S: none of this interpreter's own installs (an editable mpllm among them)
    r = subprocess.run([sys.executable, "-S", "-c", IMPORTS, str(site_dir)], cwd=tmp_path,
                       capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    llm_ext, llm_py = r.stdout.split()
    assert Path(llm_ext).parent == repo / "build" / "inplace"
    assert Path(llm_py) == repo / "firmware" / "modules" / "llm.py"


def test_the_tools_and_the_tests_look_for_the_engine_in_one_place() -> None:
    assert checkout.ENGINE_BUILD == engine_ext.EXT_DIR == ROOT / "build" / "inplace"
    assert checkout.ENGINE_BUILD in checkout.BOARD_PATHS
