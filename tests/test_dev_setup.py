"""The test set-up itself: `python tools/setup_dev.py` says what it found and
what it could not get; a missing tool skips its test, except under CI=true,
where it fails (conftest.missing_tool); a user's MPLLM_CACHE or other MPLLM_*
settings change no result; .ci/run runs the README's commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
import setup_dev

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "tools" / "setup_dev.py"


# ---- the rule for a missing tool -----------------------------------------


def test_missing_tool_is_skipped_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no frobnicator"):
        conftest.missing_tool("no frobnicator")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        conftest.missing_tool("no frobnicator")


def test_missing_tool_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no frobnicator.*CI=true"):
        conftest.missing_tool("no frobnicator")


def test_need_tool_turns_a_finders_missing_into_the_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def finder() -> str:
        raise setup_dev.Missing("clang not found")

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="clang not found"):
        conftest.need_tool(finder)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="clang not found"):
        conftest.need_tool(finder)
    assert conftest.need_tool(lambda: "/usr/bin/x") == "/usr/bin/x"


# ---- the user's environment ----------------------------------------------


def test_the_run_has_its_own_cache() -> None:
    """conftest replaced the user's MPLLM_CACHE (and removed other MPLLM_* settings)."""
    cache = Path(os.environ["MPLLM_CACHE"])
    assert cache.name.startswith("mpllm-cache") and cache.is_dir()
    assert str(conftest.USER_CACHE) != str(cache)
    assert os.environ.get("MPLLM_SOME_SETTING") is None


def test_users_mpllm_settings_change_no_result(tmp_path: Path) -> None:
    """The flash dry run (its commands name the cache) and the check above,
    in a pytest run whose user has MPLLM_CACHE and another MPLLM_ variable set
    (before: the dry run's paths named the user's cache and it failed)."""
    user_cache = tmp_path / "user-cache"
    env = {**os.environ, "MPLLM_CACHE": str(user_cache), "MPLLM_SOME_SETTING": "1",
           "PYTHONPATH": ""}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         f"--basetemp={tmp_path / 'run'}",
         "tests/test_flash.py::test_dry_run_prints_build_and_esptool_commands",
         "tests/test_dev_setup.py::test_the_run_has_its_own_cache"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 passed" in r.stdout
    assert not user_cache.exists()  # nothing written into the user's cache


# ---- tools/setup_dev.py ----------------------------------------------------


def _setup(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SETUP), *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_setup_check_names_each_missing_tool(tmp_path: Path) -> None:
    """On a machine without clang, Chromium, the bundle or the ARM64 tools: one
    line each, and exit status 1; --check installs nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "MPLLM_CACHE": str(tmp_path / "c"),
           "PLAYWRIGHT_BROWSERS_PATH": str(tmp_path / "pw"), "PYTHONPATH": ""}
    r = _setup(["--check"], env)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    missing = [ln.strip() for ln in lines if "MISSING:" in ln]
    assert len(missing) == 4, r.stdout
    assert "clang not found" in missing[0]
    assert "no Chromium" in missing[1]
    assert "python -m mpllm.board.release web-tools" in missing[2]
    assert "no aarch64-linux-gnu-gcc" in missing[3] and "qemu-user" in missing[3]
    assert "not ready: clang + libFuzzer, Chromium, esp-web-tools, ARM64 + qemu-user" in r.stdout
    assert "MICROPY_DIR is not set" in r.stdout
    assert not (tmp_path / "c").exists()


def test_setup_check_reports_the_tools_the_tests_use() -> None:
    """Where every tool is there (CI, this machine after set-up): exit 0 and
    the same paths the tests use."""
    clang = conftest.need_tool(setup_dev.clang_fuzzer)
    chromium = conftest.need_tool(setup_dev.chromium_path)
    tarball = conftest.web_tools_tarball()
    cross, qemu = conftest.need_tool(setup_dev.arm64_tools)
    env = {**os.environ, "MPLLM_CACHE": str(conftest.USER_CACHE), "PYTHONPATH": ""}
    r = _setup(["--check"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    for path in (clang, chromium, tarball, f"{cross} and {qemu}"):
        assert f"ok: {path}" in r.stdout
    assert r.stdout.rstrip().endswith("ready: python -m pytest -n 2")


def test_apt_is_used_only_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(setup_dev.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(setup_dev.Missing, match=r"cannot apt-get install clang \(not root\); "
                       r"run it as root: apt-get install clang"):
        setup_dev.Apt().install(["clang"])


def test_no_chromium_is_installed_without_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Chromium nothing can drive is not worth an apt-get (seen in a venv whose
    pip install had not finished)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "playwright" else real(name, *a))

    class NoApt(setup_dev.Apt):
        def install(self, packages: list[str]) -> None:  # type: ignore[override]
            raise AssertionError(f"apt-get install {packages}")

    with pytest.raises(setup_dev.Missing, match="playwright is not installed"):
        setup_dev.get_chromium(NoApt())


# ---- the README's commands and .ci/run -------------------------------------


def readme_test_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Testing\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README has no Testing section"
    block = re.match(r"\n((?:    \S.*\n)+)", section.group(1))
    assert block, "the Testing section starts with its commands"
    return [ln.strip() for ln in block.group(1).splitlines()]


def test_ci_runs_the_readmes_commands() -> None:
    commands = readme_test_commands()
    assert commands == ["pip install -e '.[dev]'", "python tools/setup_dev.py",
                        "python -m pytest -n 2"]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.lstrip().startswith("#")]
    at = ci.index(commands[0])
    assert ci[at:at + len(commands)] == commands
    # one list of what to install: set-up's
    assert "apt-get" not in (ROOT / ".ci" / "run").read_text()
