"""Benchmark the board (or the host board) and check it computes what the host does.

    python tools/bench.py --port /dev/ttyACM0          the board, over its serial REPL
    python tools/bench.py --board host [--image IMG]   in-process, CPython `_llm`
    python tools/bench.py --board host --release-shaped   ... plus a release-shaped model
    python tools/bench.py --gate --image IMG [--port PORT | --board host]
    python tools/bench.py --model-s3 [--release-shaped | --image IMG]   cost model

Two speeds are reported: engine ms/token (the engine's own stage
timers, decode steps only) and round-trip tok/s (when the text reaches this
machine: through MicroPython's print and the serial link for a board). Also:
per-stage ms, time to first token (engine and round trip), memory placement
and build_info. Results go to a JSON file and a PNG stage chart.

How the board is driven: the bench itself is the board's own module
`llm_bench` (firmware/modules/llm_bench.py, frozen in the firmware).
mpremote's SerialTransport enters the raw REPL, sends a two-line call of
llm_bench.bench() with exec_raw_no_follow and follows the output as it
streams, timestamping every byte. The host board runs the same function
in-process on CPython.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import costmodel
from ..atomic import atomic_path, atomic_write_bytes
from . import gate
from .quality import QUALITY_MAX_NATS

STAGES = costmodel.STAGES

#: The fixed prompt set (TinyStories openings).
PROMPTS = ("Once upon a time", "One day, a little girl named Lily", "Tom and his dog")
#: Sampled runs use upstream's sampler settings (T 0.8, top-k 40) and fixed seeds.
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 40
SAMPLE_SEED = 20240601


def _board(name: str):  # type: ignore[no-untyped-def]
    """A module of firmware/modules: the bench itself runs in `llm_bench`."""
    from ..checkout import board_module

    return board_module(name)


@dataclass(frozen=True)
class RunSpec:
    prompt: str
    temperature: float
    top_k: int
    seed: int

    @property
    def mode(self) -> str:
        return "greedy" if self.seed == 0 or self.temperature == 0 else "sampled"


def default_runs(prompts: Sequence[str] = PROMPTS, *, greedy: bool = True,
                 sampled: bool = True) -> list[RunSpec]:
    runs = []
    for i, p in enumerate(prompts):
        if greedy:
            runs.append(RunSpec(p, 0.0, 0, 0))
        if sampled:
            runs.append(RunSpec(p, SAMPLE_TEMPERATURE, SAMPLE_TOP_K, SAMPLE_SEED + i))
    return runs


#: engine modes: exact (the default), plain (every speed-up off: the exact
#: reference), fast (lossy, opt-in)
MODES = ("exact", "plain", "fast")
DRAFTS = ("auto", "none", "lookup", "ngram")


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


@dataclass
class RunResult:
    prompt: str
    mode: str
    prompt_tokens: int
    tokens: int  # generated, the first one included
    text: str
    engine_ms_per_token: float  # decode steps: stage time after prefill / steps
    stage_ms_per_token: dict[str, float]
    engine_ttft_ms: float
    roundtrip_tok_s: float  # tokens after the first / time between their arrival
    roundtrip_ttft_ms: float  # start marker -> first text byte
    engine_tok_s: float | None  # None when the engine's timers read 0 (a replay double)
    wall_tok_s: float | None  # the board's own clock, prefill to last token
    # decode steps only: share of head rows the certified head scored, and bytes
    # read per token per region (None: the engine reports no such counters)
    head_rows_fraction: float | None = None
    bytes_per_token: dict[str, float] | None = None
    # verify passes (speculative decoding): passes over the weights after the
    # prefill, guesses checked and kept (passes == tokens - 1 without a drafter)
    passes: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens_per_pass(self) -> float | None:
        """Tokens after the first per pass over the weights (1.0 without drafting)."""
        return (self.tokens - 1) / self.passes if self.passes else None

    @property
    def draft_accept_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class BenchResult:
    board: str
    build_info: str
    config: dict
    memory: list
    runs: list[RunResult] = field(default_factory=list)
    mode: str = "exact"  # exact, plain or fast (lossy)
    drafter: str | None = None  # the draft= option that drafted, None: steps

    def tokens_per_pass(self) -> float | None:
        """Story tokens after the first per pass over the weights, over all runs."""
        passes = sum(r.passes for r in self.runs)
        return sum(r.tokens - 1 for r in self.runs) / passes if passes else None

    def draft_accept_rate(self) -> float | None:
        drafted = sum(r.drafted for r in self.runs)
        return sum(r.accepted for r in self.runs) / drafted if drafted else None

    def summary(self) -> dict[str, float]:
        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else float("nan")

        def harmonic_mean(rates: list[float]) -> float:
            # a mean of rates must average the time per token, like the engine's ms
            # mean beside it, or the round trip can come out faster than the engine
            return len(rates) / sum(1.0 / r for r in rates) if rates and all(rates) else 0.0

        out = {"engine_ms_per_token": mean([r.engine_ms_per_token for r in self.runs]),
               "roundtrip_tok_s": harmonic_mean([r.roundtrip_tok_s for r in self.runs]),
               "engine_ttft_ms": mean([r.engine_ttft_ms for r in self.runs]),
               "roundtrip_ttft_ms": mean([r.roundtrip_ttft_ms for r in self.runs])}
        for st in STAGES:
            out[f"stage_{st}_ms"] = mean([r.stage_ms_per_token[st] for r in self.runs])
        return out

    def head_rows_fraction(self) -> float | None:
        """Mean share of head rows scored per decoded token, over the runs."""
        xs = [r.head_rows_fraction for r in self.runs]
        return None if not xs or None in xs else sum(xs) / len(xs)  # type: ignore[arg-type]

    def bytes_per_token(self) -> dict[str, float] | None:
        """Mean bytes read per decoded token, per region, over the runs."""
        xs = [r.bytes_per_token for r in self.runs]
        if not xs or any(x is None for x in xs):
            return None
        return {k: sum(x[k] for x in xs) / len(xs) for k in xs[0]}  # type: ignore[index]


class StreamRecorder:
    """Collects streamed output with the arrival time of every chunk."""

    def __init__(self, on_text: Callable[[str], None] | None = None) -> None:
        self.chunks: list[tuple[float, bytes]] = []
        self.on_text = on_text

    def feed(self, data: bytes) -> None:
        self.chunks.append((time.perf_counter(), bytes(data)))
        if self.on_text is not None:
            self.on_text(data.decode("utf-8", "replace"))

    def text(self) -> str:
        return b"".join(c for _, c in self.chunks).decode("utf-8", "replace")

    def time_of(self, offset: int) -> float:
        """Arrival time of the byte at `offset` in the concatenated stream."""
        pos = 0
        for t, c in self.chunks:
            pos += len(c)
            if pos > offset:
                return t
        raise IndexError(f"offset {offset} past the end of the stream ({pos} bytes)")


def parse_stream(rec: StreamRecorder, runs: Sequence[RunSpec], board: str) -> BenchResult:
    """Turn llm_bench.bench()'s output into results; ValueError with the output
    on anything missing."""
    lb = _board("llm_bench")
    START, END, INFO = lb.START, lb.END, lb.INFO  # the board's markers
    raw = b"".join(c for _, c in rec.chunks)
    text = raw.decode("utf-8", "replace")
    info_at = raw.find(INFO.encode())
    if info_at < 0:
        raise ValueError(f"{board}: no {INFO} line in the output:\n{text[-2000:]}")
    line_end = raw.find(b"\n", info_at)
    info = json.loads(raw[info_at + len(INFO):line_end].decode())
    result = BenchResult(board, info["build_info"], info["config"], info["memory"],
                         mode=info.get("mode", "exact"), drafter=info.get("drafter"))
    pos = line_end
    for i, spec in enumerate(runs):
        s = raw.find(f"{START} {i}".encode(), pos)
        if s < 0:
            raise ValueError(f"{board}: run {i} never started; output:\n{text[-2000:]}")
        body = raw.find(b"\n", s) + 1
        e = raw.find(END.encode(), body)
        if e < 0:
            raise ValueError(f"{board}: run {i} did not finish; output:\n{text[-2000:]}")
        e_line = raw.find(b"\n", e)
        res = json.loads(raw[e + len(END):e_line if e_line >= 0 else len(raw)].decode())
        story = raw[body:e].decode("utf-8", "replace").rstrip("\r\n")
        t_start = rec.time_of(s)
        t_first = rec.time_of(body) if e > body else rec.time_of(e)
        t_end = rec.time_of(e)
        n = len(res["ids"])
        a, f = res["after_prefill"], res["final"]
        # per token written after the first (a verify pass also runs the
        # positions of refused guesses: those are its cost, not tokens)
        steps = n - 1
        counts = res.get("counts", {})
        passes = int(counts.get("passes", 0)) or (f["tokens"] - a["tokens"])
        per_stage = {st: (f["stage_ms"][st] - a["stage_ms"][st]) / steps if steps else 0.0
                     for st in STAGES}
        eng = sum(per_stage.values())
        window = t_end - t_first
        heads = f["heads"] - a["heads"]
        frac = ((f["head_rows"] - a["head_rows"]) / (heads * result.config["vocab_out"])
                if "head_rows" in f and heads > 0 else None)
        per_region = ({r: (f["bytes"][r] - a["bytes"][r]) / steps for r in f["bytes"]}
                      if steps and any(f["bytes"].values()) else None)
        result.runs.append(RunResult(
            prompt=spec.prompt, mode=spec.mode, prompt_tokens=len(res["prompt_ids"]),
            tokens=n, text=story, engine_ms_per_token=eng, stage_ms_per_token=per_stage,
            engine_ttft_ms=float(a["ttft_ms"]),
            roundtrip_tok_s=(n - 1) / max(window, 1e-6),
            roundtrip_ttft_ms=1e3 * (t_first - t_start),
            engine_tok_s=1e3 / eng if eng > 0 else None,
            wall_tok_s=n / (res["wall_us"] / 1e6) if res["wall_us"] > 0 else None,
            head_rows_fraction=frac, bytes_per_token=per_region, passes=passes,
            drafted=int(counts.get("drafted", 0)), accepted=int(counts.get("accepted", 0))))
        pos = e
    return result


# ---------------------------------------------------------------------------
# Host board and serial board
# ---------------------------------------------------------------------------

class _TimedWriter(io.TextIOBase):
    def __init__(self, rec: StreamRecorder) -> None:
        self.rec = rec

    def write(self, s: str) -> int:
        self.rec.feed(s.encode("utf-8"))
        return len(s)


def _import_llm_modules(llm_module: object | None) -> object:
    if llm_module is not None:
        sys.modules["_llm"] = llm_module  # type: ignore[assignment]
    return _board("_llm")


def run_host(image: str | os.PathLike[str], runs: Sequence[RunSpec], n_tokens: int, *,
             llm_module: object | None = None, progress: bool = True,
             mode: str = "exact", draft: str = "auto") -> BenchResult:
    """The bench on the host board: the board's own llm_bench.bench() in-process
    with the CPython `_llm` on a model of its own (mode: exact, plain = every
    speed-up off, fast = lossy; draft: llm.drafter's option)."""
    _import_llm_modules(llm_module)
    args = _bench_args(runs, n_tokens, mode, draft, os.fspath(image), private=True)
    rec = StreamRecorder(_progress_callback(len(runs), progress))
    with contextlib.redirect_stdout(_TimedWriter(rec)):
        _board("llm_bench").bench(*args)
    _progress_close()
    return parse_stream(rec, runs, "host")


def _open_transport(port: str) -> object:
    try:
        from mpremote.transport_serial import SerialTransport
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SystemExit("talking to a board needs mpremote: pip install 'mpllm[board]'") from e
    return SerialTransport(port, baudrate=115200)


def run_port_snippet(port: str, snippet: str, *, consumer: Callable[[bytes], None],
                     soft_reset: bool = False, timeout: float = 120) -> bytes:
    """Run `snippet` on the board at `port` through mpremote's transport,
    streaming its stdout to `consumer`; returns its stderr (the traceback of
    an exception, empty on success)."""
    from mpremote.transport import TransportError

    tr = _open_transport(port)
    try:
        tr.enter_raw_repl(soft_reset=soft_reset)
        tr.exec_raw_no_follow(snippet)
        _out, err = tr.follow(timeout, consumer)
        tr.exit_raw_repl()
    except TransportError as e:
        raise RuntimeError(f"{port}: {e}") from e
    finally:
        tr.close()
    return err


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
    _progress_close()
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


def _progress_close() -> None:
    for bar in _BAR:
        bar.close()  # type: ignore[attr-defined]
    _BAR.clear()


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------

def _memory_summary(memory: list) -> str:
    """Region totals, then the placements outside the per-layer matrices."""
    totals: dict[str, int] = {}
    named = []
    for name, region, size in memory:
        totals[region] = totals.get(region, 0) + int(size)
        if not (name.startswith("L") and "." in name):
            named.append(f"{name}:{region}")
    layer = sorted({r for n, r, _ in memory if n.startswith("L") and "." in n})
    parts = [f"{r} {b / 1024:.1f} KiB" for r, b in sorted(totals.items())]
    return ("; ".join(parts) + " | " + ", ".join(named)
            + (f", layer matrices:{'+'.join(layer)}" if layer else ""))


def format_result(res: BenchResult) -> str:
    s = res.summary()
    tpp, rate = res.tokens_per_pass(), res.draft_accept_rate()
    drafting = ("steps (no drafter)" if res.drafter is None else
                f"drafter {res.drafter}: {tpp or 1.0:.2f} tokens per pass, "
                f"{'-' if rate is None else f'{rate:.0%}'} of guesses kept")
    label = {"fast": "fast (LOSSY, opt-in)", "plain": "plain (every speed-up off)"}
    lines = [f"board: {res.board}", f"build_info: {res.build_info}",
             f"mode: {label.get(res.mode, res.mode)}; {drafting}",
             "memory: " + _memory_summary(res.memory),
             (f"{'prompt':<36} {'mode':<8} {'tok':>4} {'engine ms/tok':>13} "
             f"{'engine tok/s':>12} {'round-trip tok/s':>16} {'TTFT ms (eng/rt)':>17}")]
    for r in res.runs:
        lines.append(f"{r.prompt[:36]:<36} {r.mode:<8} {r.tokens:>4} "
                     f"{r.engine_ms_per_token:>13.3f} {r.engine_tok_s or 0.0:>12.1f} "
                     f"{r.roundtrip_tok_s:>16.1f} "
                     f"{r.engine_ttft_ms:>8.1f}/{r.roundtrip_ttft_ms:<8.1f}")
    lines.append("per stage, ms/token (mean over runs): "
                 + ", ".join(f"{st} {s[f'stage_{st}_ms']:.3f}" for st in STAGES))
    eng = s["engine_ms_per_token"]
    eng_rate = f"{1e3 / eng:.1f} tok/s" if eng > 0 else "its stage timers read 0: no clock"
    lines.append(f"engine {eng:.3f} ms/token ({eng_rate}); round trip "
                 f"{s['roundtrip_tok_s']:.1f} tok/s")
    frac, per_region = res.head_rows_fraction(), res.bytes_per_token()
    if frac is not None:
        by_mode = {}
        for mode in ("greedy", "sampled"):
            xs = [r.head_rows_fraction for r in res.runs if r.mode == mode]
            if xs and None not in xs:
                by_mode[mode] = sum(xs) / len(xs)  # type: ignore[arg-type]
        lines.append(f"head rows scored per token: {frac:.1%} ("
                     + ", ".join(f"{m} {v:.1%}" for m, v in by_mode.items()) + ")")
    if per_region is not None:
        lines.append("bytes read per token: " + ", ".join(
            f"{r} {v:,.0f}" for r, v in per_region.items()))
    return "\n".join(lines)


def compare_plain(fast: BenchResult, plain: BenchResult) -> tuple[str, bool]:
    """One line: the plain/fast ms-per-token ratio and whether every run gave the
    same tokens (the speed-ups must never change them)."""
    same = [a.text == b.text and a.tokens == b.tokens for a, b in zip(fast.runs, plain.runs)]
    f, p = fast.summary()["engine_ms_per_token"], plain.summary()["engine_ms_per_token"]
    ratio = f"{p / f:.2f}x faster than plain" if f > 0 else "no engine clock"
    line = (f"{fast.board}: {ratio} ({p:.3f} -> {f:.3f} ms/token); same tokens in "
            f"{sum(same)}/{len(same)} runs")
    return line, all(same) and len(same) == len(plain.runs)


def to_json(results: Sequence[BenchResult]) -> dict:
    return {"results": [{**{k: v for k, v in asdict(r).items() if k != "runs"},
                         "summary": r.summary(),
                         "head_rows_fraction": r.head_rows_fraction(),
                         "bytes_per_token": r.bytes_per_token(),
                         "tokens_per_pass": r.tokens_per_pass(),
                         "draft_accept_rate": r.draft_accept_rate(),
                         "runs": [asdict(x) for x in r.runs]} for r in results]}


def write_json(data: dict, path: Path) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode())


def plot_stages(results: Sequence[BenchResult], path: Path) -> Path:
    """Stacked bar per benchmarked model/board: ms/token per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.board for r in results]
    fig, ax = plt.subplots(figsize=(max(5, 2.2 * len(results) + 2), 4.5))
    bottom = [0.0] * len(results)
    for st in STAGES:
        vals = [r.summary()[f"stage_{st}_ms"] for r in results]
        ax.bar(labels, vals, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(results):
        ax.annotate(f"{bottom[i]:.2f} ms\n{r.summary()['roundtrip_tok_s']:.0f} tok/s round trip",
                    (i, bottom[i]), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=8)
    ax.set_ylim(0, max(bottom, default=1.0) * 1.2)  # room for the labels above the bars
    ax.set_ylabel("engine ms per token (decode)")
    ax.set_title("mpllm bench: time per stage")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def _default_image() -> Path | None:
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


def _release_dir() -> Path:
    return Path(tempfile.gettempdir()) / "mpllm-bench-release-shaped"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--port", help="serial port of the board (or a serial peer)")
    where.add_argument("--board", choices=["host"], help="run on this machine (CPython _llm)")
    p.add_argument("--image", type=Path, help="model image (host board; the gate's reference)")
    p.add_argument("--port-image", metavar="PATH",
                   help="with --port: the image a runtime with no model partition opens when "
                        "its session has no model open (the MicroPython unix port: a path on "
                        "its filesystem); a board uses its model partition")
    p.add_argument("--release-shaped", action="store_true",
                   help="also bench a random model of the release shape (generated once)")
    p.add_argument("--tokens", type=int, default=100, help="tokens per run (default 100)")
    p.add_argument("--prompt", action="append", help="replace the fixed prompt set")
    p.add_argument("--greedy-only", action="store_true", help="skip the sampled runs")
    p.add_argument("--sampled-only", action="store_true", help="skip the greedy runs")
    p.add_argument("--json", type=Path, help="write results here (default bench-<board>.json)")
    p.add_argument("--plot", type=Path, help="write the stage chart here (default: beside --json)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--plain", action="store_true",
                   help="the engine with every speed-up off (dense head, one core, no "
                        "drafting): same tokens")
    p.add_argument("--fast", action="store_true",
                   help="fast mode (LOSSY, opt-in): attention over an int8 KV cache; with "
                        "--quality, the quality gate against exact mode instead of a bench")
    p.add_argument("--quality", action="store_true",
                   help="with --fast: cross-entropy on held-out demo text and greedy agreement "
                        "of fast vs exact mode (exit 1 if the cross-entropy differs by more "
                        f"than {QUALITY_MAX_NATS} nats)")
    p.add_argument("--report", type=Path, metavar="FILE",
                   help="one JSON for a bug report: build_info, selftest(), the gate hash, the "
                        "bench per stage, memory placement and free memory (prints a summary); "
                        "leaves the model the board has open as it was")
    p.add_argument("--draft", choices=DRAFTS, default="auto",
                   help="speculative decoding's drafter (default auto: the image's n-gram "
                        "table when it has one; the tokens are the same either way)")
    p.add_argument("--compare-plain", action="store_true",
                   help="run every bench twice, with and without the speed-ups: print the "
                        "ms/token ratio and check that every run produced the same tokens")
    p.add_argument("--soft-reset", action="store_true",
                   help="soft-reset the board before running (releases its model)")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds of silence from the board before giving up")
    p.add_argument("--gate", action="store_true",
                   help="check the gate: board (or host engine) hash == host reference hash")
    p.add_argument("--expect", help="with --gate: compare against this hash, not the reference")
    p.add_argument("--model-s3", action="store_true",
                   help="print the ESP32-S3 cost model (uses --image/--release-shaped if given)")
    p.add_argument("--rows-fraction", type=float, default=costmodel.RELEASE_GREEDY_FRACTION,
                   help="with --model-s3: share of the release head's rows the certified head "
                        "scores for greedy (default %(default)s, published 0.332-0.345)")
    p.add_argument("--fraction-tokens", type=int, default=200,
                   help="with --model-s3: tokens per run when measuring rows fractions on the "
                        "demo (and release-shaped) model (default %(default)s)")
    p.add_argument("--draft-stories", type=int, default=200,
                   help="with --model-s3: stories the demo model writes for the n-gram "
                        "drafter's table when measuring tokens per pass (default %(default)s)")
    p.add_argument("--draft-tokens", type=int, default=200,
                   help="with --model-s3: story tokens per run for the drafting and head-union "
                        "measurements of the speculative builds (default %(default)s)")
    p.add_argument("--no-adaptive", action="store_true",
                   help="with --model-s3: skip the n-gram threshold x draft cap sweep "
                        "(the adaptive draft length)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _have_matplotlib() -> bool:
    """Plots need matplotlib (in the [board] and [dev] extras); without it, say so and go on."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)",
              file=sys.stderr)
        return False
    return True


#: What a board owner's --report collects on the board itself (runs on
#: MicroPython and CPython): build, self-test, free memory.
def report_info(port: str | None, *, timeout: float = 300) -> dict:
    """llm_bench.report()'s answer, from the board at `port` or (None) in-process."""
    marker = _board("llm_bench").REPORT
    if port is None:
        rec = StreamRecorder()
        with contextlib.redirect_stdout(_TimedWriter(rec)):
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


def _report_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """--report FILE: build, self-test, gate, the bench per stage, placement and
    free memory in one JSON, and a summary to paste into an issue. On a board
    the model the user has open stays open (the bench and gate share it)."""
    _import_llm_modules(llm_module)
    image = args.image or (None if args.port else _default_image())
    if args.port is None and image is None:
        print("bench.py --report: no demo model found; give --image", file=sys.stderr)
        return 2
    info = report_info(args.port, timeout=max(args.timeout, 300))
    try:
        got = (port_gate(args.port, timeout=max(args.timeout, 300), port_image=args.port_image)
               if args.port
               else gate.engine_gate(image))
        gate_info: dict = {"hash": got.hash, "source": got.source}
        if image is not None:
            ref = gate.reference_gate(image)
            gate_info.update(reference=ref.hash, same=ref.hash == got.hash)
    except (RuntimeError, ValueError) as e:
        gate_info = {"error": str(e)}
    runs = default_runs(args.prompt or PROMPTS, greedy=not args.sampled_only,
                        sampled=not args.greedy_only)
    res = (run_port(args.port, runs, args.tokens, progress=not args.quiet,
                    timeout=args.timeout, draft=args.draft, port_image=args.port_image)
           if args.port
           else run_host(image, runs, args.tokens, progress=not args.quiet, draft=args.draft))
    bench_json = to_json([res])["results"][0]
    data = {"report": 1, "where": args.port or "host", **info, "gate": gate_info,
            "bench": bench_json}
    write_json(data, args.report)
    st = info.get("selftest") or {}
    s = res.summary()
    if "hash" not in gate_info:
        gate_text = f"error: {gate_info['error']}"
    elif "reference" in gate_info:
        same = "same" if gate_info["same"] else "DIFFERENT"
        gate_text = f"{gate_info['hash']} (reference {gate_info['reference']}: {same})"
    else:
        gate_text = gate_info["hash"]
    selftest_text = (f"{st.get('passed')} passed, {st.get('failures')} failed, "
                     f"{st.get('probe_differences')} probe differences (kernels="
                     f"{st.get('kernels')})" if st else "not in this build")
    speed = (f"engine {s['engine_ms_per_token']:.3f} ms/token, round trip "
             f"{s['roundtrip_tok_s']:.1f} tok/s; tokens per pass "
             f"{res.tokens_per_pass() or 1.0:.2f}")
    stages = ", ".join(f"{name} {s[f'stage_{name}_ms']:.3f}" for name in STAGES)
    lines = [f"mpllm report ({data['where']}): {info['build_info']}",
             f"selftest: {selftest_text}", f"gate: {gate_text}", speed,
             f"per stage (ms/token): {stages}",
             f"heap free: {info.get('heap_free')}; memory: {_memory_summary(res.memory)}",
             f"json: {args.report}"]
    print("\n".join(lines))
    return 0


def _quality_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """bench.py --fast --quality: fast mode against exact mode on held-out demo
    text (mpllm.board.quality); the demo model unless --image."""
    from . import hostboard, quality

    if args.port:
        print("--fast --quality runs on the host board (it reads logits at every "
              "position)", file=sys.stderr)
        return 2
    image = args.image or _default_image()
    if image is None:
        print("bench.py --quality: no demo model found; give --image", file=sys.stderr)
        return 2
    report = Path(hostboard.demo_sources()[0]).parent / "train_report.json"
    q = quality.measure(image, report, llm_module=llm_module)
    print(q.line())
    if args.json:
        write_json({"quality": {"tokens": q.tokens, "exact_nats": q.exact_nats,
                                "fast_nats": q.fast_nats, "delta_nats": q.delta_nats,
                                "greedy_agreement": q.agreement, "max_delta_nats":
                                QUALITY_MAX_NATS, "passed": q.passed}}, args.json)
        print(f"json: {args.json}")
    return 0 if q.passed else 1


def _gate_main(args: argparse.Namespace, llm_module: object | None) -> int:
    if args.port and args.image is None and not args.release_shaped:
        print("bench.py --port --gate needs --image: the image the board runs (or "
              "--release-shaped)", file=sys.stderr)
        return 2
    image = args.image or (make_release_shaped(_release_dir()) if args.release_shaped
                           else _default_image())
    if image is None:
        print("bench.py --gate: no demo model found; give --image or --release-shaped",
              file=sys.stderr)
        return 2
    if args.port:
        other = port_gate(args.port, soft_reset=args.soft_reset, timeout=max(args.timeout, 300),
                          port_image=args.port_image)
    else:
        _import_llm_modules(llm_module)
        other = gate.engine_gate(image)
    if args.expect:
        want = args.expect.strip().lower()
        if len(want) != 16 or any(c not in "0123456789abcdef" for c in want):
            print(f"--expect {args.expect!r}: expected 16 hex digits", file=sys.stderr)
            return 2
        ref = gate.GateResult(want, other.prompt_ids, other.ids, "expected (--expect)")
    else:
        ref = gate.reference_gate(image)
    ok, text = gate.compare(ref, other)
    print(text)
    return 0 if ok else 1


def _model_s3_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """The ESP32-S3 cost model: anchors, our build before/after, variants.

    The engine's counters feed it where they exist: bytes and PIE counts from
    a release-shaped image (--image or --release-shaped), and the certified
    head's rows fractions measured on the demo model (its top-40/greedy ratio
    scales the published greedy fraction for our sampled figure) and on the
    release-shaped random model."""
    if not 0.0 < args.rows_fraction <= 1.0:
        print(f"--rows-fraction {args.rows_fraction}: expected a share in (0, 1]",
              file=sys.stderr)
        return 2
    if args.draft_stories < 1 or args.draft_tokens < 10:
        print("--draft-stories must be >= 1 and --draft-tokens >= 10", file=sys.stderr)
        return 2
    measured = None
    image = args.image or (make_release_shaped(_release_dir()) if args.release_shaped else None)
    _llm = None
    try:
        _llm = _import_llm_modules(llm_module)
    except ImportError as e:
        print(f"_llm not importable ({e}): analytic counters only", file=sys.stderr)
    if image is not None and _llm is not None:
        with _llm.Model(os.fspath(image)) as m:  # type: ignore[attr-defined]
            shape = costmodel.Shape.from_config(m.config())
        if shape != costmodel.RELEASE:
            print(f"{image}: not release-shaped ({shape}); the S3 prediction needs the release "
                  "shape, using the analytic counts", file=sys.stderr)
            image = None
        else:
            measured = costmodel.measure_host(os.fspath(image), llm_module=_llm)
    demo = _default_image() if _llm is not None else None
    fractions = (costmodel.measure_fractions(demo, os.fspath(image) if image else None,
                                             llm_module=_llm, n_steps=args.fraction_tokens)
                 if _llm is not None else costmodel.HeadFractions())
    fractions.greedy = args.rows_fraction
    # speculative builds: drafting and head sharing measured on the demo model
    # (and the head sharing on the release-shaped image when one is in use)
    if _llm is not None and demo is not None:
        spec = costmodel.measure_spec(demo, os.fspath(image) if image else None,
                                      llm_module=_llm, table_stories=args.draft_stories,
                                      n_tokens=args.draft_tokens, adaptive=not args.no_adaptive)
    else:
        spec = costmodel.SpecInputs.default()
        print("speculative inputs: no engine or demo model here, using the defaults measured "
              "at 9a6b552", file=sys.stderr)
    rep = costmodel.report(measured, fractions, spec=spec)
    print(rep.table())
    for name in (*costmodel.OURS, *costmodel.SPEC):
        b = rep.builds[name]
        fr = b.get("rows_fraction")
        rows = "dense head" if fr is None else f"{100 * fr:.1f} % of head rows"
        if name in costmodel.SPEC:
            rows += (f", {b['drafter']}: {b['tokens_per_pass']:.2f} tokens/pass, m "
                     f"{b['positions_per_pass']:.2f}, pass {b['pass_ms']:.2f} ms")
        print(f"ours, predicted ms/token per stage on the N16R8 ({b['label']}, {rows}): "
              + ", ".join(f"{st} {b['stages'][st]:.2f}" for st in STAGES)
              + f"; total {b['total_ms']:.2f} ({b['tok_s']:.1f} tok/s)")
    for mode, rows_d in spec.drafts.items():
        print(f"drafting ({mode}, demo model; {spec.source.get('drafts', '')}): " + "; ".join(
            f"{n} {d.tokens_per_pass:.2f} tokens/pass, {d.drafted_per_pass:.2f} drafted/pass, "
            f"accept {100 * d.accept_rate:.1f} %" for n, d in rows_d.items()))
    if spec.table:
        print(f"n-gram table: {spec.table.get('contexts', 0):,} contexts, "
              f"{spec.table.get('entries', 0):,} entries from {spec.table.get('stories', 0)} "
              "self-generated stories")
    best = {n: rep.builds[n]["drafter"] for n in costmodel.SPEC}
    print("speculative: best drafter measured "
          + ", ".join(f"{costmodel.SPEC_BUILD_MODE[n]} {d}" for n, d in best.items())
          + "; union sources: " + "; ".join(f"{k}: {spec.source[k]}" for k in
                                             ("union", "union_release", "cols_pie")
                                             if k in spec.source))
    lo, hi = fractions.greedy_range
    line = (f"rows fractions: greedy {100 * fractions.greedy:.1f} % (release head, published "
            f"{100 * lo:.1f}-{100 * hi:.1f} %)")
    if fractions.sampled is not None:
        line += (f"; sampled {100 * fractions.sampled:.1f} % = greedy x demo top-40/greedy "
                 f"({100 * fractions.demo_topk:.1f} / {100 * fractions.demo_greedy:.1f} %)")
    else:
        line += "; sampled: no demo measurement (engine without head counters), greedy used"
    if fractions.random_greedy is not None:
        line += (f"; release-shaped random head {100 * fractions.random_greedy:.1f} % greedy, "
                 f"{100 * fractions.random_topk:.1f} % top-40")
    print(line)
    print("counters: " + ("measured (" + "; ".join(measured.sources.values()) + ")"
                          if measured else "analytic (the engine's formulas, no image given)"))
    if not args.no_plot and _have_matplotlib():
        path = args.plot or Path("costmodel-s3.png")
        costmodel.plot(rep, path)
        print(f"plot: {path}")
    if args.json:
        write_json(rep.to_json(), args.json)
        print(f"json: {args.json}")
    return 0


def main(argv: Sequence[str] | None = None, *, llm_module: object | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.greedy_only and args.sampled_only:
        print("--greedy-only and --sampled-only exclude each other", file=sys.stderr)
        return 2
    try:
        if args.model_s3:
            return _model_s3_main(args, llm_module)
        if args.port is None and args.board is None:
            print("say where to run: --port PORT (a board) or --board host", file=sys.stderr)
            return 2
        if args.report:
            return _report_main(args, llm_module)
        if args.gate:
            return _gate_main(args, llm_module)
        runs = default_runs(args.prompt or PROMPTS, greedy=not args.sampled_only,
                            sampled=not args.greedy_only)
        if args.plain + args.compare_plain + args.fast > 1:
            print("--plain, --fast and --compare-plain exclude each other", file=sys.stderr)
            return 2
        if args.quality and not args.fast:
            print("--quality is fast mode's gate: give --fast too", file=sys.stderr)
            return 2
        if args.quality:
            return _quality_main(args, llm_module)
        modes = (["exact", "plain"] if args.compare_plain else
                 ["plain" if args.plain else "fast" if args.fast else "exact"])
        suffix = {"exact": "", "plain": " (plain)", "fast": " (fast, lossy)"}
        results: list[BenchResult] = []
        if args.port:
            for mode in modes:
                r = run_port(args.port, runs, args.tokens, soft_reset=args.soft_reset,
                             progress=not args.quiet, timeout=args.timeout, mode=mode,
                             draft=args.draft, port_image=args.port_image)
                r.board += suffix[mode]
                results.append(r)
        else:
            images: list[tuple[str, Path]] = []
            img = args.image or _default_image()
            if img is not None:
                images.append((f"host:{img.name}" if args.image else "host:demo", img))
            if args.release_shaped:
                images.append(("host:release-shaped", make_release_shaped(_release_dir())))
            if not images:
                print("no model: give --image PATH or --release-shaped (no demo model found "
                      "under models/demo)", file=sys.stderr)
                return 2
            for label, path in images:
                if not Path(path).is_file():
                    print(f"{path}: no such image", file=sys.stderr)
                    return 2
                for mode in modes:
                    r = run_host(path, runs, args.tokens, llm_module=llm_module,
                                 progress=not args.quiet, mode=mode, draft=args.draft)
                    r.board = label + suffix[mode]
                    results.append(r)
        for r in results:
            print(format_result(r))
            print()
        if args.compare_plain:
            same = True
            for fast, plain in zip(results[::2], results[1::2]):
                line, ok = compare_plain(fast, plain)
                same &= ok
                print(line)
            if not same:
                print("error: the speed-ups changed the output", file=sys.stderr)
                return 1
        name = "host" if args.board else Path(args.port).name
        jpath = args.json or Path(f"bench-{name}.json")
        write_json(to_json(results), jpath)
        print(f"json: {jpath}")
        if not args.no_plot and _have_matplotlib():
            ppath = args.plot or jpath.with_suffix(".png")
            plot_stages(results, ppath)
            print(f"plot: {ppath}")
        return 0
    except (RuntimeError, ValueError, OSError) as e:
        print(f"bench.py: {e}", file=sys.stderr)
        return 1


__all__ = [
    "PROMPTS",
    "BenchResult",
    "RunResult",
    "RunSpec",
    "bench_code",
    "default_runs",
    "main",
    "make_release_shaped",
    "parse_stream",
    "plot_stages",
    "port_gate",
    "run_host",
    "run_port",
    "run_port_snippet",
]
