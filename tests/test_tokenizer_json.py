"""The host side of the tokenizer (mpllm.formats.tokenizer): tokenizer.json read
and checked, its tables laid out as the image's tokenizer section, every
unsupported feature refused with its own message; and the tokenizers
mpllm.training.tokenizers makes."""

from __future__ import annotations

import json
import random
import struct

import llm
import pytest
import tokenizer_cases
from mpllm.formats.tokenizer import (
    BYTE_SYMBOLS,
    TokenizerFormatError,
    load_tokenizer,
    parse_tokenizer_json,
    tokenizer_section,
)
from mpllm.training.tokenizers import synthetic_tokenizer_json
from tokenizer_cases import hf
from tokenizers import Tokenizer as HFTokenizer


@pytest.fixture(scope="module")
def tokenizer_jsons() -> dict[str, str]:
    return tokenizer_cases.tokenizer_jsons()


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
    with pytest.raises(ValueError, match="100 bytes, too small for its header"):
        llm.Tokenizer(bytes(sec[:100]))
    with pytest.raises(ValueError, match="merges need .* bytes after the texts"):
        llm.Tokenizer(bytes(sec[:-1]))
    with pytest.raises(ValueError, match="merges need .* bytes after the texts"):
        llm.Tokenizer(bytes(sec) + b"\0\0")
    bad = bytearray(sec)
    bad[12] = 4
    with pytest.raises(ValueError, match="unknown flags 0x4"):
        llm.Tokenizer(bytes(bad))
    bad[12] = 1  # the sentencepiece flag: one special id (no BOS/EOS pair), no rank table
    with pytest.raises(ValueError, match="sentencepiece needs BOS and EOS ids"):
        llm.Tokenizer(bytes(bad))
    bad = bytearray(sec)
    bad[16 + 2 * 65 : 16 + 2 * 65 + 2] = struct.pack("<H", 300)
    with pytest.raises(ValueError, match="byte 65 maps to id 300"):
        llm.Tokenizer(bytes(bad))
    bad = bytearray(sec)
    bad[-6:-4] = struct.pack("<H", 999)
    with pytest.raises(ValueError, match="merge 42 uses id 999 >= n_vocab 300"):
        llm.Tokenizer(bytes(bad))
    t = llm.Tokenizer(memoryview(bytes(sec)))  # read in place from a memoryview
    with pytest.raises(ValueError, match="out of range"):
        t.token_bytes(300)
