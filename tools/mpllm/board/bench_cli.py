"""`tools/bench.py` and `mpllm-bench`: benchmark the board (or the host board) and check it
computes what the host does.

    python tools/bench.py --port /dev/ttyACM0          the board, over its serial REPL
    python tools/bench.py --board host [--image IMG]   in-process, CPython `_llm`
    python tools/bench.py --board host --release-shaped   ... plus a release-shaped model
    python tools/bench.py --gate --image IMG [--port PORT | --board host]
    python tools/bench.py --model-s3 [--release-shaped | --image IMG]   cost model
    python tools/bench.py --port PORT --ab [--json AB.json]   each engine switch off/on
    python tools/bench.py --board host --ab [--image IMG]     ... on the host board
    python tools/bench.py --model-s3 --refit AB.json          the model refitted by it

Two speeds are reported: engine ms/token (the engine's own stage
timers, decode steps only) and round-trip tok/s (when the text reaches this
machine: through MicroPython's print and the serial link for a board). Also:
per-stage ms, time to first token (engine and round trip), memory placement
and build_info. Results go to a JSON file and a PNG stage chart.

How the board is driven and what runs there: bench.py.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..atomic import OutputError, check_output, is_stream
from ..image_cache import ImageFileError, check_image_file
from ..models import PRICED_SHAPES, RELEASE_GREEDY_FRACTION
from . import gate
from .bench import (
    default_image,
    import_llm_modules,
    make_release_shaped,
    port_gate,
    progress_close,
    release_dir,
    report_info,
    run_host,
    run_port,
)
from .bench_ab import AB_SWITCHES, format_ab, run_ab_host, run_ab_port
from .bench_runs import (
    PROMPTS,
    STAGES,
    BenchResult,
    compare_plain,
    default_runs,
    format_result,
    memory_summary,
    plot_stages,
    to_json,
    write_json,
)
from .modes import add_mode_flags
from .quality import QUALITY_MAX_NATS


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
    add_mode_flags(p)
    p.add_argument("--quality", action="store_true",
                   help="with --fast, instead of a bench: the quality gate against exact mode, "
                        "cross-entropy on held-out demo text and greedy agreement "
                        "of fast vs exact mode (exit 1 if the cross-entropy differs by more "
                        f"than {QUALITY_MAX_NATS} nats)")
    p.add_argument("--report", type=Path, metavar="FILE",
                   help="one JSON for a bug report: build_info, selftest(), the gate hash, the "
                        "bench per stage, memory placement and free memory (prints a summary); "
                        "leaves the model the board has open as it was")
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
                   help="print the ESP32-S3 cost model, every figure as a low/mid/high band "
                        "(uses --image/--release-shaped if given; a llama2.c --image: its "
                        "shape's figures, as --shape, where the cost model prices that shape)")
    p.add_argument("--shape", choices=["release", *PRICED_SHAPES], default="release",
                   help="with --model-s3: the model shape (default release: the esp32-ai "
                        "model); a llama2.c shape prints its placement on the N16R8 and the "
                        "N8 (no PSRAM) and its ms/token bands, dense and certified head, "
                        "greedy and sampled (no plot)")
    p.add_argument("--rows-fraction", type=float, default=RELEASE_GREEDY_FRACTION,
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
    p.add_argument("--vs-runc", type=Path, metavar="RUN",
                   help="with --board host and --llama2c: time llama2.c's run.c (your own "
                        "build, e.g. `make run` in a llama2.c checkout) beside our engine on "
                        "the same checkpoint, prompt and positions, and print the ratio")
    p.add_argument("--llama2c", type=Path, nargs=2, metavar=("MODEL.bin", "TOKENIZER.bin"),
                   help="with --vs-runc: the llama2.c checkpoint and its tokenizer.bin "
                        "(converted into an image once, cached)")
    p.add_argument("--weights", choices=("auto", "int4", "int8", "fp32"), default="auto",
                   help="with --vs-runc: our image's weight format (convert.py --weights; "
                        "default auto, what convert.py chooses): fp32 beside run.c, int8 "
                        "beside runq.c")
    p.add_argument("--ab", action="store_true",
                   help="each engine switch (cache preload, K as int16 dots) off and on, "
                        "interleaved (--ab-rounds times), on the fixed greedy and sampled "
                        "runs: per-stage ms and the on/off ratio of each, the fill/compute "
                        "overlap fitted from the stages; exit 1 if a switch changed any "
                        "run's ids or logits hash. --board host runs a release-shaped "
                        "image unless --image is given; a board runs its own")
    p.add_argument("--ab-switch", action="append", metavar="NAME",
                   help="with --ab: only this switch (repeat for several; default all)")
    p.add_argument("--ab-rounds", type=int, default=2,
                   help="with --ab: off/on rounds per switch (default %(default)s)")
    p.add_argument("--refit", type=Path, metavar="AB.json",
                   help="with --model-s3: the overlap refitted from a board's --ab report and "
                        "what it moves (our exact builds at the release shape)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


@functools.cache  # asked when the outputs are checked and again when plotting: said once
def _have_matplotlib() -> bool:
    """Plots need matplotlib (in the [board] and [dev] extras); without it, say so and go on."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)",
              file=sys.stderr)
        return False
    return True


@functools.cache  # said once, however often asked
def _nothing_beside(path: Path) -> None:
    print(f"plot skipped: --json {path} is written in place (a device or a pipe), so no plot "
          "goes beside it; --plot FILE names one", file=sys.stderr)


def _plotting(args: argparse.Namespace) -> bool:
    return not args.no_plot and _plot_path(args) is not None and _have_matplotlib()


def _bench_json(args: argparse.Namespace) -> Path:
    """Where a bench writes its JSON (its plot goes beside it unless --plot)."""
    name = "host" if args.board else Path(args.port).name
    return args.json or Path(f"bench-{name}.json")


def _ab_json(args: argparse.Namespace) -> Path:
    """Where --ab writes its report."""
    name = "host" if args.board else Path(args.port).name
    return args.json or Path(f"ab-{name}.json")


def _plot_path(args: argparse.Namespace) -> Path | None:
    """Where the chart goes: --plot, else beside the JSON (the cost model without
    --json: costmodel-s3.png here); None when the JSON is written in place (a
    device such as /dev/null, or a pipe): nothing can go beside it."""
    if args.plot:
        return args.plot
    if args.model_s3 and not args.json:
        return Path("costmodel-s3.png")
    beside = args.json if args.model_s3 else _bench_json(args)
    if is_stream(beside):
        _nothing_beside(beside)
        return None
    return beside.with_suffix(".png")


def _outputs(args: argparse.Namespace) -> list[Path]:
    """Every file this run will write, known before it runs (so all are checked
    before any work is done or any file written)."""
    if args.model_s3 and args.refit is not None:
        return [args.json] if args.json else []
    if args.model_s3:
        plots = [_plot_path(args)] if args.shape == "release" and _plotting(args) else []  # type: ignore[list-item]
        return plots + ([args.json] if args.json else [])
    if args.ab:
        return [_ab_json(args)]
    if args.report:
        return [args.report]
    if args.gate:
        return []
    if args.quality:
        return [args.json] if args.json else []
    return [_bench_json(args)] + ([_plot_path(args)] if _plotting(args) else [])  # type: ignore[list-item]


def _report_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """--report FILE: build, self-test, gate, the bench per stage, placement and
    free memory in one JSON, and a summary to paste into an issue. On a board
    the model the user has open stays open (the bench and gate share it)."""
    import_llm_modules(llm_module)
    image = args.image or (None if args.port else default_image())
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
            ref = gate.reference_gate(image, n_tokens=len(got.ids))
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
             f"heap free: {info.get('heap_free')}; memory: {memory_summary(res.memory)}",
             f"weights: {weights_summary(res.config)}",
             f"json: {args.report}"]
    print("\n".join(lines))
    return 0


def weights_summary(cfg: dict) -> str:
    """The model's weight format and the converter's measured choice, from
    Model.config() (an engine older than the formats reports neither)."""
    fmt = cfg.get("weights", "int4")
    choice = cfg.get("weights_choice") or {}
    if not choice:
        return f"{fmt} (the converter measured no choice)"
    figures = {k: v for k, v in choice.items() if k not in ("chosen", "positions")}
    tried = ", ".join(f"{name} {100 * agree:.1f} % agreement, mean |diff| {diff:.3g}, "
                      f"{size:,} bytes" for name, (agree, diff, size) in figures.items())
    return (f"{fmt}, chosen by the converter over {choice['positions']} positions of "
            f"the fp32 forward ({tried})")


def _quality_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """bench.py --fast --quality: fast mode against exact mode on held-out demo
    text (mpllm.board.quality); the demo model unless --image."""
    from . import hostboard, quality

    if args.port:
        print("--fast --quality runs on the host board (it reads logits at every "
              "position)", file=sys.stderr)
        return 2
    image = args.image or default_image()
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
    image = args.image or (make_release_shaped(release_dir()) if args.release_shaped
                           else default_image())
    if image is None:
        print("bench.py --gate: no demo model found; give --image or --release-shaped",
              file=sys.stderr)
        return 2
    if args.port:
        other = port_gate(args.port, soft_reset=args.soft_reset, timeout=max(args.timeout, 300),
                          port_image=args.port_image)
    else:
        import_llm_modules(llm_module)
        other = gate.engine_gate(image)
    if args.expect:
        want = args.expect.strip().lower()
        if len(want) != 16 or any(c not in "0123456789abcdef" for c in want):
            print(f"--expect {args.expect!r}: expected 16 hex digits", file=sys.stderr)
            return 2
        if len(other.ids) != gate.N_TOKENS:
            print(f"--expect: a stored hash is of the gate's {gate.N_TOKENS} tokens, but the "
                  f"board's context held {len(other.ids)}: leave --expect out to compare "
                  "with the host's reference over the same count", file=sys.stderr)
            return 2
        ref = gate.GateResult(want, other.prompt_ids, other.ids, "expected (--expect)")
    else:
        ref = gate.reference_gate(image, n_tokens=len(other.ids))
    ok, text = gate.compare(ref, other)
    print(text)
    return 0 if ok else 1


class _Steps:
    """The steps of a long run (--model-s3: a minute or more), each said on
    stderr as it starts, with the seconds since the run began; stdout keeps
    the figures."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, what: str) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f} s] {what} ...", file=sys.stderr,
              flush=True)

    def done(self) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f} s] done", file=sys.stderr, flush=True)


def _costmodel() -> ModuleType:
    """The S3 cost model (mpllm.costmodel), an add-on: imported here alone, when a
    command asks for its figures (--model-s3 and its --shape and --refit, and the
    overlap --ab's report fits), never at module level, so nothing else of the
    bench (a board's run, the gate, --report) loads it."""
    from .. import costmodel

    return costmodel


def _model_s3_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """The ESP32-S3 cost model: anchors, our build before/after, variants.

    The engine's counters feed it where they exist: bytes and PIE counts from
    a release-shaped image (--image or --release-shaped), and the certified
    head's rows fractions measured on the demo model (its top-40/greedy ratio
    scales the published greedy fraction for our sampled figure) and on the
    release-shaped random model."""
    if args.shape != "release":
        return _model_s3_shape(args)
    cm = _costmodel()
    if not 0.0 < args.rows_fraction <= 1.0:
        print(f"--rows-fraction {args.rows_fraction}: expected a share in (0, 1]",
              file=sys.stderr)
        return 2
    if args.draft_stories < 1 or args.draft_tokens < 10:
        print("--draft-stories must be >= 1 and --draft-tokens >= 10", file=sys.stderr)
        return 2
    measured = None
    step = _Steps()
    if args.release_shaped and not args.image:
        step("a release-shaped image (made once, then cached)")
    image = args.image or (make_release_shaped(release_dir()) if args.release_shaped else None)
    _llm = None
    try:
        _llm = import_llm_modules(llm_module)
    except ImportError as e:
        print(f"_llm not importable ({e}): analytic counters only", file=sys.stderr)
    if image is not None and _llm is not None:
        with _llm.Model(os.fspath(image)) as m:  # type: ignore[attr-defined]
            shape = cm.Shape.from_config(m.config())
        if not shape.has_ple:
            # a llama2.c image: the release prediction below would price the
            # esp32-ai model (minutes of measuring the demo), not this one
            return _model_s3_llama2c_image(args, image, shape, cm)
        if shape != cm.RELEASE:
            print(f"{image}: not release-shaped ({shape}); the S3 prediction needs the release "
                  "shape, using the analytic counts", file=sys.stderr)
            image = None
        else:
            step(f"the engine's counters on {image}")
            measured = cm.measure_host(os.fspath(image), llm_module=_llm)
    demo = default_image() if _llm is not None else None
    if _llm is not None:
        step(f"the certified head's rows fractions, {args.fraction_tokens} tokens a run")
    fractions = (cm.measure_fractions(demo, os.fspath(image) if image else None,
                                             llm_module=_llm, n_steps=args.fraction_tokens)
                 if _llm is not None else cm.HeadFractions())
    fractions.greedy = args.rows_fraction
    # speculative builds: drafting and head sharing measured on the demo model
    # (and the head sharing on the release-shaped image when one is in use)
    if _llm is not None and demo is not None:
        spec = cm.measure_spec(demo, os.fspath(image) if image else None,
                                      llm_module=_llm, table_stories=args.draft_stories,
                                      n_tokens=args.draft_tokens, adaptive=not args.no_adaptive,
                                      progress=step)
    else:
        spec = cm.SpecInputs.default()
        print("speculative inputs: no engine or demo model here, using the defaults measured "
              "at 9a6b552", file=sys.stderr)
    rep = cm.report(measured, fractions, spec=spec, progress=step)
    step.done()
    print(rep.table())
    for name in (*cm.OURS, *cm.SPEC):
        b = rep.builds[name]
        fr = b.get("rows_fraction")
        rows = "dense head" if fr is None else f"{100 * fr:.1f} % of head rows"
        if name in cm.SPEC:
            rows += (f", {b['drafter']}: {b['tokens_per_pass']:.2f} tokens/pass, m "
                     f"{b['positions_per_pass']:.2f}, pass {b['pass_ms']:.2f} ms")
        band = b["band"]
        print(f"ours, predicted ms/token per stage on the N16R8 ({b['label']}, {rows}): "
              + ", ".join(f"{st} {b['stages'][st]:.2f}" for st in cm.MODEL_STAGES)
              + f"; total {band['mid']:.2f} (band {band['low']:.2f}-{band['high']:.2f}; "
              f"{b['tok_s']:.1f} tok/s at the mid)")
    for mode, rows_d in spec.drafts.items():
        print(f"drafting ({mode}, demo model; {spec.source.get('drafts', '')}): " + "; ".join(
            f"{n} {d.tokens_per_pass:.2f} tokens/pass, {d.drafted_per_pass:.2f} drafted/pass, "
            f"accept {100 * d.accept_rate:.1f} %" for n, d in rows_d.items()))
    if spec.table:
        print(f"n-gram table: {spec.table.get('contexts', 0):,} contexts, "
              f"{spec.table.get('entries', 0):,} entries from {spec.table.get('stories', 0)} "
              "self-generated stories")
    best = {n: rep.builds[n]["drafter"] for n in cm.SPEC}
    print("speculative: best drafter measured "
          + ", ".join(f"{cm.SPEC_BUILD_MODE[n]} {d}" for n, d in best.items())
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
    if _plotting(args):
        path = _plot_path(args)
        cm.plot(rep, path)
        print(f"plot: {path}")
    if args.json:
        write_json(rep.to_json(), args.json)
        print(f"json: {args.json}")
    return 0


def _llama2c_shape_name(shape: Any, cm: ModuleType) -> str | None:
    """The cost model's name (--shape) of a llama2.c image's shape, if it
    prices that shape: every dimension the same, the context too (the KV
    cache and so the placement follow it); the weight format and group it
    prices in every variant convert.py offers."""
    def dims(s: Any) -> tuple[int, ...]:
        return tuple(int(getattr(s, k)) for k in ("dim", "n_layers", "n_heads", "n_kv_heads",
                                                   "ffn", "vocab_out", "seq_len"))

    return next((name for name, s in cm.SHAPES.items() if dims(s) == dims(shape)), None)


def _model_s3_llama2c_image(args: argparse.Namespace, image: object, shape: Any,
                            cm: ModuleType) -> int:
    """--model-s3 --image IMG of a llama2.c model: its shape's report when the
    cost model prices that shape (as --shape NAME), else one line saying what
    it prices and where this image's placement is shown."""
    s = shape
    what = (f"dim {s.dim}, {s.n_layers} layers, {s.n_heads} heads, {s.n_kv_heads} kv heads, "
            f"hidden {s.ffn}, vocab {s.vocab_out}, seq_len {s.seq_len}")
    name = _llama2c_shape_name(shape, cm)
    if name is None:
        print(f"{image}: a llama2.c model ({what}) of a shape the S3 cost model does not price: "
              f"it prices the esp32-ai release model and llama2.c's "
              f"{', '.join(cm.SHAPES)} (--shape NAME); where this image lives on each board "
              "is in convert.py's table", file=sys.stderr)
        return 2
    print(f"{image}: a llama2.c model of the {name} shape ({what}): the cost model's "
          f"figures for it (--shape {name}) follow, for every weight format", file=sys.stderr)
    args.shape = name
    return _model_s3_shape(args)


def _model_s3_shape(args: argparse.Namespace) -> int:
    """--model-s3 --shape NAME: a llama2.c shape on the S3's boards (cm.llama):
    analytic (no engine run), every figure a band."""
    cm = _costmodel()
    rep = cm.shape_report(args.shape)
    print(cm.shape_table(rep))
    if args.json:
        write_json(rep, args.json)
        print(f"json: {args.json}")
    return 0


def _ab_main(args: argparse.Namespace, llm_module: object | None) -> int:
    """bench.py --ab: the switches off and on, interleaved; the report."""
    if args.plain or args.fast or args.compare_plain or args.gate or args.report:
        print("--ab measures exact mode's switches: not with --plain, --fast, "
              "--compare-plain, --gate or --report", file=sys.stderr)
        return 2
    runs = default_runs(args.prompt or PROMPTS, greedy=not args.sampled_only,
                        sampled=not args.greedy_only)
    switches = tuple(args.ab_switch or AB_SWITCHES)
    overlap = _costmodel().ab_overlap  # the report's fitted overlap: the cost model's figure
    if args.port:
        rep = run_ab_port(args.port, runs, args.tokens, switches=switches,
                          rounds=args.ab_rounds, soft_reset=args.soft_reset,
                          timeout=args.timeout, port_image=args.port_image, overlap=overlap)
    else:
        image = args.image or make_release_shaped(release_dir())
        rep = run_ab_host(image, runs, args.tokens, switches=switches, rounds=args.ab_rounds,
                          llm_module=llm_module,
                          board="host:" + (args.image.name if args.image else "release-shaped"),
                          overlap=overlap)
    print(format_ab(rep))
    path = _ab_json(args)
    write_json(rep, path)
    print(f"json: {path}")
    return 0


def _refit_main(args: argparse.Namespace) -> int:
    """bench.py --model-s3 --refit AB.json."""
    import json

    cm = _costmodel()
    try:
        ab = json.loads(args.refit.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"bench.py: cannot read {args.refit}: {e}", file=sys.stderr)
        return 2
    if not isinstance(ab, dict):
        print(f"bench.py: {args.refit} is not a bench.py --ab report", file=sys.stderr)
        return 2
    summary = cm.refit_summary(ab)
    ov = summary["overlap"]
    note = "" if ov["physical"] else " (outside [0, 1]: priced clamped)"
    print(f"{args.refit} ({summary['board']}): overlap {ov['was']:.3f} (calibration) -> "
          f"{ov['value']:.3f} fitted from its stages{note}, {ov['used']:.3f} used")
    for row in ov["stages"]:
        print(f"  {row['mode']:<8} {row['stage']:<5} measured {row['measured_ms']:.3f} ms, "
              f"model without overlap {row['base_ms']:.3f}, hideable {row['hideable_ms']:.3f}: "
              f"implies {row['implied']:.3f}")
    for mode, p in summary["release_ms"].items():
        print(f"exact {mode}, release shape, positions 4..203: {p['before_ms']:.2f} -> "
              f"{p['after_ms']:.2f} ms/token")
    if args.json:
        write_json(summary, args.json)
        print(f"json: {args.json}")
    return 0


def _vs_runc_main(args: argparse.Namespace) -> int:
    """--vs-runc RUN --llama2c MODEL TOKENIZER: run.c and our host engine side by side."""
    from ..image_cache import converted, default_cache_dir
    from . import runc

    if not (args.vs_runc and args.llama2c and args.board == "host"):
        print("--vs-runc RUN, --llama2c MODEL.bin TOKENIZER.bin and --board host go together",
              file=sys.stderr)
        return 2
    for path, what in ((args.vs_runc, "--vs-runc"), *((p, "--llama2c") for p in args.llama2c)):
        if not path.is_file():
            hint = (" (llama2.c's run or runq: make runfast in a llama2.c checkout builds both)"
                    if what == "--vs-runc" else "")
            print(f"bench.py: {what} {path}: no such file{hint}", file=sys.stderr)
            return 2
    model_bin, tokenizer_bin = args.llama2c
    image = converted(model_bin, tokenizer_bin, default_cache_dir(), weights=args.weights)
    from ..checkout import board_module

    m = board_module("_llm").Model(str(image))
    try:
        steps = min(args.tokens if args.tokens != 100 else 256, int(m.config()["seq_len"]))
        prompt, ids = runc.long_prompt(board_module("llm_tokenizer").Tokenizer(
            m.tokenizer()).encode, steps)
    finally:
        m.close()
    try:
        a, b = runc.compare(args.vs_runc, model_bin, tokenizer_bin, image, ids, prompt, steps,
                            runc.REPEATS)
    except runc.RuncError as e:
        print(f"bench.py: {e}", file=sys.stderr)
        return 1
    print(runc.format_comparison(a, b, steps, runc.REPEATS))
    if args.json:
        write_json({"steps": steps, "prompt_ids": ids[:steps],
                    "runc_ms_per_token": a.ms_per_token, "mpllm_ms_per_token": b.ms_per_token,
                    "ratio": a.ms_per_token / b.ms_per_token,
                    "runc_cpu_ms_per_token": a.cpu_ms_per_token,
                    "mpllm_cpu_ms_per_token": b.cpu_ms_per_token}, args.json)
        print(f"json: {args.json}")
    return 0


def main(argv: Sequence[str] | None = None, *, llm_module: object | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.greedy_only and args.sampled_only:
        print("--greedy-only and --sampled-only exclude each other", file=sys.stderr)
        return 2
    try:
        if args.shape != "release" and (not args.model_s3 or args.image or args.release_shaped):
            print("--shape NAME is the cost model's (give --model-s3) and analytic: --image "
                  "and --release-shaped do not apply to it", file=sys.stderr)
            return 2
        if args.vs_runc or args.llama2c:
            if args.json:
                check_output(args.json)
            return _vs_runc_main(args)
        if args.refit is not None and not args.model_s3:
            print("--refit AB.json refits the cost model: give --model-s3 too", file=sys.stderr)
            return 2
        if args.port is None and args.board is None and not args.model_s3:
            print("say where to run: --port PORT (a board) or --board host", file=sys.stderr)
            return 2
        if args.image is not None:  # first: a bad image is the one line, no plot note before it
            check_image_file(args.image)
        for path in _outputs(args):
            check_output(path)
        if args.model_s3 and args.refit is not None:
            return _refit_main(args)
        if args.model_s3:
            return _model_s3_main(args, llm_module)
        if args.ab:
            return _ab_main(args, llm_module)
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
            img = args.image or default_image()
            if img is not None:
                images.append((f"host:{img.name}" if args.image else "host:demo", img))
            if args.release_shaped:
                images.append(("host:release-shaped", make_release_shaped(release_dir())))
            if not images:
                print("no model: give --image PATH or --release-shaped (no demo model found "
                      "under models/demo)", file=sys.stderr)
                return 2
            for label, path in images:
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
        jpath = _bench_json(args)
        write_json(to_json(results), jpath)
        print(f"json: {jpath}")
        if _plotting(args):
            ppath = _plot_path(args)
            plot_stages(results, ppath)
            print(f"plot: {ppath}")
        return 0
    except (OutputError, ImageFileError) as e:  # what the user gave: as bad arguments
        print(f"bench.py: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, ValueError, OSError) as e:
        progress_close()  # a bar left open would print again after the message
        print(f"bench.py: {e}", file=sys.stderr)
        return 1
