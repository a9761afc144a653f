"""The tokenizer tests' shared cases: the strings, the tokenizer.json files
(trained, synthetic, the golden ones) and the two tokenizers compared, Hugging
Face `tokenizers` (the oracle) and the board's plain-Python one; and the
oracle of llama2.c's encoding (run.c's rule, transcribed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "firmware" / "modules"))

import llm
from mpllm.formats.tokenizer import parse_tokenizer_json, tokenizer_section
from mpllm.training.tokenizers import synthetic_tokenizer_json, train_tokenizer_json


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


def llama2c_encode(texts: list[bytes], scores: list[float], text: str) -> list[int]:
    """run.c's encode(text, bos=1, eos=0), step by step."""
    ids = {t: i for i, t in enumerate(texts)}
    toks = [1]
    if text:
        toks.append(ids[b" "])  # the dummy prefix
    b = text.encode()
    i = 0
    while i < len(b):
        j = i + 1
        while j < len(b) and b[j] & 0xC0 == 0x80 and j - i < 4:
            j += 1
        if b[i:j] in ids:
            toks.append(ids[b[i:j]])
        else:
            toks.extend(x + 3 for x in b[i:j])  # byte fallback: <0xNN> is id NN + 3
        i = j
    while True:
        best, at = -1e10, -1
        for k in range(len(toks) - 1):
            m = ids.get(texts[toks[k]] + texts[toks[k + 1]])
            if m is not None and scores[m] > best:
                best, at, merged = scores[m], k, m
        if at < 0:
            return toks
        toks[at:at + 2] = [merged]
