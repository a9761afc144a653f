"""Run the bench and the gate where the engine runs: on a board (or a serial
peer) over its raw REPL, or in process on the host board. The command line,
`tools/bench.py`, is bench_cli.py; the runs and their results, bench_runs.py.

How the board is driven: the bench itself is the board's own module
`llm_bench` (firmware/modules/llm_bench.py, frozen in the firmware).
mpremote's SerialTransport enters the raw REPL, sends a two-line call of
llm_bench.bench() with exec_raw_no_follow and follows the output as it
streams, timestamping every byte. The host board runs the same function
in-process on CPython.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from . import gate
from .bench_runs import (
    BenchResult,
    RunSpec,
    StreamRecorder,
    parse_stream,
)
from .modes import DRAFTS
from .transport import run_port_snippet


def _board(name: str):  # type: ignore[no-untyped-def]
    """A module of firmware/modules: the bench itself runs in `llm_bench`."""
    from ..checkout import board_module

    return board_module(name)






#: engine modes: exact (the default), plain (every speed-up off: the exact
#: reference), fast (lossy, opt-in)
MODES = ("exact", "plain", "fast")


def bench_code(runs: Sequence[RunSpec], n_tokens: int, mode: str = "exact",
               draft: str = "auto", image: str | None = None) -> str:
    """The code a board runs for the bench: `llm_bench.bench()` on the model its
    session shares (`image`: what a runtime with no model partition opens,
    the MicroPython unix port)."""
    args = ", ".join(repr(a) for a in _bench_args(runs, n_tokens, mode, draft, image))
    return f"import llm_bench\nllm_bench.bench({args})\n"


def _bench_args(runs: Sequence[RunSpec], n_tokens: int, mode: str, draft: str,
                image: str | None, private: bool = False) -> tuple:
    """llm_bench.bench()'s arguments, checked here (a board's traceback is the
    worse place to learn of a typo)."""
    if n_tokens < 2:
        raise ValueError(f"--tokens must be at least 2, got {n_tokens}")
    if draft not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}, not {draft!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    spec = [(r.prompt, r.temperature, r.top_k, r.seed) for r in runs]
    return (spec, n_tokens, draft, image, private, mode == "plain", mode == "fast")










# ---------------------------------------------------------------------------
# Host board and serial board
# ---------------------------------------------------------------------------

class TimedWriter(io.TextIOBase):
    """stdout into a StreamRecorder (the host board's runs print as a board would)."""

    def __init__(self, rec: StreamRecorder) -> None:
        self.rec = rec

    def write(self, s: str) -> int:
        self.rec.feed(s.encode("utf-8"))
        return len(s)


def import_llm_modules(llm_module: object | None) -> object:
    if llm_module is not None:
        sys.modules["_llm"] = llm_module  # type: ignore[assignment]
    return _board("_llm")


def run_host(image: str | os.PathLike[str], runs: Sequence[RunSpec], n_tokens: int, *,
             llm_module: object | None = None, progress: bool = True,
             mode: str = "exact", draft: str = "auto") -> BenchResult:
    """The bench on the host board: the board's own llm_bench.bench() in-process
    with the CPython `_llm` on a model of its own (mode: exact, plain = every
    speed-up off, fast = lossy; draft: llm.drafter's option)."""
    import_llm_modules(llm_module)
    args = _bench_args(runs, n_tokens, mode, draft, os.fspath(image), private=True)
    rec = StreamRecorder(_progress_callback(len(runs), progress))
    with contextlib.redirect_stdout(TimedWriter(rec)):
        _board("llm_bench").bench(*args)
    progress_close()
    return parse_stream(rec, runs, "host")






def run_port(port: str, runs: Sequence[RunSpec], n_tokens: int, *, soft_reset: bool = False,
             progress: bool = True, timeout: float = 120, mode: str = "exact",
             draft: str = "auto", port_image: str | None = None) -> BenchResult:
    """The bench on a board (or a serial peer) through its raw REPL, on the
    model the board's session shares (port_image: what a runtime with no model
    partition opens when it has none open)."""
    code = bench_code(runs, n_tokens, mode, draft, port_image)
    rec = StreamRecorder(_progress_callback(len(runs), progress))
    err = run_port_snippet(port, code, consumer=rec.feed, soft_reset=soft_reset,
                           timeout=timeout)
    progress_close()
    if err:
        raise RuntimeError(f"{port}: the bench raised on the board:\n"
                           f"{err.decode('utf-8', 'replace')}")
    return parse_stream(rec, runs, port)


def port_gate(port: str, *, soft_reset: bool = False, timeout: float = 300,
              port_image: str | None = None) -> gate.GateResult:
    """The gate computed on the board at `port` (the model its session shares)."""
    chunks: list[bytes] = []
    err = run_port_snippet(port, gate.gate_code(port_image), consumer=chunks.append,
                           soft_reset=soft_reset, timeout=timeout)
    out = b"".join(chunks).decode("utf-8", "replace")
    if err:
        raise RuntimeError(f"{port}: the gate raised on the board:\n"
                           f"{err.decode('utf-8', 'replace')}")
    return gate.parse_gate_line(out, f"board at {port}")


_BAR: list[object] = []


def _progress_callback(n_runs: int, enabled: bool) -> Callable[[str], None] | None:
    """A tqdm bar over the runs, advanced when a run's end marker streams by."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = tqdm(total=n_runs, desc="bench runs", unit="run", file=sys.__stderr__)
    end = _board("llm_bench").END
    _BAR[:] = [bar]
    tail = [""]

    def on_text(s: str) -> None:
        buf = tail[0] + s
        k = buf.count(end)
        if k:
            bar.update(k)
        tail[0] = buf[-(len(end) - 1):]  # a marker split across chunks still counts once

    return on_text


def progress_close() -> None:
    for bar in _BAR:
        bar.close()  # type: ignore[attr-defined]
    _BAR.clear()


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------













# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def default_image() -> Path | None:
    """The bundled demo model's image (converted once into the cache), if there is one."""
    from . import hostboard

    try:
        return hostboard.ensure_image(*hostboard.demo_sources())
    except hostboard.HostBoardError:
        return None


def make_release_shaped(out_dir: Path, seed: int = 104) -> Path:
    """A random model with the release model's exact shape (H1's generator),
    converted to an image; cached in out_dir."""
    from ..convert import convert
    from ..formats.image import ImageFormatError, verify_image
    from ..formats.model import Config
    from ..training.generate import write_test_model

    img = out_dir / "model.img"
    if img.is_file():
        try:
            verify_image(img)  # an image of an older format is converted again
            return img
        except ImageFormatError:
            pass
    cfg = Config(vocab_in=32768, vocab_out=25353, dim=96, n_layers=6, n_heads=4, ffn=66,
                 ple_dim=128, seq_len=256, group=128, tied_head=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_bin, tok = write_test_model(out_dir, cfg, seed)
    convert(model_bin, tok, img, progress=False)
    return img


def release_dir() -> Path:
    return Path(tempfile.gettempdir()) / "mpllm-bench-release-shaped"


#: What a board owner's --report collects on the board itself (runs on
#: MicroPython and CPython): build, self-test, free memory.
def report_info(port: str | None, *, timeout: float = 300) -> dict:
    """llm_bench.report()'s answer, from the board at `port` or (None) in-process."""
    marker = _board("llm_bench").REPORT
    if port is None:
        rec = StreamRecorder()
        with contextlib.redirect_stdout(TimedWriter(rec)):
            _board("llm_bench").report()
        out = rec.text()
    else:
        chunks: list[bytes] = []
        err = run_port_snippet(port, "import llm_bench\nllm_bench.report()\n",
                               consumer=chunks.append, timeout=timeout)
        if err:
            raise RuntimeError(f"{port}: the report raised on the board:\n"
                               f"{err.decode('utf-8', 'replace')}")
        out = b"".join(chunks).decode("utf-8", "replace")
    at = out.find(marker + " ")
    if at < 0:
        raise ValueError(f"no {marker} line in the output:\n{out[-2000:]}")
    return json.loads(out[at + len(marker) + 1:].splitlines()[0])












__all__ = [
    "bench_code",
    "make_release_shaped",
    "port_gate",
    "run_host",
    "run_port",
]
