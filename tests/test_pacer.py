"""llm.Pacer: draft="auto" uses the image's drafter only while a verify pass
costs less per token than a plain step on this machine's clock. Pacing mixes
plain steps and verify passes inside one story, so the story must stay the
one plain decoding writes whatever the mix: checked with forced mixes on the
demo, a release-shaped and a stories260K-shaped image, greedy and sampled,
through both decoding loops (Session.run and decode_tokens)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import llm
import pytest

PROMPTS = ("Once upon a time", "The little dog", "Tom and Sue went to the park", "One day")
#: (temperature, top_k, seed): greedy, and sampled with and without top-k
SAMPLERS = ((0.0, 0, None), (0.8, 40, 11), (1.0, 0, 2024))


class _Mixed(llm.Pacer):
    """A pacer whose choice between a step and a pass is a seeded coin, not
    the clock: every mix of the two a real pacer could make is one of these."""

    def __init__(self, draft: Callable, seed: int) -> None:
        super().__init__(draft)
        self.coin = random.Random(seed)
        self.choices: list[bool] = []

    def drafting(self) -> bool:
        self.choices.append(self.coin.random() < 0.5)
        return self.choices[-1]


def _story(prompt: str, sampler: tuple, draft: object) -> tuple[list[int], dict]:
    temperature, top_k, seed = sampler
    out: list[int] = []
    session = llm.default_session
    model = session.load()
    model.reset()
    ids = session.prompt_ids(prompt)
    for _ in session.run(ids, 120, temperature, top_k, seed, draft, out=out):
        pass
    return out, dict(llm.stats())


@pytest.fixture(params=["demo", "release", "llama2c_fp32"])
def paced_image(request: pytest.FixtureRequest, demo_image: Path,
                engine_image: Callable[[str], Path]) -> tuple[str, Path]:
    name = request.param
    return name, demo_image if name == "demo" else engine_image(name)


def test_any_mix_of_steps_and_passes_writes_the_plain_story(paced_image) -> None:
    name, image = paced_image
    model = llm.load(str(image), plain=False)
    ngram = llm.drafter(model, "ngram") if model.config().get("max_draft", 0) else None
    guesses = ngram or llm.prompt_lookup  # (an image without a table: prompt lookup)
    mixed_both = 0
    for k, prompt in enumerate(PROMPTS):
        for sampler in SAMPLERS:
            plain, plain_stats = _story(prompt, sampler, None)
            mix = _Mixed(guesses, seed=k)
            mixed, s = _story(prompt, sampler, mix)
            assert mixed == plain, (name, prompt, sampler, mix.choices)
            assert s["stop"] == plain_stats["stop"]
            # every token is accounted for: plain steps plus what the passes chose
            assert s["steps"] == mix.choices.count(False)
            assert s["passes"] == mix.choices.count(True)
            mixed_both += s["steps"] > 0 and s["passes"] > 0
    assert mixed_both >= len(PROMPTS)  # the check saw real mixes, not one mode


def test_decode_tokens_with_a_pacer_writes_the_plain_tokens(demo_image: Path) -> None:
    model = llm.load(str(demo_image), plain=False)
    tok = llm.default_session.tokenizer
    ngram = llm.drafter(model, "ngram")
    for k, prompt in enumerate(PROMPTS):
        for temperature, top_k, seed in SAMPLERS:
            ids = tok.encode(prompt)
            runs = []
            for draft in (None, _Mixed(ngram, seed=100 + k)):
                model.reset()
                model.sampler(temperature, top_k, seed or 0)
                first = model.prefill(ids)
                counts: dict = {}
                runs.append([first, *llm.decode_tokens(model, first, 80, draft, list(ids),
                                                       None, counts)])
                if draft is not None:
                    assert counts["steps"] == draft.choices.count(False)
            assert runs[0] == runs[1], (prompt, temperature, seed)


class _Clock:
    """Costs for a pacer, as the decoding loop would report them."""

    def __init__(self, pacer: llm.Pacer, step_us: float, pass_us: float,
                 tokens_per_pass: float) -> None:
        self.pacer, self.step_us, self.pass_us, self.tpp = pacer, step_us, pass_us, tokens_per_pass

    def run(self, decisions: int) -> list[bool]:
        out = []
        for _ in range(decisions):
            d = self.pacer.drafting()
            out.append(d)
            if d:
                self.pacer.passed(self.pass_us, self.tpp)
            else:
                self.pacer.stepped(self.step_us)
        return out


def test_the_pacer_drafts_only_where_a_pass_pays() -> None:
    # 2.4 tokens a pass for the time of 1.3 steps: drafting pays
    paying = _Clock(llm.Pacer(llm.prompt_lookup), 1000, 1300, 2.4).run(320)
    # 1.5 tokens a pass for the time of 1.6 steps: it does not
    losing = _Clock(llm.Pacer(llm.prompt_lookup), 1000, 1600, 1.5).run(320)
    assert paying[:2] == [False, True] and losing[:2] == [False, True]  # one of each first
    # then the cheaper way, but for a probe of the other after PROBE decisions,
    # then twice as many each time the probe changed nothing, up to PROBE_MAX
    probes, at, gap = [], 0, llm.Pacer.PROBE
    while at + gap <= len(paying) - 2:
        at += gap
        probes.append(at - 1)
        gap = min(2 * gap, llm.Pacer.PROBE_MAX)
    assert [i for i, d in enumerate(paying[2:]) if not d] == probes == [31, 95, 223]
    assert [i for i, d in enumerate(losing[2:]) if d] == probes
    # a long story: a probe every PROBE_MAX decisions at most, not every PROBE
    assert _Clock(llm.Pacer(llm.prompt_lookup), 1000, 1600, 1.5).run(3000).count(True) <= (
        1 + 4 + 3000 // llm.Pacer.PROBE_MAX)


def test_the_pacer_follows_a_cost_that_changes() -> None:
    pacer = llm.Pacer(llm.prompt_lookup)
    clock = _Clock(pacer, 1000, 1300, 2.4)
    clock.run(100)
    clock.tpp = 1.0  # the story turned unpredictable: a pass writes one token
    later = clock.run(400)
    # the running means move 1/8 per reading: a few passes, then steps
    assert later[-200:].count(True) <= 200 // llm.Pacer.PROBE + 1
    assert later[:10].count(True) >= 3
    # and back: passes pay again; a probe sees it within PROBE_MAX decisions
    clock.tpp = 2.4
    again = clock.run(600)
    assert again[-100:].count(True) >= 90


def test_auto_paces_and_a_named_drafter_does_not(demo_image: Path) -> None:
    model = llm.load(str(demo_image), plain=False)
    assert isinstance(llm.drafter(model, "auto"), llm.Pacer)
    assert not isinstance(llm.drafter(model, "auto", paced=False), llm.Pacer)
    assert not isinstance(llm.drafter(model, "ngram"), llm.Pacer)
    # a paced story is the plain story (the real clock decides the mix)
    for prompt in PROMPTS:
        paced, s = _story(prompt, (0.8, 40, 5), llm.drafter(model, "auto"))
        plain, _ = _story(prompt, (0.8, 40, 5), None)
        assert paced == plain
        assert s["steps"] + s["passes"] >= 1


def test_a_session_keeps_its_pacer_from_story_to_story(demo_image: Path,
                                                      engine_image: Callable[[str], Path]) -> None:
    session = llm.default_session
    model = llm.load(str(demo_image), plain=False)
    first = session.paced(llm.drafter(model, "auto"))
    "".join(llm.generate("Once upon a time", seed=3, max_tokens=40))
    assert first.decisions > 0  # generate() paced with the session's pacer
    assert session.paced(llm.drafter(model, "auto")) is first
    assert session.paced(None) is None and session.paced(llm.prompt_lookup) is llm.prompt_lookup
    llm.load(str(engine_image("release")), plain=False)  # another model: its own costs
    fresh = llm.Pacer(llm.prompt_lookup)
    assert session.paced(fresh) is fresh
    llm.unload()
    assert session._pacer is None
