"""Replay double of the `_llm` engine, for running llm.py on MicroPython unix.

The MicroPython unix interpreter from PyPI cannot load our C engine, so this
pure-Python module stands in for it. It knows no numerics: it plays back
what the REAL engine answered, recorded by tests/helpers/replay/record.py while the
same llm.py ran on CPython. Anything llm.py asks that was not recorded (a
sampler setting, a prompt, a token fed that differs from the recorded
one, a story longer than the recording, logits of a context never read, a
call order the recording did not see) raises ReplayMiss, so a change in
llm.py's behaviour cannot pass silently.

Recording (a directory): replay.json = {"version": 2, "config": {...},
"memory": [[name, region, bytes], ...], "runs": [{"sampler": [temperature,
top_k, seed], "prompt": [ids...], "tokens": [next tokens returned by
prefill, then by each step...], "fed": [the token each step fed...]}],
"logits": [{"context": [ids...], "hex": the logits' bytes after that
context, in hex}], "best_of": [{"context": [ids...], "tokens": [ids...] or
null, "skip": the skip bitmap in hex or null, "best": the id best_of()
chose}], "refused_samplers": [[temperature, top_k, the engine's
ValueError message], ...]}; tokenizer.bin = the image's tokenizer section.
Runs with the same sampler and prompt differ in what was fed (token
healing feeds its own choice): a step picks the runs that fed its token.

Model() with no argument opens the recording named by $MPLLM_REPLAY, the way
the board's Model() opens its flash partition; Model(path) opens `path`.

Runs unchanged on MicroPython and CPython (no typing, no dataclasses).
"""

import json
import os

__version__ = "replay"


class Error(RuntimeError):
    pass


class ReplayMiss(Exception):
    """llm.py asked for something the recording does not hold.

    Deliberately not a ValueError/RuntimeError: llm.py must not be able to
    catch and hide it."""


def build_info():
    return "mpllm replay double (tokens recorded from the real engine) port=replay"


def _join(path, name):
    return path + "/" + name if not path.endswith("/") else path + name


class Model:
    def __init__(self, image=None, plain=False):
        # $MPLLM_REPLAY_STEP_S: seconds each step() waits first, so that a test
        # can interrupt a reply half-way (the real engine takes time too)
        self._step_s = float(os.getenv("MPLLM_REPLAY_STEP_S") or 0)
        if image is None:
            image = os.getenv("MPLLM_REPLAY")
            if not image:
                raise TypeError(
                    "Model() takes a path (str or os.PathLike) or a bytes-like image, not NoneType"
                )
        if not isinstance(image, str):
            raise ReplayMiss("the replay double opens recordings by path only")
        with open(_join(image, "replay.json")) as f:
            rec = json.load(f)
        if rec.get("version") != 2:
            raise ReplayMiss("recording version " + str(rec.get("version")) + ", expected 2")
        with open(_join(image, "tokenizer.bin"), "rb") as f:
            self._tok = f.read()
        self._config = rec["config"]
        self._memory = rec.get("memory")
        self._runs = rec["runs"]
        self._logits = {}
        for entry in rec.get("logits", []):
            self._logits[tuple(entry["context"])] = entry["hex"]
        self._best_of = {}
        for entry in rec.get("best_of", []):
            tokens = entry["tokens"]
            key = (tuple(entry["context"]), None if tokens is None else tuple(tokens),
                   entry["skip"])
            self._best_of[key] = entry["best"]
        self._refused = rec.get("refused_samplers", [])
        self._open = True
        self._plain = bool(plain)  # recordings are the same tokens either way
        self.reset()
        self._sampler = (0.0, 0, 0)

    def _ready(self):
        if not self._open:
            raise Error("bad state: the model is closed")

    def config(self):
        self._ready()
        return dict(self._config)

    def tokenizer(self):
        self._ready()
        return self._tok

    def reset(self):
        self._ready()
        self._pos = 0
        self._ctx = []  # the ids in the context, which a recording is keyed by
        self._run = None  # the recorded runs being played (those that fed what was fed)
        self._next = 0  # index in it of the next token to return
        self._fed = 0  # tokens through the layers since reset
        self._prefill_tokens = 0
        self._heads = 0

    def sampler(self, temperature=0.0, top_k=0, seed=0):
        self._ready()
        for t, k, message in self._refused:  # what the real engine said to these
            if float(t) == float(temperature) and int(k) == int(top_k):
                raise ValueError(message)
        self._sampler = (float(temperature), int(top_k), int(seed))

    def prefill(self, tokens):
        self._ready()
        tokens = list(tokens)
        if self._run is not None:
            raise ReplayMiss("prefill() after step() (without rewind) was never recorded")
        ctx = self._ctx + tokens  # recordings are keyed by the whole context
        runs = []
        for run in self._runs:
            s = run["sampler"]
            if (float(s[0]), int(s[1]), int(s[2])) == self._sampler and run["prompt"] == ctx:
                runs.append(run)
        if not runs:
            raise ReplayMiss(
                "no recording of context " + str(ctx) + " with sampler " + str(self._sampler)
            )
        self._run = runs
        self._next = 0
        self._ctx = ctx
        self._pos = len(ctx)
        self._fed += len(tokens)
        self._prefill_tokens = len(tokens)
        return self._give()

    def _give(self):
        tokens = self._run[0]["tokens"]
        if self._next >= len(tokens):
            raise ReplayMiss(
                "the recording ends after " + str(len(tokens)) + " tokens; llm.py asked for more"
            )
        t = tokens[self._next]
        self._next += 1
        self._heads += 1
        return t

    def step(self, token):
        if self._step_s:
            import time

            time.sleep(self._step_s)  # before any change: a Ctrl-C here changes nothing
        self._ready()
        if self._run is None:
            raise ReplayMiss("step() before prefill() was never recorded")
        k = self._next - 1  # steps since the prefill
        # a run fed `token` here, or ended where the engine had chosen it (then
        # the recording is too short, said by _give)
        runs = [r for r in self._run if (r["fed"] + r["tokens"][-1:])[k:k + 1] == [token]]
        if not runs:
            fed = [(r["fed"] + r["tokens"][-1:])[k] for r in self._run]
            raise ReplayMiss(
                "step(" + str(token) + "): the recording fed back " + str(fed) + " here"
            )
        if self._pos >= self._config["seq_len"]:
            raise Error("context full: all " + str(self._config["seq_len"]) + " positions used")
        self._run = runs
        self._pos += 1
        self._fed += 1
        self._ctx.append(token)
        return self._give()

    def rewind(self, pos):
        self._ready()
        if not 0 <= pos <= self._pos:
            raise ValueError("rewind position must be in 0.." + str(self._pos))
        self._pos = pos
        self._ctx = self._ctx[:pos]
        self._run = None

    def pos(self):
        self._ready()
        return self._pos

    def logits(self):
        self._ready()
        h = self._logits.get(tuple(self._ctx)) if self._heads else None
        if h is None:
            raise ReplayMiss("no logits recorded after context " + str(self._ctx))
        import binascii

        return binascii.unhexlify(h)

    def best_of(self, tokens=None, skip=None):
        self._ready()
        import binascii

        key = (tuple(self._ctx), None if tokens is None else tuple(tokens),
               None if skip is None else binascii.hexlify(bytes(skip)).decode())
        b = self._best_of.get(key) if self._heads else None
        if b is None:
            raise ReplayMiss("no best_of() recorded after context " + str(self._ctx)
                             + " for these ids")
        return b

    def set_plain(self, on):
        self._ready()
        self._plain = bool(on)

    def plain(self):
        self._ready()
        return self._plain

    def fast(self):
        self._ready()
        return False  # recordings are of exact mode

    def set_fast(self, on):
        self._ready()
        if on:
            raise ReplayMiss("fast mode is not recorded")

    def memory(self):
        self._ready()
        if self._memory is None:
            raise ReplayMiss("the memory report is not recorded")
        return [tuple(x) for x in self._memory]

    def stats(self):
        self._ready()
        # Counts as the engine keeps them; no clock in a replay, so times are 0,
        # and no head counters (llm.stats() then reports no head_rows_fraction).
        stages = {}
        for k in ("embed", "attn", "ffn", "ple", "head", "sample"):
            stages[k] = 0.0
        return {
            "tokens": self._fed,
            "prefill_tokens": self._prefill_tokens,
            "heads": self._heads,
            "ttft_ms": 0.0,
            "stage_ms": stages,
            "total_ms": 0.0,
            "bytes": {"flash": 0, "fast": 0, "bulk": 0},
        }

    def close(self):
        self._open = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
