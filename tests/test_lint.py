"""House style is a test: ruff (settings in pyproject.toml) over every Python file in the repo."""

from __future__ import annotations

import shutil
import subprocess

import cbuild
import pytest


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed (it comes with `pip install -e '.[dev]'`)")
    result = subprocess.run([ruff, "check", "--output-format", "concise", "."], check=False,
                            cwd=cbuild.ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
