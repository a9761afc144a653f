"""Coverage-guided fuzzer (atheris, libFuzzer's engine for Python) for the
board's tokenizer (firmware/modules/llm_tokenizer.py, as llm.Tokenizer), both
of its encoders: the one CPython runs (characters classified with
unicodedata) and the one the board runs (MicroPython has no unicodedata: the
built-in table).

For every input string, with each encoder: decode(encode(s)) gives s back,
streaming the token bytes through Utf8Decoder gives the same text, and the
`ends` the encoder reports close its pieces in order at the last id. The
CPython encoder must give exactly the ids of Hugging Face `tokenizers` (the
oracle) for all of Unicode; the board's must too for text inside the blocks
its table covers (elsewhere it may split differently, never lose text).
The same tokenizer's sentencepiece mode (llama2.c's tokenizer.bin, on a
vocabulary trained here) must give the ids of run.c's rule
(tokenizer_cases.llama2c_encode) and decode back to the input.
Inputs are arbitrary Unicode (no surrogates).

Runs, the corpus and the long run: tests/fuzz/fuzzrun.py (target
"tokenizer"). A failure prints the input and leaves crash-<sha1>; replay with
    python tests/fuzz/fuzz_tokenizer.py crash-<sha1>
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzrun  # also puts tools/ and firmware/modules/ on sys.path

with atheris.instrument_imports():
    import llm
    import llm_tokenizer

from mpllm.formats import llama2c
from mpllm.formats.tokenizer import parse_tokenizer_json, tokenizer_section
from mpllm.training.corpus import stories
from mpllm.training.llama2c_vocab import train_vocab
from mpllm.training.tokenizers import train_tokenizer_json
from tokenizer_cases import llama2c_encode
from tokenizers import Tokenizer as HFTokenizer

# A trained tokenizer has real merge structure (words, spaces, punctuation);
# the corpus is the demo's story generator, so no file is needed.
_TEXT = train_tokenizer_json(stories(300, 7), 700)
_ORACLE = HFTokenizer.from_str(_TEXT)
_ORACLE.encode_special_tokens = True  # llm.py encodes a typed "<|endoftext|>" as text
_PLAIN = llm.Tokenizer(tokenizer_section(parse_tokenizer_json(_TEXT)))
_SP_VOCAB = train_vocab(stories(300, 7), 400)
_SP = llm.Tokenizer(tokenizer_section(llama2c.tokenizer_tables(*_SP_VOCAB)))


def _covered(s: str) -> bool:
    """Every character is one the board's table classifies exactly."""
    return all(ord(c) < 0x80 or any(lo <= ord(c) <= hi for lo, hi in llm_tokenizer._TOK_COVERED)
               for c in s)


def _board_encode(s: str, ends: list[int]) -> list[int]:
    """encode() as on the board: classes from the table, not unicodedata."""
    saved = llm_tokenizer._tok_unicodedata
    llm_tokenizer._tok_unicodedata = False
    try:
        return _PLAIN.encode(s, ends)
    finally:
        llm_tokenizer._tok_unicodedata = saved


def _round_trip(s: str, ids: list[int], ends: list[int], encoder: str) -> None:
    if _PLAIN.decode(ids) != s:
        raise AssertionError(f"{encoder}: decode(encode({s!r})) = {_PLAIN.decode(ids)!r}")
    dec = llm.Utf8Decoder()
    streamed = "".join(dec.feed(_PLAIN.token_bytes(i)) for i in ids) + dec.flush()
    if streamed != s:
        raise AssertionError(f"{encoder}: streaming {s!r} gave {streamed!r}")
    if ends != sorted(ends) or (ends[-1] if ends else 0) != len(ids):
        raise AssertionError(f"{encoder}: ends {ends} for {len(ids)} ids of {s!r}")


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    s = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
    want = _ORACLE.encode(s).ids
    ends: list[int] = []
    ids = _PLAIN.encode(s, ends)
    if ids != want:
        raise AssertionError(f"encode({s!r}) = {ids}, tokenizers says {want}")
    _round_trip(s, ids, ends, "CPython encoder")
    board_ends: list[int] = []
    board = _board_encode(s, board_ends)
    if _covered(s) and board != want:
        raise AssertionError(f"board encode({s!r}) = {board}, tokenizers says {want}")
    _round_trip(s, board, board_ends, "board encoder")
    sp = _SP.encode(s)
    if sp != llama2c_encode(*_SP_VOCAB, s):
        raise AssertionError(f"sentencepiece encode({s!r}) = {sp}, run.c's rule says "
                             f"{llama2c_encode(*_SP_VOCAB, s)}")
    if _SP.decode(sp) != s:
        raise AssertionError(f"sentencepiece: decode(encode({s!r})) = {_SP.decode(sp)!r}")


if __name__ == "__main__":
    fuzzrun.atheris_fuzz(test_one_input)
