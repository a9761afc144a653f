"""The MicroPython loop measurement (`python -m mpllm.costmodel.python_loop`):
its bad input always; the measurement itself on the unix port built with the
real binding (under MICROPY_DIR, like the other unix-port tests)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from test_micropython_binding import MICROPY_DIR, micropython  # noqa: F401 (the fixture)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpllm.costmodel.python_loop", *args],
                          capture_output=True, text=True, cwd=ROOT / "tools", timeout=1200,
                          check=False)


def test_a_missing_binary_is_one_clear_line(tmp_path: Path) -> None:
    r = _run("--micropython", str(tmp_path / "nothing"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].endswith(f"--micropython {tmp_path / 'nothing'}: "
                                                      "no such file")


def test_the_loop_is_measured_on_the_unix_port(micropython: Path, demo_image: Path,  # noqa: F811
                                               tmp_path: Path) -> None:
    """At a tiny size: every way timed and positive, the same stories every
    way, the per-pass solve finite, the heap and (with MicroPython's
    perf_bench) the pystone figure there."""
    out = tmp_path / "loop.json"
    r = _run("--micropython", str(micropython), "--image", str(demo_image), "--tokens", "40",
             "--seeds", "1,2", "--runs", "2", "--pystone-runs", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert set(data["us_per_token"]) == {"step", "never", "ngram", "bare"}
    assert all(v > 0 for v in data["us_per_token"].values()), data["us_per_token"]
    assert 0 < data["tokens_per_pass"]["never"] <= 1 < data["tokens_per_pass"]["ngram"]
    assert math.isfinite(data["token_us"]) and math.isfinite(data["pass_us"])
    assert 0 < data["story_tokens"] <= 2 * 40 and len(data["stories_sha256"]) == 64
    heap = data["heap_free"]
    assert heap["start"] > heap["after_import"] > heap["after_load"] > 0
    assert f"{data['us_per_token']['step']:6.2f} us a token" in r.stdout
    # the fixture built the port, so MICROPY_DIR is set: the tool's default --micropy-dir
    if (Path(str(MICROPY_DIR)) / "tests" / "perf_bench" / "misc_pystone.py").is_file():
        assert data["pystones"] > 0 and "pystones/s" in r.stdout
