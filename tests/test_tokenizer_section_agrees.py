"""The tokenizer section has two readers: the C loader (native/engine/image.c,
check_tokenizer) and the board's Python (firmware/modules/llm_tokenizer.py,
check_section and the Tokenizer's merge table). They apply one list of rules in one
order with one wording, so an image one accepts the other accepts, and where both
refuse they say the same thing. Held here rule by rule (each rule broken on its own,
on a byte-level BPE image and a sentencepiece one), then on seeded random damage;
tests/fuzz/fuzz_tokenizer_section.py keeps looking for a disagreement."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from image_edit import section_payload, tokenizer_verdicts


@dataclass(frozen=True)
class Layout:
    """Where the parts of a valid tokenizer section start (image_format.h)."""

    n: int
    n_merges: int
    n_special: int
    sp: bool
    specials: int
    lengths: int
    texts: int
    merges: int

    @classmethod
    def of(cls, s: bytes) -> Layout:
        n, n_merges, n_special, flags = struct.unpack_from("<4I", s, 0)
        lengths = 16 + 512 + 2 * n_special
        lengths += -lengths % 4
        texts = lengths + n
        end = texts + sum(s[lengths:texts])
        return cls(n, n_merges, n_special, bool(flags & 1), 16 + 512, lengths, texts,
                   end + end % 2)

    def text_at(self, s: bytes, i: int) -> int:
        return self.texts + sum(s[self.lengths:self.lengths + i])


@pytest.fixture(scope="module")
def images(tiny_model, llama2c_image) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return {"bpe": tiny_model.image.read_bytes(),
            "sentencepiece": llama2c_image("tied").read_bytes()}


def u16(s: bytearray, at: int, v: int) -> None:
    struct.pack_into("<H", s, at, v)


def emptied(s: bytes, lay: Layout, i: int) -> bytes:
    """Token i's text removed and its length 0: the issue's image (#36), re-signed."""
    at, size = lay.text_at(s, i), s[lay.lengths + i]
    body = bytearray(s[:lay.lengths + i]) + b"\0" + s[lay.lengths + i + 1:at] + s[at + size:]
    end = lay.texts + sum(body[lay.lengths:lay.texts])  # re-pad the merges to 2 bytes
    tail = s[lay.merges:]
    return bytes(body[:end] + bytes(end % 2) + tail)


def _set(at: Callable[[Layout], int], v: int, width: str = "<H") -> Callable[[bytes, Layout], bytes]:
    def f(s: bytes, lay: Layout) -> bytes:
        b = bytearray(s)
        struct.pack_into(width, b, at(lay), v)
        return bytes(b)
    return f


# rule -> (the damage, the message both must give); {n}: the vocabulary size
RULES: dict[str, tuple[Callable[[bytes, Layout], bytes], str]] = {
    "too small": (lambda s, lay: s[:527], "section 'tokenizer': 527 bytes, too small for its header"),
    "n_vocab": (_set(lambda lay: 0, 7, "<I"), "section 'tokenizer': n_vocab 7 != vocab_out {n}"),
    "flags": (_set(lambda lay: 12, 6, "<I"), "section 'tokenizer': unknown flags 0x6 (newer format?)"),
    "no specials": (_set(lambda lay: 8, 0, "<I"),
                    "section 'tokenizer': no special tokens (needs an end-of-text id)"),
    "byte id": (_set(lambda lay: 16 + 2 * 65, 60000),
                "section 'tokenizer': byte 65 maps to id 60000 >= n_vocab {n}"),
    "specials past the end": (_set(lambda lay: 8, 1 << 20, "<I"),
                              "section 'tokenizer': special ids run past the end"),
    "special id": (_set(lambda lay: lay.specials, 65000),
                   "section 'tokenizer': special id 65000 >= n_vocab {n}"),
    "lengths past the end": (lambda s, lay: s[:lay.lengths + lay.n - 1],
                             "section 'tokenizer': token lengths run past the end"),
    "empty token": (lambda s, lay: emptied(s, lay, lay.n - 3),
                    "section 'tokenizer': token {m} has no text"),
    "texts past the end": (lambda s, lay: s[:lay.merges - 3],
                           "section 'tokenizer': token texts run past the end"),
    "merges size": (lambda s, lay: s + b"\0\0",
                    ("section 'tokenizer': {k} merges need {need} bytes after the texts, "
                     "{more} remain")),
    "merge id": (_set(lambda lay: lay.merges + 6 * 2 + 2, 64000),
                 "section 'tokenizer': merge 2 uses id 64000 >= n_vocab {n}"),
}


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_refused_by_both_with_the_same_words(images, kind: str, rule: str) -> None:
    image = images[kind]
    good = section_payload(image, "tokenizer")
    lay = Layout.of(good)
    assert tokenizer_verdicts(image, good) == (None, None)
    damage, words = RULES[rule]
    mb = 8 if lay.sp else 6
    want = words.format(n=lay.n, m=lay.n - 3, k=lay.n_merges, need=mb * lay.n_merges,
                        more=mb * lay.n_merges + 2)
    assert tokenizer_verdicts(image, damage(good, lay)) == (want, want)


def test_the_two_rules_of_the_family(images) -> None:
    # byte-level BPE needs a special that is <|endoftext|>; sentencepiece needs BOS and EOS
    good = section_payload(images["bpe"], "tokenizer")
    lay = Layout.of(good)
    b = bytearray(good)
    eot = [k for k in range(lay.n_special)
           if good[lay.text_at(good, struct.unpack_from("<H", good, lay.specials + 2 * k)[0]):]
           .startswith(b"<|endoftext|>")]
    assert eot
    for k in eot:
        u16(b, lay.specials + 2 * k, 5)  # a plain token now
    want = "section 'tokenizer': no special token is <|endoftext|>"
    assert tokenizer_verdicts(images["bpe"], bytes(b)) == (want, want)
    good = section_payload(images["sentencepiece"], "tokenizer")
    lay = Layout.of(good)
    one = bytearray(good)
    struct.pack_into("<I", one, 8, 1)  # one special id: the lengths move up 2 bytes
    want = "section 'tokenizer': sentencepiece needs BOS and EOS ids"
    assert tokenizer_verdicts(images["sentencepiece"], bytes(one)) == (want, want)


def mutate(rng: random.Random, s: bytes, lay: Layout) -> bytes:
    """One random damage, aimed at the fields the rules read."""
    b = bytearray(s)
    how = rng.randrange(6)
    if how == 0:  # a header field or a byte id
        at = rng.choice([0, 4, 8, 12, 16 + 2 * rng.randrange(256)])
        struct.pack_into("<H", b, at, rng.choice([0, 1, lay.n - 1, lay.n, lay.n + 1, 0xFFFF,
                                                   rng.randrange(1 << 16)]))
    elif how == 1:  # a special id
        u16(b, lay.specials + 2 * rng.randrange(lay.n_special), rng.randrange(lay.n + 40))
    elif how == 2:  # a token length
        b[lay.lengths + rng.randrange(lay.n)] = rng.choice([0, 1, 2, 200, 255])
    elif how == 3:  # a merge id
        u16(b, lay.merges + 2 * rng.randrange(3 * lay.n_merges), rng.randrange(lay.n + 40))
    elif how == 4:  # cut short or grown
        return bytes(b[:rng.randrange(len(b))]) if rng.random() < 0.7 else bytes(b) + bytes(
            rng.randrange(1, 9))
    else:  # anything, anywhere
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_random_damage_never_splits_the_readers(images, kind: str) -> None:
    image = images[kind]
    good = section_payload(image, "tokenizer")
    lay = Layout.of(good)
    rng = random.Random(36)
    refused = accepted = 0
    for case in range(300):
        section = mutate(rng, good, lay)
        c, py = tokenizer_verdicts(image, section)
        assert c == py, f"case {case}: the C loader says {c!r}, llm_tokenizer {py!r}"
        refused += c is not None
        accepted += c is None
    # the damage reaches both outcomes (a generator that only ever broke one rule, or
    # never broke any, would prove nothing)
    assert refused >= 100 and accepted >= 10, (refused, accepted)


def test_the_tools_reader_is_the_board_one(images, tmp_path: Path) -> None:
    # mpllm.formats.image.read_image checks the section by the same rules
    from image_edit import with_section
    from mpllm.formats.image import ImageFormatError, read_image

    good = section_payload(images["bpe"], "tokenizer")
    lay = Layout.of(good)
    bad = with_section(images["bpe"], "tokenizer", emptied(good, lay, 7))
    with pytest.raises(ImageFormatError, match=r"^section 'tokenizer': token 7 has no text$"):
        read_image(bad)
