"""Measurements that run where the engine runs: the bench, the gate, the report.

The same file on the board (frozen next to llm.py), on the MicroPython unix
port and on CPython (the host board). The PC's tools (tools/mpllm/board/bench.py,
gate.py) call it over the board's raw REPL, or in process for the host board,
and read the lines it prints:

  bench()   per run: "MPLLM-BENCH-START i", the story as it streams (control
            characters escaped: a raw \\x04 would end the raw REPL's output
            early), then "MPLLM-BENCH-END {json}"; one "MPLLM-BENCH-INFO {json}"
            before the runs.
  gate()    "MPLLM-GATE <hash> <n_prompt> <ids...>" (the definition is in
            tools/mpllm/board/gate.py's docstring).
  report()  "MPLLM-REPORT {json}": build, self-test, free memory.
  ab()      one "MPLLM-BENCH-INFO {json}", then per switch, round, state and
            run one "MPLLM-AB {json}" (or one "MPLLM-AB-SKIP {json}" for a
            switch this engine or port does not have): bench.py --ab.

Which model: by default the one the user's session shares (session=None:
llm.default_session), left open in the modes it had. A runtime with no model
partition (the unix port) and no model open yet opens `image` as that shared
model. private=True opens `image` in a session of its own for this call only
and closes it (the host board's tools).
"""

import json
import time

START = "MPLLM-BENCH-START"
END = "MPLLM-BENCH-END"
INFO = "MPLLM-BENCH-INFO"
GATE = "MPLLM-GATE"
REPORT = "MPLLM-REPORT"
AB = "MPLLM-AB"
AB_SKIP = "MPLLM-AB-SKIP"
#: The engine's switches ab() can measure: name -> (setter, getter) of
#: _llm.Model. Each leaves every token and logit as it was (llm.h).
SWITCHES = {"preload": ("set_preload", "preload"), "k_dots": ("set_k_dots", "k_dots")}

try:
    _now = time.ticks_us

    def _us(a, b):
        return time.ticks_diff(b, a)

except AttributeError:  # CPython

    def _now():
        return int(time.perf_counter() * 1e6)

    def _us(a, b):
        return b - a


class _Using:
    """The session whose model is measured, in the modes asked for, put back
    afterwards."""

    def __init__(self, session, image, private, plain, fast):
        import llm

        self.private = private
        if private:
            self.session = llm.Session()
            self.session.load(image, plain=plain or None, fast=fast or None)
            return
        self.session = llm.default_session if session is None else session
        try:
            model = self.session.load()
        except TypeError:  # no default model (unix port) and none open yet
            if image is None:
                raise
            model = self.session.load(image)
        self.modes = (model.plain(), model.fast())
        self.session.load(plain=plain, fast=fast)

    def __enter__(self):
        return self.session

    def __exit__(self, *exc):
        session = self.session
        if self.private:
            session.unload()
        else:  # a change of fast mode starts the context over: there is one model
            session.load(plain=False, fast=self.modes[1])
            session.model.set_plain(self.modes[0])
            session.forget_context()  # the bench fed the model: the user's story is not there


def _clean(s):
    out = []
    for c in s:
        o = ord(c)
        if o < 32 and c != "\n" or o == 127:
            out.append(f"\\x{o:02x}")
        else:
            out.append(c)
    return "".join(out)


def bench(runs, n_tokens, draft="auto", image=None, private=False, plain=False, fast=False,
          session=None):
    """Each run (prompt, temperature, top_k, seed): n_tokens tokens through
    llm.decode_tokens (speculative with `draft`), timed by the engine and on
    the wall."""
    import _llm
    import llm

    with _Using(session, image, private, plain, fast) as using:
        model = using.model
        cfg = model.config()
        tok = using.tokenizer
        drafter = llm.drafter(model, draft, paced=False)  # (the drafter itself is measured)
        mode = "fast" if model.fast() else "plain" if model.plain() else "exact"
        info = {"build_info": _llm.build_info(), "config": cfg, "mode": mode,
                "drafter": None if drafter is None else "ngram" if draft == "auto" else draft,
                "memory": [list(m) for m in model.memory()]}
        print(INFO, json.dumps(info))
        for i, (prompt, temperature, top_k, seed) in enumerate(runs):
            ids = tok.encode(prompt)
            n = min(n_tokens, cfg["seq_len"] - len(ids) + 1)
            model.reset()
            model.sampler(temperature, top_k, seed)
            dec = llm.Utf8Decoder()
            print(START, i)
            t0 = _now()
            t = model.prefill(ids)
            first = model.stats()
            out = [t]
            print(_clean(dec.feed(tok.token_bytes(t))), end="")
            counts = {}
            for u in llm.decode_tokens(model, t, n - 1, drafter, list(ids), None, counts):
                out.append(u)
                print(_clean(dec.feed(tok.token_bytes(u))), end="")
            t1 = _now()
            print(_clean(dec.flush()))
            res = {"run": i, "prompt_ids": ids, "ids": out, "wall_us": _us(t0, t1),
                   "after_prefill": first, "final": model.stats(), "counts": counts}
            print(END, json.dumps(res))


def ab(runs, n_tokens, switches, rounds, rows, image=None, private=False, session=None):
    """Each switch off then on, `rounds` times (off, on, off, on, ...), each
    time every run (prompt, temperature, top_k, seed) for n_tokens tokens
    one step at a time in exact mode (no drafter: a pass is one token). Per
    run one AB line: the ids, the FNV-1a 64 of the first `rows` logits rows
    (the gate's hash) and the engine's ms per decoded token by stage. The
    switch is put back as it was; a switch the model lacks or refuses (a port
    without the preload hook) gets one AB_SKIP line."""
    import _llm

    with _Using(session, image, private, False, False) as using:
        model = using.model
        cfg = model.config()
        tok = using.tokenizer
        info = {"build_info": _llm.build_info(), "config": cfg, "mode": "exact",
                "drafter": None, "memory": [list(m) for m in model.memory()]}
        print(INFO, json.dumps(info))
        for name in switches:
            if name not in SWITCHES:
                raise ValueError("no switch " + repr(name) + " (known: " + ", ".join(SWITCHES) + ")")
            setter = getattr(model, SWITCHES[name][0], None)
            getter = getattr(model, SWITCHES[name][1], None)
            if setter is None or getter is None:
                print(AB_SKIP, json.dumps({"switch": name, "why": "not in this engine"}))
                continue
            was = getter()
            try:
                setter(True)
            except _llm.Error as e:  # the engine's own refusal (a port without the hook)
                print(AB_SKIP, json.dumps({"switch": name, "why": str(e)}))
                continue
            try:
                for rnd in range(rounds):
                    for on in (False, True):
                        setter(on)
                        for i, (prompt, temperature, top_k, seed) in enumerate(runs):
                            res = _ab_run(model, tok, cfg, prompt, temperature, top_k, seed,
                                          n_tokens, rows)
                            res.update({"switch": name, "on": on, "round": rnd, "run": i})
                            print(AB, json.dumps(res))
            finally:
                setter(was)


def _ab_run(model, tok, cfg, prompt, temperature, top_k, seed, n_tokens, rows):
    ids = tok.encode(prompt)
    n = min(n_tokens, cfg["seq_len"] - len(ids) + 1)
    model.reset()
    model.sampler(temperature, top_k, seed)
    state = fnv_state()
    t = model.prefill(ids)
    a = model.stats()
    if rows > 0:
        fnv_update(state, model.logits())  # outside the stage timers (llm.h: llm_logits)
    out = [t]
    for k in range(1, n):
        t = model.step(t)
        if k < rows:
            fnv_update(state, model.logits())
        out.append(t)
    f = model.stats()
    steps = n - 1
    stage = {st: (f["stage_ms"][st] - a["stage_ms"][st]) / steps if steps else 0.0
             for st in f["stage_ms"]}
    heads = f["heads"] - a["heads"]
    return {"prompt_ids": ids, "ids": out, "hash": fnv_hex(state), "steps": steps,
            "stage_ms": stage, "head_rows": f["head_rows"] - a["head_rows"], "heads": heads,
            "preloads": f.get("preloads", 0) - a.get("preloads", 0)}


# ---- the gate's hash: FNV-1a 64 ------------------------------------------------
# Each kernel is (new state, update(state, bytes), hex digits of a state). A
# viper kernel on 32-bit halves where the native emitter is there (the board
# has no cheap long integers), plain Python ints everywhere.


def _plain_state():
    return [0xCBF29CE484222325]


def _plain_update(state, data):
    h = state[0]
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    state[0] = h


def _plain_hex(state):
    return f"{state[0]:016x}"


FNV_KERNELS = {"plain": (_plain_state, _plain_update, _plain_hex)}

try:
    import micropython  # noqa: F401 (the decorator in the code below)

    # viper's annotations are not CPython syntax: compiled only here
    exec(  # noqa: S102
        """
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
"""
    )

    def _viper_state():
        return bytearray(b"\x25\x23\x22\x84\xe4\x9c\xf2\xcb")  # the offset, little-endian

    def _viper_update(state, data):
        _fnv_viper(state, data, len(data))  # noqa: F821 (defined by the exec above)

    def _viper_hex(state):
        return "".join(f"{state[7 - i]:02x}" for i in range(8))

    _probe = _viper_state()
    _viper_update(_probe, b"a")
    if _viper_hex(_probe) == "af63dc4c8601ec8c":  # FNV-1a 64 of b"a"
        FNV_KERNELS["viper"] = (_viper_state, _viper_update, _viper_hex)
except (ImportError, SyntaxError, NameError, TypeError, ValueError):
    pass

FNV_KERNEL = "viper" if "viper" in FNV_KERNELS else "plain"
fnv_state, fnv_update, fnv_hex = FNV_KERNELS[FNV_KERNEL]


def gate(prompt, n_tokens, n_rows, image=None, private=False, session=None):
    """Greedy decoding from `prompt` in exact mode: the hash of the first
    n_rows logits rows and the text of n_tokens tokens, or of as many as the
    model's context holds (a board without PSRAM opens a short one by
    default): the line gives the ids, so the host hashes the same count."""
    with _Using(session, image, private, False, False) as using:
        model = using.model
        tok = using.tokenizer
        ids_in = tok.encode(prompt)
        n_tokens = min(n_tokens, model.config()["seq_len"] - len(ids_in) + 1)
        if n_tokens < n_rows:
            raise ValueError(f"the gate needs {len(ids_in) + n_rows - 1} positions, the "
                             f"model's context holds {model.config()['seq_len']}")
        state = fnv_state()
        model.reset()
        model.sampler(0.0, 0, 0)
        t = model.prefill(ids_in)
        ids = [t]
        fnv_update(state, model.logits())
        for k in range(1, n_tokens):
            t = model.step(t)
            if k < n_rows:
                fnv_update(state, model.logits())
            ids.append(t)
        fnv_update(state, tok.decode(ids).encode("utf-8"))
        print(GATE, fnv_hex(state), len(ids_in), " ".join(str(i) for i in ids_in + ids))


def report():
    """Build, self-test and free memory (the ESP-IDF heaps on the board)."""
    import gc

    import _llm

    info = {"build_info": _llm.build_info(), "selftest": None, "heap_free": None,
            "idf_heap": None}
    if hasattr(_llm, "selftest"):
        info["selftest"] = _llm.selftest()
    gc.collect()
    if hasattr(gc, "mem_free"):
        info["heap_free"] = gc.mem_free()
    try:
        import esp32

        info["idf_heap"] = {"data": [list(h) for h in esp32.idf_heap_info(esp32.HEAP_DATA)],
                            "exec": [list(h) for h in esp32.idf_heap_info(esp32.HEAP_EXEC)]}
    except ImportError:
        pass
    print(REPORT, json.dumps(info))
