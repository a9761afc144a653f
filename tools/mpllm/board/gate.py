"""The gate: one hash that says host and board compute the same bits.

Definition (gate version 1)
---------------------------
  prompt  "Once upon a time", encoded with the image's own tokenizer
          (llm.Tokenizer: the same code on the host and on the board).
  run     greedy decoding (sampler seed 0), no stop at <|endoftext|>:
          row 0 is the logits after prefill(prompt) and g0 = argmax(row 0);
          row k (k >= 1) is the logits after step(g[k-1]) and gk = argmax(row k);
          200 tokens g0..g199 (needs len(prompt) + 199 <= seq_len).
  bytes   rows 0..19 as raw little-endian float32 (vocab_out * 4 bytes each),
          concatenated in order, then the UTF-8 bytes of the greedy text,
          decode(g0..g199) (an end-of-text id decodes to its literal text;
          invalid UTF-8 becomes U+FFFD, as llm.Tokenizer.decode does).
  hash    FNV-1a 64 over those bytes: h = 0xcbf29ce484222325; per byte
          h ^= b; h = (h * 0x100000001b3) mod 2^64. Printed as 16 lowercase
          hex digits.

Three producers compute it:
  * the host reference (mpllm.reference.forward, numpy) -- `reference_gate`;
  * the engine through a `_llm` module: the CPython one in-process
    (`engine_gate`), or the board's through the serial transport: both run
    the same code, `llm_bench.gate()` (firmware/modules/llm_bench.py, frozen
    on the board; its FNV-1a has a viper kernel on 32-bit halves, so the
    board needs no long integers).
It prints one line "MPLLM-GATE <hash> <n_prompt> <ids...>" that
`parse_gate_line` reads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

GATE_VERSION = 1
PROMPT = "Once upon a time"
N_LOGIT_ROWS = 20
N_TOKENS = 200

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes | bytearray | memoryview, h: int = FNV_OFFSET) -> int:
    """FNV-1a 64 of `data`, continuing from state `h`."""
    prime, mask = FNV_PRIME, _MASK64
    for b in bytes(data):
        h = ((h ^ b) * prime) & mask
    return h


@dataclass(frozen=True)
class GateResult:
    hash: str  # 16 hex digits
    prompt_ids: list[int]
    ids: list[int]  # the N_TOKENS greedy ids (fewer if the board's context holds fewer)
    source: str  # who computed it

    @property
    def text_ids(self) -> list[int]:
        return self.ids


def gate_bytes(rows: list[bytes], text: str) -> bytes:
    """The exact byte string the gate hashes (see the module doc)."""
    if len(rows) != N_LOGIT_ROWS:
        raise ValueError(f"the gate hashes {N_LOGIT_ROWS} logits rows, got {len(rows)}")
    return b"".join(rows) + text.encode("utf-8")


def _tokenizer_class() -> type:
    from ..checkout import board_module

    return board_module("llm").Tokenizer  # type: ignore[no-any-return]


def _check_room(n_prompt: int, seq_len: int, n_tokens: int = N_TOKENS) -> None:
    if n_prompt + n_tokens - 1 > seq_len:
        raise ValueError(f"the gate needs {n_prompt} prompt + {n_tokens} generated positions "
                         f"(- 1), but the model's context is {seq_len}")


def reference_gate(image: str | os.PathLike[str] | bytes, n_tokens: int = N_TOKENS
                   ) -> GateResult:
    """The gate computed by the numpy reference (mpllm.reference.forward) from
    an image; `n_tokens` fewer than N_TOKENS for a board whose context holds
    fewer (its gate line says how many it decoded)."""
    if not N_LOGIT_ROWS <= n_tokens <= N_TOKENS:
        raise ValueError(f"the gate decodes {N_LOGIT_ROWS}..{N_TOKENS} tokens, not {n_tokens}")
    import numpy as np

    from ..reference.forward import Reference

    data = Path(image).read_bytes() if not isinstance(image, (bytes, bytearray)) else bytes(image)
    from ..formats.image import read_image

    tok = _tokenizer_class()(read_image(data).tokenizer_section)
    prompt = tok.encode(PROMPT)
    ref = Reference.from_image(data)
    _check_room(len(prompt), ref.config.seq_len, n_tokens)
    ids, rows = ref.generate(prompt, n_tokens)
    logit_rows = [np.ascontiguousarray(rows[k], dtype="<f4").tobytes()
                  for k in range(N_LOGIT_ROWS)]
    h = fnv1a64(gate_bytes(logit_rows, tok.decode(ids)))
    return GateResult(f"{h:016x}", list(prompt), list(ids), "reference (numpy)")


def gate_code(image: str | None = None) -> str:
    """The code a board runs for the gate: `llm_bench.gate()` on the model its
    session shares (`image`: what a runtime with no model partition opens,
    the MicroPython unix port)."""
    return (f"import llm_bench\nllm_bench.gate({PROMPT!r}, {N_TOKENS}, {N_LOGIT_ROWS}, "
            f"{image!r})\n")


def parse_gate_line(output: str, source: str) -> GateResult:
    """The GateResult in the output of llm_bench.gate(); ValueError (with the output) if absent."""
    from ..checkout import board_module

    marker = board_module("llm_bench").GATE
    m = re.search("^" + marker + r" ([0-9a-f]{16}) (\d+) ([\d ]+)$",
                  output.replace("\r\n", "\n"), re.MULTILINE)
    if not m:
        raise ValueError(f"{source}: no {marker} line in the output:\n{output.strip()}")
    n_prompt = int(m.group(2))
    ids = [int(x) for x in m.group(3).split()]
    # N_TOKENS decoded, or as many as a short context holds (llm_bench.gate)
    if not n_prompt + N_LOGIT_ROWS <= len(ids) <= n_prompt + N_TOKENS:
        raise ValueError(f"{source}: gate line has {len(ids)} ids, expected "
                         f"{n_prompt} + {N_LOGIT_ROWS}..{N_TOKENS}")
    return GateResult(m.group(1), ids[:n_prompt], ids[n_prompt:], source)


def engine_gate(image: str | os.PathLike[str], llm_module: object | None = None) -> GateResult:
    """The gate computed by the CPython `_llm` in-process: the board's own
    `llm_bench.gate()` on a model of its own."""
    import contextlib
    import io
    import sys

    from ..checkout import board_module

    if llm_module is not None:
        sys.modules["_llm"] = llm_module  # type: ignore[assignment]
    _llm = board_module("_llm")
    with _llm.Model(os.fspath(image)) as m:
        _check_room(len(_tokenizer_class()(m.tokenizer()).encode(PROMPT)), m.config()["seq_len"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        board_module("llm_bench").gate(PROMPT, N_TOKENS, N_LOGIT_ROWS, os.fspath(image),
                                       private=True)
    return parse_gate_line(buf.getvalue(), f"engine ({_llm.build_info()})")


def compare(a: GateResult, b: GateResult) -> tuple[bool, str]:
    """(passed, report text) for two gate results."""
    ok = a.hash == b.hash
    n = len(b.ids)
    short = "" if n == N_TOKENS else f" (the board's context holds {n} of the {N_TOKENS})"
    lines = [(f"gate v{GATE_VERSION}: FNV-1a 64 of logits rows 0..{N_LOGIT_ROWS - 1} + "
             f"greedy text of {n} tokens from {PROMPT!r}{short}"),
             f"  {a.source:<40} {a.hash}", f"  {b.source:<40} {b.hash}"]
    if not ok:
        if a.prompt_ids != b.prompt_ids:
            lines.append(f"  prompt ids differ: {a.prompt_ids} vs {b.prompt_ids}")
        first = next((i for i, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y), None)
        if first is None:
            lines.append(f"  the {n} greedy ids agree: the logits bytes differ")
        else:
            lines.append(f"  first differing token at step {first}: {a.ids[first]} vs "
                         f"{b.ids[first]}")
    lines.append("PASS" if ok else "FAIL")
    return ok, "\n".join(lines)


__all__ = [
    "FNV_OFFSET",
    "FNV_PRIME",
    "GATE_VERSION",
    "N_LOGIT_ROWS",
    "N_TOKENS",
    "PROMPT",
    "GateResult",
    "compare",
    "engine_gate",
    "fnv1a64",
    "gate_bytes",
    "gate_code",
    "parse_gate_line",
    "reference_gate",
]
