"""The MicroPython loop per token, measured: what llm.py's loop around the
engine costs on the MicroPython unix port built with our module, timed or
counted (--count: the figures s3.PY_LOOP_COUNTS holds), and the pystone of
that binary.

    python -m mpllm.costmodel.python_loop --micropython PATH [--image IMG]
        [--tokens 200] [--seeds 1,2,3] [--runs 5] [--micropy-dir DIR] [--json FILE]
        [--count]

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
best of --pystone-runs. And gc.mem_free() of the binary's heap before
`import llm`, after it and after llm.load().

--count counts instead of timing (what s3.PY_LOOP_COUNTS holds): each way
runs under valgrind's callgrind, once at --count-lengths' first story length
and once at its second, and the difference per story token is the loop's:
host instructions outside the engine (MicroPython's runtime, the libc under
it, our binding and port layer; what native/engine/ calls in libc is the
engine's) and the misses they take in a simulated data cache with the
board's geometry (32 KB, 8 ways, 64-byte lines: the engine's token streams
more than that through the cache in between, as it does on the board).
Pystone is counted the same way (two loop counts), so that the S3 price of
a counted instruction is one ESP32 pystone over the host instructions of
one pystone (s3.python_loop_s_from_counts). Counts do not depend on what
else the machine is doing; the binary must keep its symbols and debug
information (the unix port built with STRIP=, as the tests build it).
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


def _env() -> dict[str, str]:
    """The binary's environment: llm.py and the modules it imports from the checkout."""
    return dict(os.environ, MICROPYPATH=f"{FIRMWARE_MODULES}:.frozen")


def _pystone(micropy_dir: Path, n: int, m: int) -> str:
    """MicroPython's pystone with bm_run(n, m), composed as run-perfbench.py composes it."""
    bench = micropy_dir / "tests" / "perf_bench"
    return ((bench / "misc_pystone.py").read_text() + "\n" + (bench / "benchrun.py").read_text()
            + f"\nbm_run({n}, {m})\n")


def _run(exe: str, code: str, what: str, timeout: float = 3600) -> str:
    env = _env()
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
    code = _pystone(micropy_dir, *PYSTONE_NM)
    best = 0.0
    for _ in range(runs):
        time_us, norm, _result = _run(exe, code, "pystone").split(None, 2)
        if int(time_us) <= 0:
            raise LoopError(f"pystone printed no time: {time_us} {norm}")
        best = max(best, 1e6 * int(norm) / int(time_us))
    return best


#: the board's data cache, as callgrind simulates it for the loop's misses
#: (the N16R8's 32 KB, 64-byte-line DCache, firmware/README.md; 8 ways)
DCACHE_SIM = "--D1=32768,8,64"
#: the story lengths (tokens at most) of a way's two counted runs
COUNT_LENGTHS = (40, 160)
#: pystone's two counted runs: misc_pystone.py's (N, M) keys for 300 and 4,000 loops
PYSTONE_COUNT_NM = ((100, 10), (1000, 10))
#: source files whose instructions are the engine's (priced by the cost model
#: stage by stage, not as the loop)
ENGINE_SOURCES = "/native/engine/"

#: what the unix binary runs under callgrind for one way and one length
COUNT_SCRIPT = """
import llm
llm.load({image!r})


def never(context, n):
    return []


draft = {{"step": None, "never": never, "ngram": "ngram"}}[{way!r}]
tokens = passes = 0
text = []
for seed in {seeds!r}:
    for piece in llm.generate({prompt!r}, max_tokens={tokens}, seed=seed, draft=draft):
        text.append(piece)
    s = llm.stats()
    tokens += s["tokens"]
    passes += s.get("passes") or 0
print("COUNT", tokens, passes)
print("TEXT", repr("".join(text)))
"""


def callgrind_costs(path: Path) -> dict[str, dict[str, int]]:
    """Cost per event in a callgrind output file, split into "engine" and
    "loop": the engine's is the code of source files under native/engine/
    and what it calls outside native/ (libm's sqrtf, memcpy: the engine's
    work, priced by the cost model); the loop's is every other file's own
    code (MicroPython, the libc under it, our binding and port layer, and
    code with no debug information)."""
    events: list[str] = []
    names: dict[str, str] = {}  # id -> file name (callgrind's name compression)
    totals: dict[str, list[int]] = {"engine": [], "loop": []}
    fn_file = cur_file = ""
    callee_file: str | None = None  # cfi=/cfl= of the next calls= line
    call_moves = False  # the cost line after calls= is the call's inclusive cost:
    after_call = False  # moved from the loop to the engine when the engine calls out

    def file_name(rest: str) -> str:
        rest = rest.strip()
        if rest.startswith("("):
            ident, _, nm = rest[1:].partition(")")
            if nm.strip():
                names[ident] = nm.strip()
            return names.get(ident, "")
        return rest

    def add(t: list[int], fields: list[str], sign: int) -> None:
        if len(t) < len(fields):
            t.extend([0] * (len(fields) - len(t)))
        for i, v in enumerate(fields):
            t[i] += sign * int(v)

    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                fields = line.split()[1:]  # after the line position ("positions: line")
                if after_call:
                    after_call = False
                    if call_moves:
                        add(totals["engine"], fields, 1)
                        add(totals["loop"], fields, -1)
                    continue
                add(totals["engine" if ENGINE_SOURCES in cur_file else "loop"], fields, 1)
            elif line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("positions:") and line.split()[1:] != ["line"]:
                raise LoopError(f"{path}: callgrind positions {line.split()[1:]} (expected line)")
            elif line.startswith("fl="):
                fn_file = cur_file = file_name(line[3:])
            elif line.startswith(("fi=", "fe=")):
                cur_file = file_name(line[3:])
            elif line.startswith("fn="):
                cur_file = fn_file
            elif line.startswith(("cfi=", "cfl=")):
                callee_file = file_name(line[4:])
            elif line.startswith("calls="):
                callee = cur_file if callee_file is None else callee_file
                call_moves = ENGINE_SOURCES in cur_file and "/native/" not in callee
                after_call, callee_file = True, None
    if not events:
        raise LoopError(f"{path} is not a callgrind output file (no events: line)")
    return {k: {e: (t[i] if i < len(t) else 0) for i, e in enumerate(events)}
            for k, t in totals.items()}


def _callgrind(exe: str, code: str, what: str, out: Path, *, engine: bool = True
               ) -> tuple[str, dict[str, dict[str, int]]]:
    env = _env()
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", DCACHE_SIM,
           f"--callgrind-out-file={out}", exe, "-c", code]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600,
                           check=False)
    except FileNotFoundError:
        raise LoopError("--count needs valgrind on the PATH (Debian: apt install valgrind)") \
            from None
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        raise LoopError(f"{what} under callgrind failed (exit {r.returncode}): " + " | ".join(tail))
    costs = callgrind_costs(out)
    if engine and costs["engine"].get("Ir", 0) == 0:
        raise LoopError(f"{exe} has no debug information for native/engine/ (build the unix "
                        "port with STRIP= and its default -g): the engine cannot be told "
                        "from the loop")
    return r.stdout, costs


@dataclass
class LoopCounts:
    """The loop counted on the unix port: host instructions ("ir") and
    simulated data-cache misses ("d1_misses") outside the engine."""

    micropython: str
    image: str
    seeds: list[int]
    lengths: list[int]
    per_token: dict[str, dict[str, float]]  # per way: per story token
    tokens_per_pass: dict[str, float]  # never, ngram
    token: dict[str, float]  # solved: per story token with verify passes
    per_pass: dict[str, float]  # solved: per verify pass
    stories_sha256: str
    pystone_ir: float | None = None  # host instructions of one pystone loop


def count_loop(exe: str, image: str, *, seeds: tuple[int, ...] = (1, 2, 3),
               lengths: tuple[int, int] = COUNT_LENGTHS, workdir: Path) -> LoopCounts:
    """The loop per story token on the unix binary `exe`, counted (see the module's doc)."""
    runs: dict[tuple[str, int], tuple[int, int, dict[str, dict[str, int]]]] = {}
    texts: dict[tuple[str, int], str] = {}
    for way in WAYS:
        for n in lengths:
            code = COUNT_SCRIPT.format(image=image, way=way, seeds=tuple(seeds), prompt=PROMPT,
                                       tokens=n)
            print(f"  callgrind: {way}, stories of at most {n} tokens ...", file=sys.stderr,
                  flush=True)
            out, costs = _callgrind(exe, code, f"the {way} loop", workdir / f"{way}-{n}.out")
            counted = [ln.split() for ln in out.splitlines() if ln.startswith("COUNT ")]
            if len(counted) != 1:
                raise LoopError(f"the {way} loop printed no COUNT line: " + out[-300:])
            runs[way, n] = int(counted[0][1]), int(counted[0][2]), costs
            texts[way, n] = out.split("TEXT ", 1)[-1]
    short, long_ = lengths
    for way in WAYS[1:]:
        if texts[way, long_] != texts["step", long_]:
            raise LoopError(f"decoding with draft {way!r} wrote another story than step by "
                            "step (verify passes must keep plain decoding's)")
    per_token: dict[str, dict[str, float]] = {}
    per_pass: dict[str, float] = {}
    for way in WAYS:
        (n0, p0, c0), (n1, p1, c1) = runs[way, short], runs[way, long_]
        if n1 <= n0:
            raise LoopError(f"the {way} stories were no longer at {long_} tokens than at "
                            f"{short}: nothing to count (stories end early?)")
        loop0, loop1 = c0["loop"], c1["loop"]
        misses = sum(loop1.get(e, 0) - loop0.get(e, 0) for e in ("D1mr", "D1mw"))
        per_token[way] = {"ir": (loop1["Ir"] - loop0["Ir"]) / (n1 - n0),
                          "d1_misses": misses / (n1 - n0)}
        if way != "step":
            if p1 <= p0:
                raise LoopError(f"the {way} loop counted no verify passes (passes {p0}, {p1})")
            per_pass[way] = (n1 - n0) / (p1 - p0)
    p_never, p_ngram = 1 / per_pass["never"], 1 / per_pass["ngram"]
    if p_never == p_ngram:
        raise LoopError("the n-gram drafter kept no guess: the per-pass cost cannot be solved")
    solved_pass = {k: (per_token["never"][k] - per_token["ngram"][k]) / (p_never - p_ngram)
                   for k in ("ir", "d1_misses")}
    solved_token = {k: per_token["never"][k] - solved_pass[k] * p_never
                    for k in ("ir", "d1_misses")}
    digest = hashlib.sha256(texts["step", long_].encode()).hexdigest()
    return LoopCounts(micropython=exe, image=image, seeds=list(seeds), lengths=list(lengths),
                      per_token=per_token, tokens_per_pass=per_pass, token=solved_token,
                      per_pass=solved_pass, stories_sha256=digest)


def count_pystone(exe: str, micropy_dir: Path, workdir: Path) -> float:
    """Host instructions of one pystone loop: MicroPython's pystone counted at
    two loop counts, the difference over the loops between them."""
    counted = []
    for n, m in PYSTONE_COUNT_NM:
        out, costs = _callgrind(exe, _pystone(micropy_dir, n, m), "pystone",
                                workdir / f"pystone-{n}.out", engine=False)
        _time_us, loops, _result = out.split(None, 2)
        counted.append((int(loops), costs["loop"]["Ir"] + costs["engine"].get("Ir", 0)))
    (l0, i0), (l1, i1) = counted
    if l1 <= l0:
        raise LoopError(f"pystone ran {l0} then {l1} loops: nothing to count")
    return (i1 - i0) / (l1 - l0)


def count_report(c: LoopCounts) -> str:
    """The counts as the command prints them, with what s3 makes of them."""
    from .s3 import python_loop_s_from_counts

    def s3_ms(ir: float, misses: float) -> str:
        if c.pystone_ir is None:
            return ""
        return f"  -> {1e3 * python_loop_s_from_counts(ir, misses, c.pystone_ir):.3f} ms on the S3"

    lines = [
        f"llm.py's loop on {c.micropython}, counted (callgrind; outside native/engine/)",
        (f"  {c.image}: stories of at most {c.lengths[1]} minus {c.lengths[0]} tokens, seeds "
         f"{','.join(map(str, c.seeds))}, T 0.8 top-40; per story token:"),
    ]
    for way, label in (("step", "step by step          "), ("never", "verify, never guesses "),
                       ("ngram", "verify, n-gram drafter")):
        t = c.per_token[way]
        extra = (f" ({c.tokens_per_pass[way]:.3f} tokens a pass)" if way in c.tokens_per_pass
                 else s3_ms(t["ir"], t["d1_misses"]))
        lines.append(f"  {label} {t['ir']:9,.0f} instructions, {t['d1_misses']:6.1f} data-cache "
                     f"misses{extra}")
    lines += [
        (f"  with verify passes:    {c.token['ir']:9,.0f} instructions, {c.token['d1_misses']:6.1f}"
         f" misses a story token{s3_ms(c.token['ir'], c.token['d1_misses'])}"),
        (f"                       + {c.per_pass['ir']:,.0f} instructions, "
         f"{c.per_pass['d1_misses']:.1f} misses a pass"
         f"{s3_ms(c.per_pass['ir'], c.per_pass['d1_misses'])}"),
        f"  stories: sha256 {c.stories_sha256[:16]} (every way wrote the same text)",
    ]
    if c.pystone_ir is not None:
        lines.append(f"pystone: {c.pystone_ir:,.0f} instructions a loop")
    return "\n".join(lines)


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
    ap.add_argument("--count", action="store_true",
                    help="count instructions and data-cache misses under valgrind's callgrind "
                         "instead of timing (the figures s3.PY_LOOP_* hold; needs valgrind and "
                         "a binary with debug information)")
    ap.add_argument("--count-lengths", default=",".join(map(str, COUNT_LENGTHS)),
                    metavar="SHORT,LONG",
                    help="--count: the two story lengths (tokens at most) whose difference is "
                         f"counted (default {','.join(map(str, COUNT_LENGTHS))})")
    args = ap.parse_args(argv)
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: give comma-separated integers")
    try:
        lengths = tuple(int(n) for n in args.count_lengths.split(","))
    except ValueError:
        lengths = ()
    if len(lengths) != 2 or not 1 <= lengths[0] < lengths[1]:
        ap.error(f"--count-lengths {args.count_lengths!r}: give two lengths, the shorter first")
    args.count_lengths = lengths
    if args.tokens < 2 or args.runs < 1 or args.pystone_runs < 1:
        ap.error("--tokens must be at least 2, --runs and --pystone-runs at least 1")
    if not Path(args.micropython).is_file():
        ap.error(f"--micropython {args.micropython}: no such file")
    image = args.image
    if image is None:  # the demo, converted once into the tools' image cache
        from ..checkout import DEMO_DIR
        from ..image_cache import converted, default_cache_dir

        try:
            image = str(converted(DEMO_DIR / "model.bin", DEMO_DIR / "tokenizer.json",
                                  default_cache_dir(), lambda line: print(line, file=sys.stderr)))
        except (OSError, ValueError) as e:  # convert.ConvertError is a ValueError
            ap.error(f"no --image and the demo model does not convert: {e}")
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
        figures: LoopFigures | LoopCounts = (
            _count(args, image, seeds, pystone_dir) if args.count
            else _time(args, image, seeds, pystone_dir))
    except LoopError as e:
        print(f"python_loop: {e}", file=sys.stderr)
        return 1
    print(count_report(figures) if isinstance(figures, LoopCounts) else report(figures))
    if args.json:
        args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")
    return 0


def _time(args: argparse.Namespace, image: str, seeds: tuple[int, ...],
          pystone_dir: Path | None) -> LoopFigures:
    print(f"measuring the loop: {args.runs} rounds x {len(WAYS)} ways x {len(seeds)} "
          f"stories ...", file=sys.stderr, flush=True)
    figures = measure_loop(args.micropython, image, tokens=args.tokens, seeds=seeds,
                           runs=args.runs)
    if pystone_dir is not None:
        print(f"pystone x {args.pystone_runs} ...", file=sys.stderr, flush=True)
        figures.pystones = measure_pystone(args.micropython, pystone_dir, args.pystone_runs)
    return figures


def _count(args: argparse.Namespace, image: str, seeds: tuple[int, ...],
           pystone_dir: Path | None) -> LoopCounts:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mpllm-loop-count-") as tmp:
        print(f"counting the loop: {len(WAYS)} ways x 2 lengths under callgrind (a few "
              "minutes) ...", file=sys.stderr, flush=True)
        counts = count_loop(args.micropython, image, seeds=seeds, lengths=args.count_lengths,
                            workdir=Path(tmp))
        if pystone_dir is not None:
            print("  callgrind: pystone ...", file=sys.stderr, flush=True)
            counts.pystone_ir = count_pystone(args.micropython, pystone_dir, Path(tmp))
    return counts


if __name__ == "__main__":
    sys.exit(main())
