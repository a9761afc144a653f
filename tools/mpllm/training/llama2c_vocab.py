"""A llama2.c vocabulary trained here: sentencepiece BPE on the generated corpus,
exported the way llama2.c's tokenizer.py exports one (tokenizer.bin).

llama2.c trains its small vocabularies (e.g. the 512 tokens of stories260K)
with sentencepiece's BPE trainer: byte fallback, digits split, whitespace-only
pieces allowed, the "identity" normalization, every character covered. The
export keeps each piece's score, writes U+2581 as a space and BOS / EOS as
"\\n<s>\\n" / "\\n</s>\\n". mpllm.formats.llama2c reads the result like any
llama2.c tokenizer.bin.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

__all__ = ["train_vocab"]


def train_vocab(texts: Sequence[str], vocab_size: int) -> tuple[list[bytes], list[float]]:
    """(token texts, scores) of a BPE vocabulary of `vocab_size` pieces over `texts`
    (ids 0, 1, 2 = <unk>, BOS, EOS; then the 256 byte pieces)."""
    import sentencepiece as spm

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, model_type="bpe",
            vocab_size=vocab_size, self_test_sample_size=0, input_format="text",
            character_coverage=1.0, num_threads=1, split_digits=True,
            allow_whitespace_only_pieces=True, byte_fallback=True,
            normalization_rule_name="identity", max_sentence_length=1 << 16,
            minloglevel=2)
    except RuntimeError as e:  # sentencepiece reports a bad size as an INTERNAL error
        raise ValueError(f"a {vocab_size}-piece vocabulary for this corpus: {e}") from None
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    special = {sp.bos_id(): "\n<s>\n", sp.eos_id(): "\n</s>\n"}
    pieces = [special.get(i, sp.id_to_piece(i)).replace("\u2581", " ").encode()
              for i in range(sp.get_piece_size())]
    return pieces, [float(sp.get_score(i)) for i in range(sp.get_piece_size())]
