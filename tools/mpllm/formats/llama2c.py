"""llama2.c's files: `tokenizer.bin` (its export of a sentencepiece vocabulary).

tokenizer.bin, little-endian: i32 max_token_length, then per token id in
order: f32 score, i32 length, that many bytes of text. The text is the
sentencepiece piece with U+2581 already turned into a space; the 256
byte-fallback pieces are the literal strings "<0x00>".."<0xFF>"; ids 0, 1, 2
are <unk>, BOS and EOS.

llama2.c encodes by score: start from one symbol per character (or its
bytes' fallback tokens), then repeatedly merge the adjacent pair whose
concatenated text is a token with the highest score, the leftmost among equal
scores. That is byte-pair encoding with a merge for every way of writing a
token as two tokens, ranked by the merged token's score: the tables here say
exactly that, and the board's `llm.Tokenizer` runs them (llm_tokenizer.py).
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

from .tokenizer import MAX_IDS, MAX_TOKEN_BYTES, TokenizerFormatError, TokenizerTables

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_BYTE_PIECES = {f"<0x{b:02X}>".encode(): b for b in range(256)}


def read_tokenizer_bin(data: bytes, where: str = "tokenizer.bin") -> tuple[list[bytes], list[float]]:
    """(texts, scores) per token id; TokenizerFormatError on anything malformed."""
    if len(data) < 4:
        raise TokenizerFormatError(f"{where}: {len(data)} bytes, too short for its header")
    (max_len,) = struct.unpack_from("<i", data, 0)
    if not 1 <= max_len <= 4096:
        raise TokenizerFormatError(f"{where}: max token length {max_len} is not a "
                                   "llama2.c tokenizer.bin header")
    texts: list[bytes] = []
    scores: list[float] = []
    at = 4
    while at < len(data):
        if at + 8 > len(data):
            raise TokenizerFormatError(f"{where}: truncated in the entry of token {len(texts)}")
        score, n = struct.unpack_from("<fi", data, at)
        at += 8
        if not 0 < n <= max_len or at + n > len(data):
            raise TokenizerFormatError(f"{where}: token {len(texts)} has length {n} "
                                       f"(max {max_len}, {len(data) - at} bytes left)")
        if math.isnan(score):
            raise TokenizerFormatError(f"{where}: token {len(texts)} has a NaN score")
        texts.append(data[at:at + n])
        scores.append(score)
        at += n
    if len(texts) <= EOS_ID:
        raise TokenizerFormatError(f"{where}: {len(texts)} tokens, needs <unk>, BOS and EOS")
    if len(texts) > MAX_IDS:
        raise TokenizerFormatError(f"{where}: {len(texts)} tokens, the image holds {MAX_IDS}")
    return texts, scores


def tokenizer_tables(texts: list[bytes], scores: list[float],
                     where: str = "tokenizer.bin") -> TokenizerTables:
    """The image's KIND_TOKENIZER tables for llama2.c's encoding of this vocabulary."""
    n = len(texts)
    ids: dict[bytes, int] = {}
    for i, t in enumerate(texts):
        ids.setdefault(t, i)  # llama2.c's sorted-vocabulary lookup: unique texts assumed
    if len(ids) != n:
        raise TokenizerFormatError(f"{where}: {n - len(ids)} token texts appear twice")
    byte_ids = [0xFFFF] * 256
    token_bytes: list[bytes] = []
    for i, t in enumerate(texts):
        b = _BYTE_PIECES.get(t)
        if b is not None:
            byte_ids[b] = i
            t = bytes([b])  # decoding writes the byte itself
        if len(t) > MAX_TOKEN_BYTES:
            raise TokenizerFormatError(f"{where}: token {i} is {len(t)} bytes "
                                       f"(the image holds {MAX_TOKEN_BYTES})")
        token_bytes.append(t)
    # Every split of a token's text into two tokens' texts is a merge (llama2.c
    # looks the concatenation up); its priority is the merged token's score.
    merges = [(ids[t[:k]], ids[t[k:]], i) for i, t in enumerate(texts)
              for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    by_score = sorted({scores[m[2]] for m in merges}, reverse=True)
    if len(by_score) > MAX_IDS:
        raise TokenizerFormatError(f"{where}: {len(by_score)} distinct merge scores, "
                                   f"ranks hold {MAX_IDS}")
    rank_of = {s: r for r, s in enumerate(by_score)}
    merges.sort(key=lambda m: (rank_of[scores[m[2]]], m[2], m[0]))
    return TokenizerTables(vocab_size=n, eot_id=EOS_ID, token_bytes=token_bytes, merges=merges,
                           byte_ids=byte_ids, special_ids=[BOS_ID, EOS_ID],
                           ranks=[rank_of[scores[m[2]]] for m in merges])


def load_tokenizer_bin(path: str | Path) -> TokenizerTables:
    path = Path(path)
    return tokenizer_tables(*read_tokenizer_bin(path.read_bytes(), str(path)), where=str(path))


def tokenizer_bin_bytes(texts: list[bytes], scores: list[float]) -> bytes:
    """A tokenizer.bin of these tokens, as llama2.c's export writes it (tests,
    and models trained here)."""
    out = bytearray(struct.pack("<i", max(len(t) for t in texts)))
    for t, s in zip(texts, scores, strict=True):
        out += struct.pack("<fi", s, len(t)) + t
    return bytes(out)
