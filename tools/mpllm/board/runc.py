"""llama2.c's `run.c` beside our host engine: one checkpoint, one prompt, greedy,
the same forward passes, on this machine in the same run.

    python tools/bench.py --board host --vs-runc ./run --llama2c MODEL.bin TOKENIZER.bin

`run.c` is the user's own build of llama2.c's reference program (`make run`
or `make runfast` in a llama2.c checkout: fp32 weights, one core), or its
`runq.c` (int8 Q8_0, on a v2 checkpoint); mpllm does not ship them. Both
programs start from BOS plus the prompt's ids (llama2.c's encoding, which our
tokenizer reproduces) and run `steps` positions one forward pass at a time.
run.c prints "achieved tok/s" over positions 2..steps (its clock starts after
the first pass); ours is timed the same way, through `_llm.Model.step` on the
converted image (the weight format bench.py --weights asks, by default what
convert.py chooses; the exact engine with every default speed-up).
Both are fed the SAME ids: the prompt is a text longer than `steps` tokens, so
run.c forwards only prompt ids (it would stop early at a BOS of its own
choosing otherwise) and we feed the same ids; the positions, and so the
attention lengths, are the same. Best of `repeats` interleaved runs each.
Beside the clock, the CPU time of each side (a shared machine's other work
lengthens the clock far more than the CPU time); run.c's is the CPU time of a
run less that of a two-position run.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ACHIEVED = re.compile(r"achieved tok/s:\s*([0-9.]+)")
#: interleaved runs of each side, the best kept: a run of a small model is tens
#: of milliseconds, so one pause of a busy machine's scheduler is a large share
#: of it, and the best of a few runs is often still a disturbed one
REPEATS = 9
#: repeated into a prompt longer than the positions timed
PARAGRAPH = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
             "in the park with her friends. One day, she saw a big red ball under a tree. ")


def long_prompt(encode: Callable[[str], list[int]], steps: int) -> tuple[str, list[int]]:
    """A text whose encoding (with BOS) has more than `steps` ids, and the ids."""
    text = PARAGRAPH
    while len(ids := encode(text)) <= steps:
        text += PARAGRAPH
    return text, ids


class RuncError(RuntimeError):
    """run.c could not be run, or said something we cannot read."""


@dataclass(frozen=True)
class Side:
    name: str
    ms_per_token: float  # best of the repeats, positions 2..steps
    #: CPU time per token (None where it cannot be measured): what a busy,
    #: shared machine's other programs barely change, unlike the clock
    cpu_ms_per_token: float | None = None

    @property
    def tok_per_s(self) -> float:
        return 1000.0 / self.ms_per_token


def _children_cpu() -> float | None:
    """CPU seconds (user + system) of this process's finished children, or
    None where the platform does not say (no `resource` module)."""
    try:
        import resource
    except ImportError:
        return None
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def runc_ms_per_token(binary: Path, checkpoint: Path, tokenizer: Path, steps: int,
                      prompt: str, timeout: float = 600) -> float:
    """One greedy run of run.c (-t 0: argmax): its own ms per token."""
    return runc_run(binary, checkpoint, tokenizer, steps, prompt, timeout)[0]


def runc_run(binary: Path, checkpoint: Path, tokenizer: Path, steps: int, prompt: str,
             timeout: float = 600, rate: bool = True) -> tuple[float, float | None]:
    """One greedy run of run.c: its own ms per token, and the CPU seconds the
    whole process took (loading included; None where not measurable). With
    rate False (a run too short for run.c's millisecond clock, which then
    says "inf"), only the CPU seconds (and NaN)."""
    cmd = [str(binary), str(checkpoint), "-z", str(tokenizer), "-t", "0", "-n", str(steps),
           "-i", prompt]
    before = _children_cpu()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except OSError as e:
        raise RuncError(f"cannot run {binary}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise RuncError(f"{binary} did not finish in {timeout:.0f} s") from None
    m = ACHIEVED.search(r.stderr) or ACHIEVED.search(r.stdout)
    if r.returncode != 0 or (rate and m is None):
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuncError(f"{binary} exited with {r.returncode} without 'achieved tok/s': "
                        f"{tail[0]}")
    after = _children_cpu()
    cpu = after - before if before is not None and after is not None else None
    return (1000.0 / float(m.group(1)) if m is not None else float("nan")), cpu


def ours_ms_per_token(image: Path, prompt_ids: list[int], steps: int) -> float:
    """Our engine on the same positions: the prompt's ids fed one per pass (as
    run.c does); timed from the second pass on."""
    return ours_times(image, prompt_ids, steps)[0]


def ours_times(image: Path, prompt_ids: list[int], steps: int) -> tuple[float, float]:
    """ours_ms_per_token, and the CPU ms per token of the same passes (this
    thread's CPU time)."""
    from ..checkout import board_module

    m = board_module("_llm").Model(str(image))
    try:
        m.sampler(0.0, 0, 0)
        m.prefill(prompt_ids[:1])
        start, cpu = time.perf_counter(), time.thread_time()
        for pos in range(1, steps):
            m.step(prompt_ids[pos])
        cpu = time.thread_time() - cpu
        return ((time.perf_counter() - start) * 1000.0 / (steps - 1),
                cpu * 1000.0 / (steps - 1))
    finally:
        m.close()


def compare(binary: Path, checkpoint: Path, tokenizer: Path, image: Path, prompt_ids: list[int],
            prompt: str, steps: int = 256, repeats: int = REPEATS) -> tuple[Side, Side]:
    """(run.c, mpllm): the best ms/token of each over `repeats` interleaved runs.

    The CPU figure of run.c is a difference: the CPU time of a run of `steps`
    positions less that of a run of 2 (both load the same files and forward
    one prompt id a pass, so what remains is positions 2..steps), best of the
    repeats each."""
    if steps < 3 or steps >= len(prompt_ids):
        raise ValueError(f"the prompt's {len(prompt_ids)} ids must outnumber steps {steps} "
                         f"(at least 3)")
    runc, ours, runc_cpu, short_cpu, ours_cpu = [], [], [], [], []
    for _ in range(repeats):
        ms, cpu = runc_run(binary, checkpoint, tokenizer, steps, prompt)
        runc.append(ms)
        runc_cpu.append(cpu)
        short_cpu.append(runc_run(binary, checkpoint, tokenizer, 2, prompt, rate=False)[1])
        wall, cpu_ms = ours_times(image, prompt_ids, steps)
        ours.append(wall)
        ours_cpu.append(cpu_ms)
    theirs = "llama2.c runq.c (int8)" if "runq" in binary.name else "llama2.c run.c (fp32)"
    their_cpu = None
    if None not in runc_cpu and None not in short_cpu:
        diff = min(c for c in runc_cpu if c is not None) - min(c for c in short_cpu
                                                              if c is not None)
        their_cpu = diff * 1000.0 / (steps - 2) if diff > 0 else None
    return (Side(theirs, min(runc), their_cpu),
            Side(f"mpllm host engine ({_weights(image)}, exact)", min(ours), min(ours_cpu)))


def _weights(image: Path) -> str:
    """The image's weight format as Model.config() names it."""
    from ..checkout import board_module

    m = board_module("_llm").Model(str(image))
    try:
        return str(m.config().get("weights", "int4"))
    finally:
        m.close()


def format_comparison(runc: Side, ours: Side, steps: int, repeats: int) -> str:
    head = (f"same machine, same checkpoint, the same {steps} prompt ids fed one per pass, "
            f"timed over positions 2..{steps}, best of {repeats}:")
    lines = [head]
    cpu = runc.cpu_ms_per_token is not None and ours.cpu_ms_per_token is not None
    for s in (runc, ours):
        line = f"  {s.name:<34} {s.ms_per_token:8.3f} ms/token  {s.tok_per_s:9.0f} tok/s"
        if cpu:
            line += f"  (CPU {s.cpu_ms_per_token:.3f} ms/token)"
        lines.append(line)
    theirs = "runq.c" if "runq" in runc.name else "run.c"
    ratio = f"  mpllm is {runc.ms_per_token / ours.ms_per_token:.2f}x {theirs}'s speed"
    if cpu:
        ratio += (f" by the clock, {runc.cpu_ms_per_token / ours.cpu_ms_per_token:.2f}x "  # type: ignore[operator]
                  f"in CPU time")
    lines.append(ratio)
    return "\n".join(lines)
