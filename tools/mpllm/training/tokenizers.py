"""Tokenizers made here, as tokenizer.json text: `synthetic_tokenizer_json` (a
release-shaped byte-level BPE of any size, for generated test models) and
`train_tokenizer_json` (a real BPE trained on a corpus, for the demo model).
Both are read back by mpllm.formats.tokenizer like any downloaded one."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterable

from ..formats.tokenizer import (
    BYTE_SYMBOLS,
    EOT_TEXT,
    MAX_IDS,
    MAX_TOKEN_BYTES,
    parse_tokenizer_json,
)


def _tokenizer_doc(vocab: dict[str, int], merges: list[tuple[str, str]], eot_id: int) -> dict:
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": eot_id,
                "content": EOT_TEXT,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": dict(byte_level),
        "post_processor": None,
        "decoder": dict(byte_level, add_prefix_space=True),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            # "left right" strings: what the release (tokenizers < 0.20) wrote, and
            # what every tokenizers version still reads.
            "merges": ["{} {}".format(*m) for m in merges],
        },
    }


_ONSETS = [
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y", "z",
    "bl", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gl", "gr", "pl", "pr", "sc", "sh", "sk", "sl",
    "sm", "sn", "sp", "st", "sw", "th", "tr", "tw", "wh", "qu", "str"
]
_VOWELS = [
    "a", "e", "i", "o", "u", "a", "e", "i", "o", "y", "ee", "oo", "ea", "ai", "ou", "ie", "oa"
]
_CODAS = [
    "-", "-", "-", "-", "b", "d", "g", "k", "l", "m", "n", "p", "r", "s", "t", "x", "ll", "ss",
    "nd", "nt", "ng", "nk", "st", "ck", "rd", "rt", "sh", "th", "ch", "ed", "er", "ing", "ly", "y"
]
# Frequent story words go in first, so prompts like "Once upon a time" get
# whole-word tokens the way they do with the release tokenizer.
_COMMON = [
    "the", "a", "and", "was", "to", "he", "she", "it", "they", "her", "his", "said", "there",
    "once", "upon", "time", "day", "little", "girl", "boy", "named", "lily", "tom", "ben", "mom",
    "dad", "wanted", "play", "park", "big", "happy", "sad", "saw", "went", "with", "in", "on", "of",
    "at", "one", "very", "friend", "friends", "dog", "cat", "ball", "tree", "bird", "sun", "fun",
    "toy", "home", "what", "is", "are", "be", "so", "but", "then", "that", "had", "have", "not",
    "you", "i", "we", "me", "my", "can", "could", "would", "like", "loved", "looked", "found",
    "asked", "started", "felt", "help", "together", "every", "after", "came", "back", "out", "up",
    "down", "too", "all", "new", "good"
]
_PUNCT = [
    ".",
    ",",
    "!",
    "?",
    '"',
    '."',
    '!"',
    '?"',
    ',"',
    "'",
    ":",
    ";",
    "-",
    "(",
    ")",
    "...",
    "--",
]


def _english_ish(rng: random.Random) -> str:
    word = ""
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        coda = rng.choice(_CODAS)
        word += rng.choice(_ONSETS) + rng.choice(_VOWELS) + ("" if coda == "-" else coda)
    if rng.random() < 0.15:
        word = word[:1].upper() + word[1:]
    return word


def _piece(rng: random.Random) -> str:
    """A string the GPT-2 pre-split can produce as one piece, in byte-level symbols."""
    r = rng.random()
    if r < 0.84:
        text = ("" if rng.random() < 0.3 else " ") + _english_ish(rng)
    elif r < 0.90:
        text = ("" if rng.random() < 0.5 else " ") + str(rng.randrange(10 ** rng.randint(1, 4)))
    elif r < 0.97:
        text = ("" if rng.random() < 0.6 else " ") + rng.choice(_PUNCT)
    else:
        text = rng.choice(("\n", "\n\n", "  ", "   ", "\t", "\n\n\n"))
    return "".join(BYTE_SYMBOLS[b] for b in text.encode("utf-8"))


def _apply_merges(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Plain BPE (lowest rank first, leftmost on ties), for building the synthetic vocab."""
    while len(symbols) > 1:
        best = min(
            (ranks.get((a, b), len(ranks)), i)
            for i, (a, b) in enumerate(itertools.pairwise(symbols))
        )
        if best[0] == len(ranks):
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


def synthetic_tokenizer_json(vocab_size: int, seed: int) -> str:
    """A valid release-shaped byte-level BPE tokenizer.json of exactly `vocab_size` tokens.

    Layout mirrors a trained release tokenizer: id 0 is <|endoftext|>, ids
    1..256 the byte symbols in code point order (what BpeTrainer assigns), then
    one token per merge. Merges build random English-ish words (with and
    without the leading space symbol), numbers, punctuation and whitespace
    runs, each from pieces already in the vocabulary, so every merge is
    reachable by real text. Deterministic for a given (vocab_size, seed).
    """
    base = 1 + 256
    if not isinstance(vocab_size, int) or vocab_size < base or vocab_size > MAX_IDS:
        raise ValueError(f"vocab_size must be an int in {base}..{MAX_IDS}, got {vocab_size!r}")
    rng = random.Random(seed)
    vocab: dict[str, int] = {EOT_TEXT: 0}
    for sym in sorted(BYTE_SYMBOLS):
        vocab[sym] = len(vocab)
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}

    def new_merge(left: str, right: str) -> None:
        ranks[(left, right)] = len(merges)
        merges.append((left, right))
        vocab[left + right] = len(vocab)

    def add(target: str) -> None:
        # Build `target` from the left, splitting at a random point where both
        # halves already exist when there is one (keeps merge shapes varied).
        stack = [target]
        while stack and len(vocab) < vocab_size:
            s = stack[-1]
            if s in vocab:
                stack.pop()
                continue
            splits = [k for k in range(1, len(s)) if s[:k] in vocab and s[k:] in vocab]
            if splits:
                k = rng.choice(splits)
                new_merge(s[:k], s[k:])
                stack.pop()
            else:
                stack.append(s[:-1])

    for word in _COMMON:
        for text in (" " + word, word, " " + word.capitalize(), word.capitalize()):
            # Merge whatever the current merges make of the word, left to right,
            # as a trainer would: the word then always encodes to one token.
            segs = _apply_merges([BYTE_SYMBOLS[b] for b in text.encode("utf-8")], ranks)
            while len(segs) > 1 and len(vocab) < vocab_size and segs[0] + segs[1] not in vocab:
                new_merge(segs[0], segs[1])
                segs[0:2] = [segs[0] + segs[1]]
    while len(vocab) < vocab_size:
        piece = _piece(rng)
        if len(piece) > 1 and len(piece.encode("utf-8")) <= MAX_TOKEN_BYTES:
            add(piece)
    return json.dumps(_tokenizer_doc(vocab, merges, 0), ensure_ascii=False)


def train_tokenizer_json(texts: Iterable[str], vocab_size: int) -> str:
    """Train a byte-level BPE the way the release was made and return its JSON.

    <|endoftext|> gets id 0 and all 256 byte symbols are in the vocabulary
    whatever the corpus holds, so any text can be encoded; no token is longer
    than the image's 255-byte limit.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=MAX_TOKEN_BYTES,  # a byte-level symbol is one byte
    )
    tok.train_from_iterator(texts, trainer=trainer)
    text = tok.to_str()
    parse_tokenizer_json(text, where="trained tokenizer")  # fail here, not at convert time
    return text
