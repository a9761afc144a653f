"""mpllm.drafting: the drafters and the replay that counts tokens per pass."""

from __future__ import annotations

import engine_ext
from conftest import ROOT
from mpllm import drafting as D
from mpllm.convert import convert


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
    table = t.table([0.5] * 7)
    assert table.records[1][(1, 2)] == (3, 65535 * 3 // 5)
    assert table.draft([1], 5) == [2]  # 2 (odds 4/5), then 3 would be 4/5 * 3/5 = .48 < .5
    assert t.table([0.4] * 7).draft([1], 5) == [2, 3]  # then 4: .48 * 3/4 = .36 < .4
    assert t.table([0.3] * 7).draft([1], 5) == [2, 3, 4]
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
    res = D.study(str(img), n_tokens=80, table_stories=10, seeds=(1, 2),
                  llm_module=engine_ext.load())
    assert res["table"]["entries"]["contexts"] > 100
    for mode in ("greedy", "sampled"):
        for name in ("lookup", "ngram", "both"):
            r = res[mode][name]
            assert r["tokens_per_pass"] >= 1.0 and 0.0 <= r["accept_rate"] <= 1.0
    # a self-distilled table predicts this model far better than prompt lookup
    assert res["sampled"]["ngram"]["tokens_per_pass"] > res["sampled"]["lookup"]["tokens_per_pass"]
