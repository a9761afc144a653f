"""`bench.py --ab`: each engine switch (firmware/modules/llm_bench.py SWITCHES:
cache preload, K as int16 dots) off and on, interleaved, on a board (or a
serial peer) or on the host board, and the report a board owner sends back.

The board runs llm_bench.ab(): per switch, `rounds` times off then on (off,
on, off, on, ...), every run of the release-shaped workload (the fixed
prompts, greedy and sampled) one step at a time, printing per run its ids,
the FNV-1a 64 of its first logits rows and the engine's ms per decoded token
by stage. Here the lines are read back (`parse_ab`) and summed up
(`ab_report`): a switch that changed any run's ids or hash, on against off or
one round against another, is an error (the switches are hints and
schedules: they must change no bit). The report (`AB_KEYS` of
mpllm.costmodel, written with --json) holds per switch the mean stage times
off and on and their on/off ratio, the baseline (every switch off) per mode
with the positions decoded and the head rows scored, and the fill/compute
overlap fitted from that baseline the way the cost model uses it. That fit
is the cost model's (costmodel/ab.py `ab_overlap`), handed in by bench.py's
command line (`overlap=`): this module measures and imports no cost model;
`bench.py --model-s3 --refit AB.json` refits the model with the report.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence

from ..boards import STAGES
from ..checkout import board_module
from .bench import TimedWriter, import_llm_modules, progress_close
from .bench_runs import RunSpec, StreamRecorder
from .transport import run_port_snippet

#: The switches measured by default (llm_bench.SWITCHES).
AB_SWITCHES = ("preload", "k_dots")
#: Logits rows hashed per run (the gate's count: the board hashes them in Python).
AB_ROWS = 8
#: The fill/compute overlap fitted from a baseline (per mode: stage_ms,
#: positions, rows_fraction) of an image of this config: {"value",
#: "physical", "stages", "was"}, ValueError when no stage fits it (the cost
#: model's costmodel.ab_overlap, which bench.py's command line hands in).
OverlapFit = Callable[[Mapping[str, Mapping], Mapping], dict]


def _ab_args(runs: Sequence[RunSpec], n_tokens: int, switches: Sequence[str], rounds: int,
             rows: int) -> tuple:
    if n_tokens < 2:
        raise ValueError(f"--tokens must be at least 2, got {n_tokens}")
    if rounds < 1:
        raise ValueError(f"--ab-rounds must be at least 1, got {rounds}")
    known = board_module("llm_bench").SWITCHES
    bad = [s for s in switches if s not in known]
    if bad:
        raise ValueError(f"no switch {', '.join(bad)} (known: {', '.join(known)})")
    spec = [(r.prompt, r.temperature, r.top_k, r.seed) for r in runs]
    return spec, n_tokens, list(switches), rounds, rows


def ab_code(runs: Sequence[RunSpec], n_tokens: int, switches: Sequence[str], rounds: int,
            rows: int = AB_ROWS, image: str | None = None) -> str:
    """The code a board runs: llm_bench.ab() on the model its session shares."""
    args = ", ".join(repr(a) for a in _ab_args(runs, n_tokens, switches, rounds, rows))
    return f"import llm_bench\nllm_bench.ab({args}, image={image!r})\n"


def run_ab_port(port: str, runs: Sequence[RunSpec], n_tokens: int, *,
                switches: Sequence[str] = AB_SWITCHES, rounds: int = 2, rows: int = AB_ROWS,
                soft_reset: bool = False, timeout: float = 120,
                port_image: str | None = None, overlap: OverlapFit | None = None) -> dict:
    """The A/B on a board through its raw REPL; the report (ab_report)."""
    code = ab_code(runs, n_tokens, switches, rounds, rows, port_image)
    rec = StreamRecorder()
    err = run_port_snippet(port, code, consumer=rec.feed, soft_reset=soft_reset,
                           timeout=timeout)
    if err:
        raise RuntimeError(f"{port}: the A/B raised on the board:\n"
                           f"{err.decode('utf-8', 'replace')}")
    return ab_report(parse_ab(rec.text(), port), runs, n_tokens, rounds, rows, port,
                     overlap=overlap)


def run_ab_host(image: str | os.PathLike[str], runs: Sequence[RunSpec], n_tokens: int, *,
                switches: Sequence[str] = AB_SWITCHES, rounds: int = 2, rows: int = AB_ROWS,
                llm_module: object | None = None, board: str = "host",
                overlap: OverlapFit | None = None) -> dict:
    """The A/B on the host board: the board's own llm_bench.ab() in process."""
    import_llm_modules(llm_module)
    args = _ab_args(runs, n_tokens, switches, rounds, rows)
    rec = StreamRecorder()
    with contextlib.redirect_stdout(TimedWriter(rec)):
        board_module("llm_bench").ab(*args, image=os.fspath(image), private=True)
    progress_close()
    return ab_report(parse_ab(rec.text(), board), runs, n_tokens, rounds, rows, board,
                     overlap=overlap)


def parse_ab(text: str, board: str) -> dict:
    """llm_bench.ab()'s lines: {"info", "measurements", "skipped"}; ValueError
    with the output's tail when the info line is missing."""
    lb = board_module("llm_bench")
    info, meas, skipped = None, [], {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(lb.INFO + " "):
            info = json.loads(line[len(lb.INFO) + 1:])
        elif line.startswith(lb.AB_SKIP + " "):
            s = json.loads(line[len(lb.AB_SKIP) + 1:])
            skipped[s["switch"]] = s["why"]
        elif line.startswith(lb.AB + " "):
            meas.append(json.loads(line[len(lb.AB) + 1:]))
    if info is None:
        raise ValueError(f"{board}: no {lb.INFO} line in the A/B output:\n{text[-2000:]}")
    return {"info": info, "measurements": meas, "skipped": skipped}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _stages(ms: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out = {st: _mean([m[st] for m in ms]) for st in STAGES}
    out["total"] = sum(out[st] for st in STAGES)
    return out


def _check_same(name: str, meas: Sequence[Mapping], runs: Sequence[RunSpec]) -> None:
    """Every measurement of a run gives the first one's ids and hash."""
    first: dict[int, Mapping] = {}
    for m in meas:
        ref = first.setdefault(m["run"], m)
        if m["ids"] != ref["ids"] or m["hash"] != ref["hash"]:
            what = "ids" if m["ids"] != ref["ids"] else "logits hash"
            def state(x: Mapping) -> str:
                return f"{'on' if x['on'] else 'off'} in round {x['round']}"

            raise ValueError(f"switch {name} changed the output of run {m['run']} "
                             f"({runs[m['run']].prompt!r}, {runs[m['run']].mode}): its {what} "
                             f"with the switch {state(m)} differs from {state(ref)}; a switch "
                             "must change no token or logit")


def ab_report(parsed: Mapping, runs: Sequence[RunSpec], n_tokens: int, rounds: int, rows: int,
              board: str, *, overlap: OverlapFit | None = None) -> dict:
    """The A/B report (costmodel.AB_KEYS). ValueError when a switch changed a
    run's output or a measured switch is missing a state. The overlaps are
    `overlap`'s fits (None without one: the measured stages alone)."""
    info, meas = parsed["info"], parsed["measurements"]
    cfg = info["config"]
    switches: dict[str, dict] = {}
    names = list(dict.fromkeys([m["switch"] for m in meas] + list(parsed["skipped"])))
    for name in names:
        if name in parsed["skipped"]:
            switches[name] = {"status": "skipped", "why": parsed["skipped"][name],
                              "same_output": None, "off": None, "on": None, "ratio": None,
                              "overlap": None}
            continue
        mine = [m for m in meas if m["switch"] == name]
        _check_same(name, mine, runs)
        states = {}
        for on in (False, True):
            got = [m["stage_ms"] for m in mine if m["on"] is on]
            if not got:
                raise ValueError(f"switch {name}: no run with it {'on' if on else 'off'}")
            states["on" if on else "off"] = _stages(got)
        ratio = {st: (states["on"][st] / states["off"][st] if states["off"][st] > 0 else None)
                 for st in states["off"]}
        try:
            ov_on = (overlap(_baseline([m for m in mine if m["on"]], runs, cfg), cfg)["value"]
                     if overlap is not None else None)
        except ValueError:
            ov_on = None
        switches[name] = {"status": "measured", "why": None, "same_output": True,
                          "off": states["off"], "on": states["on"], "ratio": ratio,
                          "overlap": {"on": ov_on}}
    off = [m for m in meas if not m["on"]]
    baseline = _baseline(off, runs, cfg) if off else {}
    fitted = None
    if baseline and overlap is not None:
        fitted = overlap(baseline, cfg)
        for name, sw in switches.items():
            if sw["status"] == "measured":
                sw["overlap"]["off"] = fitted["value"]
    return {"kind": "mpllm-ab", "version": 1, "board": board,
            "build_info": info["build_info"], "config": cfg, "memory": info["memory"],
            "tokens": n_tokens, "rounds": rounds, "rows_hashed": rows,
            "runs": [{"prompt": r.prompt, "temperature": r.temperature, "top_k": r.top_k,
                      "seed": r.seed, "mode": r.mode} for r in runs],
            "switches": switches, "baseline": baseline, "overlap": fitted,
            "measurements": list(meas)}


def _baseline(meas: Sequence[Mapping], runs: Sequence[RunSpec], cfg: Mapping) -> dict:
    """Per mode: mean ms per decoded token by stage, the positions decoded (the
    token fed at step k of a run sits at len(prompt) + k - 1) and the share of
    head rows the certified head scored."""
    out = {}
    for mode in ("greedy", "sampled"):
        mine = [m for m in meas if runs[m["run"]].mode == mode]
        if not mine:
            continue
        positions = [p for m in mine
                     for p in range(len(m["prompt_ids"]), len(m["prompt_ids"]) + m["steps"])]
        heads = sum(m["heads"] for m in mine)
        frac = (sum(m["head_rows"] for m in mine) / (heads * cfg["vocab_out"])
                if heads else None)
        out[mode] = {"stage_ms": _stages([m["stage_ms"] for m in mine]),
                     "positions": positions, "rows_fraction": frac, "runs": len(mine)}
    return out


def format_ab(rep: Mapping) -> str:
    """The report as text: per switch the stage times off / on and the ratio,
    then the overlap."""
    stages = (*STAGES, "total")
    lines = [f"board: {rep['board']}", f"build_info: {rep['build_info']}",
             (f"A/B: {rep['rounds']} rounds of off/on, {len(rep['runs'])} runs of "
              f"{rep['tokens']} tokens each; ms per decoded token by stage")]
    head = f"{'switch':<10} {'state':<6} " + " ".join(f"{st:>8}" for st in stages)
    lines.append(head)
    for name, sw in rep["switches"].items():
        if sw["status"] == "skipped":
            lines.append(f"{name:<10} skipped: {sw['why']}")
            continue
        for state in ("off", "on"):
            lines.append(f"{name:<10} {state:<6} "
                         + " ".join(f"{sw[state][st]:>8.3f}" for st in stages))
        lines.append(f"{name:<10} {'on/off':<6} " + " ".join(
            f"{sw['ratio'][st]:>8.3f}" if sw["ratio"][st] is not None else f"{'-':>8}"
            for st in stages))
        lines.append(f"{name:<10} same ids and logits hashes on and off in every run")
    ov = rep.get("overlap")
    if ov:
        flag = "" if ov["physical"] else " (outside [0, 1]: these stages are not an S3's)"
        lines.append(f"fill/compute overlap fitted from the stages with every switch off: "
                     f"{ov['value']:.3f}{flag}; the calibration's {ov['was']:.3f}")
    return "\n".join(lines)
