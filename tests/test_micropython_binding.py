"""The MicroPython `_llm` (native/micropython/modllm.c, modllm_call.c).

Always: the binding exposes the same names as the CPython `_llm`, and every
build (setup.py, micropython.mk, micropython.cmake) compiles the same engine
sources. With MICROPY_DIR pointing at a MicroPython checkout: build the unix
port with our USER_C_MODULES and drive the real binding end to end, comparing
every token and logit byte with the CPython `_llm` on the same image.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cbuild
import pytest
from unix_micropython import VARIANTS, run_mp, unix_port

ROOT = Path(__file__).resolve().parent.parent
MP_BINDING = ROOT / "native" / "micropython"


def _c_table(text: str, table: str, pattern: str) -> list[str]:
    body = re.search(re.escape(table) + r"\[\] = \{(.*?)\n\};", text, re.DOTALL)
    assert body, f"no {table} table"
    return re.findall(pattern, body.group(1))


def test_same_api_as_the_cpython_binding() -> None:
    """The methods both bindings take from the core's LLM_BIND_METHODS list,
    plus each one's own entries, and the module globals, are the same."""
    mp = (MP_BINDING / "modllm.c").read_text()
    cp = (ROOT / "native" / "python" / "mod_llm.c").read_text()
    core = re.search(r"#define LLM_BIND_METHODS\(X\)(.*?)\n\n",
                     (ROOT / "native" / "binding" / "llm_bind.h").read_text(), re.DOTALL)
    shared = set(re.findall(r"X\((\w+),", core.group(1)))
    assert {"prefill", "step", "verify", "sampler"} <= shared
    mp_table = _c_table(mp, "llm_model_locals_dict_table", r"LLM_BIND_METHODS|MP_QSTR_(\w+)\)")
    cp_table = _c_table(cp, "Model_methods", r'LLM_BIND_METHODS|\{"(\w+)"')
    assert "" in mp_table and "" in cp_table  # each expands the shared list
    # __del__ is how MicroPython runs a finaliser; CPython uses tp_dealloc
    assert set(mp_table) - {"", "__del__"} == set(cp_table) - {""}
    assert not shared & set(cp_table)
    mp_globals = set(_c_table(mp, "llm_module_globals_table",
                                r"\{ MP_ROM_QSTR\(MP_QSTR_(\w+)\)")) - {
        "__name__"}
    cp_globals = set(_c_table(cp, "module_methods", r'\{"(\w+)"'))
    cp_globals |= set(re.findall(r'PyModule_Add\w*\(module, "(\w+)"', cp))
    assert mp_globals == cp_globals


def test_method_list_matches_the_pyi() -> None:
    """The core's LLM_BIND_METHODS list plus each binding's own entries
    (close, tokenizer, __enter__, __exit__) are exactly the methods
    _llm.pyi documents on Model, so a method added to one and not the other
    fails here (the recipe beside LLM_BIND_METHODS, llm_bind.h)."""
    import ast

    core = re.search(r"#define LLM_BIND_METHODS\(X\)(.*?)\n\n",
                     (ROOT / "native" / "binding" / "llm_bind.h").read_text(), re.DOTALL)
    assert core
    listed = re.findall(r"X\((\w+),", core.group(1))
    own = set(_c_table((ROOT / "native" / "python" / "mod_llm.c").read_text(), "Model_methods",
                       r'\{"(\w+)"'))
    tree = ast.parse((ROOT / "firmware" / "modules" / "_llm.pyi").read_text())
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    documented = {n.name for n in model.body if isinstance(n, ast.FunctionDef)} - {"__init__"}
    assert len(listed) == len(set(listed)) and own >= {"close", "tokenizer", "__enter__"}
    assert not set(listed) & own
    assert documented - own - set(listed) == set(), "in _llm.pyi, in no binding"
    assert set(listed) - documented == set(), "in LLM_BIND_METHODS, not in _llm.pyi"
    assert own - documented == set(), "a binding's own method not in _llm.pyi"


def test_every_build_compiles_the_one_engine_list() -> None:
    """native/engine/sources.txt is the engine's one source list: every build
    reads it (none keeps a copy), and every engine .c file is in it or is one
    of the kernels/self-test files a build adds by name."""
    listed = [p.name for p in cbuild.engine_sources()]
    assert "engine.c" in listed and len(set(listed)) == len(listed)
    mk = (MP_BINDING / "micropython.mk").read_text()
    cm = (MP_BINDING / "micropython.cmake").read_text()
    setup = (ROOT / "setup.py").read_text()
    assert "engine/sources.txt" in mk and "engine/sources.txt" in cm
    assert '"sources.txt"' in setup
    for text in (mk, cm, setup):
        assert "engine_open.c" not in text  # no copy of the list
    added = {"kernels_pie.c", "pie_model.c", "selftest.c"}
    on_disk = {p.name for p in (ROOT / "native" / "engine").glob("*.c")}
    assert on_disk == set(listed) | added
    for name in listed:
        assert (ROOT / "native" / "engine" / name).is_file(), name


# ---------------------------------------------------------------------------
# the real binding on the unix port


BAD_IMAGE = b"MPLLMIMG" + bytes(200)

DRIVE = """
import _llm
m = _llm.Model({image!r})
print("INFO", _llm.build_info())
assert _llm.Model({image!r}) is m          # kept open across calls
cfg = m.config()
m.sampler(temperature={t}, top_k={k}, seed={seed})
toks = [m.prefill({prompt})]
for i in range({n}):
    toks.append(m.step(toks[-1]))
print("TOKENS", toks)
print("LOGITS", m.logits().hex())
m.rewind(m.pos() - 3)                       # drop three, verify three others in one pass
print("VERIFY", m.verify([toks[-4], 1, 2]), m.pos())
m.rewind(m.pos() - 3)
print("RESTEP", [m.step(t) for t in (toks[-4], 1, 2)])
print("VLOGITS", m.logits().hex())
print("POS", m.pos(), cfg["vocab_out"], cfg["tied_head"])
names = [p[0] for p in m.memory()]
print("MEM", len(names) > 0, m.stats()["tokens"])
m.close()
try:
    m.step(1)
except _llm.Error as e:
    print("CLOSED", str(e))
def closing(model):
    yield 1
    model.close()
    yield 2
g = _llm.Model({image!r})
try:
    g.prefill(closing(g))
except _llm.Error as e:
    print("GEN", str(e))
try:
    _llm.Model({bad!r})
except _llm.Error as e:
    print("BAD", str(e))
try:
    _llm.Model({image!r}).step(10 ** 6)
except ValueError as e:
    print("RANGE", str(e))
"""


def _cpython_reference(image: Path, t: float, k: int, seed: int, prompt: list[int],
                       n: int) -> tuple[list[int], str, str, str]:
    from engine_ext import load

    _llm = load()
    with _llm.Model(str(image)) as m:
        m.sampler(temperature=t, top_k=k, seed=seed)
        toks = [m.prefill(prompt)]
        for _ in range(n):
            toks.append(m.step(toks[-1]))
        logits = m.logits().hex()
        m.rewind(m.pos() - 3)
        verify = f"{m.verify([toks[-4], 1, 2])} {m.pos()}"
    with pytest.raises(_llm.Error) as bad:
        _llm.Model(BAD_IMAGE)
    return toks, logits, str(bad.value), verify


@pytest.mark.parametrize("t,k,seed", [(0.0, 0, 0), (0.8, 40, 1234567890123)])
def test_unix_binding_matches_cpython(micropython: Path, tiny_model, tmp_path: Path,
                                      t: float, k: int, seed: int) -> None:
    prompt, n = [5, 17, 42, 7], 20
    out = run_mp(micropython, DRIVE.format(image=str(tiny_model.image), t=t, k=k, seed=seed,
                                            prompt=prompt, n=n, bad=BAD_IMAGE), tmp_path)
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    print(lines["INFO"])
    ref_tokens, ref_logits, ref_bad, ref_verify = _cpython_reference(tiny_model.image, t, k, seed,
                                                                     prompt, n)
    assert lines["TOKENS"] == str(ref_tokens)
    assert lines["LOGITS"] == ref_logits
    # one verify pass == three steps after a rewind, on both bindings
    assert lines["VERIFY"] == ref_verify
    assert lines["RESTEP"] == ref_verify.rsplit(" ", 1)[0]
    assert "the model is closed" in lines["GEN"]
    assert lines["POS"].split()[0] == str(len(prompt) + n)
    assert lines["MEM"] == f"True {len(prompt) + n + 6}"  # + 3 verified, 3 stepped again
    assert "the model is closed" in lines["CLOSED"]
    assert lines["BAD"] == ref_bad  # the engine's message, through the one helper
    assert "out of range" in lines["RANGE"]
    assert "port=micropython-unix" in lines["INFO"]


def test_llm_py_story_through_the_real_binding(micropython: Path, tmp_path: Path,
                                               demo_image: Path) -> None:
    """llm.py on MicroPython unix with the demo model, end to end through the real
    binding: the same greedy and seeded stories, byte for byte, as CPython's, with
    the image's n-gram drafter guessing (the same passes) and in fast mode."""
    import engine_ext

    img = demo_image
    code = f"""
import llm
llm.load({str(img)!r})
llm.story("Once upon a time", temperature=0, draft="ngram")  # (auto: paced by the clock)
s = llm.stats()
print("PASSES", s["passes"], s["accepted"], s["drafted"])
llm.story("Tom and his dog", seed=7, max_tokens=60)
llm.load(fast=True)
print("MODE", llm.mode())
llm.story("Once upon a time", seed=3, max_tokens=60)
"""
    out = run_mp(micropython, code, tmp_path)
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=engine_ext.PYTHONPATH),
                          timeout=300, check=False)
    assert host.returncode == 0, host.stdout + host.stderr
    assert out.startswith("Once upon a time"), out[:200]
    assert "[stopped: token budget 60 reached]" in out or out.count("Tom and his dog") == 1
    assert out == host.stdout
    passes = next(line for line in out.splitlines() if line.startswith("PASSES")).split()
    assert int(passes[1]) > 0 and int(passes[2]) > 0  # guesses were made and kept
    assert "MODE fast" in out
    print(out)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def micropython_variant(request: pytest.FixtureRequest) -> Path:
    return unix_port(request.param)


INTERRUPTED = """
import _llm, time
m = _llm.Model({image!r})
m.sampler(0.8, 40, 5)
prompt = [(7 * i + 3) % 1000 for i in range(250)]
want = m.prefill(prompt)
m.reset()
print("READY")
caught = 0
t0 = time.ticks_ms()
while caught < 3 and time.ticks_diff(time.ticks_ms(), t0) < 60000:
    try:
        m.reset()
        m.prefill(prompt)
    except KeyboardInterrupt:
        caught += 1
        print("CAUGHT", m.pos(), time.ticks_ms())
m.reset()
m.sampler(0.8, 40, 5)
print("AGAIN", m.prefill(prompt) == want, m.pos())
for _ in range(30):  # opening and closing are never cut half-way
    try:
        _llm.Model({image!r}).close()
    except KeyboardInterrupt:
        caught += 1
print("DONE", caught)
"""


def test_ctrl_c_interrupts_a_prefill_and_changes_nothing(micropython_variant: Path,
                                                         tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) during long prefills on both unix builds: each raises
    KeyboardInterrupt within a pass, a prefill it cuts leaves the position at
    0 (never part-way), and the model then gives the uninterrupted result."""
    import signal
    import time

    demo = ROOT / "models" / "demo"
    sys.path.insert(0, str(ROOT / "tools"))
    from mpllm.convert import convert

    img = tmp_path / "demo.img"
    convert(demo / "model.bin", demo / "tokenizer.json", img, progress=False)
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED.format(image=str(img)))
    p = subprocess.Popen([str(micropython_variant), str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().startswith("READY")
    latencies = []
    for _ in range(3):
        time.sleep(0.02)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline()
        latencies.append(time.monotonic() - sent)
        # inside a prefill it is undone (0); between calls it may find one done
        assert line.split()[:2] in (["CAUGHT", "0"], ["CAUGHT", "250"]), line + p.stderr.read()
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 0, rest + err
    assert "AGAIN True 250" in rest and "DONE 3" in rest, rest
    print(f"{micropython_variant.parent.name}: Ctrl-C latency during prefill "
          f"{', '.join(f'{1e3 * x:.1f}' for x in latencies)} ms")


#: calls whose outcome (exception type and message) both bindings must share
SAME_OUTCOME = [
    "m.step(2**40)", "m.step(2**70)", "m.step(True)", "m.step(1.5)",
    "m.sampler(0.8, 2**40, 1)", "m.sampler(0.8, True, 1)", "m.sampler(0.8, 40, -1)",
    "m.sampler(0.8, 40, 2**64)", "m.sampler(-1.0, 40, 1)", "m.sampler(0.8, 300, 1)",
    "m.rewind(3)", "m.rewind(-1)", "m.draft([1], -1)", "m.verify([1] * 9)", "m.prefill([])",
    "_llm.Model(IMAGE, plain=True, fast=True)", "_llm.Model(b'')", "_llm.Model(bytearray())",
    "m.sampler(temperature=Closes())", "m.prefill(closing(m))",
    "m.set_fast(ClosesBool())", "m.set_plain(ClosesBool())", "m.set_k_dots(ClosesBool())",
    "m.k_dots(1)", "m.set_k_dots()",
    "print('DRAFT', m.draft([], 3))",
    # the core's method table: keywords, and Python's arity errors
    "print('KW', m.prefill(tokens=[1, 2]), m.step(token=3), m.verify(tokens=(4, 5)))",
    "print('KW', m.draft(max_len=2, context=[1]), m.rewind(pos=0), m.pos())",
    "m.step(3, token=3)", "m.step(tok=3)", "m.step()", "m.step(1, 2)", "m.pos(1)",
    # big ints read alike (a too-large max_len clamps; negatives keep their value)
    "print('BIG', m.draft([1], 2**70))", "m.step(-2**62 - 1)", "m.rewind(-2**40)",
    # return values built from the core's value stream
    "print('MEM', m.memory())",
    # (MicroPython's Model(IMAGE) is the shared model: reset it first)
    ("m.reset() or print('STATS', sorted(m.stats()), sorted(m.stats()['stage_ms']), "
     "sorted(m.stats()['bytes'].items()))"),
    ("print('CFG', sorted((k, v) for k, v in m.config().items() "
     "if k not in ('rope_theta', 'norm_eps')))"),
    "print('SELF', sorted(k for k in _llm.selftest() if k != 'lines'))",
    # Model()'s source: a NUL cuts no path short, the type named, OSError exactly
    "_llm.Model('a\\0b')", "_llm.Model(123)", "_llm.Model(NOT_THERE)", "_llm.Model(A_DIR)",
    # a token list that is not iterable; the tokenizer's indices (CPython's memoryview's words)
    "m.prefill(5)", "m.verify(None)", "m.draft(3, 1)",
    "m.tokenizer()[10**20]", "m.tokenizer()[-10**20]", "m.tokenizer()[2**40]",
    "m.tokenizer()[-1 - len(m.tokenizer())]", "print('BOOL', m.tokenizer()[True])",
    "print('TOK', m.tokenizer()[-1], bytes(m.tokenizer()[3:40:7]), bytes(m.tokenizer()[9:2:-3]))",
    # a context cap: checked alike, refused past the image's seq_len (the open model
    # kept on MicroPython), and held (last: MicroPython's Model(IMAGE) then keeps it)
    "_llm.Model(IMAGE, context=0)", "_llm.Model(IMAGE, context=2**70)",
    "_llm.Model(IMAGE, context=True)", "_llm.Model(IMAGE, context=65)",
    "print('CTX', m.pos(), _llm.Model(IMAGE, context=20).config()['seq_len'])",
    # best_of: its rules, its ids' range (the head's), None as omitted, a bitmap of the
    # head's ids (280 ids: 35 bytes); MicroPython's Model(IMAGE) is the shared model
    "m.reset() or m.best_of([1])", "[m.prefill([1]), m.best_of([])]", "m.best_of(5)",
    "[m.prefill([1]), m.best_of([280])]", "[m.prefill([1]), m.best_of([-1])]",
    "[m.prefill([1]), m.best_of(skip=bytes(34))]", "[m.prefill([1]), m.best_of(skip=[0])]",
    "[m.prefill([1]), m.best_of(skip=b'\\xff' * 35)]",
    ("m.reset() or print('BEST', m.prefill([1, 2]), m.best_of([3, 4, 3]), m.best_of(None, None), "
     "m.best_of(skip=bytearray(35)), m.best_of(tokens=(9, 8), skip=memoryview(bytes(35))))"),
]

OUTCOMES = """
import _llm
IMAGE = {image!r}
NOT_THERE = {not_there!r}
A_DIR = {a_dir!r}
class Closes:
    def __float__(self):
        m.close()
        return 0.5
class ClosesBool:
    def __bool__(self):
        m.close()
        return True
def closing(model):
    yield 1
    model.close()
    yield 2
for i, case in enumerate({cases!r}):
    m = _llm.Model(IMAGE)
    try:
        eval(case)
        print("CASE", i, "ok")
    except OSError as e:  # str() is each runtime's rendering of OSError(errno, message)
        print("CASE", i, type(e).__name__ + ":", e.errno, e.args)
    except Exception as e:
        print("CASE", i, type(e).__name__ + ":", str(e))
good = _llm.Model(IMAGE)
try:
    _llm.Model(b"MPLLMIMG" + bytes(200))
except _llm.Error:
    pass
print("GOOD", good.prefill([1, 2]) >= 0)
print("MAX_TOP_K", _llm.MAX_TOP_K)
"""


def test_both_bindings_decide_alike(micropython_variant: Path, tiny_model,
                                    tmp_path: Path) -> None:
    """The same calls give the same exception type and message on both
    bindings (no crash where user code closes the model mid-call), and a
    failed Model() leaves the open model usable on MicroPython too."""
    from engine_ext import load

    code = OUTCOMES.format(image=str(tiny_model.image), cases=SAME_OUTCOME,
                           not_there=str(tmp_path / "missing.img"), a_dir=str(tmp_path))
    mp_out = run_mp(micropython_variant, code, tmp_path)
    ns: dict[str, object] = {}
    lines = []
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code.replace("import _llm", ""), {"_llm": load(), **ns})  # noqa: S102
    lines = buf.getvalue()
    assert mp_out == lines
    assert "GOOD True" in mp_out and "MAX_TOP_K 256" in mp_out
    said = dict(line.split(" ", 1)[1].split(" ", 1) for line in mp_out.splitlines()
                if line.startswith("CASE "))
    missing, directory = tmp_path / "missing.img", tmp_path
    for case, outcome in [
        ("_llm.Model('a\\0b')", "ValueError: Model() path has a NUL character at index 1"),
        ("_llm.Model(123)", ("TypeError: Model() takes a path (str or os.PathLike) or a "
                             "bytes-like image, not int")),
        ("_llm.Model(NOT_THERE)",
         f"OSError: 2 (2, \"cannot open model image '{missing}': No such file or directory\")"),
        ("_llm.Model(A_DIR)",
         f"OSError: 21 (21, \"cannot map model image '{directory}': Is a directory\")"),
        ("m.prefill(5)", "TypeError: prefill() takes a sequence of token ids, not int"),
        ("m.tokenizer()[10**20]", "IndexError: cannot fit 'int' into an index-sized integer"),
        ("m.tokenizer()[2**40]", "IndexError: index out of bounds on dimension 1"),
        ("m.step(2**70)", "ValueError: token id >= 2**63 out of range 0..279"),
    ]:
        assert said[str(SAME_OUTCOME.index(case))] == outcome, case
    print(mp_out)


def test_report_from_the_unix_port(micropython: Path, tmp_path: Path) -> None:
    """bench.py --port --report against the real binding behind a pty: the
    self-test passes, the gate equals the host reference, and the model the
    user's session has open is still open (in its mode) afterwards."""
    import json

    from mpllm.board import bench
    from mpllm.convert import convert
    from serial_peer import SerialPeer

    demo = ROOT / "models" / "demo"
    img = tmp_path / "demo.img"
    convert(demo / "model.bin", demo / "tokenizer.json", img, progress=False,
            drafter_stories=10, drafter_always=True)

    def on_board(port: str, code: str) -> str:
        chunks: list[bytes] = []
        assert not bench.run_port_snippet(port, code, consumer=chunks.append)
        return b"".join(chunks).decode()

    out = tmp_path / "report.json"
    with SerialPeer([ROOT / "firmware" / "modules"], micropython=str(micropython)) as peer:
        # a fresh session on a runtime with no model partition: --port-image
        fresh = subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), "--port",
                                peer.port, "--image", str(img), "--port-image", str(img),
                                "--report", str(tmp_path / "fresh.json"), "--tokens", "10",
                                "--quiet"], capture_output=True, text=True, timeout=600,
                               check=False)
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr
        assert json.loads((tmp_path / "fresh.json").read_text())["gate"]["same"]
        on_board(peer.port, f"import llm\nllm.load({str(img)!r}, plain=True)")
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), "--port",
                            peer.port, "--image", str(img), "--report", str(out), "--tokens",
                            "30", "--quiet"], capture_output=True, text=True, timeout=600,
                           check=False)
        after = on_board(peer.port, "import llm\nprint('STILL', llm.default_session.model is not None and "
                                    "llm.default_session.model.plain())")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["selftest"]["ok"] and data["selftest"]["passed"] > 10
    assert data["gate"]["same"] and "port=micropython-unix" in data["build_info"]
    assert data["bench"]["tokens_per_pass"] >= 1.0 and data["heap_free"] > 0
    assert "STILL True" in after
    print(r.stdout)


OPEN_LOOP = """
import _llm
def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4
first = rss_kib()
opened = caught = 0
while caught < {signals}:
    round_start = opened
    try:  # every SIGINT comes while this try runs: the test waits for ARMED
        while True:
            _llm.Model({image!r}).close()
            opened += 1
            if opened == round_start + 1:
                print("ARMED", caught)  # one open done this round; send the next one
    except KeyboardInterrupt:
        caught += 1
print("DONE", caught, opened, rss_kib() - first)
"""


@pytest.mark.parametrize("pause", [0.002, 0.05])
def test_ctrl_c_during_open_leaks_nothing(micropython: Path, release_model, tmp_path: Path,
                                          pause: float) -> None:
    """SIGINTs while models of the release shape are opened and closed: they
    become KeyboardInterrupts between calls, none cuts llm_open half-way
    (before, each cut leaked its buffers: 25 took the RSS from 2.5 MB to
    356 MB). One signal at a time, each `pause` s after the script says it is
    opening again: every signal is caught exactly once however slow either
    side is (before, a loaded machine could deliver the signals after the
    loop had ended, or merge them: it failed 1 run in 9). The 50 ms pause is
    such a slow sender."""
    import signal
    import threading
    import time

    signals = 25
    script = tmp_path / "open_loop.py"
    script.write_text(OPEN_LOOP.format(image=str(release_model.image), signals=signals))
    p = subprocess.Popen([str(micropython), str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    watchdog = threading.Timer(300, p.kill)  # a hung script ends the reads below
    watchdog.start()
    try:
        for k in range(signals):
            assert p.stdout.readline() == f"ARMED {k}\n", p.stderr.read() if p.stderr else ""
            time.sleep(pause)
            p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
    finally:
        watchdog.cancel()
        p.kill()
    assert p.returncode == 0, out + err
    _, caught, opened, grown = out.split()
    assert int(caught) == signals and int(opened) >= signals
    assert int(grown) < 64 * 1024, f"RSS grew {grown} KiB"
    print(f"{signals} SIGINTs during {opened} opens: {caught} caught, RSS grew {grown} KiB")


SECTION = """
import _llm
m = _llm.Model({image!r})
t = m.tokenizer()
print("TYPE", type(t).__name__, len(t), t[0], t[-1], list(t[4:8]), t[:4])
print("HEX", t[:].hex())
try:
    t[0] = 1
except TypeError:
    print("READONLY")
m.close()
try:
    t[0]
except _llm.Error as e:
    print("CLOSED", e)
"""


def test_tokenizer_is_read_in_place_on_micropython(micropython: Path, tiny_model,
                                                   tmp_path: Path) -> None:
    """MicroPython's tokenizer() reads the image's section in place (no heap
    copy) and refuses to read it once the model is closed."""
    from mpllm.formats.image import read_image

    want = read_image(tiny_model.image).tokenizer_section
    out = run_mp(micropython, SECTION.format(image=str(tiny_model.image)), tmp_path)
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert lines["TYPE"] == (f"Section {len(want)} {want[0]} {want[-1]} {list(want[4:8])} "
                             f"{want[:4]!r}")
    assert lines["HEX"] == want.hex() and "READONLY" in out
    assert lines["CLOSED"] == "bad state: the model is closed"


#: a bytearray image, zeroed once the model is open: the tokens are those of the file
MUTABLE = """
import _llm
data = bytearray(open({image!r}, "rb").read())
m = _llm.Model(data)
got = [m.prefill([1, 2, 3])]
data[:] = bytes(len(data))
got += [m.step(got[-1]) for _ in range(8)]
m.close()
m = _llm.Model({image!r})
want = [m.prefill([1, 2, 3])]
want += [m.step(want[-1]) for _ in range(8)]
print("SAME", got == want, len(set(want)) > 1)
"""


def test_a_mutable_image_is_copied_on_micropython(micropython: Path, tiny_model,
                                                  tmp_path: Path) -> None:
    """Model(bytearray) on MicroPython copies the image at open (llm_bind_place),
    so zeroing the caller's buffer afterwards changes no token: the twin of
    test_bindings.py::test_empty_and_mutable_buffers."""
    out = run_mp(micropython, MUTABLE.format(image=str(tiny_model.image)), tmp_path)
    assert "SAME True True" in out, out


#: a view of tokenizer() kept while its model is closed or replaced, then read
KEPT_VIEW = """
import _llm, llm
for replace in ("close", "Model", "llm.load"):
    first = llm.load({a!r}) if replace == "llm.load" else _llm.Model({a!r})
    t = first.tokenizer()
    want = bytes(t[:64])
    try:
        view = memoryview(t)
    except TypeError as e:
        view = None
        print("VIEW", replace, "TypeError:", e)
    if replace == "close":
        first.close()
    elif replace == "Model":
        _llm.Model({b!r})  # another source: closes the open model
    else:
        llm.load({b!r})
    for what, read in (("VIEW", lambda: bytes(view[:64])), ("SECTION", lambda: bytes(t[:64]))):
        if what == "VIEW" and view is None:
            continue
        try:
            print("READ", what, replace, read() == want)
        except Exception as e:
            print("READ", what, replace, type(e).__name__ + ":", e)
"""


def test_a_kept_tokenizer_view_never_reads_freed_memory(micropython: Path, tiny_model,
                                                        tmp_path: Path) -> None:
    """A memoryview of tokenizer() kept past close(), past Model(another
    source) or llm.load(another image) (both close the open model) read
    unmapped memory: SIGSEGV. MicroPython's Section now lends no buffer (a
    MicroPython memoryview could not keep the image mapped), so the view is
    refused when it is made, and the Section itself says the model is closed;
    CPython's view keeps the bytes (test_bindings.py)."""
    other = tmp_path / "other.img"
    other.write_bytes(tiny_model.image.read_bytes())
    out = run_mp(micropython, KEPT_VIEW.format(a=str(tiny_model.image), b=str(other)),
                  tmp_path)
    no_buffer = ("TypeError: a Section lends no buffer (a view could outlive the model's image): "
                 "t[a:b] gives bytes")
    closed = "Error: bad state: the model is closed"
    assert out.splitlines() == [line for replace in ("close", "Model", "llm.load")
                                for line in (f"VIEW {replace} {no_buffer}",
                                             f"READ SECTION {replace} {closed}")], out


#: Ctrl-C forced (MPLLM_TEST_SIGINT) right after the engine is released and
#: right after the image is unmapped, by close() and by Model(another source)
FORCED_RELEASE = """
import _llm
def guarded(what, call):
    try:
        call()
        print(what, "no interrupt")
    except KeyboardInterrupt:
        print(what, "KeyboardInterrupt")
a = _llm.Model({a!r})
guarded("CLOSE", a.close)
guarded("AGAIN", a.close)  # nothing left: no second munmap
b = _llm.Model({b!r})
guarded("REPLACE", lambda: _llm.Model({c!r}))  # releases b
guarded("OLD", b.close)
print("STILL", _llm.Model({c!r}).prefill([1, 2]) >= 0)
"""


def test_ctrl_c_right_after_munmap(micropython_variant: Path, tiny_model,
                                   tmp_path: Path) -> None:
    """A SIGINT right after llm_release's munmap left `mapped` set (default
    build: the handler's longjmp skipped the rest), so a later release
    unmapped the address again, by then maybe another model's image; on the
    GIL build a SIGINT held back during the release became a pending
    KeyboardInterrupt before the munmap, and the second one found it pending
    and MicroPython exited with status 1 and no output. Now the release runs
    with Ctrl-C held back throughout, flags cleared first: one
    KeyboardInterrupt, raised by the call, and nothing released twice."""
    images = []
    for name in ("a", "b", "c"):
        images.append(tmp_path / f"{name}.img")
        images[-1].write_bytes(tiny_model.image.read_bytes())
    code = FORCED_RELEASE.format(**{k: str(v) for k, v in zip("abc", images)})
    out = run_mp(micropython_variant, code, tmp_path, MPLLM_TEST_SIGINT="released,unmapped")
    assert out.splitlines() == ["CLOSE KeyboardInterrupt", "AGAIN no interrupt",
                                "REPLACE KeyboardInterrupt", "OLD no interrupt",
                                "STILL True"], out


SOFT_RESET = """
import _llm
m = _llm.Model({image!r})
m.sampler(0.8, 40, 5)
before = [m.prefill([1, 2, 3])] + [m.step(1) for _ in range(4)]
section = m.tokenizer()
m.__del__()  # the finaliser, which gc_sweep_all() runs at a soft reset
for what, read in (("MODEL", m.pos), ("SECTION", lambda: section[0])):
    try:
        read()
    except _llm.Error as e:
        print(what, e)
again = _llm.Model({image!r})
again.sampler(0.8, 40, 5)
after = [again.prefill([1, 2, 3])] + [again.step(1) for _ in range(4)]
print("AGAIN", again is not m, after == before)
"""


def test_the_finaliser_frees_the_model_like_a_soft_reset(micropython: Path, tiny_model,
                                                          tmp_path: Path) -> None:
    """What a soft reset runs, the finaliser, closes the model: it and its
    tokenizer section then say so (no read of freed memory), and the next
    Model() opens afresh (the root pointer no longer names the dead object)
    and decodes what the first did."""
    out = run_mp(micropython, SOFT_RESET.format(image=str(tiny_model.image)), tmp_path)
    assert "MODEL bad state: the model is closed" in out
    assert "SECTION bad state: the model is closed" in out
    assert "AGAIN True True" in out


def test_gc_sweep_at_exit_unmaps_the_open_model(tiny_model, tmp_path: Path) -> None:
    """The coverage build's exit runs gc_sweep_all() as a soft reset does:
    the open model's finaliser must unmap its image (seen with strace: the
    mapping of the image's size is unmapped after the script's last line)."""
    import shutil

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    exe = unix_port("coverage")
    script = tmp_path / "open.py"
    script.write_text(f"import _llm\nm = _llm.Model({str(tiny_model.image)!r})\n"
                      "m.prefill([1, 2, 3])\nprint('OPEN', m.pos())\n")
    trace = tmp_path / "trace.txt"
    r = subprocess.run(["strace", "-o", str(trace), "-e", "trace=mmap,munmap,write", str(exe),
                        str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0 and r.stdout == "OPEN 3\n", r.stdout + r.stderr
    size = tiny_model.image.stat().st_size
    calls = trace.read_text().splitlines()
    mapped = [re.search(r"= (0x[0-9a-f]+)", c).group(1) for c in calls  # type: ignore[union-attr]
              if c.startswith(f"mmap(NULL, {size}, PROT_READ, MAP_PRIVATE,")]
    assert len(mapped) == 1, calls
    printed = next(i for i, c in enumerate(calls) if c.startswith('write(1, "OPEN'))
    assert any(c.startswith(f"munmap({mapped[0]}, {size})") for c in calls[printed:]), calls


#: plan() on the same image and memory as the CPython binding's
PLAN = """
import _llm
data = open({image!r}, "rb").read()
for kw in ({{}}, {{"context": 5, "plain": True}}, {{"fast": 0, "bulk": 0}},
           {{"fast": 20000, "bulk": 0, "bulk_is_fast": True, "block_overhead": 32}},
           {{"context": None, "fast": 20000, "bulk": 0, "bulk_is_fast": True}}):
    print("PLAN", repr(_llm.plan(data, **kw)))
try:
    _llm.plan(data, fast=-1)
except ValueError as e:
    print("ERROR", e)
"""


def test_plan_agrees_with_cpython(micropython: Path, tiny_model, tmp_path: Path) -> None:
    """_llm.plan on MicroPython gives the CPython binding's dict for the same
    image and memory (both are the core's llm_bind_plan), and its errors."""
    import ast

    import _llm

    out = run_mp(micropython, PLAN.format(image=str(tiny_model.image)), tmp_path)
    data = tiny_model.image.read_bytes()
    got = [ast.literal_eval(line[5:]) for line in out.splitlines() if line.startswith("PLAN ")]
    want = [_llm.plan(data, **kw) for kw in (
        {}, {"context": 5, "plain": True}, {"fast": 0, "bulk": 0},
        {"fast": 20000, "bulk": 0, "bulk_is_fast": True, "block_overhead": 32},
        {"context": None, "fast": 20000, "bulk": 0, "bulk_is_fast": True})]
    # MicroPython's repr of a tuple list is Python's: compare as values
    assert [{**g, "blocks": [tuple(b) for b in g["blocks"]]} for g in got] == want
    with pytest.raises(ValueError) as e:
        _llm.plan(data, fast=-1)
    assert f"ERROR {e.value}" in out
