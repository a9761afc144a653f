"""mpllm.drafting: the drafters and the replay that counts tokens per pass;
mpllm.costmodel.drafting_study: the study that prices it."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import engine_ext
import pytest
from conftest import ROOT
from mpllm import drafting as D
from mpllm.convert import convert
from mpllm.costmodel import drafting_study as S
from mpllm.formats import drafts_table as DT


def test_prompt_lookup_takes_the_latest_longest_match() -> None:
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert D.prompt_lookup(ctx, 2) == [7, 8]  # the latest earlier "1 2 3"
    assert D.prompt_lookup([4, 5, 6, 5], 3) == [6, 5]  # falls back to one token
    assert D.prompt_lookup([1, 2, 3], 4) == []
    assert D.prompt_lookup([7], 4) == []


def test_ngram_counts_become_the_drafts_table() -> None:
    t = D.NgramTable(order=2)
    for _ in range(3):
        t.add([1, 2, 3, 4])
    t.add([1, 2, 5])
    assert t.counts[(1, 2)] == {3: 3, 5: 1} and (1, 2, 3) not in t.counts
    table = t.table([0.5] * 7, calibrated=False)  # the counts' own shares
    assert table.records[1][(1, 2)] == (3, 65535 * 3 // 5)
    assert table.draft([1], 5) == [2]  # 2 (odds 4/5), then 3 would be 4/5 * 3/5 = .48 < .5
    assert t.table([0.4] * 7, calibrated=False).draft([1], 5) == [2, 3]  # 4: .36 < .4
    assert t.table([0.3] * 7, calibrated=False).draft([1], 5) == [2, 3, 4]
    assert table.draft([99], 5) == []


def test_simulate_counts_passes_exactly() -> None:
    story = [5, 6, 7, 8, 9]
    perfect = D.simulate([([1], story)], lambda ctx, n: story[len(ctx) - 1:][:n], max_draft=2)
    # passes emit 3 tokens each (2 accepted + 1 computed) until the end: 3 + 2
    assert (perfect.passes, perfect.story_tokens, perfect.accepted) == (2, 5, 3)
    assert perfect.tokens_per_pass == 2.5
    never = D.simulate([([1], story)], lambda ctx, n: [0] * n)
    assert never.passes == 5 and never.accepted == 0 and never.tokens_per_pass == 1.0
    assert never.drafted == 4 + 3 + 2 + 1  # never past the story's end


def test_study_on_the_demo_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    img = tmp_path / "demo.img"
    convert(ROOT / "models/demo/model.bin", ROOT / "models/demo/tokenizer.json", img,
            progress=False)
    res = S.study(str(img), n_tokens=80, table_stories=40, seeds=(1, 2),
                  llm_module=engine_ext.load())
    assert res["table"]["entries"]["contexts"] > 100
    for mode in ("greedy", "sampled"):
        for name in ("lookup", "ngram", "both"):
            r = res[mode][name]
            assert r["tokens_per_pass"] >= 1.0 and 0.0 <= r["accept_rate"] <= 1.0
    # a self-distilled table predicts this model far better than prompt lookup
    assert res["sampled"]["ngram"]["tokens_per_pass"] > res["sampled"]["lookup"]["tokens_per_pass"]


# ---- calibration: a guess is proposed only when it pays ----------------------


def _markov_stories(n: int, length: int, p_next: float, seed: int) -> list[list[int]]:
    """Stories of a source as unpredictable as real text: after token t comes
    t + 1 with chance p_next, else any of 64 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = [rng.randrange(64)]
        while len(s) < length:
            s.append((s[-1] + 1) % 64 if rng.random() < p_next else rng.randrange(64))
        out.append(s)
    return out


def test_calibrated_shares_are_the_held_out_hit_rates() -> None:
    # the top guess is right with chance p_next + (1 - p_next) / 64 ~ 0.31
    t = D.NgramTable()
    for s in _markov_stories(120, 200, 0.3, seed=1):
        t.add(s)
    raw = t.table([0.0] * 7, calibrated=False)
    cal = t.table([0.0] * 7)
    assert raw.records[0].keys() == cal.records[0].keys()  # the same contexts, other shares
    true = (0.3 + 0.7 / 64) * DT.ONE
    # order-1 contexts are seen hundreds of times: both near the truth
    assert all(abs(sh - true) < 0.1 * DT.ONE for _n, sh in cal.records[0].values())
    # an order-3 context seen once guesses what followed it that once: right with
    # chance q * q + (1 - q) * 0.7 / 64 ~ 0.10 (q: the top token's chance). The counts
    # claim 1/2; the calibration says what such a guess was worth on held-out stories
    q = 0.3 + 0.7 / 64
    once = [k for k, c in t.counts.items() if len(k) == 3 and sum(c.values()) == 1]
    assert len(once) > 1000
    assert all(raw.records[2][k][1] == DT.ONE // 2 for k in once)
    cal3 = sum(cal.records[2][k][1] for k in once) / len(once)
    assert abs(cal3 - (q * q + (1 - q) * 0.7 / 64) * DT.ONE) < 0.03 * DT.ONE


def test_calibrated_table_proposes_only_what_pays() -> None:
    prices = [0.4] * 7  # about the release shape's (costmodel.draft_prices)
    table = D.NgramTable()
    for s in _markov_stories(200, 200, 0.3, seed=2):
        table.add(s)
    held_out = [([s[0]], s[1:]) for s in _markov_stories(100, 200, 0.3, seed=3)]
    raw = D.simulate(held_out, table.table(prices, calibrated=False).draft, max_draft=7)
    cal = D.simulate(held_out, table.table(prices).draft, max_draft=7)
    # trusted as counted, the table guesses and loses: more cost than tokens
    assert raw.drafted > 1000 and raw.cost(prices) > raw.story_tokens
    # calibrated: a guess right 31 % of the time never pays 40 %: nothing proposed
    assert cal.drafted == 0 and cal.tokens_per_pass == 1.0
    assert cal.cost(prices) == cal.story_tokens
    # where a guess does pay (a cheaper position), the calibrated table guesses and wins
    cheap = [0.2] * 7
    win = D.simulate(held_out, table.table(cheap).draft, max_draft=7)
    assert win.drafted > 1000 and win.tokens_per_pass > 1.05
    assert win.cost(cheap) < win.story_tokens


def test_study_cost_and_bootstrap() -> None:
    each = [D.Study(10, 5, 4, 3, Counter({0: 3, 2: 2})), D.Study(6, 6, 0, 0, Counter({0: 6}))]
    prices = [0.5, 0.25]
    assert each[0].cost(prices) == 3 * 1.0 + 2 * 1.75
    f = S.figure(each, prices, plain_ms=10.0)
    assert f.total.story_tokens == 16 and f.total.passes == 11
    assert f.cost == pytest.approx((6.5 + 6.0) / 16) and f.ms_per_token == pytest.approx(
        10 * 12.5 / 16)
    assert 0.0 < f.se["tpp"] < 1.0 and 0.0 < f.se["cost"] < 0.5
    same = S.figure([each[0]] * 2, prices, plain_ms=10.0)
    assert same.se == pytest.approx({"tpp": 0.0, "cost": 0.0}, abs=1e-12)  # no spread


def test_calibration_on_an_unpredictable_engine_model(small_model) -> None:  # type: ignore[no-untyped-def]
    """A random model's stories at T 0.8: trusted as counted its table loses;
    calibrated on its own held-out stories it never costs more than plain."""
    prices = [0.4] * 7
    with engine_ext.load().Model(str(small_model.image)) as m:
        w = D.ImageStories(m, int(m.config()["eot_id"]), [[5, 6, 7], [9, 9], [40, 41]], "small")
        res = S.measure(w, prices={"greedy": prices, "sampled": prices},
                        plain_ms={"greedy": 1.0, "sampled": 1.0}, table_stories=60,
                        n_tokens=60, stories={"sampled": 60}, drafters=("ngram raw", "ngram"))
    raw, cal = res["sampled"]["ngram raw"], res["sampled"]["ngram"]  # type: ignore[index]
    assert raw.total.story_tokens == cal.total.story_tokens > 1000
    assert raw.total.drafted > 100 and raw.cost > 1.0
    assert cal.total.tokens_per_pass >= 1.0 and cal.cost <= 1.0


def test_cached_images_are_keyed_by_the_table_rule(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An image cached with a table made by an older rule (the counts' shares,
    over-confident) is converted again, not reused."""
    from mpllm import image_cache

    src = (ROOT / "models/demo/model.bin", ROOT / "models/demo/tokenizer.json", tmp_path)
    now = image_cache.cached_image_path(*src)
    monkeypatch.setattr(D, "TABLE_RULE", "counts-shares")
    assert image_cache.cached_image_path(*src) != now


def test_cached_images_are_keyed_by_the_prices_not_the_cost_model(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An image cached before the prices changed (its drafts table's min_odds are
    draft_prices.json's) is converted again, not reused; an edit of the cost
    model itself converts nothing again (the converter does not read it): a copy
    of the package with a cost model file edited gives the same key."""
    import shutil

    from mpllm import draft_prices, image_cache

    src = (ROOT / "models/demo/model.bin", ROOT / "models/demo/tokenizer.json", tmp_path)
    now = image_cache.cached_image_path(*src)
    assert image_cache.cached_image_path(*src) == now
    pkg = tmp_path / "mpllm"
    shutil.copytree(Path(image_cache.__file__).parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(image_cache, "__file__", str(pkg / "image_cache.py"))
    assert image_cache.cached_image_path(*src) == now  # the same sources, the same key
    model = pkg / "costmodel" / "prices.py"
    model.write_text(model.read_text() + "\n# an edit\n")
    assert image_cache.cached_image_path(*src) == now
    data = pkg / "draft_prices.json"
    data.write_text(data.read_text().replace("0.", "0.0", 1))
    monkeypatch.setattr(draft_prices, "DATA", data)
    assert image_cache.cached_image_path(*src) != now


def test_cli_prints_both_models_labeled_with_spread(capsys) -> None:  # type: ignore[no-untyped-def]
    llama2c = ROOT.parent / "shared" / "llama2c" / "stories260K.bin"
    small = ["--table-stories", "20", "--stories", "8", "--greedy-stories", "4",
             "--tokens", "40", "--prices", "release"]
    if llama2c.is_file():
        small += ["--llama2c", str(llama2c)]
    assert S.main(small) == 0
    out = capsys.readouterr().out
    assert "priced for the release shape (modeled S3): a plain step" in out
    assert "demo: n-gram table from 20 of its own stories" in out
    for mode in ("greedy", "sampled"):
        for name in ("ngram raw", "ngram", "lookup", "both"):
            row = rf"^  {mode} +{name} +\d\.\d\d ± \d\.\d\d +\d+\.\d%"
            assert re.search(row, out, re.MULTILINE), (mode, name)
    assert re.search(r"^  sampled T 0.8 top-40: at demo's \d\.\d\d tokens/pass \d+\.\d\d ± "
                     r"\d\.\d\d ms \(plain \d+\.\d\d\)", out, re.MULTILINE)
    if llama2c.is_file():
        assert "stories260K.bin: n-gram table from 20 of its own stories" in out
        assert "; at stories260K.bin's " in out


@pytest.mark.parametrize("args,message", [
    (["--stories", "0"], "--stories must be >= 1, not 0"),
    (["--llama2c", "nowhere.bin"], "--llama2c nowhere.bin: no such file"),
    (["nowhere.img"], "nowhere.img: no such image"),
])
def test_cli_refuses_bad_arguments_in_one_line(capsys, args, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        S.main(args)
    assert message in capsys.readouterr().err


def test_calibration_keeps_most_of_the_demo_gain(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On the demo model the counts were nearly right: calibrated, the table
    still saves most of what it saved (priced like the release shape)."""
    from mpllm.checkout import import_llm
    from mpllm.costmodel.prices import draft_prices

    img = tmp_path / "demo.img"
    convert(ROOT / "models/demo/model.bin", ROOT / "models/demo/tokenizer.json", img,
            progress=False)
    prices = draft_prices()
    with engine_ext.load().Model(str(img)) as m:
        tok = import_llm().Tokenizer(m.tokenizer())
        w = D.ImageStories(m, int(m.config()["eot_id"]),
                           [tok.encode(p) for p in D.DEFAULT_PROMPTS], "demo")
        res = S.measure(w, prices={"greedy": prices, "sampled": prices},
                        plain_ms={"greedy": 1.0, "sampled": 1.0}, table_stories=60,
                        n_tokens=100, stories={"sampled": 40}, drafters=("ngram raw", "ngram"))
    raw, cal = res["sampled"]["ngram raw"], res["sampled"]["ngram"]  # type: ignore[index]
    assert raw.cost < 0.95  # the demo's guesses pay (0.88 ± 0.01 when measured)
    assert 1.0 - cal.cost >= 0.8 * (1.0 - raw.cost)


def test_real_model_figures_for_the_cost_model() -> None:
    """The cost model's inputs at stories260K's acceptance: what the table does
    there (fewer tokens per pass than the demo, over a thousand passes each)."""
    from mpllm.costmodel import spec_inputs

    real, demo = spec_inputs.real_model_drafts(), spec_inputs.SpecInputs.default().drafts
    for mode in ("greedy", "sampled"):
        r = real[mode]["ngram"]
        assert r.usable and r.passes > 1000 and r.drafter == "ngram"
        assert 1.0 < r.tokens_per_pass < demo[mode]["ngram"].tokens_per_pass
        assert r.positions_per_pass == pytest.approx(1 + r.drafted_per_pass)


def test_draft_prices_data_exact_nearest_and_head() -> None:
    """draft_prices.json gives a tabulated shape's own figures (the release
    model's), prices another shape as the nearest tabulated one and says so, has
    no draft prices for a context too short for a verify pass, and interpolates
    the head's step between its tabulated rows fractions."""
    from mpllm import draft_prices as P

    release = {"dim": 96, "n_layers": 6, "n_heads": 4, "ffn": 66, "ple_dim": 128,
               "vocab_out": 25353, "seq_len": 256, "group": 128}
    p = P.prices_for(release)
    assert p.name == "release" and p.exact and p.draft is not None and len(p.draft) == 7
    near = P.prices_for({**release, "vocab_out": 25000})
    assert near.name == "release" and not near.exact and near.draft == p.draft
    tiny = P.prices_for({**release, "seq_len": 8})
    assert tiny.draft is None and tiny.loop is None
    a, b = p.head_step_ms(0.5)[0], p.head_step_ms(0.52)[0]
    assert p.head_step_ms(0.51)[0] == pytest.approx((a + b) / 2)
    assert p.head_step_ms(1.0)[1] == p.head_dense_ms
    with pytest.raises(ValueError, match="rows_fraction 1.5"):
        p.head_step_ms(1.5)
