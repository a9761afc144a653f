"""Coverage-guided fuzzer (atheris) for llama2.c's tokenizer.bin reader
(mpllm.formats.llama2c: read_tokenizer_bin, tokenizer_tables) and the image
section made of what it accepts, on any bytes as a tokenizer.bin.

For every input: reading it and making its tables either succeed or raise
TokenizerFormatError with a one-line message, nothing else. A file the reader
accepts is written back byte for byte (after the max-length header field,
which the writer recomputes); its tables' section opens as the board's
llm.Tokenizer, which gives every token's bytes back; and when the vocabulary
has llama2.c's layout (<unk>, BOS, EOS, the 256 byte tokens <0x00>..<0xFF>
at ids 3..258, a space), encoding a text made of its tokens gives run.c's ids
(tests/helpers/tokenizer_cases.llama2c_encode) and decodes back to the text.

Seeds (tests/fuzz/corpus/tokenizer_bin/): small vocabularies, `seeds()` below.

Target "tokenizer_bin" of tests/fuzz/fuzzrun.py (its runs, the corpus, how a
failure is replayed).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzrun  # also puts tools/, firmware/modules/ and tests/helpers on sys.path

with atheris.instrument_imports(include=["mpllm.formats.llama2c", "mpllm.formats.tokenizer",
                                         "llm_tokenizer"]):
    import llm
    from mpllm.formats import llama2c
    from mpllm.formats.tokenizer import TokenizerFormatError, tokenizer_section

from tokenizer_cases import llama2c_encode

_BYTES = [f"<0x{b:02X}>".encode() for b in range(256)]


def _standard(texts: list[bytes]) -> bool:
    """llama2.c's layout: the byte tokens at 3..258 (run.c's fallback is id
    byte + 3) and a space for its dummy prefix."""
    return texts[3:259] == _BYTES and b" " in texts


def test_one_input(data: bytes) -> None:
    try:
        texts, scores = llama2c.read_tokenizer_bin(data)
        tables = llama2c.tokenizer_tables(texts, scores)
    except TokenizerFormatError as e:
        fuzzrun.one_line(e)
        return
    again = llama2c.tokenizer_bin_bytes(texts, scores)
    if again[4:] != data[4:]:
        raise AssertionError("the tokenizer.bin written back differs from its file")
    tok = llm.Tokenizer(tokenizer_section(tables))
    for i, t in enumerate(texts):
        want = bytes([_BYTES.index(t)]) if t in _BYTES else t
        if tok.token_bytes(i) != want:
            raise AssertionError(f"token {i}: {tok.token_bytes(i)!r}, the file has {t!r}")
    if not _standard(texts):
        return
    # a text of the vocabulary's own pieces (and what is between them)
    text = b"".join(texts[i] for i in range(259, len(texts), 7)).decode("utf-8", "replace")
    want_ids = llama2c_encode(texts, scores, text)
    ids = tok.encode(text)
    if ids != want_ids:
        raise AssertionError(f"encode({text!r}) = {ids}, run.c's rule says {want_ids}")
    if tok.decode(ids) != text:
        raise AssertionError(f"decode(encode({text!r})) = {tok.decode(ids)!r}")


def seeds() -> dict[str, bytes]:
    """The committed seeds: llama2.c-shaped vocabularies of 340 and 330
    tokens (trained here), one without its byte tokens, and the smallest."""
    from mpllm.training.corpus import stories
    from mpllm.training.llama2c_vocab import train_vocab

    out = {"trained340": llama2c.tokenizer_bin_bytes(*train_vocab(stories(60, 3), 340))}
    texts, scores = train_vocab(stories(30, 4), 330)
    out["trained330"] = llama2c.tokenizer_bin_bytes(texts, scores)
    out["no-bytes"] = llama2c.tokenizer_bin_bytes(texts[:3] + texts[259:], scores[:3] + scores[259:])
    out["three"] = llama2c.tokenizer_bin_bytes([b"<unk>", b"\n<s>\n", b"\n</s>\n"], [0.0] * 3)
    out["short"] = struct.pack("<i", 8)
    return out


if __name__ == "__main__":
    fuzzrun.atheris_fuzz(test_one_input)
