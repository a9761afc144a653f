"""The MicroPython loop measurement (`python -m mpllm.costmodel.python_loop`):
its bad input always; the measurement itself on the unix port built with the
real binding (under MICROPY_DIR, like the other unix-port tests)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, missing_tool
from unix_micropython import MICROPY_DIR


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpllm.costmodel.python_loop", *args],
                          capture_output=True, text=True, cwd=ROOT / "tools", timeout=1200,
                          check=False)


def test_a_missing_binary_is_one_clear_line(tmp_path: Path) -> None:
    r = _run("--micropython", str(tmp_path / "nothing"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].endswith(f"--micropython {tmp_path / 'nothing'}: "
                                                      "no such file")


def test_the_loop_is_measured_on_the_unix_port(micropython: Path, demo_image: Path,
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


CALLGRIND = """# callgrind format
version: 1
positions: line
events: Ir D1mr D1mw
summary: 999

ob=(1) /bin/micropython-llm
fl=(1) /src/native/engine/engine.c
fn=(1) forward
10 1000 5 1
+2 500
cfl=(2) /usr/lib/libm/sqrtf.c
cfn=(2) sqrtf
calls=3 40
* 90 3
cfl=(5) /src/native/port/host/port_host.c
cfn=(5) host_now_us
calls=2 7
* 60 1
fi=(3) /src/native/engine/mathf.c
12 40 1
fn=(3) step_glue
fl=(4) /src/native/binding/llm_bind.c
fn=(4) llm_bind_call
3 30 2 1
cfl=(1)
cfn=(1)
calls=1 10
* 1630 6 2
fl=(2)
fn=(2)
40 90 3
fl=(5)
fn=(5)
7 60 1
fl=(6) /src/py/vm.c
fn=(6) mp_execute_bytecode
5 200 10
fe=(1)
11 8 0 1
"""


def test_callgrind_costs_split_the_engine_from_the_loop(tmp_path: Path) -> None:
    """Self cost by source file: native/engine/ (inlined files included) is
    the engine's, and so is what it calls outside native/ (libm's sqrtf);
    the VM, the binding and the port layer (even when the engine calls it)
    are the loop's; a call's inclusive cost line is not counted again."""
    from mpllm.costmodel.python_loop import LoopError, callgrind_costs

    f = tmp_path / "callgrind.out"
    f.write_text(CALLGRIND)
    costs = callgrind_costs(f)
    assert costs["engine"] == {"Ir": 1000 + 500 + 40 + 90 + 8, "D1mr": 5 + 1 + 3,
                               "D1mw": 1 + 1}
    assert costs["loop"] == {"Ir": 30 + 60 + 200, "D1mr": 2 + 1 + 10, "D1mw": 1}
    bad = tmp_path / "not.out"
    bad.write_text("hello\n")
    with pytest.raises(LoopError, match="not a callgrind output file"):
        callgrind_costs(bad)


def test_the_loop_is_counted_on_the_unix_port(micropython: Path, demo_image: Path,
                                              tmp_path: Path) -> None:
    """--count at a tiny size: every way counted and positive, the per-pass
    solve finite, and (with MicroPython's perf_bench) pystone counted."""
    if shutil.which("valgrind") is None:
        missing_tool("valgrind is not installed (Debian: apt install valgrind)")
    out = tmp_path / "count.json"
    r = _run("--micropython", str(micropython), "--image", str(demo_image), "--count",
             "--count-lengths", "6,18", "--seeds", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert set(data["per_token"]) == {"step", "never", "ngram"}
    for way in data["per_token"].values():
        assert way["ir"] > 0 and way["d1_misses"] >= 0
    assert data["per_token"]["never"]["ir"] > data["per_token"]["step"]["ir"]
    assert all(math.isfinite(v) for v in (*data["token"].values(), *data["per_pass"].values()))
    assert f"{data['per_token']['step']['ir']:9,.0f} instructions" in r.stdout
    if (Path(str(MICROPY_DIR)) / "tests" / "perf_bench" / "misc_pystone.py").is_file():
        assert data["pystone_ir"] > 0 and "instructions a loop" in r.stdout


def test_bad_count_lengths_are_one_clear_line(tmp_path: Path) -> None:
    exe = tmp_path / "mp"
    exe.write_text("")
    r = _run("--micropython", str(exe), "--count", "--count-lengths", "20,10")
    assert r.returncode == 2 and "--count-lengths '20,10': give two lengths" in r.stderr
