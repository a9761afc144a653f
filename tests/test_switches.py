"""The switches for what only a board can price (llm.h: llm_set_preload; the
K-as-dots switch, set_k_dots, has its own tests in test_kv_dots.py): with
each on or off the engine gives the same tokens and logits bits, and the
host port's preload hook is called when the switch is on and never when off.

Also `bench.py --ab` (tools/mpllm/board/bench_cli.py, firmware/modules/
llm_bench.py ab()): its JSON's keys, its refusal of a switch that changed a
story, and the cost model's refit of the fill/compute overlap from that JSON
(costmodel/ab.py).
"""

from __future__ import annotations

import hashlib

import engine_ext
import pytest
import story_matrix

_llm = engine_ext.load()


def _story(image: str, prompt: list[int], sampler: tuple[float, int, int], n: int, *,
           preload: bool, plain: bool = False) -> tuple[list[int], list[str], dict]:
    """n tokens one step at a time, the sha256 of every evaluation's logits, the stats."""
    with _llm.Model(image, plain=plain) as m:
        m.set_preload(preload)
        m.sampler(*sampler)
        seq = m.config()["seq_len"]
        tokens = [m.prefill(prompt)]
        rows = [hashlib.sha256(m.logits()).hexdigest()]
        while len(tokens) < n and m.pos() < seq:
            tokens.append(m.step(tokens[-1]))
            rows.append(hashlib.sha256(m.logits()).hexdigest())
        return tokens, rows, m.stats()


@pytest.mark.parametrize("name", ["demo", "release"])
def test_preload_changes_no_bit(request: pytest.FixtureRequest, engine_image,  # type: ignore[no-untyped-def]
                                name: str) -> None:
    """Greedy and sampled stories with preload on are plain mode's and preload
    off's, token for token and logits row for logits row; the hook is called
    (for the KV rows, the next matrices and the head's next tiles) only while
    the switch is on, and never in plain mode."""
    image = str(request.getfixturevalue("demo_image") if name == "demo"
                else engine_image(name))
    with _llm.Model(image) as m:
        vocab = m.config()["vocab_out"]
    n = 24 if name == "release" else 48
    samplers = story_matrix.SAMPLERS if name == "demo" else story_matrix.SAMPLERS[:2]
    for prompt in story_matrix.prompts(vocab, 3):
        for sampler in samplers:
            ref = _story(image, prompt, sampler, n, preload=False, plain=True)
            off = _story(image, prompt, sampler, n, preload=False)
            on = _story(image, prompt, sampler, n, preload=True)
            assert on[:2] == off[:2] == ref[:2], (prompt, sampler)
            assert off[2]["preloads"] == 0 and off[2]["preload_bytes"] == 0
            assert on[2]["preloads"] > 0 and on[2]["preload_bytes"] > 0
            assert ref[2]["preloads"] == 0  # plain mode: every speed-up off
    # the preload byte counts: every hint at most LLM_PRELOAD_MAX_BYTES
    _t, _r, st = _story(image, [1, 2, 3], (0.0, 0, 0), 8, preload=True)
    assert st["preload_bytes"] <= 8192 * st["preloads"]


def test_preload_switch_at_runtime(demo_image) -> None:  # type: ignore[no-untyped-def]
    """set_preload/preload through the binding: off by default, on and off again
    mid-story with the same story as never on; a bad argument is refused."""
    image = str(demo_image)
    ref, ref_rows, _ = _story(image, [5, 6], (0.8, 40, 3), 40, preload=False)
    with _llm.Model(image) as m:
        assert m.preload() is False
        m.sampler(0.8, 40, 3)
        tokens = [m.prefill([5, 6])]
        rows = [hashlib.sha256(m.logits()).hexdigest()]
        counts = []
        for i in range(1, 40):
            m.set_preload(i % 10 < 5)
            assert m.preload() is (i % 10 < 5)
            before = m.stats()["preloads"]
            tokens.append(m.step(tokens[-1]))
            rows.append(hashlib.sha256(m.logits()).hexdigest())
            counts.append((i % 10 < 5, m.stats()["preloads"] - before))
        assert tokens == ref and rows == ref_rows
        assert all((n > 0) == on for on, n in counts), counts
        with pytest.raises(TypeError):
            m.set_preload()  # type: ignore[call-arg]
