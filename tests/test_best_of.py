"""Model.best_of (llm_best_of, native/engine/engine.c): the likeliest of some
token ids, from those ids' head rows alone, is exactly the choice a scan of
the full dense logits over those ids makes (largest value, lowest id on a
tie), on every head the engine supports; and token healing (llm.py
_likeliest) uses it, so a co-writing line copies no logits vector."""

from __future__ import annotations

import random
from pathlib import Path
from typing import ClassVar

import engine_ext
import numpy as np
import pytest

_llm = engine_ext.load()
_Model = _llm.Model  # (the test below replaces _llm.Model with a counting one)


def scan(logits: bytes, ids: list[int] | None, skip: bytes | None = None) -> int:
    """The full logits' choice among ids (None: all), skipped bits left out."""
    v = np.frombuffer(logits, "<f4")
    order = range(len(v)) if ids is None else ids
    best, top = -1, 0.0
    for i in order:
        if skip is not None and skip[i >> 3] >> (i & 7) & 1:
            continue
        x = float(v[i])
        if best < 0 or x > top or (x == top and i < best):
            best, top = i, x
    return best


def candidate_sets(logits: bytes, rng: random.Random) -> list[list[int]]:
    """Random sets, singletons, duplicates, the whole range, the top few, and
    every tie the logits hold (its ids highest first, with a better-looking
    id after them when there is one)."""
    v = np.frombuffer(logits, "<f4")
    n = len(v)
    top = [int(i) for i in np.argsort(-v, kind="stable")[:5]]
    sets = [[rng.randrange(n)], [rng.randrange(n)] * 3, list(range(n)), top, top[::-1],
            [top[1], top[0], top[1], top[0]]]
    for k in (2, 7, 40):
        sets.append([rng.randrange(n) for _ in range(k)])
    _, first, counts = np.unique(v, return_index=True, return_counts=True)
    for f, c in zip(first, counts):
        if c > 1:
            tied = sorted(int(i) for i in np.flatnonzero(v == v[f]))
            sets.append(tied[::-1])
    return sets


def ties_in(logits: bytes, sets: list[list[int]]) -> int:
    v = np.frombuffer(logits, "<f4")
    return sum(len({int(i) for i in s}) > 1 and len({float(v[i]) for i in s}) == 1 for s in sets)


def check_model(image: Path | str, seed: int, plain: bool = False) -> tuple[int, int]:
    """best_of against the scan at a prefill, several steps, after verify and
    after rewind; (calls compared, tie sets among them)."""
    rng = random.Random(seed)
    calls = ties = 0
    with _llm.Model(str(image), plain=plain) as m:
        vocab = m.config()["vocab_out"]
        with pytest.raises(_llm.Error, match="bad state: no head evaluation yet"):
            m.best_of([0])
        prompt = [rng.randrange(1, vocab) for _ in range(5)]
        t = m.prefill(prompt)

        def compare() -> None:
            nonlocal calls, ties
            # the rows first (no logits computed yet), then the logits it matches
            sets = [[rng.randrange(vocab) for _ in range(3)]]
            got_rows = m.best_of(sets[0])
            logits = bytes(m.logits())
            assert got_rows == scan(logits, sets[0])
            sets = candidate_sets(logits, rng)
            ties += ties_in(logits, sets)
            skip = bytes(rng.randrange(256) for _ in range((vocab + 7) // 8))
            for ids in sets:
                assert m.best_of(ids) == scan(logits, ids), ids
                want = scan(logits, ids, skip)
                if want < 0:
                    with pytest.raises(_llm.Error, match="no candidate left"):
                        m.best_of(tokens=ids, skip=skip)
                else:
                    assert m.best_of(tokens=ids, skip=skip) == want
                calls += 2
            assert m.best_of() == scan(logits, None) == int(np.argmax(
                np.frombuffer(logits, "<f4")))
            assert m.best_of(skip=skip) == scan(logits, None, skip)
            calls += 2

        compare()
        for _ in range(4):
            t = m.step(t)
            compare()
        # the rows alone again, at an evaluation whose logits were never read
        t = m.step(t)
        ids = [rng.randrange(vocab) for _ in range(20)]
        got = m.best_of(ids)
        assert got == scan(bytes(m.logits()), ids)
        # a verify pass's last evaluation, then a rewind to an earlier one
        start = m.pos()
        nxt = m.verify([t, t, t])
        ids = [rng.randrange(vocab) for _ in range(30)]
        got = m.best_of(ids)
        assert got == scan(bytes(m.logits()), ids)
        m.rewind(start + 1)  # the evaluation that proposed nxt[0]
        got = m.best_of(ids)
        assert got == scan(bytes(m.logits()), ids)
        assert m.best_of() == nxt[0]  # (the default sampler is greedy)
        calls += 4
    return calls, ties


def head_kind(image: Path | str) -> tuple[str, bool, bool]:
    """(weights name of the head, certified, tied)."""
    with _llm.Model(str(image)) as m:
        c = m.config()
        names = [name for name, _, _ in m.memory()]
        return c["weights"], "head_tiles" in names, c["tied_head"]


@pytest.fixture(scope="module")
def uncertified_image(tiny_model, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The tiny model's int4 head without a certificate (every row dense)."""
    from mpllm.convert import convert

    out = tmp_path_factory.mktemp("best_of") / "no-tiles.img"
    convert(tiny_model.model_bin, tiny_model.tokenizer_json, out, progress=False, tile_rows=0)
    return out


@pytest.mark.parametrize("name", ["tiny", "tiny_untied"])
def test_certified_int4_heads(test_model, name: str) -> None:  # type: ignore[no-untyped-def]
    image = test_model(name).image
    weights, certified, tied = head_kind(image)
    assert weights == "int4" and certified and tied is (name == "tiny")
    calls, _ = check_model(image, 1)
    assert calls > 50
    # plain mode: the dense route wrote the logits; best_of reads them
    check_model(image, 2, plain=True)


def test_int4_head_without_certificate(uncertified_image: Path) -> None:
    weights, certified, tied = head_kind(uncertified_image)
    assert weights == "int4" and not certified and tied
    check_model(uncertified_image, 3)


@pytest.mark.parametrize("name", ["untied", "tied", "int8", "fp32", "mixed"])
def test_llama2c_heads(llama2c_image, name: str) -> None:  # type: ignore[no-untyped-def]
    """int4 (untied, tied), int8, fp32 (tied) heads and a certified int4 head
    among mixed layers."""
    image = llama2c_image(name)
    with _llm.Model(str(image)) as m:
        assert m.config()["tied_head"] is (name in ("tied", "fp32"))
    check_model(image, 4)


def test_ties_are_exercised(test_model) -> None:  # type: ignore[no-untyped-def]
    """At least one position of the small int4 models holds equal logits for
    distinct ids, listed highest id first: the lowest wins, as in the scan."""
    total = 0
    for name in ("tiny", "tiny_untied"):
        total += check_model(test_model(name).image, 5)[1]
    assert total > 0


def test_bad_calls(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(str(tiny_model.image)) as m:
        c = m.config()
        vocab, rows = c["vocab_out"], c["vocab_rows"]
        m.prefill([1, 2, 3])
        # (an id past the head but in the embedding, where vocab_rows > vocab_out, too)
        for bad in (vocab, rows, -1, 2**40):
            with pytest.raises(ValueError, match=f"token id .* out of range 0..{vocab - 1}$"):
                m.best_of([1, bad])
        with pytest.raises(ValueError, match="best_of\\(\\) needs at least one token"):
            m.best_of([])
        with pytest.raises(TypeError, match="best_of\\(\\) takes a sequence of token ids"):
            m.best_of(5)
        with pytest.raises(TypeError, match="best_of\\(\\) skip takes a bytes-like object "
                           "\\(a bit per head id\\), not list"):
            m.best_of([1], skip=[0, 1])
        need = (vocab + 7) // 8
        with pytest.raises(ValueError, match=f"a bit per head id: {need} bytes for {vocab} ids, "
                           f"got {need + 1}"):
            m.best_of(skip=bytes(need + 1))
        every = b"\xff" * need
        with pytest.raises(_llm.Error, match="no candidate left"):
            m.best_of([1, 2], skip=every)
        with pytest.raises(_llm.Error, match="no candidate left"):
            m.best_of(skip=every)
        # one id left: it, whatever its logit
        one = bytearray(every)
        one[7 >> 3] &= ~(1 << (7 & 7))
        assert m.best_of(skip=bytes(one)) == 7 == m.best_of([3, 7, 9], skip=one)
        # not decoding work: the counters stay (as for logits())
        before = m.stats()
        m.best_of([5, 6, 7])
        m.best_of()
        after = m.stats()
        for key in ("heads", "head_rows", "head_ids", "tokens", "bytes"):
            assert after[key] == before[key], key
        # None is an argument omitted
        assert m.best_of(None, None) == m.best_of() == m.best_of(tokens=None, skip=None)
        # a mutable skip is read during the call only
        assert m.best_of(skip=memoryview(one)) == 7


class _Counting:
    """An _llm.Model that counts logits() and best_of() calls."""

    calls: ClassVar[dict[str, int]] = {"logits": 0, "best_of": 0}

    def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        self._m = _Model(*args, **kw)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._m, name)

    def logits(self) -> bytes:
        _Counting.calls["logits"] += 1
        return self._m.logits()  # type: ignore[no-any-return]

    def best_of(self, *args, **kw) -> int:  # type: ignore[no-untyped-def]
        _Counting.calls["best_of"] += 1
        return self._m.best_of(*args, **kw)  # type: ignore[no-any-return]


def test_a_cowriting_line_on_the_release_shape_copies_no_logits(release_model, monkeypatch,  # type: ignore[no-untyped-def]
                                                                capsys) -> None:
    """A co-writing line ending inside a word (token healing) on the
    release-shaped image (25353 head ids: a logits vector is ~99 KiB): healing
    asks the engine for its choices (best_of) and never copies the logits."""
    import builtins

    import llm

    monkeypatch.setattr(_llm, "Model", _Counting)
    _Counting.calls.update(logits=0, best_of=0)
    lines = iter(["Once upon a time there was a litt", "She had a bi"])

    def fake_input(prompt: str = "") -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(builtins, "input", fake_input)
    llm.load(str(release_model.image))
    try:
        llm.chat(seed=3, max_tokens=4, finish=0, stories=None)
    finally:
        llm.unload()
    capsys.readouterr()
    assert _Counting.calls["logits"] == 0, "token healing copied the logits"
    assert _Counting.calls["best_of"] >= 1, "token healing never asked the engine"
