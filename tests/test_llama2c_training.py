"""What makes a llama2.c model here: the PyTorch Llama (mpllm.reference.torch_llama)
and the sentencepiece vocabulary trainer (mpllm.training.llama2c_vocab).

The real stories260K-shaped checkpoint in ../shared/llama2c/ is the oracle of
the architecture: the file's greedy ids from BOS are known (its README: a
newline, id 13, after 19 tokens) and llama2.c's run.c, built by hand beside
this repository, gives logits within 4e-5 of this model's on them.
"""

from __future__ import annotations

import llm_tokenizer
import numpy as np
import pytest
import torch
from llama2c_models import STORIES260K_BIN, random_checkpoint
from mpllm.formats import llama2c
from mpllm.formats.tokenizer import tokenizer_section
from mpllm.reference.torch_llama import LlamaModel
from mpllm.training import corpus
from mpllm.training.llama2c_vocab import train_vocab
from tokenizer_cases import llama2c_encode


@torch.no_grad()
def _greedy(model: LlamaModel, n: int) -> list[int]:
    ids = [llama2c.BOS_ID]
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[1:]


def test_stories260k_greedy_puts_a_newline_after_19_tokens():
    if not STORIES260K_BIN.is_file():
        pytest.skip(f"stories260K.bin is not at {STORIES260K_BIN}")
    model = LlamaModel.from_checkpoint(llama2c.read_checkpoint(STORIES260K_BIN.read_bytes()))
    ids = _greedy(model, 20)
    assert ids.index(13) == 19, ids


@pytest.mark.parametrize("shared", [True, False])
def test_checkpoint_round_trip_and_causality(shared):
    ck = random_checkpoint(shared)
    model = LlamaModel.from_checkpoint(ck)
    back = model.to_checkpoint()
    for name in llama2c.LAYER_MATRICES:
        assert np.array_equal(back.layers[name], ck.layers[name])
    assert np.array_equal(back.output, ck.output)
    ids = torch.tensor([[1, 5, 9, 33, 2, 70]])
    with torch.no_grad():
        full = model(ids)[0]
        prefix = model(ids[:, :3])[0]
    # position t sees only positions <= t
    assert torch.allclose(full[:3], prefix, atol=1e-5)
    assert not torch.allclose(full[3], full[4])


def test_a_trained_vocabulary_reads_back_and_encodes_by_llama2c_rule(tmp_path):
    stories = corpus.stories(400, 7)
    with pytest.raises(ValueError, match="a 300-piece vocabulary for this corpus"):
        train_vocab(stories, 300)  # fewer than its 256 bytes and ~50 characters
    texts, scores = train_vocab(stories, 400)
    assert train_vocab(stories, 400) == (texts, scores)  # the same corpus, the same vocabulary
    assert len(texts) == 400 and texts[1] == b"\n<s>\n" and texts[3] == b"<0x00>"
    p = tmp_path / "tokenizer.bin"
    p.write_bytes(llama2c.tokenizer_bin_bytes(texts, scores))
    tables = llama2c.load_tokenizer_bin(p)
    tok = llm_tokenizer.Tokenizer(tokenizer_section(tables))
    total_ids = total_bytes = 0
    for s in stories[:40]:
        ids = tok.encode(s)
        assert ids == llama2c_encode(texts, scores, s)
        assert tok.decode(ids) == s
        total_ids += len(ids)
        total_bytes += len(s.encode())
    assert total_ids < 0.7 * total_bytes  # merges learned from this corpus compress it
