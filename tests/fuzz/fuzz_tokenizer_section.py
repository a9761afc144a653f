"""Coverage-guided fuzzer (atheris) for the tokenizer section's two readers:
the C loader (native/engine/image.c, check_tokenizer, through `_llm.Model`)
and the board's Python (firmware/modules/llm_tokenizer.py, Tokenizer). An
input is one selector byte (even: a byte-level BPE image, odd: a sentencepiece
one) and then a tokenizer section, spliced into that image with every CRC
made right (tests/helpers/image_edit.py), so each input reaches the section's
own rules. Both readers must accept it, or both refuse it with the same
message (tests/test_tokenizer_section_agrees.py holds the rules one by one).

Runs, the corpus and the long run: tests/fuzz/fuzzrun.py (target
"tokenizer_section"). A failure prints both verdicts and leaves crash-<sha1>;
replay with
    python tests/fuzz/fuzz_tokenizer_section.py crash-<sha1>
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzrun  # also puts tools/, firmware/modules/ and tests/helpers on sys.path

with atheris.instrument_imports():
    import llm_tokenizer  # noqa: F401 - instrumented before image_edit imports it

from image_edit import tokenizer_verdicts

IMAGES = [fuzzrun.micro_image().read_bytes(), fuzzrun.micro_llama2c_image().read_bytes()]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    c, py = tokenizer_verdicts(IMAGES[data[0] & 1], data[1:])
    if c != py:
        raise AssertionError(f"the C loader says {c!r}, llm_tokenizer says {py!r}")


if __name__ == "__main__":
    fuzzrun.atheris_fuzz(test_one_input)
