"""Early Ctrl-Cs at random moments into a tool, as a terminal sends them: the
tool runs in a session of its own and SIGINT goes to its foreground process
group, some random time after it was started (from Python's own start-up on).

Each run passes when stderr has no traceback (nor Python's "Exception
ignored" or "Fatal Python error"), no staging file is left beside the output,
the output is absent or a whole valid image, and no process the tool started
outlives it. A Ctrl-C that lands while Python itself starts (its `site`
module, before the tool's first line runs) is counted apart: Python says so
itself and nothing of the tool has run (mpllm.interrupt).

    python tests/helpers/ctrl_c.py convert --runs 30     # the by-hand run
    python tests/helpers/ctrl_c.py serve --runs 30 --max-delay 25

tests/test_ctrl_c.py runs a few of each.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO_LLAMA2C = ROOT / "models" / "llama2c-demo"
#: what Python prints when a Ctrl-C lands before it runs the script
PYTHON_START_UP = "Fatal Python error: init_import_site"
BAD = ("Traceback", "Exception ignored", "Fatal Python error")


@dataclass
class Run:
    delay: float  # seconds after the start
    landed: bool  # False: the tool had ended before the signal was due
    returncode: int
    stderr: str
    problems: list[str]

    @property
    def in_python_start_up(self) -> bool:
        return PYTHON_START_UP in self.stderr

    def line(self) -> str:
        where = " (in Python's own start-up)" if self.in_python_start_up else ""
        where += "" if self.landed else " (it had ended before: no signal sent)"
        last = self.stderr.strip().splitlines()[-1:] or ["(nothing)"]
        return (f"SIGINT at {self.delay:6.3f} s: exit {self.returncode}{where}; last line: "
                f"{last[0][:100]}" + "".join(f"\n    PROBLEM: {p}" for p in self.problems)
                + ("".join(f"\n    | {x}" for x in self.stderr.splitlines()[-40:])
                   if self.problems else ""))


def command(tool: str, work: Path) -> list[str]:
    """The tool's command line, its output (convert) in `work`."""
    if tool == "convert":
        return [sys.executable, str(ROOT / "tools" / "convert.py"),
                str(DEMO_LLAMA2C / "model.bin"), str(DEMO_LLAMA2C / "tokenizer.bin"),
                "-o", str(work / "out.img")]
    if tool == "serve":
        return [sys.executable, str(ROOT / "tools" / "serve.py"), "--board", "host",
                "--http-port", "0", "--engines", "2"]
    raise ValueError(f"unknown tool {tool!r}: convert or serve")


def left_processes(work: Path) -> list[str]:
    """Processes still running in `work` (the tool's and its children's cwd)."""
    left = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "cwd") == str(work):
                    left.append(f"{d.name}: {(d / 'cmdline').read_bytes()[:120]!r}")
            except OSError:
                continue
    return left


def sigint_as_a_terminal_has_it() -> None:
    """The tools this process starts get Ctrl-C as a terminal's foreground job
    has it: a shell starts a background job (this script run with `&`) with
    SIGINT ignored, which its children would inherit and keep."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def environment(cache: Path) -> dict[str, str]:
    """The in-place `_llm` and the tools; the image cache `cache`."""
    return dict(os.environ, PYTHONPATH=str(ROOT / "build" / "inplace"), MPLLM_CACHE=str(cache))


def one(tool: str, delay: float, cache: Path, extra: Sequence[str] = (),
        timeout: float = 120.0) -> Run:
    """One run of `tool` (its command line, then `extra`), SIGINT `delay`
    seconds after its start."""
    sigint_as_a_terminal_has_it()
    with tempfile.TemporaryDirectory(prefix=f"ctrl-c-{tool}-") as tmp:
        work = Path(tmp)
        proc = subprocess.Popen([*command(tool, work), *extra], cwd=work, env=environment(cache),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        time.sleep(delay)
        landed = proc.poll() is None
        if landed:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err_bytes = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err_bytes = proc.communicate()
            err_bytes += b"\n(killed: no exit within the timeout)"
        err = err_bytes.decode(errors="replace")
        problems = [f"stderr has {b!r}" for b in BAD if b in err]
        if proc.returncode not in (0, 130, 2) and not problems:
            problems.append(f"exit status {proc.returncode}")
        deadline = time.monotonic() + 10  # engines end once their stdin closes
        while (left := left_processes(work)) and time.monotonic() < deadline:
            time.sleep(0.1)
        problems += [f"process left running: {p}" for p in left]
        staging = [p.name for p in work.iterdir() if p.name != "out.img"]
        staging += [str(p) for p in cache.rglob("*.tmp")] if cache.is_dir() else []
        problems += [f"file left: {n}" for n in staging]
        out = work / "out.img"
        if out.exists():
            sys.path.insert(0, str(ROOT / "tools"))
            from mpllm.formats.image import ImageFormatError, verify_image

            try:
                verify_image(out)
            except ImageFormatError as e:
                problems.append(f"out.img is not a whole image: {e}")
        return Run(delay, landed, proc.returncode, err, problems)


def storm(tool: str, runs: int, max_delay: float, seed: int, cache: Path,
          extra: Sequence[str] = ()) -> list[Run]:
    """`runs` runs, each SIGINT at a moment drawn uniformly from 0..max_delay s."""
    rng = random.Random(seed)
    return [one(tool, rng.uniform(0.0, max_delay), cache, extra) for _ in range(runs)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tool", choices=["convert", "serve"])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--max-delay", type=float, default=None,
                    help="latest moment of the SIGINT in seconds (default: 10 convert, 25 serve)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=None,
                    help="the image cache the runs share (default: a new empty one, so the "
                         "first runs convert the demo model)")
    args = ap.parse_args(argv)
    max_delay = args.max_delay or (10.0 if args.tool == "convert" else 25.0)
    with tempfile.TemporaryDirectory(prefix="ctrl-c-cache-") as tmp:
        results = storm(args.tool, args.runs, max_delay, args.seed, args.cache or Path(tmp))
    bad = 0
    for r in results:
        print(r.line(), flush=True)
        bad += bool(r.problems) and not r.in_python_start_up
    early = sum(r.in_python_start_up for r in results)
    landed = sum(r.landed for r in results)
    print(f"{args.tool}: {len(results)} runs, {landed} Ctrl-Cs sent while it ran, {bad} runs with "
          f"a problem, {early} Ctrl-Cs in Python's own start-up")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
