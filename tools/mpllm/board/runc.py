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

    @property
    def tok_per_s(self) -> float:
        return 1000.0 / self.ms_per_token


def runc_ms_per_token(binary: Path, checkpoint: Path, tokenizer: Path, steps: int,
                      prompt: str, timeout: float = 600) -> float:
    """One greedy run of run.c (-t 0: argmax): its own ms per token."""
    cmd = [str(binary), str(checkpoint), "-z", str(tokenizer), "-t", "0", "-n", str(steps),
           "-i", prompt]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except OSError as e:
        raise RuncError(f"cannot run {binary}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise RuncError(f"{binary} did not finish in {timeout:.0f} s") from None
    m = ACHIEVED.search(r.stderr) or ACHIEVED.search(r.stdout)
    if r.returncode != 0 or m is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuncError(f"{binary} exited with {r.returncode} without 'achieved tok/s': "
                        f"{tail[0]}")
    return 1000.0 / float(m.group(1))


def ours_ms_per_token(image: Path, prompt_ids: list[int], steps: int) -> float:
    """Our engine on the same positions: the prompt's ids fed one per pass (as
    run.c does); timed from the second pass on."""
    from ..checkout import board_module

    m = board_module("_llm").Model(str(image))
    try:
        m.sampler(0.0, 0, 0)
        m.prefill(prompt_ids[:1])
        start = time.perf_counter()
        for pos in range(1, steps):
            m.step(prompt_ids[pos])
        return (time.perf_counter() - start) * 1000.0 / (steps - 1)
    finally:
        m.close()


def compare(binary: Path, checkpoint: Path, tokenizer: Path, image: Path, prompt_ids: list[int],
            prompt: str, steps: int = 256, repeats: int = REPEATS) -> tuple[Side, Side]:
    """(run.c, mpllm): the best ms/token of each over `repeats` interleaved runs."""
    if steps < 2 or steps >= len(prompt_ids):
        raise ValueError(f"the prompt's {len(prompt_ids)} ids must outnumber steps {steps}")
    runc, ours = [], []
    for _ in range(repeats):
        runc.append(runc_ms_per_token(binary, checkpoint, tokenizer, steps, prompt))
        ours.append(ours_ms_per_token(image, prompt_ids, steps))
    theirs = "llama2.c runq.c (int8)" if "runq" in binary.name else "llama2.c run.c (fp32)"
    return Side(theirs, min(runc)), Side(f"mpllm host engine ({_weights(image)}, exact)",
                                         min(ours))


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
    for s in (runc, ours):
        lines.append(f"  {s.name:<34} {s.ms_per_token:8.3f} ms/token  {s.tok_per_s:9.0f} tok/s")
    theirs = "runq.c" if "runq" in runc.name else "run.c"
    lines.append(f"  mpllm is {runc.ms_per_token / ours.ms_per_token:.2f}x {theirs}'s speed")
    return "\n".join(lines)
