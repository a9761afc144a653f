"""The C engine (through CPython `_llm`) computes exactly what the reference does.

Bit-exact means the raw float32 bytes of every logits vector are equal to
mpllm.reference.forward.Reference's, on generated models of four shapes (the release
shape included), over at least 64 positions or the whole context; greedy and
seeded sampled token sequences are identical to the Python sampler's. Then
the API contract: prefill == stepping, context full, bad tokens, reset, stats
and placement reporting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import engine_ext
import numpy as np
import pytest
from mpllm.formats.align import align_up
from mpllm.formats.image import read_image
from mpllm.formats.model import Config
from mpllm.reference.forward import Reference
from mpllm.reference.sampler import Sampler

_llm = engine_ext.load()

SHAPES = ("tiny", "tiny_untied", "small", "release")


def _prompt(vocab_out: int, n: int, salt: int = 0) -> list[int]:
    return [(37 * i + 11 + salt) % vocab_out for i in range(n)]


def _positions(seq_len: int) -> int:
    return min(seq_len, 72)


def test_build_info_names_what_ran() -> None:
    info = _llm.build_info()
    assert info.startswith(f"mpllm {_llm.__version__} ")
    assert "numerics=exact" in info and "port=host" in info
    assert any(f"kernels={k} " in info for k in ("ref", "pie", "pie-emu")), info
    print(info)


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_logits_bit_exact(test_model, shape: str) -> None:  # type: ignore[no-untyped-def]
    files = test_model(shape)
    ref = Reference.from_image(files.image)
    cfg = ref.config
    total = _positions(cfg.seq_len)
    assert total >= 64 or total == cfg.seq_len
    prompt = _prompt(cfg.vocab_out, 7)
    n = total - len(prompt) + 1  # prompt + (n - 1) fed tokens fill `total` positions
    ids, rows = ref.generate(prompt, n)
    with _llm.Model(files.image) as m:
        got = [m.prefill(prompt)]
        logits = [m.logits()]
        for _ in range(n - 1):
            got.append(m.step(got[-1]))
            logits.append(m.logits())
        assert m.pos() == total
        stats = m.stats()
    for k in range(n):
        assert logits[k] == rows[k].tobytes(), f"{shape}: logits differ at output {k}"
    assert got == ids
    assert len(set(ids)) > 3, "degenerate test: the model repeats one token"
    assert stats["tokens"] == total and stats["heads"] == n
    assert stats["prefill_tokens"] == len(prompt)


SAMPLERS = [  # (temperature, top_k, seed)
    (0.8, 40, 1),
    (1.0, 0, 2),
    (0.5, 5, 3),
    (1.3, 256, 12345678901234567),
    (0.8, 1, 7),  # top-1 is greedy whatever the noise
    (0.0, 40, 9),  # temperature 0: greedy
    (0.8, 40, 0),  # seed 0: greedy
]


@pytest.mark.parametrize("shape", ["small", "release"])
def test_sampled_sequences_match_python_sampler(test_model, shape: str) -> None:  # type: ignore[no-untyped-def]
    files = test_model(shape)
    ref = Reference.from_image(files.image)
    prompt = _prompt(ref.config.vocab_out, 4, salt=5)
    # the numpy reference is slow on the release head: fewer, shorter runs there
    n, samplers = (16, SAMPLERS[:4]) if shape == "release" else (40, SAMPLERS)
    seen: set[tuple[int, ...]] = set()
    with _llm.Model(files.image) as m:
        for temperature, top_k, seed in samplers:
            ref.reset()
            want, rows = ref.generate(prompt, n, Sampler(temperature, top_k, seed))
            m.reset()
            m.sampler(temperature=temperature, top_k=top_k, seed=seed)
            got = [m.prefill(prompt)]
            assert m.logits() == rows[0].tobytes()
            for k in range(1, n):
                got.append(m.step(got[-1]))
                assert m.logits() == rows[k].tobytes(), (temperature, top_k, seed, k)
            assert got == want, (temperature, top_k, seed)
            seen.add(tuple(got))
            if seed == 0 or temperature == 0 or top_k == 1:
                ref.reset()
                assert got == ref.generate(prompt, n)[0], "should equal greedy"
    assert len(seen) >= 3, "samplers did not produce different stories"


def test_prefill_equals_stepping(small_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(small_model.image) as a, _llm.Model(small_model.image) as b:
        prompt = _prompt(a.config()["vocab_out"], 9)
        next_a = a.prefill(prompt)
        for t in prompt:
            next_b = b.step(t)
        assert next_a == next_b and a.logits() == b.logits() and a.pos() == b.pos() == 9
        assert a.stats()["heads"] == 1 and b.stats()["heads"] == 9
        # and prefill in pieces continues the same context
        c = _llm.Model(small_model.image)
        c.prefill(prompt[:4])
        assert c.prefill(prompt[4:]) == next_a and c.logits() == a.logits()
        for _ in range(10):
            next_a, next_b = a.step(next_a), b.step(next_b)
            assert next_a == next_b and a.logits() == b.logits()
        c.close()


@pytest.mark.parametrize("context", [None, 64, 20])
def test_context_full(tiny_model, context) -> None:  # type: ignore[no-untyped-def]
    # the image's seq_len is 64; context=N holds N positions and refuses the
    # one past them as the image's seq_len does
    kw = {} if context is None else {"context": context}
    with _llm.Model(tiny_model.image, **kw) as m:
        seq = m.config()["seq_len"]
        assert seq == (context or 64)
        with pytest.raises(_llm.Error, match=rf"^context full: {seq + 1} tokens at position 0 "
                                             rf"exceed the context of {seq} positions$"):
            m.prefill([1] * (seq + 1))
        assert m.pos() == 0
        t = m.prefill([1] * (seq - 1))
        t = m.step(t)
        assert m.pos() == seq
        logits = m.logits()
        with pytest.raises(_llm.Error, match=rf"^context full: all {seq} positions used"):
            m.step(t)
        with pytest.raises(_llm.Error, match=r"^context full:"):
            m.prefill([t])
        assert m.pos() == seq and m.logits() == logits  # refused calls change nothing
        m.reset()
        assert m.pos() == 0
        m.step(t)


def test_bad_arguments(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(tiny_model.image) as m:
        rows = m.config()["vocab_rows"]
        for bad in (-1, rows, 2**31, 2**70):
            with pytest.raises(ValueError, match=r"token id .* out of range 0\.\.279"):
                m.step(bad)
            with pytest.raises(ValueError, match="out of range"):
                m.prefill([1, bad, 2])
        for wrong in (1.0, "3", None, True):
            with pytest.raises(TypeError, match="a token id must be an int"):
                m.step(wrong)
        with pytest.raises(TypeError):
            m.prefill(5)
        with pytest.raises(ValueError, match="at least one token"):
            m.prefill([])
        assert m.pos() == 0 and m.stats()["tokens"] == 0
        with pytest.raises(_llm.Error, match=r"^bad state: no logits yet"):
            m.logits()
        m.prefill((1, 2))  # any sequence
        for kwargs in ({"temperature": -1.0}, {"temperature": float("nan")},
                       {"temperature": float("inf")}, {"top_k": -1}, {"seed": -1},
                       {"seed": 2**64}):
            with pytest.raises(ValueError):
                m.sampler(**kwargs)
        with pytest.raises(TypeError):
            m.sampler(seed=1.5)
        # one rule (native/binding/llm_bind.c), the limit exported as _llm.MAX_TOP_K
        for k in (_llm.MAX_TOP_K + 1, 10_000, 2**70):
            with pytest.raises(ValueError, match=rf"top_k must be 0\.\.{_llm.MAX_TOP_K}, or 0 / "
                                                 rf"280 for the whole vocabulary"):
                m.sampler(temperature=1.0, top_k=k, seed=1)
        m.sampler(temperature=1.0, top_k=_llm.MAX_TOP_K, seed=1)
        m.sampler(temperature=1.0, top_k=m.config()["vocab_out"], seed=1)  # every id


def test_reset_replays_exactly(small_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(small_model.image) as m:
        m.sampler(temperature=0.9, top_k=20, seed=77)
        prompt = _prompt(m.config()["vocab_out"], 5)

        def run() -> tuple[list[int], str]:
            h = hashlib.sha256()
            ids = [m.prefill(prompt)]
            h.update(m.logits())
            for _ in range(30):
                ids.append(m.step(ids[-1]))
                h.update(m.logits())
            return ids, h.hexdigest()

        first = run()
        m.reset()
        assert m.pos() == 0 and m.stats()["tokens"] == 0
        with pytest.raises(_llm.Error, match="no logits yet"):
            m.logits()
        assert run() == first
        # a new sampler call restarts the stream too
        m.reset()
        m.sampler(temperature=0.9, top_k=20, seed=77)
        assert run() == first


def test_config_and_tokenizer(test_model) -> None:  # type: ignore[no-untyped-def]
    for shape in ("tiny", "tiny_untied"):
        files = test_model(shape)
        img = read_image(files.image)
        with _llm.Model(files.image) as m:
            c = m.config()
            src = files.config
            assert (c["vocab_out"], c["dim"], c["n_layers"], c["n_heads"], c["ffn"],
                    c["ple_dim"], c["seq_len"], c["group"]) == (
                src.vocab_out, src.dim, src.n_layers, src.n_heads, src.ffn, src.ple_dim,
                src.seq_len, src.group)
            assert c["head_dim"] == src.dim // src.n_heads
            assert c["vocab_rows"] == img.header.vocab_rows
            assert c["tied_head"] is src.tied_head and c["rope_theta"] == 10000.0
            assert c["eot_id"] == img.header.eot_id
            assert m.tokenizer() == img.tokenizer_section


def _kv_cache_bytes(cfg: Config, *, v_floats: bool = False, context: int | None = None) -> int:
    """The kv_cache placement for `context` positions (None: seq_len), each array
    on a 64-byte line: K as floats (or int16 dots in the same rows); V as int16
    dots when its rows are one scale group, its rows float-wide when they are not
    or when some V row could give dots wider than int16 (`v_floats`); a scale per
    position; at least fast mode's arrays (which lie over them); then the sampler
    stream's state per position and one more (16 bytes each, for rewind)."""
    s = context or cfg.seq_len
    L, h, dh = cfg.n_layers, cfg.n_heads, cfg.head_dim
    kvh = cfg.kv_dim // dh
    cells = L * s * cfg.kv_dim
    v_dots = -(-cfg.dim // cfg.group) == 1
    exact = (align_up(4 * cells, 64) + align_up((4 if v_floats or not v_dots else 2) * cells, 64)
             + align_up(4 * L * s, 64))
    dhp, sp = align_up(dh, 16), align_up(s, 16)
    fast = sum(align_up(n, 16) for n in (L * kvh * s * dhp, L * kvh * dh * sp, 4 * L * kvh * s,
                                         4 * L * kvh * s, 8 * h * dhp, 8 * h * sp, 4 * 8 * h * s))
    return max(exact, align_up(fast, 64)) + align_up(16 * (s + 1), 64)


def _v_can_widen(img) -> bool:  # type: ignore[no-untyped-def]
    """engine_open.c's v_can_widen, worked out here from a read image: some
    layer's V rows (qkv rows dim + kv_dim ..) could give an int16 dot a value
    it cannot hold, |dot| <= 127 * sum |code| over the row."""
    d, kvd = img.config.dim, img.config.kv_dim
    return any(int(np.abs(ly.qkv.q[d + kvd: d + 2 * kvd].astype(np.int64)).sum(axis=1).max())
               * 127 > 32767 for ly in img.weights.layers)


def _decode(m, vocab: int, n_prompt: int, n_steps: int) -> dict:  # type: ignore[no-untyped-def]
    """A prompt (one pass: <= 8 tokens) then steps; the stats after them."""
    t = m.prefill(_prompt(vocab, n_prompt))
    for _ in range(n_steps):
        t = m.step(t)
    return m.stats()


def _kv_rows_read(cfg: Config, n_prompt: int, tokens: int) -> int:
    """Cache rows attention reads, over the layers: the prompt's once for its
    whole pass, then positions 0..pos for each step."""
    return cfg.n_layers * (n_prompt + sum(p + 1 for p in range(n_prompt, tokens)))


def _kv_bytes_read(cfg: Config, n_prompt: int, tokens: int, *, k_dots: bool = False) -> int:
    """KV traffic: each layer writes k and v and reads them back for positions
    0..pos, a row being K's floats (or with k_dots its int16 dots), V's int16
    dots and the position's scale."""
    row = (4 if k_dots else 6) * cfg.kv_dim + 4
    return (cfg.n_layers * tokens + _kv_rows_read(cfg, n_prompt, tokens)) * row


def _flash_bytes(cfg: Config, n_prompt: int, tokens: int, row: int, *,
                 k_dots: bool = False) -> int:
    """Flash traffic: each token's rows (`row`: the embedding row, with PLE its
    PLE row, and its RoPE row), and with k_dots the RoPE row of every cached k
    rebuilt from its dots."""
    rope = _kv_rows_read(cfg, n_prompt, tokens) * cfg.head_dim * 4 if k_dots else 0
    return tokens * row + rope


def test_memory_and_stats_accounting(tiny_model) -> None:  # type: ignore[no-untyped-def]
    img = read_image(tiny_model.image)
    cfg = img.config
    with _llm.Model(tiny_model.image) as m:
        mem = m.memory()
        where = {name: (region, size) for name, region, size in mem}
        assert all(region in ("flash", "fast", "bulk") for _n, region, _s in mem)
        assert where["embed"][0] == where["ple_rows"][0] == where["rope"][0] == "flash"
        assert not _v_can_widen(img)  # dim 32: |dot| <= 127 * 8 * 32 fits int16
        assert where["kv_cache"] == ("bulk", _kv_cache_bytes(cfg))
        # decoding uses no logits buffer: the dense route's lives in PSRAM
        assert where["head"][0] == "bulk" and where["logits"] == ("bulk", cfg.vocab_out * 4)
        assert where["head_ids"][0] == "bulk" and where["head_tiles"][0] == "fast"
        assert where["activations"][0] == "fast" and where["norms"][0] == "fast"
        for i in range(cfg.n_layers):
            for f in ("qkv", "attn_proj", "gate", "up", "down", "ple_gate", "ple_proj"):
                assert where[f"L{i}.{f}"][0] == "fast"
        sec = {s.name: s for s in img.sections}
        for name in ("embed", "ple_rows"):
            assert where[name][1] == sec[name].size

        n_prompt, n_steps = 5, 6
        s = _decode(m, cfg.vocab_out, n_prompt, n_steps)
        tokens = n_prompt + n_steps
        heads = 1 + n_steps
        assert s["tokens"] == tokens and s["heads"] == heads
        assert s["ttft_ms"] > 0 and s["total_ms"] > 0
        assert set(s["stage_ms"]) == {"embed", "attn", "ffn", "ple", "head", "sample"}
        assert s["total_ms"] == pytest.approx(sum(s["stage_ms"].values()))
        d, lp, hd = cfg.dim, cfg.n_layers * cfg.ple_dim, cfg.head_dim
        embed_row = d // 2 + 4  # 32 columns of nibbles + one f32 scale
        ple_row = -(-((lp + 1) // 2 + 2 * -(-lp // cfg.group)) // 16) * 16
        assert s["bytes"]["flash"] == _flash_bytes(cfg, n_prompt, tokens,
                                                   embed_row + ple_row + hd * 4)
        assert s["v_wide"] == s["k_wide"] == 0
        kv = _kv_bytes_read(cfg, n_prompt, tokens)
        # the head: each scored row (codes, its scale as 2-byte fp16 in the copy staged
        # in tile order) and each token id read (only rows that could enter the
        # candidate list), counted by the engine
        assert heads <= s["head_tiles"] and s["head_waves"] >= heads
        assert heads <= s["head_rows"] <= heads * cfg.vocab_out
        assert heads <= s["head_ids"] < s["head_rows"]
        head = s["head_rows"] * (-(-d // 32) * 16 + 2) + s["head_ids"] * 2
        assert s["bytes"]["bulk"] == kv + head
        assert s["bytes"]["fast"] > 0
        m.reset()
        s = m.stats()
        assert s["tokens"] == 0 and s["bytes"] == {"flash": 0, "fast": 0, "bulk": 0}


def test_closed_model_and_lifetime(tiny_model) -> None:  # type: ignore[no-untyped-def]
    data = bytearray(tiny_model.image.read_bytes())
    m = _llm.Model(data)
    first = m.prefill([1, 2, 3])
    m.close()
    m.close()
    for call in (lambda: m.step(1), m.logits, m.config, m.stats, m.memory, m.pos, m.reset,
                 m.tokenizer, lambda: m.sampler(), lambda: m.prefill([1])):
        with pytest.raises(_llm.Error, match=r"^bad state: the model is closed"):
            call()
    # the buffer was held while open (no resize), and is free again now
    data.append(0)
    with _llm.Model(tiny_model.image.read_bytes()) as m2:
        assert m2.prefill([1, 2, 3]) == first


def test_models_run_in_threads(small_model) -> None:  # type: ignore[no-untyped-def]
    """The GIL is released around compute; separate models in separate threads
    give exactly what they give alone."""
    prompt = _prompt(900, 6)

    def story(m: object) -> tuple[list[int], bytes]:
        ids = [m.prefill(prompt)]  # type: ignore[attr-defined]
        for _ in range(40):
            ids.append(m.step(ids[-1]))  # type: ignore[attr-defined]
        return ids, m.logits()  # type: ignore[attr-defined]

    with _llm.Model(small_model.image) as alone:
        want = story(alone)
    models = [_llm.Model(small_model.image) for _ in range(3)]
    results: list[tuple[list[int], bytes] | None] = [None] * 3

    def worker(i: int, fn: Callable[[object], tuple[list[int], bytes]]) -> None:
        results[i] = fn(models[i])

    threads = [threading.Thread(target=worker, args=(i, story)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [want] * 3
    for mm in models:
        mm.close()


def test_greedy_first_token_matches_numpy_argmax(small_model) -> None:  # type: ignore[no-untyped-def]
    """The engine's pick is the lowest-id maximum of the logits it returns."""
    with _llm.Model(small_model.image) as m:
        t = m.prefill(_prompt(900, 3))
        for _ in range(20):
            logits = np.frombuffer(m.logits(), dtype="<f4")
            assert t == int(np.flatnonzero(logits == logits.max())[0])
            t = m.step(t)


@pytest.mark.parametrize("rows", ["V", "K", "KV"])
def test_kv_rows_too_wide_for_int16_stay_exact(small_model, tmp_path, rows: str) -> None:  # type: ignore[no-untyped-def]
    """V, and with set_k_dots K, are cached as int16 integer dots; a row whose dots
    do not fit is kept as floats (K rotated; V over the pair's bytes when K took
    the position's float row). Force that: every embedding weight +7 (x is a
    constant vector, so its int8 input is all 127) and layer 0's V rows, K rows
    or both all +7, so every such layer-0 dot is 7 * 127 * 64 = 56,896. Logits
    must still equal the reference's, and the wide rows are counted; with K as
    floats no K row is wide."""
    from mpllm.convert import convert
    from mpllm.formats.esp32ai import read_model_bin, write_model_bin
    from mpllm.formats.model import QMatrix

    w = read_model_bin(small_model.model_bin.read_bytes())
    d = w.config.dim
    assert w.config.kv_dim == d
    emb = QMatrix(np.full_like(w.tok_emb.q, 7), np.abs(w.tok_emb.scales), w.tok_emb.group)
    l0 = w.layers[0]
    q = l0.qkv.q.copy()
    q[{"V": 2 * d, "K": d, "KV": d}[rows]:{"V": 3 * d, "K": 2 * d, "KV": 3 * d}[rows]] = 7
    layers = [dataclasses.replace(l0, qkv=QMatrix(q, np.abs(l0.qkv.scales), l0.qkv.group),
                                  attn_norm=np.abs(l0.attn_norm))] + w.layers[1:]
    mb = tmp_path / "wide.bin"
    write_model_bin(dataclasses.replace(w, tok_emb=emb, layers=layers), mb)
    img = tmp_path / "wide.img"
    convert(mb, small_model.tokenizer_json, img, progress=False)
    ref = Reference.from_image(img)
    prompt = [3, 9, 27]
    ids, want = ref.generate(prompt, 12)
    for k_dots in (True, False):
        with _llm.Model(img) as m:
            m.set_k_dots(k_dots)
            got = [m.prefill(prompt)]
            logits = [m.logits()]
            for _ in range(11):
                got.append(m.step(got[-1]))
                logits.append(m.logits())
            st = m.stats()
        # every layer-0 position at least
        assert (st["k_wide"] >= 14) == ("K" in rows and k_dots)
        assert (st["v_wide"] >= 14) == ("V" in rows)
        assert st["k_wide"] * st["v_wide"] == 0 or rows == "KV"
        assert got == ids
        assert all(a == b.tobytes() for a, b in zip(logits, want))


# ---- llama2.c's Llama through the same forward pass ----------------------------------- #

LLAMA2C_SAMPLERS = [(0.0, 0, 0), (0.8, 40, 1), (1.0, 0, 2), (0.5, 5, 3)]


@pytest.mark.parametrize("name", ["untied", "tied", "int8", "fp32", "mixed"])
def test_llama2c_logits_bit_exact_greedy_and_sampled(llama2c_image, name: str) -> None:  # type: ignore[no-untyped-def]
    """The stories260K shape (no PLE, 4 kv heads for 8 query heads, rmsnorm epsilon
    1e-5, untied or tied head), its matrices int4, int8, fp32 or a mix of the three:
    the raw logits bytes of the prefill and every step hash alike in the engine and
    the numpy reference, and the ids agree, greedy and sampled."""
    image = llama2c_image(name)
    ref = Reference.from_image(image)
    cfg = ref.config
    assert (cfg.family, cfg.kv_heads, cfg.ple_dim, cfg.tied_head) == (
        "llama2c", 4, 0, name in ("tied", "fp32"))
    prompt = _prompt(cfg.vocab_out, 7, salt=3)
    n = 72
    seen = set()
    with _llm.Model(image) as m:
        c = m.config()
        assert (c["arch"], c["n_kv_heads"], c["ple_dim"]) == ("llama2c", 4, 0)
        assert c["norm_eps"] == float(np.float32(1e-5))
        assert c["tied_head"] is (name in ("tied", "fp32"))
        for sampler in LLAMA2C_SAMPLERS:
            ref.reset()
            want, rows = ref.generate(prompt, n, Sampler(*sampler))
            m.reset()
            m.sampler(*sampler)
            got = [m.prefill(prompt)]
            h = hashlib.sha256(m.logits())
            for _ in range(n - 1):
                got.append(m.step(got[-1]))
                h.update(m.logits())
            assert got == want, sampler
            assert h.hexdigest() == hashlib.sha256(rows.tobytes()).hexdigest(), sampler
            seen.add(tuple(got))
        assert m.stats()["stage_ms"]["ple"] == 0.0  # no PLE branch ran
    assert len(seen) >= 3, "samplers did not produce different sequences"


def test_llama2c_context_of_1024(llama2c_image) -> None:  # type: ignore[no-untyped-def]
    """seq_len 1024 (llama2.c's longest here) and several scale groups per row: a
    610-token prompt, then steps past position 620 and to the last position, bit
    for bit; one more is refused."""
    image = llama2c_image("long")
    ref = Reference.from_image(image)
    cfg = ref.config
    assert cfg.seq_len == 1024 and cfg.dim // cfg.group == 2
    prompt = _prompt(cfg.vocab_out, 610, salt=1)
    with _llm.Model(image) as m:
        tok = m.prefill(prompt)
        assert m.logits() == ref.prefill(prompt).tobytes()
        for _ in range(12):
            want = ref.forward(tok)
            tok = m.step(tok)
            assert m.logits() == want.tobytes(), m.pos()
        while m.pos() < cfg.seq_len:
            tok = m.step(tok)
        with pytest.raises(_llm.Error, match="context full"):
            m.step(tok)


def test_llama2c_memory_and_stats(llama2c_image) -> None:  # type: ignore[no-untyped-def]
    """No PLE placements; the KV cache and the bytes read are sized by kv_dim (half of
    dim here); the untied head is the image's own head section."""
    image = llama2c_image("untied")
    img = read_image(image)
    cfg = img.config
    assert cfg.kv_dim * 2 == cfg.dim
    with _llm.Model(image) as m:
        where = {name: (region, size) for name, region, size in m.memory()}
        assert not [n for n in where if "ple" in n]
        sec = {s.name: s for s in img.sections}
        assert where["L0.qkv"] == ("fast", sec["L0.qkv"].size - 16)  # codes + scales
        assert where["head"][0] == "bulk" and "head" in sec
        # random weights: some V row could outgrow int16 dots, so float-wide V rows
        assert _v_can_widen(img)
        assert where["kv_cache"] == ("bulk", _kv_cache_bytes(cfg, v_floats=True))
        n_prompt, n_steps = 5, 6
        s = _decode(m, cfg.vocab_out, n_prompt, n_steps)
        tokens = n_prompt + n_steps
        # per token: the embedding row and the RoPE row, no PLE row
        assert s["bytes"]["flash"] == _flash_bytes(cfg, n_prompt, tokens,
                                                   cfg.dim // 2 + 4 + cfg.head_dim * 4)
        assert 0 < s["head_ids"] < s["head_rows"]  # ids read only for possible entrants
        head = s["head_rows"] * (-(-cfg.dim // 32) * 16 + 2) + s["head_ids"] * 2  # fp16 scales
        assert s["v_wide"] == s["k_wide"] == 0
        assert s["bytes"]["bulk"] == _kv_bytes_read(cfg, n_prompt, tokens) + head


# ---- a context cap (Model(context=N)) and the float V only plain mode needs ------------ #

def _run_capped(m, prompt: list[int], total: int, plain_after_prefill: bool = False  # type: ignore[no-untyped-def]
                ) -> tuple[list[int], list[str]]:
    """ids and the sha256 of every evaluation's logits until `total` positions hold."""
    m.sampler(temperature=0.9, top_k=0, seed=5)
    ids = [m.prefill(prompt)]
    sums = [hashlib.sha256(m.logits()).hexdigest()]
    if plain_after_prefill:
        m.set_plain(True)
    while m.pos() < total:
        ids.append(m.step(ids[-1]))
        sums.append(hashlib.sha256(m.logits()).hexdigest())
    return ids, sums


@pytest.mark.parametrize("name,context", [("tiny", 40), ("small", 33),
                                          ("llama2c_untied", 100), ("llama2c_long", 70)])
def test_context_cap_is_exact_and_plain_equals_default(engine_image, name: str,
                                                       context: int) -> None:
    """With a cap, default mode, plain mode (from the start, or switched on after the
    prompt: V rows then in both forms) and the uncapped engine decode the same ids and
    logits bits for every position the cap holds; the cap refuses the next one."""
    image = engine_image(name)
    prompt = _prompt(read_image(image).config.vocab_out, 6)
    with _llm.Model(image) as m:
        assert m.config()["seq_len"] > context
        want = _run_capped(m, prompt, context)
    runs = [({}, False), ({"plain": True}, False), ({}, True)]
    for kw, switch in runs:
        with _llm.Model(image, context=context, **kw) as m:
            assert m.config()["seq_len"] == context
            assert _run_capped(m, prompt, context, switch) == want, (kw, switch)
            with pytest.raises(_llm.Error, match=rf"^context full: all {context} positions"):
                m.step(0)


@pytest.mark.parametrize("name", ["tiny", "llama2c_untied", "llama2c_long"])
def test_context_cap_shrinks_memory_as_computed(engine_image, name: str) -> None:
    """Every block sized by seq_len is sized by the context: the KV cache as the
    formula says, every block as the engine's own plan at that context;
    the float V that no V row can need in default mode is placed by
    set_plain(True), K as dots' scratch (four rows of head_dim floats a head, in
    internal SRAM) by set_k_dots(True), each once."""
    image = engine_image(name)
    img = read_image(image)
    cfg, widen = img.config, _v_can_widen(img)
    v_dots = -(-cfg.dim // cfg.group) == 1
    for context in (cfg.seq_len, cfg.seq_len // 4, 17):
        with _llm.Model(image, context=context) as m:
            mem = {n: b for n, _r, b in m.memory()}
            assert m.config()["seq_len"] == context
            planned = _llm.plan(Path(image).read_bytes(), context=context)
            assert planned["opens"] and planned["context"] == context
            assert {n: b for n, _r, b in planned["blocks"]} == mem
            assert mem["kv_cache"] == _kv_cache_bytes(cfg, context=context, v_floats=widen)
            assert "kv_values" not in mem and "k_rebuilt" not in mem
            m.set_plain(True)
            later = {n: b for n, _r, b in m.memory()}
            if v_dots and not widen:
                cells = cfg.n_layers * context * cfg.kv_dim
                assert later.pop("kv_values") == -(-4 * cells // 64) * 64
            assert later == mem  # else the V rows were float-wide from the start
            m.set_plain(False)
            m.set_plain(True)
            for on in (True, False, True):
                m.set_k_dots(on)
            again = {n: (r, b) for n, r, b in m.memory()}
            assert again.pop("k_rebuilt") == ("fast", cfg.n_heads * 4 * cfg.head_dim * 4)
            assert {n: b for n, (_r, b) in again.items() if n != "kv_values"} == mem  # once


def test_context_argument_is_checked(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(_llm.Error, match=r"^bad argument: context 65 exceeds the image's "
                                         r"seq_len 64$"):
        _llm.Model(tiny_model.image, context=65)
    for bad in (0, -1, 2**40, 2**70):
        with pytest.raises(ValueError, match=r"^context must be a number of positions from 1 "
                                             r"to the image's seq_len, not "):
            _llm.Model(tiny_model.image, context=bad)
    for bad in (True, 3.0, "8"):
        with pytest.raises(TypeError, match=r"^context must be an int, not "):
            _llm.Model(tiny_model.image, context=bad)
    with _llm.Model(tiny_model.image, context=None) as m:
        assert m.config()["seq_len"] == 64
    with _llm.Model(tiny_model.image, context=1) as m:
        assert m.config()["seq_len"] == 1
        m.prefill([1])
        with pytest.raises(_llm.Error, match="context full"):
            m.step(1)


@pytest.mark.parametrize("name", ["tiny", "llama2c_tied"])
def test_plan_is_the_open(engine_image, name: str) -> None:  # type: ignore[no-untyped-def]
    """_llm.plan is the open run dry: with the memory this host gives (no
    limit) its blocks are Model.memory()'s after the real open, at every
    context and mode; a plan that finds no memory says why as the open
    would; bad arguments and images are refused."""
    data = engine_image(name).read_bytes()
    for context in (0, 1, 7):
        for plain in (False, True):
            p = _llm.plan(data, context=context, plain=plain)
            with _llm.Model(data, context=context or None, plain=plain) as m:
                assert p["opens"] and p["why"] == ""
                assert p["blocks"] == m.memory()
                assert p["context"] == m.config()["seq_len"] and p["spilled"] == 0
    # a misaligned buffer is copied: the same plan
    buf = bytearray(len(data) + 1)
    buf[1:] = data
    assert _llm.plan(memoryview(buf)[1:]) == _llm.plan(data)
    # everything in one capped region (a board without PSRAM): weights spill first
    whole = sum(b for _n, r, b in _llm.plan(data)["blocks"] if r != "flash")
    lo, hi = 0, whole  # the least memory it opens in, by bisection over plans
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _llm.plan(data, fast=0, bulk=mid)["opens"] else (mid + 1, hi)
    tight = _llm.plan(data, fast=0, bulk=lo)
    assert tight["opens"] and tight["spilled"] > 0 and not _llm.plan(data, fast=0, bulk=lo - 1)["opens"]
    assert {r for _n, r, _b in tight["blocks"]} <= {"flash", "bulk"}
    none = _llm.plan(data, fast=0, bulk=0)
    assert not none["opens"] and none["blocks"] == [] and none["context"] == 0
    assert none["why"].startswith("out of memory: no memory for the engine state")
    shared = _llm.plan(data, fast=whole, bulk=0, bulk_is_fast=True)
    assert shared["opens"] and {r for _n, r, _b in shared["blocks"]} <= {"flash", "fast"}
    with pytest.raises(ValueError, match="plan\\(\\) fast must be a number of bytes"):
        _llm.plan(data, fast=-1)
    with pytest.raises(TypeError):
        _llm.plan(data, bulk="1")
    with pytest.raises(_llm.Error, match="exceeds the image's seq_len"):
        _llm.plan(data, context=10**6)
    with pytest.raises(_llm.Error, match="bad image|checksum"):
        _llm.plan(data[:-1] + bytes([data[-1] ^ 1]))
