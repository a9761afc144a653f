"""House style is a test: ruff (settings in pyproject.toml) over every Python file in the repo."""

from __future__ import annotations

import subprocess

import cbuild
import setup_dev
from conftest import need_tool


def test_ruff_clean() -> None:
    ruff = need_tool(lambda: setup_dev.console_script("ruff"))
    result = subprocess.run([ruff, "check", "--output-format", "concise", "."], check=False,
                            cwd=cbuild.ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
