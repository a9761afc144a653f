"""bench.py --vs-runc: llama2.c's run.c beside our host engine (mpllm.board.runc).

run.c itself is the user's build and is not here: a stand-in program that
answers like run.c (and checks the arguments it is given) takes its place.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from mpllm.board import runc

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "llama2c-demo"


def fake_runc(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "run"
    exe.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


RUNC_LIKE = """
assert args[1:3] == ["-z", args[2]] and args[3:5] == ["-t", "0"] and args[5] == "-n"
steps = int(args[6]); prompt = args[args.index("-i") + 1]
assert prompt.startswith("Once upon a time") and len(prompt.split()) > steps // 2
print("Once upon a time ...")
print("achieved tok/s: 2000.000000", file=sys.stderr)
"""


def test_the_comparison_feeds_both_the_same_ids(tmp_path: Path) -> None:
    exe = fake_runc(tmp_path, RUNC_LIKE)
    out = tmp_path / "vs.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), "--board", "host",
                        "--vs-runc", str(exe), "--llama2c", str(DEMO / "model.bin"),
                        str(DEMO / "tokenizer.bin"), "--tokens", "64", "--json", str(out)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "the same 64 prompt ids fed one per pass" in r.stdout
    assert "llama2.c run.c (fp32)                 0.500 ms/token" in r.stdout
    data = json.loads(out.read_text())
    assert len(data["prompt_ids"]) == 64 and data["prompt_ids"][0] == 1  # BOS first
    assert data["runc_ms_per_token"] == 0.5 and data["mpllm_ms_per_token"] > 0
    assert data["ratio"] == pytest.approx(0.5 / data["mpllm_ms_per_token"])
    assert data["mpllm_cpu_ms_per_token"] > 0


#: a run.c whose CPU time grows with the positions asked (about 2 ms each)
RUNC_BUSY = RUNC_LIKE + """
import time
end = time.process_time() + steps * 0.002
while time.process_time() < end:
    pass
"""


@pytest.mark.skipif(sys.platform == "win32", reason="children's CPU time: POSIX getrusage")
def test_cpu_time_beside_the_clock(tmp_path: Path, demo_image: Path) -> None:
    """run.c's CPU time per token is a run's CPU time less a two-position
    run's (the loading cancels); ours is the stepping thread's CPU time."""
    exe = fake_runc(tmp_path, RUNC_BUSY)
    ids = [1] + list(range(3, 40))
    a, b = runc.compare(exe, DEMO / "model.bin", DEMO / "tokenizer.bin", demo_image, ids,
                        runc.PARAGRAPH * 4, steps=24, repeats=2)
    assert a.cpu_ms_per_token == pytest.approx(2.0, rel=0.25)
    assert b.cpu_ms_per_token is not None and 0 < b.cpu_ms_per_token < 50
    text = runc.format_comparison(a, b, 24, 2)
    assert "x run.c's speed by the clock, " in text and "x in CPU time" in text
    assert "(CPU 2." in text or "(CPU 1." in text or "(CPU 3." in text


def test_a_prompt_longer_than_the_positions() -> None:
    text, ids = runc.long_prompt(lambda t: [1] + [0] * len(t.split()), 100)
    assert len(ids) > 100 and text.startswith(runc.PARAGRAPH)


@pytest.mark.parametrize("body,message", [
    ("sys.exit(3)", "exited with 3 without 'achieved tok/s'"),
    ("print('achieved tok/s: inf', file=sys.stderr)", "without 'achieved tok/s': achieved"),
])
def test_a_runc_that_does_not_answer_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(runc.RuncError, match=message):
        runc.runc_ms_per_token(fake_runc(tmp_path, body), tmp_path / "m.bin", tmp_path / "t.bin",
                               16, "x")


def test_vs_runc_needs_its_partners(tmp_path: Path) -> None:
    bench = [sys.executable, str(ROOT / "tools" / "bench.py")]
    for extra, message in (
            (["--vs-runc", str(tmp_path / "run")], "go together"),
            (["--board", "host", "--vs-runc", str(tmp_path / "run"), "--llama2c",
              str(DEMO / "model.bin"), str(DEMO / "tokenizer.bin")],
             (f"--vs-runc {tmp_path / 'run'}: no such file (llama2.c's run or runq: make "
              "runfast in a llama2.c checkout builds both)")),
            (["--board", "host", "--vs-runc", sys.executable, "--llama2c",
              str(tmp_path / "m.bin"), str(DEMO / "tokenizer.bin")],
             f"--llama2c {tmp_path / 'm.bin'}: no such file")):
        r = subprocess.run(bench + extra, capture_output=True, text=True, check=False)
        assert r.returncode == 2 and message in r.stderr, r.stderr
