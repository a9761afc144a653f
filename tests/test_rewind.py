"""Model.rewind(pos): drop positions >= pos in O(1); decoding then goes on
exactly as if the dropped positions had never been decoded (tokens, logits
bits and the sampler's random stream), greedy and sampled."""

from __future__ import annotations

import engine_ext
import pytest

_llm = engine_ext.load()

SAMPLERS = [(0.0, 0, 0), (0.8, 40, 7), (1.1, 0, 3), (0.8, 1, 5)]


def decode(m, prompt: list[int], feeds: list[int]) -> tuple[list[int], list[bytes]]:  # type: ignore[no-untyped-def]
    """prefill(prompt), then step(f) for each f: the tokens returned and the logits."""
    out = [m.prefill(prompt)]
    logits = [m.logits()]
    for f in feeds:
        out.append(m.step(f))
        logits.append(m.logits())
    return out, logits


@pytest.mark.parametrize("model", ["small", "llama2c_untied", "llama2c_tied"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_rewind_is_as_if_never_decoded(engine_image, model, sampler) -> None:  # type: ignore[no-untyped-def]
    prompt = [5, 17, 300, 42]
    image = engine_image(model)
    with _llm.Model(image) as m:
        m.sampler(*sampler)
        first, _ = decode(m, prompt, [])
        chain = [first[0]]
        for _ in range(9):  # a detour of 10 generated tokens
            chain.append(m.step(chain[-1]))
        assert m.pos() == len(prompt) + 9
        m.rewind(len(prompt) + 2)  # keep two of them
        assert m.pos() == len(prompt) + 2
        with pytest.raises(_llm.Error, match="no logits"):
            m.logits()
        # now a different continuation than the detour took
        other = [(chain[2] + 1) % m.config()["vocab_out"], 11, 12]
        after = [m.step(t) for t in other]
        after_logits = m.logits()
    with _llm.Model(image) as fresh:
        fresh.sampler(*sampler)
        assert fresh.prefill(prompt) == first[0]
        assert fresh.step(chain[0]) == chain[1]
        assert fresh.step(chain[1]) == chain[2]
        assert [fresh.step(t) for t in other] == after
        assert fresh.logits() == after_logits


def test_rewind_into_a_prefill_and_to_zero(small_model) -> None:  # type: ignore[no-untyped-def]
    prompt = [9, 8, 7, 6, 5, 4]
    with _llm.Model(small_model.image) as m:
        m.sampler(0.8, 40, 11)
        ref, ref_logits = decode(m, prompt, [1, 2, 3])
        m.rewind(3)  # inside the prompt: feed its tail again
        got, got_logits = decode(m, prompt[3:], [1, 2, 3])
        assert got == ref and got_logits == ref_logits
        m.rewind(0)
        assert m.pos() == 0
        assert decode(m, prompt, [1, 2, 3]) == (ref, ref_logits)
        here = m.pos()
        m.rewind(here)  # keeps every position: decoding goes on from the same stream
        assert m.pos() == here
        with _llm.Model(small_model.image) as fresh:
            fresh.sampler(0.8, 40, 11)
            decode(fresh, prompt, [1, 2, 3])
            assert m.step(4) == fresh.step(4) and m.logits() == fresh.logits()


def test_rewind_arguments(small_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(small_model.image) as m:
        m.prefill([1, 2, 3])
        for bad in (4, -1, 2**40):
            with pytest.raises(ValueError, match="rewind position must be in 0..3"):
                m.rewind(bad)
        for bad in (1.0, "1", None, True):
            with pytest.raises(TypeError):
                m.rewind(bad)
        assert m.pos() == 3  # nothing changed
    with pytest.raises(_llm.Error, match="closed"):
        m.rewind(0)


def test_rewind_in_plain_mode_too(small_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(small_model.image, plain=True) as a, _llm.Model(small_model.image) as b:
        for m in (a, b):
            m.sampler(0.8, 40, 21)
        ta = decode(a, [3, 4, 5], [6, 7, 8])
        tb = decode(b, [3, 4, 5], [6, 7, 8])
        a.rewind(4)
        b.rewind(4)
        assert decode(a, [60], [70]) == decode(b, [60], [70])
        assert ta == tb
