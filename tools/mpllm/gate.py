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
  * the host reference (mpllm.reference, numpy) -- `reference_gate`;
  * the engine through a `_llm` module: the CPython one in-process
    (`engine_gate`), or the board's through the serial transport: both run
    the same source, GATE_SNIPPET, which also runs under MicroPython (a viper
    FNV-1a kernel on 32-bit halves when the native emitter is there, so the
    board needs no long integers; plain Python ints otherwise).
The snippet prints one line "MPLLM-GATE <hash> <n_prompt> <ids...>" that
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
    ids: list[int]  # the 200 greedy ids
    source: str  # who computed it

    @property
    def text_ids(self) -> list[int]:
        return self.ids


def gate_bytes(rows: list[bytes], text: str) -> bytes:
    """The exact byte string the gate hashes (see the module doc)."""
    if len(rows) != N_LOGIT_ROWS:
        raise ValueError(f"the gate hashes {N_LOGIT_ROWS} logits rows, got {len(rows)}")
    return b"".join(rows) + text.encode("utf-8")


def _llm_module_path() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "firmware" / "modules"


def _tokenizer_class() -> type:
    try:
        from llm import Tokenizer  # the pip-installed top-level module
    except ImportError:
        import sys

        sys.path.insert(0, str(_llm_module_path()))
        from llm import Tokenizer
    return Tokenizer


def _check_room(n_prompt: int, seq_len: int) -> None:
    if n_prompt + N_TOKENS - 1 > seq_len:
        raise ValueError(f"the gate needs {n_prompt} prompt + {N_TOKENS} generated positions "
                         f"(- 1), but the model's context is {seq_len}")


def reference_gate(image: str | os.PathLike[str] | bytes) -> GateResult:
    """The gate computed by the numpy reference (mpllm.reference) from an image."""
    import numpy as np

    from .reference import Reference

    data = Path(image).read_bytes() if not isinstance(image, (bytes, bytearray)) else bytes(image)
    tok = _tokenizer_class().from_image(data)
    prompt = tok.encode(PROMPT)
    ref = Reference.from_image(data)
    _check_room(len(prompt), ref.config.seq_len)
    ids, rows = ref.generate(prompt, N_TOKENS)
    logit_rows = [np.ascontiguousarray(rows[k], dtype="<f4").tobytes()
                  for k in range(N_LOGIT_ROWS)]
    h = fnv1a64(gate_bytes(logit_rows, tok.decode(ids)))
    return GateResult(f"{h:016x}", list(prompt), list(ids), "reference (numpy)")


# The snippet runs unchanged on CPython and MicroPython (board or unix port).
# `_MODEL_ARGS` is substituted: "" opens the board's model partition; a
# repr'd path opens an image file (CPython, MicroPython unix).
GATE_SNIPPET = r'''
import _llm
import llm

_FNV_HEX = None
try:
    import micropython

    exec("""
@micropython.viper
def _fnv_viper(state, data, n: int):
    # FNV-1a 64 on two 32-bit halves: h*P = h*0x1b3 + (h << 40) mod 2^64.
    # Every store to the uint32 state truncates mod 2^32 on 32- and 64-bit
    # machines alike, so no 64-bit constant or long int is needed.
    s = ptr32(state)
    d = ptr8(data)
    i = 0
    while i < n:
        lo = uint(s[0]) ^ uint(d[i])
        hi = uint(s[1])
        pc = (lo & 0xFFFF) * 0x1B3
        pa = (lo >> 16) * 0x1B3
        s[1] = hi * 0x1B3 + ((pa + (pc >> 16)) >> 16) + (lo << 8)
        s[0] = pc + (pa << 16)
        i += 1
""")

    def _fnv_update(state, data):
        _fnv_viper(state, data, len(data))

    def _fnv_hex(state):
        return "".join("%%02x" %% state[7 - i] for i in range(8))

    _probe = bytearray(b"\x25\x23\x22\x84\xe4\x9c\xf2\xcb")
    _fnv_update(_probe, b"a")
    if _fnv_hex(_probe) == "af63dc4c8601ec8c":  # FNV-1a 64 of b"a"
        _FNV_HEX = _fnv_hex
except (ImportError, SyntaxError, NameError, TypeError, ValueError):
    pass

if _FNV_HEX is None:

    def _fnv_update(state, data):
        h = state[0]
        for b in data:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        state[0] = h

    def _fnv_hex(state):
        return "%%016x" %% state[0]

    _state = [0xCBF29CE484222325]
else:
    _state = bytearray(b"\x25\x23\x22\x84\xe4\x9c\xf2\xcb")


def _gate(model):
    tok = llm.Tokenizer(model.tokenizer())
    prompt = tok.encode(%(prompt)r)
    model.reset()
    model.sampler(0.0, 0, 0)
    t = model.prefill(prompt)
    ids = [t]
    _fnv_update(_state, model.logits())
    for k in range(1, %(n_tokens)d):
        t = model.step(t)
        if k < %(n_rows)d:
            _fnv_update(_state, model.logits())
        ids.append(t)
    _fnv_update(_state, tok.decode(ids).encode("utf-8"))
    print("MPLLM-GATE", _fnv_hex(_state), len(prompt), " ".join(str(i) for i in prompt + ids))


if %(shared)r:
    # the board: the model llm.py shares with the user's session stays open
    # (the gate is exact mode: plain and fast are put back afterwards)
    _m = llm.load()
    _modes = (_m.plain(), _m.fast())
    llm.load(plain=False, fast=False)
    try:
        _gate(_m)
    finally:
        llm.load(fast=_modes[1])
        _m.set_plain(_modes[0])
else:
    _m = _llm.Model(%(model_args)s)
    try:
        _gate(_m)
    finally:
        _m.close()
'''


def gate_snippet(model_args: str = "") -> str:
    """GATE_SNIPPET ready to run; `model_args` is the source of Model()'s
    arguments ("" on the board: its model partition)."""
    return GATE_SNIPPET % {"prompt": PROMPT, "n_tokens": N_TOKENS, "n_rows": N_LOGIT_ROWS,
                           "model_args": model_args, "shared": not model_args}


_GATE_LINE = re.compile(r"^MPLLM-GATE ([0-9a-f]{16}) (\d+) ([\d ]+)$", re.MULTILINE)


def parse_gate_line(output: str, source: str) -> GateResult:
    """The GateResult in a snippet's output; ValueError (with the output) if absent."""
    m = _GATE_LINE.search(output.replace("\r\n", "\n"))
    if not m:
        raise ValueError(f"{source}: no MPLLM-GATE line in the output:\n{output.strip()}")
    n_prompt = int(m.group(2))
    ids = [int(x) for x in m.group(3).split()]
    if len(ids) != n_prompt + N_TOKENS:
        raise ValueError(f"{source}: gate line has {len(ids)} ids, expected "
                         f"{n_prompt} + {N_TOKENS}")
    return GateResult(m.group(1), ids[:n_prompt], ids[n_prompt:], source)


def engine_gate(image: str | os.PathLike[str], llm_module: object | None = None) -> GateResult:
    """The gate computed by the CPython `_llm` in-process, running GATE_SNIPPET."""
    import contextlib
    import io
    import sys

    if llm_module is not None:
        sys.modules["_llm"] = llm_module  # type: ignore[assignment]
    _tokenizer_class()  # makes `llm` importable from a checkout
    import _llm

    with _llm.Model(os.fspath(image)) as m:
        _check_room(len(_tokenizer_class()(m.tokenizer()).encode(PROMPT)), m.config()["seq_len"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        # the board's snippet, run unchanged on the host board
        src = gate_snippet(repr(os.fspath(image)))
        exec(src, {"__name__": "mpllm_gate"})  # noqa: S102
    return parse_gate_line(buf.getvalue(), f"engine ({_llm.build_info()})")


def compare(a: GateResult, b: GateResult) -> tuple[bool, str]:
    """(passed, report text) for two gate results."""
    ok = a.hash == b.hash
    lines = [(f"gate v{GATE_VERSION}: FNV-1a 64 of logits rows 0..{N_LOGIT_ROWS - 1} + "
             f"greedy text of {N_TOKENS} tokens from {PROMPT!r}"),
             f"  {a.source:<40} {a.hash}", f"  {b.source:<40} {b.hash}"]
    if not ok:
        if a.prompt_ids != b.prompt_ids:
            lines.append(f"  prompt ids differ: {a.prompt_ids} vs {b.prompt_ids}")
        first = next((i for i, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y), None)
        if first is None:
            lines.append("  the 200 greedy ids agree: the logits bytes differ")
        else:
            lines.append(f"  first differing token at step {first}: {a.ids[first]} vs "
                         f"{b.ids[first]}")
    lines.append("PASS" if ok else "FAIL")
    return ok, "\n".join(lines)


__all__ = [
    "FNV_OFFSET",
    "FNV_PRIME",
    "GATE_SNIPPET",
    "GATE_VERSION",
    "N_LOGIT_ROWS",
    "N_TOKENS",
    "PROMPT",
    "GateResult",
    "compare",
    "engine_gate",
    "fnv1a64",
    "gate_bytes",
    "gate_snippet",
    "parse_gate_line",
    "reference_gate",
]
