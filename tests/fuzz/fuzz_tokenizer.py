"""Coverage-guided fuzzer (atheris, libFuzzer's engine for Python) for the
plain-Python tokenizer in firmware/modules/llm.py.

For every input string: llm.Tokenizer.encode must give exactly the ids of
Hugging Face `tokenizers` (the oracle), decode(encode(s)) must give s back, and
streaming the token bytes through Utf8Decoder must give the same text. Inputs
are arbitrary Unicode (no surrogates): on CPython the tokenizer classifies
characters with unicodedata, so equality holds for all of it.

Short run (the suite, tests/test_fuzz_tokenizer.py): -runs=N. Long run:
    python tests/fuzz/fuzz_tokenizer.py -max_total_time=3600 fuzz-tokenizer-corpus
A failure prints the input and leaves crash-<sha1>; replay with
    python tests/fuzz/fuzz_tokenizer.py crash-<sha1>
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "firmware" / "modules")]

with atheris.instrument_imports():
    import llm

from mpllm.formats.tokenizer import parse_tokenizer_json, tokenizer_section
from mpllm.training.corpus import stories
from mpllm.training.tokenizers import train_tokenizer_json
from tokenizers import Tokenizer as HFTokenizer

# A trained tokenizer has real merge structure (words, spaces, punctuation);
# the corpus is the demo's story generator, so no file is needed.
_TEXT = train_tokenizer_json(stories(300, 7), 700)
_ORACLE = HFTokenizer.from_str(_TEXT)
_ORACLE.encode_special_tokens = True  # llm.py encodes a typed "<|endoftext|>" as text
_PLAIN = llm.Tokenizer(tokenizer_section(parse_tokenizer_json(_TEXT)))


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    s = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
    ids = _PLAIN.encode(s)
    want = _ORACLE.encode(s).ids
    if ids != want:
        raise AssertionError(f"encode({s!r}) = {ids}, tokenizers says {want}")
    if _PLAIN.decode(ids) != s:
        raise AssertionError(f"decode(encode({s!r})) = {_PLAIN.decode(ids)!r}")
    dec = llm.Utf8Decoder()
    streamed = "".join(dec.feed(_PLAIN.token_bytes(i)) for i in ids) + dec.flush()
    if streamed != s:
        raise AssertionError(f"streaming {s!r} gave {streamed!r}")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
