"""What both bindings of `_llm` share (native/binding/llm_bind.c): the rules
and messages of every argument, no crash when user code closes the model
mid-call, a failed open that leaves other models alone, and a prefill that
Ctrl-C interrupts without changing anything. The MicroPython side of each is
in tests/test_micropython_binding.py (under MICROPY_DIR)."""

from __future__ import annotations

import signal
import time

import engine_ext
import pytest

_llm = engine_ext.load()


def test_user_code_that_closes_the_model_mid_call(tiny_model) -> None:  # type: ignore[no-untyped-def]
    m = _llm.Model(str(tiny_model.image))

    class Closes:
        def __float__(self) -> float:
            m.close()
            return 0.5

        def __index__(self) -> int:
            m.close()
            return 1

    with pytest.raises(_llm.Error, match="the model is closed"):
        m.sampler(temperature=Closes())  # type: ignore[arg-type]
    m = _llm.Model(str(tiny_model.image))

    def closing():  # type: ignore[no-untyped-def]
        yield 1
        m.close()
        yield 2

    with pytest.raises(_llm.Error, match="the model is closed"):
        m.prefill(closing())
    m = _llm.Model(str(tiny_model.image))
    m.prefill([1, 2])
    with pytest.raises(TypeError):  # an __index__ object is not an int: refused first
        m.rewind(Closes())  # type: ignore[arg-type]

    class ClosesBool:
        def __bool__(self) -> bool:
            m.close()
            return True

    for call in ("set_plain", "set_fast"):
        m = _llm.Model(str(tiny_model.image))
        with pytest.raises(_llm.Error, match="the model is closed"):
            getattr(m, call)(ClosesBool())


def test_one_rule_per_argument(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(str(tiny_model.image)) as m:
        vocab = m.config()["vocab_out"]
        rows = m.config()["vocab_rows"]
        cases = [
            (lambda: m.step(2**40), ValueError, f"token id 1099511627776 out of range 0..{rows - 1}"),
            (lambda: m.step(2**70), ValueError, f"token id >= 2**63 out of range 0..{rows - 1}"),
            (lambda: m.step(-2**70), ValueError, f"token id < -2**63 out of range 0..{rows - 1}"),
            (lambda: m.prefill(5), TypeError, "prefill() takes a sequence of token ids, not int"),
            (lambda: m.tokenizer()[10**20], IndexError,
             "cannot fit 'int' into an index-sized integer"),
            (lambda: _llm.Model("a\0b"), ValueError, "Model() path has a NUL character at index 1"),
            (lambda: _llm.Model(123), TypeError,
             "Model() takes a path (str or os.PathLike) or a bytes-like image, not int"),
            (lambda: m.step(True), TypeError, "a token id must be an int, not bool"),
            (lambda: m.sampler(0.8, 2**40, 1), ValueError,
             (f"top_k must be 0..{_llm.MAX_TOP_K}, or 0 / {vocab} for the whole vocabulary, "
              "got 1099511627776")),
            (lambda: m.sampler(0.8, True, 1), TypeError, "top_k must be an int, not bool"),
            (lambda: m.sampler(0.8, 40, -1), ValueError, "seed must be in 0..2**64-1"),
            (lambda: m.rewind(3), ValueError,
             "rewind position must be in 0..0 (the context holds 0 tokens), got 3"),
            (lambda: m.draft([1], -1), ValueError, "draft() max_len must be >= 0, got -1"),
            (lambda: m.verify([1] * 9), ValueError, "verify() takes at most 8 tokens, got 9"),
            (lambda: _llm.Model(str(tiny_model.image), plain=True, fast=True), ValueError,
             "plain (the exact reference) and fast (lossy) exclude each other"),
        ]
        for call, kind, message in cases:
            with pytest.raises(kind) as info:
                call()
            assert str(info.value) == message
        assert _llm.MAX_TOP_K == 256
        m.sampler(0.8, _llm.MAX_TOP_K, 1)
        m.sampler(0.8, vocab, 1)


def test_a_path_that_cannot_be_opened_is_exactly_oserror(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """OSError itself, as on MicroPython (which has no FileNotFoundError):
    errno set, args (errno, the port's message), the path in the message."""
    import errno

    for path, code, message in [
        (tmp_path / "missing.img", errno.ENOENT,
         f"cannot open model image '{tmp_path / 'missing.img'}': No such file or directory"),
        (tmp_path, errno.EISDIR, f"cannot map model image '{tmp_path}': Is a directory"),
    ]:
        with pytest.raises(OSError) as info:
            _llm.Model(path)
        assert type(info.value) is OSError
        assert info.value.errno == code and info.value.args == (code, message)


def test_empty_and_mutable_buffers(tiny_model) -> None:  # type: ignore[no-untyped-def]
    for empty in (b"", bytearray(), memoryview(b"")):
        with pytest.raises(_llm.Error, match="image is 0 bytes"):
            _llm.Model(empty)
    # a mutable buffer is copied at open: zeroing it afterwards (which would zero every
    # weight the engine reads in place) changes no token and no logit
    with _llm.Model(str(tiny_model.image)) as m:
        want = [m.prefill([1, 2, 3])]
        want += [m.step(want[-1]) for _ in range(8)]
        want_logits = bytes(m.logits())
    data = bytearray(tiny_model.image.read_bytes())
    with _llm.Model(data) as m:
        got = [m.prefill([1, 2, 3])]
        data[:] = bytes(len(data))
        got += [m.step(got[-1]) for _ in range(8)]
        assert got == want and bytes(m.logits()) == want_logits


def test_a_failed_open_leaves_the_open_model_alone(tiny_model) -> None:  # type: ignore[no-untyped-def]
    good = _llm.Model(str(tiny_model.image))
    with pytest.raises(_llm.Error):
        _llm.Model(b"MPLLMIMG" + bytes(200))
    assert good.prefill([1, 2]) >= 0
    good.close()


def test_ctrl_c_during_a_long_prefill_changes_nothing(release_model) -> None:  # type: ignore[no-untyped-def]
    """A SIGINT-like signal 1 ms into a 250-token prefill: KeyboardInterrupt
    after at most one pass, the position and the sampler as before, and the
    model then gives the uninterrupted result."""
    with _llm.Model(str(release_model.image)) as m:
        m.sampler(0.8, 40, 9)
        prompt = [(7 * i + 3) % 1000 for i in range(250)]
        want = m.prefill(prompt)
        m.reset()
        m.prefill([5, 6])
        before = m.logits()
        counts = {k: v for k, v in m.stats().items() if k not in ("stage_ms", "total_ms")}
        old = signal.signal(signal.SIGALRM, signal.default_int_handler)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.001)
            t0 = time.perf_counter()
            with pytest.raises(KeyboardInterrupt):
                m.prefill(prompt[:200])
            latency = time.perf_counter() - t0
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert m.pos() == 2 and m.logits() == before  # nothing changed ...
        # ... not even the counters (only the time spent is counted)
        assert {k: v for k, v in m.stats().items() if k not in ("stage_ms", "total_ms")} == counts
        print(f"Ctrl-C latency during a 200-token prefill: {1e3 * latency:.1f} ms")
        m.reset()
        m.sampler(0.8, 40, 9)
        assert m.prefill(prompt) == want


def test_selftest_and_report_on_the_host(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from conftest import ROOT
    from mpllm.board import bench_cli
    from mpllm.convert import convert

    r = _llm.selftest()
    assert r["ok"] and r["kernels"] == "pie-emu" and r["failures"] == 0
    assert r["passed"] >= 13 and r["probes"] > 20 and len(r["lines"]) > 30
    assert "selftest (kernels=pie-emu)" in capsys.readouterr().out
    img = tmp_path / "demo.img"
    convert(ROOT / "models/demo/model.bin", ROOT / "models/demo/tokenizer.json", img,
            progress=False)
    out = tmp_path / "report.json"
    assert bench_cli.main(["--board", "host", "--image", str(img), "--report", str(out),
                       "--tokens", "20", "--quiet"], llm_module=_llm) == 0
    data = json.loads(out.read_text())
    assert data["gate"]["same"] and data["selftest"]["ok"]
    assert set(data["bench"]["summary"]) >= {"engine_ms_per_token", "roundtrip_tok_s"}
    assert "gate: " in capsys.readouterr().out


def test_tokenizer_is_read_in_place(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """tokenizer() is a read-only view of the image's section, not a copy; it
    keeps the bytes alive after close() (it cannot outlive them)."""
    from mpllm.formats.image import read_image

    want = read_image(tiny_model.image).tokenizer_section
    m = _llm.Model(str(tiny_model.image))
    view = m.tokenizer()
    assert isinstance(view, memoryview) and view.readonly and bytes(view) == want
    with pytest.raises(TypeError):
        view[0] = 0  # type: ignore[index]
    m.close()
    assert bytes(view) == want  # the mapping stays while the view does
    with pytest.raises(TypeError, match="called twice"):
        m.__init__(str(tiny_model.image))  # type: ignore[misc]
    del view


def test_a_kept_tokenizer_view_outlives_a_replaced_model(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """llm.load(another image) closes the open model: a view of its
    tokenizer kept from before still reads the right bytes (MicroPython
    refuses the view instead: test_micropython_binding.py::
    test_a_kept_tokenizer_view_never_reads_freed_memory)."""
    import llm

    other = tmp_path / "other.img"
    other.write_bytes(tiny_model.image.read_bytes())
    first = llm.load(str(tiny_model.image))
    view = memoryview(first.tokenizer())
    want = bytes(view)
    try:
        llm.load(str(other))
        with pytest.raises(_llm.Error, match="the model is closed"):
            first.pos()
        assert bytes(view) == want
    finally:
        llm.unload()


def test_methods_take_arguments_by_the_core_table(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Every method reads its arguments from the core's table (llm_bind.c
    METHODS): by position or by keyword, with Python's arity errors, the same
    results either way."""
    with _llm.Model(str(tiny_model.image)) as a, _llm.Model(str(tiny_model.image)) as b:
        a.sampler(0.8, 40, 5)
        b.sampler(seed=5, temperature=0.8, top_k=40)
        assert [a.prefill([1, 2]), a.step(3), a.verify([4, 5])] == [
            b.prefill(tokens=[1, 2]), b.step(token=3), b.verify(tokens=(4, 5))]
        assert a.logits() == b.logits() and a.pos() == b.pos() == 5
        b.rewind(pos=2)
        assert b.pos() == 2 and b.draft(max_len=3, context=[1]) == a.draft([1], 3)
        for call, message in [
            (lambda: a.step(3, token=3), r"step\(\) got multiple values for argument 'token'"),
            (lambda: a.step(tok=3), r"step\(\) got an unexpected keyword argument 'tok'"),
            (lambda: a.step(), r"step\(\) missing required argument 'token'"),
            (lambda: a.step(1, 2), r"step\(\) takes at most 1 argument \(2 given\)"),
            (lambda: a.pos(1), r"pos\(\) takes no arguments \(1 given\)"),
            (lambda: a.sampler(1, 2, 3, 4), r"sampler\(\) takes at most 3 arguments \(4 given\)"),
        ]:
            with pytest.raises(TypeError, match=message):
                call()


def test_return_values_from_the_core(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """config(), stats() and memory() are built from the core's value stream:
    the types and nesting the API documents (_llm.pyi)."""
    with _llm.Model(str(tiny_model.image)) as m:
        m.prefill([1, 2, 3])
        c = m.config()
        assert c["tied_head"] is True and isinstance(c["rope_theta"], float)
        assert isinstance(c["norm_eps"], float) and c["arch"] == "esp32ai"
        assert c["n_kv_heads"] == c["n_heads"]
        assert all(type(v) is int for k, v in c.items()
                   if k not in ("tied_head", "rope_theta", "norm_eps", "arch", "weights",
                                "weights_choice"))
        assert c["weights"] == "int4" and c["weights_choice"] == {}
        s = m.stats()
        assert s["prefill_tokens"] == 3 and s["tokens"] == 3 and s["heads"] == 1
        assert set(s["stage_ms"]) == {"embed", "attn", "ffn", "ple", "head", "sample"}
        assert abs(sum(s["stage_ms"].values()) - s["total_ms"]) < 1e-6
        assert set(s["bytes"]) == {"flash", "fast", "bulk"} and s["bytes"]["flash"] > 0
        mem = m.memory()
        assert mem and all(isinstance(t, tuple) and len(t) == 3 for t in mem)
        assert {region for _, region, _ in mem} <= {"flash", "fast", "bulk"}
        assert len(m.logits()) == 4 * c["vocab_out"]


def test_reads_from_many_threads_and_a_closed_model_first(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Only the calls that compute release the GIL and mark the model busy:
    threads that read (pos, plain, config) never see "in use" (they did when
    every call marked it). A closed model says so before any argument is
    read."""
    import threading

    m = _llm.Model(str(tiny_model.image))
    m.prefill([1, 2])
    errors: list[str] = []

    def reader() -> None:
        for _ in range(3000):
            try:
                m.pos(), m.plain(), m.config()
            except _llm.Error as e:
                errors.append(str(e))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    m.close()
    for call in (lambda: m.step("x"), lambda: m.draft(["a"], -1), lambda: m.sampler("hot")):
        with pytest.raises(_llm.Error, match="the model is closed"):
            call()


def test_a_finaliser_cannot_close_the_model_under_a_result(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """The first allocation of a result runs a garbage collection whose
    finaliser closes the model: the model is in use then, so the close is
    refused (an error inside __del__) instead of freeing the engine the
    result is read from (config() read freed memory, memory() crashed)."""
    import gc

    m = _llm.Model(str(tiny_model.image))
    m.prefill([1, 2])
    refused: list[str] = []

    class Closes:
        def __del__(self) -> None:
            try:
                m.close()
            except _llm.Error as e:
                refused.append(str(e))

    old = gc.get_threshold()
    for read in (m.config, m.memory):
        want = read()
        gc.collect()
        gc.disable()
        a = Closes()
        a.me = a  # type: ignore[attr-defined]  # garbage only a collection frees
        del a
        gc.enable()
        gc.set_threshold(1)
        try:
            got = read()  # its first GC-tracked allocation collects
        finally:
            gc.set_threshold(*old)
        assert got == want
        assert len(refused) == 1 and "in use" in refused.pop()
        assert m.pos() == 2  # still open
    m.close()


def test_a_changeable_buffer_is_copied(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Only bytes is used in place: a read-only view of a bytearray can still
    change, so it is copied and the model does not see the change."""
    tiny_bytes = tiny_model.image.read_bytes()
    buf = bytearray(tiny_bytes)
    with _llm.Model(memoryview(buf).toreadonly()) as m, _llm.Model(tiny_bytes) as ref:
        buf[:] = bytes(len(buf))
        assert m.prefill([1, 2, 3]) == ref.prefill([1, 2, 3]) and m.logits() == ref.logits()


def test_selftest_out_of_memory_raises(capsys) -> None:  # type: ignore[no-untyped-def]
    """A failed allocation while selftest() collects its lines is a
    MemoryError (it was a NULL dereference)."""
    _testcapi = pytest.importorskip("_testcapi")
    if not hasattr(_testcapi, "set_nomemory"):
        pytest.skip("this CPython's _testcapi has no set_nomemory")
    raised = 0
    for k in range(1, 30):
        _testcapi.set_nomemory(k, k + 1)
        try:
            _llm.selftest()
        except MemoryError:
            raised += 1
        finally:
            _testcapi.remove_mem_hooks()
    assert raised > 0
