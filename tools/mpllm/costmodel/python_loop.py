"""The MicroPython loop per token, measured: what llm.py's loop around the
engine costs on the MicroPython unix port built with our module (the figures
s3.py's PY_LOOP_HOST_* constants hold), and the pystone of that binary.

    python -m mpllm.costmodel.python_loop --micropython PATH [--image IMG]
        [--tokens 200] [--seeds 1,2,3] [--runs 5] [--micropy-dir DIR] [--json FILE]

PATH is the unix port built with USER_C_MODULES=native (the tests build one
when MICROPY_DIR is set: tests/test_micropython_binding.py's _build_unix).
The binary runs llm.generate on the image (default: the demo model, as
tools/chat.py converts it) at T 0.8, top-40: at most `--tokens` story tokens after
"Once upon a time" for each seed, and `--runs` such rounds, the three ways of
decoding interleaved in every round:

  step   decoding step by step (draft=None);
  never  verify passes with a drafter that never guesses (one token a pass);
  ngram  verify passes with the image's n-gram drafter.

The loop's time is the wall time from the story's first text piece to its
end, less the engine's own total_ms over the same span (what the engine's
timers see), per story token after the first piece. Noise (other processes,
the machine's clock) only adds time, so each story's figure is the least
over the rounds, and a way's is those summed over the seeds. From never and
ngram, at their passes per story token p, the loop is solved as T per story
token + P per pass (never: T + P x p_never, ngram: T + P x p_ngram). All
ways must write the same text (verify passes keep what plain decoding
chooses): the tool stops if they do not, and prints a digest of the stories
so that two checkouts can be compared for the same text. The floor under
all of them, "bare": model.step called in a bare for loop, no llm.py (what
the binding and the engine spend outside the engine's stage timers).

With --micropy-dir (default $MICROPY_DIR) holding MicroPython's
tests/perf_bench, the same binary also runs its pystone (misc_pystone.py
with benchrun.py, 20,000 loops as run-perfbench.py's largest parameters),
best of --pystone-runs: the ratio to an ESP32's pystones scales the loop to
the board (s3.PY_S3_PER_HOST). And gc.mem_free() of the binary's heap before
`import llm`, after it and after llm.load().
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..checkout import FIRMWARE_MODULES

#: the ways of decoding measured, in the order each round runs them
WAYS = ("step", "never", "ngram")
#: and the floor they stand on: model.step called in a bare for loop (what the
#: binding and the engine spend outside the engine's stage timers)
BARE = "bare"
PROMPT = "Once upon a time"
#: run-perfbench.py's (N, M) for its largest pystone parameters (20,000 loops)
PYSTONE_NM = (5000, 10)

#: what the unix binary runs; prints HEAP once, then RUN per story and
#: TEXT per way and seed of the first round (the host checks the rest agree)
SCRIPT = """
import gc
gc.collect()
free_start = gc.mem_free()
import llm
gc.collect()
free_import = gc.mem_free()
model = llm.load({image!r})
gc.collect()
print("HEAP", free_start, free_import, gc.mem_free())
ids = llm.tokenizer().encode({prompt!r})
from time import ticks_diff, ticks_us


def never(context, n):
    return []


DRAFTS = {{"step": None, "never": never, "ngram": "ngram"}}
for r in range({runs}):
    for way in {ways!r}:
        for seed in {seeds!r}:
            gc.collect()
            pieces = llm.generate({prompt!r}, max_tokens={tokens}, seed=seed,
                                  draft=DRAFTS[way])
            text = [next(pieces)]
            s0 = llm.stats()
            e0 = model.stats()["total_ms"]
            t0 = ticks_us()
            for piece in pieces:
                text.append(piece)
            t1 = ticks_us()
            e1 = model.stats()["total_ms"]
            s1 = llm.stats()
            print("RUN", r, way, seed, ticks_diff(t1, t0), e1 - e0, s1["tokens"] - s0["tokens"],
                  s1["passes"] - s0["passes"])
            if r == 0:
                print("TEXT", way, seed, repr("".join(text)))
    for seed in {seeds!r}:  # the floor: bare model.step calls, no llm.py around them
        gc.collect()
        model.reset()
        model.sampler(0.8, 40, seed)
        token = model.prefill(ids)
        step = model.step
        e0 = model.stats()["total_ms"]
        t0 = ticks_us()
        for _ in range({bare}):
            token = step(token)
        t1 = ticks_us()
        print("RUN", r, "bare", seed, ticks_diff(t1, t0), model.stats()["total_ms"] - e0, {bare}, 0)
"""


class LoopError(RuntimeError):
    """The measurement could not run (one line says why)."""


@dataclass
class LoopFigures:
    """The loop's cost on the unix port (us a story token, least over runs)."""

    micropython: str
    image: str
    tokens: int
    seeds: list[int]
    runs: int
    us_per_token: dict[str, float]  # per way and bare: the least over the runs
    tokens_per_pass: dict[str, float]  # never, ngram
    token_us: float  # solved: per story token with verify passes
    pass_us: float  # solved: per verify pass
    story_tokens: int  # per round, summed over the seeds
    stories_sha256: str
    heap_free: dict[str, int]  # gc.mem_free(): start, after_import, after_load
    pystones: float | None = None  # pystones/s, best of the pystone runs


def _run(exe: str, code: str, what: str, timeout: float = 3600) -> str:
    env = dict(os.environ, MICROPYPATH=f"{FIRMWARE_MODULES}:.frozen")
    try:
        r = subprocess.run([exe, "-c", code], capture_output=True, text=True, env=env,
                           timeout=timeout, check=False)
    except OSError as e:
        raise LoopError(f"cannot run the MicroPython binary {exe}: {e}") from None
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        raise LoopError(f"{what} failed on {exe} (exit {r.returncode}): " + " | ".join(tail))
    return r.stdout


def measure_loop(exe: str, image: str, *, tokens: int = 200, seeds: tuple[int, ...] = (1, 2, 3),
                 runs: int = 5) -> LoopFigures:
    """The loop's us per story token on the unix binary `exe` (see the module's doc)."""
    code = SCRIPT.format(image=image, runs=runs, ways=WAYS, seeds=tuple(seeds), prompt=PROMPT,
                         tokens=tokens, bare=tokens - 1)
    out = _run(exe, code, "the loop measurement")
    heap: dict[str, int] = {}
    texts: dict[tuple[str, int], str] = {}
    loop_us: dict[tuple[str, int], list[float]] = {}  # per (way, seed): one a round
    counts: dict[tuple[str, int], set[tuple[int, int]]] = {}  # (tokens, passes) seen
    for line in out.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "HEAP":
            start, after_import, after_load = (int(v) for v in rest.split())
            heap = {"start": start, "after_import": after_import, "after_load": after_load}
        elif kind == "RUN":
            _r, way, seed, wall_us, engine_ms, n, passes = rest.split()
            key = (way, int(seed))
            loop_us.setdefault(key, []).append(int(wall_us) - 1000 * float(engine_ms))
            counts.setdefault(key, set()).add((int(n), int(passes)))
        elif kind == "TEXT":
            way, seed, text = rest.split(" ", 2)
            texts[way, int(seed)] = text
    ways = (*WAYS, BARE)
    if not heap or any(len(loop_us.get((w, s), ())) != runs for w in ways for s in seeds):
        raise LoopError(f"the loop measurement did not print its {runs} rounds: " + out[-300:])
    for way in WAYS[1:]:
        for seed in seeds:
            if texts[way, seed] != texts["step", seed]:
                raise LoopError(f"seed {seed}: decoding with draft {way!r} wrote another story "
                                "than step by step (verify passes must keep plain decoding's)")
    for (way, seed), seen in counts.items():
        if len(seen) != 1:
            raise LoopError(f"draft {way!r}, seed {seed}: the rounds wrote different numbers "
                            "of tokens")
    # noise only adds time: each story's least over the rounds, summed over the seeds
    total = {w: [sum(next(iter(counts[w, s]))[i] for s in seeds) for i in (0, 1)] for w in ways}
    n = total["step"][0]
    if n <= 0:
        raise LoopError("the stories had no tokens after their first piece: nothing to time")
    least = {w: sum(min(loop_us[w, s]) for s in seeds) / total[w][0] for w in ways}
    per_pass = {way: n / total[way][1] for way in WAYS[1:]}
    # T + P x (passes / token) for never (one pass a token) and ngram
    p_never, p_ngram = 1 / per_pass["never"], 1 / per_pass["ngram"]
    if p_never == p_ngram:
        raise LoopError("the n-gram drafter kept no guess: the per-pass cost cannot be solved "
                        "(an image without a drafter table?)")
    pass_us = (least["never"] - least["ngram"]) / (p_never - p_ngram)
    token_us = least["never"] - pass_us * p_never
    digest = hashlib.sha256("\n".join(texts["step", s] for s in seeds).encode()).hexdigest()
    return LoopFigures(micropython=exe, image=image, tokens=tokens, seeds=list(seeds), runs=runs,
                       us_per_token=least, tokens_per_pass=per_pass, token_us=token_us,
                       pass_us=pass_us, story_tokens=n, stories_sha256=digest, heap_free=heap)


def measure_pystone(exe: str, micropy_dir: Path, runs: int = 5) -> float:
    """Pystones/s of MicroPython's own pystone benchmark on `exe`, best of `runs`
    (the script composed as run-perfbench.py composes it, read from the checkout)."""
    bench = micropy_dir / "tests" / "perf_bench"
    code = ((bench / "misc_pystone.py").read_text() + "\n" + (bench / "benchrun.py").read_text()
            + f"\nbm_run({PYSTONE_NM[0]}, {PYSTONE_NM[1]})\n")
    best = 0.0
    for _ in range(runs):
        time_us, norm, _result = _run(exe, code, "pystone").split(None, 2)
        if int(time_us) <= 0:
            raise LoopError(f"pystone printed no time: {time_us} {norm}")
        best = max(best, 1e6 * int(norm) / int(time_us))
    return best


def report(f: LoopFigures) -> str:
    """The figures as the command prints them."""
    lines = [
        f"llm.py's loop on {f.micropython}",
        (f"  {f.image}: {f.story_tokens} story tokens a round ({f.tokens} at most x seeds "
         f"{','.join(map(str, f.seeds))}, T 0.8 top-40), each story's least of {f.runs} rounds:"),
        f"  step by step           {f.us_per_token['step']:6.2f} us a token",
        (f"  verify, never guesses  {f.us_per_token['never']:6.2f} us a token "
         f"({f.tokens_per_pass['never']:.3f} tokens a pass)"),
        (f"  verify, n-gram drafter {f.us_per_token['ngram']:6.2f} us a token "
         f"({f.tokens_per_pass['ngram']:.3f} tokens a pass)"),
        f"  with verify passes:    {f.token_us:6.2f} us a story token + {f.pass_us:.2f} us a pass",
        (f"  the floor under them:  {f.us_per_token[BARE]:6.2f} us a step (model.step in a bare "
         "loop: the binding and the engine outside its stage timers)"),
        f"  stories: sha256 {f.stories_sha256[:16]} (every way wrote the same text)",
        (f"heap (gc.mem_free()): {f.heap_free['start']:,} B at start, "
         f"{f.heap_free['after_import']:,} after import llm, "
         f"{f.heap_free['after_load']:,} after llm.load()"),
    ]
    if f.pystones is not None:
        lines.append(f"pystone: {f.pystones:,.0f} pystones/s (best of the runs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micropython", required=True, metavar="PATH",
                    help="the MicroPython unix port built with _llm (USER_C_MODULES=native)")
    ap.add_argument("--image", help="a converted model image with an n-gram drafter "
                                    "(default: the demo model)")
    ap.add_argument("--tokens", type=int, default=200, help="story tokens at most (default 200)")
    ap.add_argument("--seeds", default="1,2,3", help="sampling seeds (default 1,2,3)")
    ap.add_argument("--runs", type=int, default=5, help="rounds; the least is kept (default 5)")
    ap.add_argument("--micropy-dir", default=os.environ.get("MICROPY_DIR"), metavar="DIR",
                    help="a MicroPython checkout whose tests/perf_bench pystone to run "
                         "(default $MICROPY_DIR; none: no pystone)")
    ap.add_argument("--pystone-runs", type=int, default=5, help="pystone runs (default 5)")
    ap.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: give comma-separated integers")
    if args.tokens < 2 or args.runs < 1 or args.pystone_runs < 1:
        ap.error("--tokens must be at least 2, --runs and --pystone-runs at least 1")
    if not Path(args.micropython).is_file():
        ap.error(f"--micropython {args.micropython}: no such file")
    image = args.image
    if image is None:
        from ..board.hostboard import demo_sources, ensure_image

        image = str(ensure_image(*demo_sources()))
    elif not Path(image).is_file():
        ap.error(f"--image {image}: no such file")
    pystone_dir = None
    if args.micropy_dir:
        pystone_dir = Path(args.micropy_dir)
        if not (pystone_dir / "tests" / "perf_bench" / "misc_pystone.py").is_file():
            print(f"(no pystone: {pystone_dir} has no tests/perf_bench/misc_pystone.py)",
                  file=sys.stderr)
            pystone_dir = None
    try:
        print(f"measuring the loop: {args.runs} rounds x {len(WAYS)} ways x {len(seeds)} "
              f"stories ...", file=sys.stderr, flush=True)
        figures = measure_loop(args.micropython, image, tokens=args.tokens, seeds=seeds,
                               runs=args.runs)
        if pystone_dir is not None:
            print(f"pystone x {args.pystone_runs} ...", file=sys.stderr, flush=True)
            figures.pystones = measure_pystone(args.micropython, pystone_dir, args.pystone_runs)
    except LoopError as e:
        print(f"python_loop: {e}", file=sys.stderr)
        return 1
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
