"""Model.verify(tokens): several positions in one pass over the weights, for
speculative decoding. The result equals that many step() calls (tokens, the
logits of every evaluation, the sampler's stream), and drafting + verify +
rewind writes exactly the plain story, greedy and sampled."""

from __future__ import annotations

import random

import engine_ext
import pytest
from mpllm import drafting

_llm = engine_ext.load()

SAMPLERS = [(0.0, 0, 0), (0.8, 40, 1), (0.8, 40, 2), (0.8, 40, 3), (1.2, 0, 4), (0.8, 40, 5)]
# an esp32-ai model and llama2.c's stories260K shape (no PLE, 4 kv heads for 8)
MODELS = ["small", "llama2c_untied", "llama2c_tied"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_verify_equals_steps(engine_image, model, sampler) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(sampler[2])
    image = engine_image(model)
    with _llm.Model(image) as a, _llm.Model(image) as b:
        vocab = a.config()["vocab_out"]
        for m in (a, b):
            m.sampler(*sampler)
        assert a.prefill([1, 2, 3]) == b.prefill([1, 2, 3])
        for _ in range(6):
            feed = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
            got = a.verify(feed)
            want = [b.step(t) for t in feed]
            assert got == want
            assert a.logits() == b.logits() and a.pos() == b.pos()
        assert a.stats()["heads"] == b.stats()["heads"]


def speculative(m, prompt: list[int], n: int, drafter: drafting.Drafter) -> tuple[list[int], int]:  # type: ignore[no-untyped-def]
    """Story tokens by draft + verify + rewind, and the passes it took."""
    story = [m.prefill(prompt)]
    passes = 1
    seq_len = m.config()["seq_len"]
    while len(story) < n and m.pos() < seq_len:
        room = min(n - len(story), seq_len - m.pos())
        draft = drafter(prompt + story, min(room - 1, drafting.max_draft()))
        start = m.pos()
        got = m.verify([story[-1], *draft])
        passes += 1
        a = 0
        while a < len(draft) and draft[a] == got[a]:
            a += 1
        m.rewind(start + a + 1)
        story += got[:a + 1]
    return story[:n], passes


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_speculative_story_equals_plain(engine_image, model, sampler) -> None:  # type: ignore[no-untyped-def]
    prompt = [7, 11, 13]
    image = engine_image(model)
    with _llm.Model(image, plain=True) as m:
        vocab = m.config()["vocab_out"]
        m.sampler(*sampler)
        plain = [m.prefill(prompt)]
        while len(plain) < 60:
            plain.append(m.step(plain[-1]))
    # a drafter that is right most of the time (the answer with some noise),
    # and one that is always wrong: both must give the plain story
    rng = random.Random(1)

    def oracle(ctx: list[int], k: int) -> list[int]:
        i = len(ctx) - len(prompt)
        return [t if rng.random() < 0.8 else (t + 1) % vocab for t in plain[i:i + k]]

    for drafter in (oracle, lambda ctx, k: [0] * k, drafting.prompt_lookup):
        with _llm.Model(image) as m:
            m.sampler(*sampler)
            story, passes = speculative(m, prompt, 60, drafter)
        assert story == plain
        if drafter is oracle:
            assert passes < 40  # several tokens per pass


def test_speculative_into_the_context_limit(tiny_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(tiny_model.image, plain=True) as m:
        m.sampler(0.8, 40, 9)
        plain = [m.prefill([1, 2])]
        while m.pos() < 64:
            plain.append(m.step(plain[-1]))
    with _llm.Model(tiny_model.image) as m:
        m.sampler(0.8, 40, 9)
        story, _ = speculative(m, [1, 2], 100, lambda ctx, k: plain[len(ctx) - 2:][:k])
        assert m.pos() == 64
    assert story == plain


def test_verify_arguments(small_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(small_model.image) as m:
        m.prefill([1])
        with pytest.raises(ValueError, match="at most 8 tokens"):
            m.verify(list(range(9)))
        with pytest.raises(ValueError, match="at least one token"):
            m.verify([])
        with pytest.raises(ValueError, match="out of range"):
            m.verify([1, 10**6])
        with pytest.raises(TypeError):
            m.verify(5)
        assert m.pos() == 1  # nothing changed
        m.rewind(0)
        m.prefill(list(range(124)))  # 4 positions left of 128
        with pytest.raises(_llm.Error, match="context full"):
            m.verify(list(range(9, 14)))
        assert len(m.verify(list(range(9, 13)))) == 4


def test_closing_the_model_while_its_tokens_are_read(small_model) -> None:  # type: ignore[no-untyped-def]
    # iterating the argument runs user code that may close the model: the
    # binding must notice instead of using the closed engine
    for name in ("prefill", "verify"):
        m = _llm.Model(small_model.image)

        def tokens(model=m):  # type: ignore[no-untyped-def]
            yield 1
            model.close()
            yield 2

        with pytest.raises(_llm.Error, match="closed"):
            getattr(m, name)(tokens())


def test_one_scan_for_all_positions_reads_the_head_once(release_model) -> None:  # type: ignore[no-untyped-def]
    """The pass scores every position's head in one scan: each tile's rows are
    fetched once for all positions that need them, so the head and the cache
    are read far less than by the same number of steps (the same answers)."""
    feed = [5, 6, 7, 8, 9, 10, 11, 12]
    with _llm.Model(release_model.image) as a, _llm.Model(release_model.image) as b:
        for m in (a, b):
            m.sampler(0.8, 40, 3)
            feed[0] = m.prefill([1, 2, 3])
        before_a, before_b = a.stats(), b.stats()
        assert a.verify(feed) == [b.step(t) for t in feed]
        sa, sb = a.stats(), b.stats()
    diff = {k: (sa[k] - before_a[k], sb[k] - before_b[k]) for k in ("head_rows", "head_tiles",
                                                                  "heads")}
    # two lanes (one per core) each prune with their own floors: a few more rows
    assert diff["heads"] == (8, 8) and diff["head_rows"][1] <= diff["head_rows"][0]
    assert diff["head_rows"][0] <= 1.1 * diff["head_rows"][1]
    assert diff["head_tiles"][0] * 4 < diff["head_tiles"][1]
    bulk = (sa["bytes"]["bulk"] - before_a["bytes"]["bulk"],
            sb["bytes"]["bulk"] - before_b["bytes"]["bulk"])
    assert bulk[0] * 4 < bulk[1]


def test_verify_on_a_model_full_of_ties(tmp_path, small_model) -> None:  # type: ignore[no-untyped-def]
    from model_edit import tied_image

    rng = random.Random(8)
    pairs = [(rng.randrange(900), rng.randrange(900)) for _ in range(300)]
    img = tied_image(tmp_path, small_model, iter(pairs), "ties")
    for sampler in SAMPLERS[:3] + [(0.8, 3, 4)]:
        with _llm.Model(img) as a, _llm.Model(img) as b:
            for m in (a, b):
                m.sampler(*sampler)
            assert a.prefill([4, 5]) == b.prefill([4, 5])
            for _ in range(5):
                feed = [rng.randrange(900) for _ in range(8)]
                assert a.verify(feed) == [b.step(t) for t in feed]
                assert a.logits() == b.logits()


@pytest.mark.parametrize("draft", ["lookup", "table"])
@pytest.mark.parametrize("options", [{"temperature": 0}, {"seed": 7}, {"seed": 2**40 + 1},
                                     {"seed": 3, "top_k": 0}])
def test_llm_story_with_a_drafter_is_the_plain_story(small_model, draft, options) -> None:  # type: ignore[no-untyped-def]
    """llm.py's speculative loop (draft= option) writes exactly the plain story,
    including the stop at <|endoftext|>, the token budget and the context."""
    from mpllm.board import hostboard

    llm = hostboard.import_llm()
    llm.load(str(small_model.image))
    table = drafting.NgramTable()
    with _llm.Model(small_model.image) as m:
        for _p, s in drafting.decode_stories(m, [[5, 6, 7], [9, 9]], (0.8, 40, 99), 80, 0):
            table.add(s)
    drafter = "lookup" if draft == "lookup" else table.table([0.0] * 7).draft
    for prompt, budget in (("Once upon a time", 60), ("The dog", 200)):
        plain = "".join(llm.generate(prompt, max_tokens=budget, **options))
        plain_stats = llm.stats()
        fast = "".join(llm.generate(prompt, max_tokens=budget, draft=drafter, **options))
        fast_stats = llm.stats()
        assert fast == plain
        assert fast_stats["stop"] == plain_stats["stop"]
        assert fast_stats["tokens"] == plain_stats["tokens"]
        assert fast_stats["passes"] >= 1 and fast_stats["tokens_per_pass"] >= 1.0
    llm.unload()


def test_draft_option_is_checked(small_model) -> None:  # type: ignore[no-untyped-def]
    from mpllm.board import hostboard

    llm = hostboard.import_llm()
    llm.load(str(small_model.image))
    with pytest.raises(ValueError, match="draft must be 'auto', 'ngram', 'lookup', None"):
        llm.generate("Once", draft="bigram")
    # (not "convert it without --drafter-stories 0": the image may have been, and
    # the converter left the table out because it did not pay)
    with pytest.raises(ValueError, match=r"this image has no n-gram drafter table \(convert.py "
                                         r"leaves it out where it does not pay"):
        llm.generate("Once", draft="ngram")
    llm.unload()


def test_rewind_keeps_the_logits_of_a_kept_evaluation(small_model) -> None:  # type: ignore[no-untyped-def]
    with _llm.Model(small_model.image) as a, _llm.Model(small_model.image) as b:
        for m in (a, b):
            m.sampler(0.8, 40, 6)
        t = a.prefill([1, 2, 3])
        assert b.prefill([1, 2, 3]) == t
        got = a.verify([t, 5, 6, 7])
        a.rewind(a.pos() - 2)  # keep two of the four: the second evaluation proposed pos()
        want = [b.step(x) for x in (t, 5)]
        assert got[:2] == want and a.logits() == b.logits()
        a.rewind(a.pos())  # a no-op keeps them too
        assert a.logits() == b.logits()
        a.rewind(0)
        with pytest.raises(_llm.Error, match="no logits"):
            a.logits()


def test_a_drafter_must_return_token_ids(small_model) -> None:  # type: ignore[no-untyped-def]
    from mpllm.board import hostboard

    llm = hostboard.import_llm()
    llm.load(str(small_model.image))
    with pytest.raises(ValueError, match="not a token id"):
        "".join(llm.generate("Once", seed=3, draft=lambda ctx, n: [10**7]))
    # longer drafts than asked are cut, the story stays the plain one
    plain = "".join(llm.generate("Once", seed=3, max_tokens=40))
    long = "".join(llm.generate("Once", seed=3, max_tokens=40,
                                draft=lambda ctx, n: drafting.prompt_lookup(ctx, 50) + [1] * 50))
    assert long == plain
    llm.unload()
