"""What a bench run is and what it gave: the runs (RunSpec, default_runs), their
results (RunResult, BenchResult), how the output of the board's
llm_bench.bench() is read into them (StreamRecorder timestamps every byte as
it arrives; parse_stream), and how results are shown: text, JSON, a PNG of the
stages."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..atomic import atomic_path, atomic_write_bytes
from ..boards import STAGES
from ..checkout import board_module

#: The fixed prompt set (TinyStories openings).
PROMPTS = ("Once upon a time", "One day, a little girl named Lily", "Tom and his dog")
#: Sampled runs use upstream's sampler settings (T 0.8, top-k 40) and fixed seeds.
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 40
SAMPLE_SEED = 20240601


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
    lb = board_module("llm_bench")
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


def memory_summary(memory: list) -> str:
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
             "memory: " + memory_summary(res.memory),
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
