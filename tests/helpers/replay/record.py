"""Record what the REAL `_llm` engine answers llm.py, for the replay double.

CPython only. install(out_dir) puts a recording proxy in sys.modules["_llm"]
(before `import llm`); every Model it opens is the real engine, watched:
the sampler settings, each prompt given to prefill(), every token fed by
step() and every token the engine returns are kept, and the logits and the
best_of() choices llm.py reads (token healing), keyed by the context. save() writes
out_dir/replay.json and out_dir/tokenizer.bin in the format
tests/helpers/replay/_llm.py reads.

Runs with the same sampler and prompt that fed the same tokens are merged;
since the engine is deterministic the shorter must be a prefix of the longer,
and save() raises if it is not (that would be an engine bug worth seeing).
Runs that fed different tokens (llm.py chose another one than the engine:
token healing) are kept apart.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any


class _Recorder:
    def __init__(self, out_dir: Path, real: types.ModuleType) -> None:
        self.out_dir = out_dir
        self.real = real
        # (sampler, prompt, tokens returned, tokens fed by step())
        self.runs: list[tuple[tuple[float, int, int], list[int], list[int], list[int]]] = []
        self.logits: dict[tuple[int, ...], str] = {}  # context -> logits() bytes, in hex
        # (context, tokens or None, skip in hex or None) -> what best_of() chose
        self.best_of: dict[tuple[tuple[int, ...], tuple[int, ...] | None, str | None], int] = {}
        self.config: dict[str, Any] | None = None
        self.tokenizer: bytes | None = None
        self.memory: list[list[Any]] | None = None
        # sampler settings the engine refused: [temperature, top_k, message]
        self.refused: list[list[Any]] = []

    def save(self) -> None:
        if self.config is None or self.tokenizer is None:
            raise RuntimeError("nothing recorded: llm.py never opened a model")
        merged: list[tuple[tuple[float, int, int], list[int], list[int], list[int]]] = []
        for sampler, prompt, tokens, fed in self.runs:
            for k, (s, p, t, f) in enumerate(merged):
                n = min(len(f), len(fed))
                if (s, p) != (sampler, prompt) or f[:n] != fed[:n]:
                    continue
                short, long_ = sorted((t, tokens), key=len)
                if long_[: len(short)] != short:
                    raise RuntimeError(f"the engine answered {sampler} {prompt} two ways")
                merged[k] = (s, p, long_, max(f, fed, key=len))
                break
            else:
                merged.append((sampler, prompt, tokens, fed))
        data = {
            "version": 2,
            "config": self.config,
            "memory": self.memory,
            "refused_samplers": self.refused,
            "runs": [{"sampler": list(s), "prompt": p, "tokens": t, "fed": f} for s, p, t, f in
                     merged],
            "logits": [{"context": list(c), "hex": h} for c, h in self.logits.items()],
            "best_of": [{"context": list(c), "tokens": None if t is None else list(t),
                         "skip": k, "best": b} for (c, t, k), b in self.best_of.items()],
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, blob in (("replay.json", json.dumps(data).encode()),
                           ("tokenizer.bin", self.tokenizer)):
            tmp = self.out_dir / (name + ".tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, self.out_dir / name)


def _proxy_module(rec: _Recorder) -> types.ModuleType:
    real = rec.real

    class Model:
        def __init__(self, image: object = None) -> None:
            # The real Model needs a path on CPython; MPLLM_REPLAY_IMAGE plays the
            # role of the board's built-in default.
            if image is None:
                image = os.environ["MPLLM_REPLAY_IMAGE"]
            self._m = real.Model(image)
            self._sampler = (0.0, 0, 0)
            self._tokens: list[int] | None = None
            self._fed: list[int] = []
            self._ctx: list[int] = []  # the ids in the context (co-writing keeps them)
            rec.config = self._m.config()
            rec.tokenizer = bytes(self._m.tokenizer())
            rec.memory = [list(x) for x in self._m.memory()]

        def __getattr__(self, name: str) -> Any:  # everything not recorded is passed on
            return getattr(self._m, name)

        def reset(self) -> None:
            self._m.reset()
            self._tokens = None
            self._ctx = []

        def rewind(self, pos: int) -> None:
            self._m.rewind(pos)
            self._tokens = None
            self._ctx = self._ctx[:pos]

        def sampler(self, temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> None:
            try:
                self._m.sampler(temperature, top_k, seed)
            except ValueError as e:  # the engine's own rule, replayed as it answered
                rec.refused.append([float(temperature), int(top_k), str(e)])
                raise
            self._sampler = (float(temperature), int(top_k), int(seed))

        def prefill(self, tokens: list[int]) -> int:
            t = self._m.prefill(tokens)
            self._ctx += list(tokens)
            self._tokens = [t]
            self._fed = []
            # keyed by the whole context: after rewind() only the new ids are fed
            rec.runs.append((self._sampler, list(self._ctx), self._tokens, self._fed))
            return t

        def step(self, token: int) -> int:
            t = self._m.step(token)
            if self._tokens is None:
                raise RuntimeError("step() before prefill(): the replay cannot record this")
            self._tokens.append(t)
            self._fed.append(token)
            self._ctx.append(token)
            return t

        def logits(self) -> bytes:
            b: bytes = self._m.logits()
            rec.logits[tuple(self._ctx)] = b.hex()
            return b

        def best_of(self, tokens: list[int] | None = None, skip: bytes | None = None) -> int:
            b: int = self._m.best_of(tokens, skip)
            key = (tuple(self._ctx), None if tokens is None else tuple(tokens),
                   None if skip is None else bytes(skip).hex())
            rec.best_of[key] = b
            return b

        def close(self) -> None:
            self._m.close()

    mod = types.ModuleType("_llm")
    mod.Model = Model  # type: ignore[attr-defined]
    mod.Error = real.Error  # type: ignore[attr-defined]
    mod.build_info = real.build_info  # type: ignore[attr-defined]
    mod.__version__ = real.__version__  # type: ignore[attr-defined]
    return mod


_active: _Recorder | None = None


def install(out_dir: str | os.PathLike[str]) -> None:
    """Replace `_llm` with the recording proxy (call before importing llm)."""
    global _active
    import _llm as real

    _active = _Recorder(Path(out_dir), real)
    sys.modules["_llm"] = _proxy_module(_active)


def save() -> None:
    """Write the recording (replay.json + tokenizer.bin) into install()'s directory."""
    if _active is None:
        raise RuntimeError("record.install() was not called")
    _active.save()


_SERVE_SESSION = """
import json, sys
sys.path[:0] = [{modules!r}, {engine!r}, {tools!r}, {replay!r}]
import record
record.install({out!r})
import llm, llm_serve
llm.load({image!r})
answers = [list(llm_serve.handle(req)) for req in json.loads({requests!r})]
record.save()
print(json.dumps(answers))
"""


def record_serve_session(image: str | os.PathLike[str], requests: list[dict],
                         out_dir: str | os.PathLike[str]) -> list[list[dict]]:
    """llm_serve's answers to `requests` on the real engine, in a fresh CPython
    process, recorded into out_dir for the replay double (what a board running
    llm_serve over the double must then answer). Returns each request's events."""
    import subprocess

    here = Path(__file__).resolve().parent
    root = here.parents[2]
    code = _SERVE_SESSION.format(modules=str(root / "firmware" / "modules"),
                                 engine=str(root / "build" / "inplace"),
                                 tools=str(root / "tools"), replay=str(here),
                                 out=str(out_dir), image=str(image),
                                 requests=json.dumps(requests))
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    if made.returncode != 0:
        raise RuntimeError(f"recording llm_serve failed:\n{made.stdout}{made.stderr}")
    return json.loads(made.stdout)
