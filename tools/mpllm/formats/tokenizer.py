"""Host side of the tokenizer: read a Hugging Face tokenizer.json, check that it
is the kind of byte-level BPE the esp32-ai release ships, and lay its tables
out as the image's KIND_TOKENIZER section (see native/engine/image_format.h).

The board never sees tokenizer.json: it gets only the section written here and
encodes/decodes with the plain-Python `llm.Tokenizer` (firmware/modules/llm_tokenizer.py). Everything the JSON may
say that the plain tokenizer cannot honour is rejected here, each with its own
message, so a model that converts is a model whose prompts encode the same on
the host and on the board.

Tokenizers made here (a synthetic one for test models, one trained for the
demo model) are in mpllm.training.tokenizers.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

EOT_TEXT = "<|endoftext|>"
MAX_TOKEN_BYTES = 255  # lengths are stored as u8
MAX_IDS = 65536  # ids are stored as u16
_NO_ID = 0xFFFF
#: KIND_TOKENIZER header flag (image_format.h): llama2.c's sentencepiece rules
SENTENCEPIECE_FLAG = 1
#: KIND_TOKENIZER's fixed start (image_format.h llm_image_tokenizer_header):
#: n_vocab, n_merges, n_special, flags, then byte_ids[256]
HEADER = struct.Struct("<4I256H")


class TokenizerFormatError(ValueError):
    """tokenizer.json is not a byte-level BPE the plain-Python tokenizer can reproduce."""


def _byte_symbols() -> list[str]:
    """Byte value -> the printable character byte-level BPE uses for it.

    Printable Latin-1 bytes stand for themselves; the remaining 68 bytes
    (controls, space, DEL, NBSP, soft hyphen...) are shifted to U+0100 upwards
    in byte order, so every byte has a visible, non-space symbol.
    """
    keeps_itself = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    symbols = []
    shifted = 0
    for b in range(256):
        if b in keeps_itself:
            symbols.append(chr(b))
        else:
            symbols.append(chr(0x100 + shifted))
            shifted += 1
    return symbols


BYTE_SYMBOLS: list[str] = _byte_symbols()
SYMBOL_TO_BYTE: dict[str, int] = {s: b for b, s in enumerate(BYTE_SYMBOLS)}


@dataclass(frozen=True)
class TokenizerTables:
    """What the image keeps of a tokenizer: enough to encode and decode exactly."""

    vocab_size: int
    eot_id: int
    token_bytes: list[bytes]  # per id; special tokens as their literal UTF-8 text
    merges: list[tuple[int, int, int]]  # (left, right, merged) in rank order
    byte_ids: list[int]  # 256 entries, 0xFFFF where the vocabulary lacks the byte
    special_ids: list[int]  # ascending; always includes eot_id (sentencepiece: BOS, EOS)
    #: sentencepiece (llama2.c's tokenizer.bin, see mpllm.formats.llama2c): one
    #: priority per merge, equal for merges of equally scored tokens; None for
    #: byte-level BPE, where a merge's priority is its index
    ranks: list[int] | None = None


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise TokenizerFormatError(message)


def _symbols_to_bytes(token: str, where: str) -> bytes:
    out = bytearray()
    for ch in token:
        b = SYMBOL_TO_BYTE.get(ch)
        _require(
            b is not None,
            f"{where}: token {token!r} contains {ch!r} (U+{ord(ch):04X}), "
            "which is not a byte-level BPE symbol",
        )
        out.append(b)
    return bytes(out)


def _parse_merge(entry: object, rank: int) -> tuple[str, str]:
    # tokenizers < 0.20 writes "left right"; newer versions write ["left", "right"].
    if isinstance(entry, str):
        parts = entry.split(" ")
        _require(len(parts) == 2, f"merge {rank} {entry!r} is not 'left right'")
        return parts[0], parts[1]
    if isinstance(entry, list) and len(entry) == 2 and all(isinstance(p, str) for p in entry):
        return entry[0], entry[1]
    raise TokenizerFormatError(f"merge {rank} {entry!r} is neither 'left right' nor [left, right]")


def parse_tokenizer_json(text: str, where: str = "tokenizer.json") -> TokenizerTables:
    """Validate the JSON text of a tokenizer and return its tables."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerFormatError(f"{where} is not valid JSON: {e}") from None
    except RecursionError:  # json recurses once per level: a real tokenizer has a handful
        raise TokenizerFormatError(f"{where}: JSON nested too deeply (thousands of levels); "
                                   f"not a tokenizer") from None
    _require(isinstance(doc, dict), f"{where}: top level is not a JSON object")

    model = doc.get("model")
    _require(isinstance(model, dict), f"{where}: no 'model' object")
    _require(
        model.get("type") == "BPE",
        "{}: model type is {!r}, expected 'BPE'".format(where, model.get("type")),
    )
    _require(
        doc.get("normalizer") is None,
        "{}: has a normalizer ({!r}); the release has none and the board cannot normalize".format(
            where, (doc.get("normalizer") or {}).get("type")
        ),
    )
    pre = doc.get("pre_tokenizer")
    _require(
        isinstance(pre, dict) and pre.get("type") == "ByteLevel",
        "{}: pre_tokenizer must be a plain ByteLevel, found {!r}".format(
            where, pre.get("type") if isinstance(pre, dict) else pre
        ),
    )
    _require(
        not pre.get("add_prefix_space", False),
        f"{where}: ByteLevel pre_tokenizer has add_prefix_space=true; the release uses false",
    )
    _require(
        pre.get("use_regex", True),
        f"{where}: ByteLevel pre_tokenizer has use_regex=false; the release splits with the "
        "GPT-2 pattern (use_regex=true)",
    )
    dec = doc.get("decoder")
    _require(
        isinstance(dec, dict) and dec.get("type") == "ByteLevel",
        "{}: decoder must be ByteLevel, found {!r}".format(
            where, dec.get("type") if isinstance(dec, dict) else dec
        ),
    )
    post = doc.get("post_processor")
    _require(
        post is None or (isinstance(post, dict) and post.get("type") == "ByteLevel"),
        "{}: post_processor {!r} may add tokens; only none or ByteLevel is supported".format(
            where, post.get("type") if isinstance(post, dict) else post
        ),
    )
    _require(not model.get("byte_fallback", False), f"{where}: BPE byte_fallback is set")
    _require(
        model.get("dropout") in (None, 0, 0.0),
        "{}: BPE dropout is set ({!r})".format(where, model.get("dropout")),
    )
    _require(
        not model.get("continuing_subword_prefix"),
        "{}: BPE continuing_subword_prefix is set ({!r})".format(
            where, model.get("continuing_subword_prefix")
        ),
    )
    _require(
        not model.get("end_of_word_suffix"),
        "{}: BPE end_of_word_suffix is set ({!r})".format(where, model.get("end_of_word_suffix")),
    )
    _require(
        not model.get("ignore_merges", False),
        f"{where}: BPE ignore_merges is set; the board always applies merges",
    )

    vocab = model.get("vocab")
    _require(isinstance(vocab, dict) and vocab, f"{where}: model vocab is missing or empty")
    id_to_text: dict[int, str] = {}
    for tok, i in vocab.items():
        _require(isinstance(i, int) and i >= 0, f"{where}: token {tok!r} has invalid id {i!r}")
        _require(
            i not in id_to_text, f"{where}: id {i} used by both {id_to_text.get(i)!r} and {tok!r}"
        )
        id_to_text[i] = tok

    specials: dict[int, str] = {}
    for added in doc.get("added_tokens") or []:
        content, i = added.get("content"), added.get("id")
        _require(
            isinstance(content, str) and isinstance(i, int) and i >= 0,
            f"{where}: malformed added token {added!r}",
        )
        _require(
            added.get("special", False),
            f"{where}: added token {content!r} is not special; tokenizers would match it "
            "inside ordinary "
            "text, which the board's tokenizer does not do",
        )
        _require(
            id_to_text.get(i, content) == content,
            f"{where}: added token {content!r} has id {i}, which the vocab gives to "
            f"{id_to_text.get(i)!r}",
        )
        id_to_text[i] = content
        specials[i] = content

    n = len(id_to_text)
    _require(n <= MAX_IDS, f"{where}: {n} tokens; ids must fit in 16 bits (at most {MAX_IDS})")
    missing = [i for i in range(n) if i not in id_to_text]
    _require(
        not missing,
        f"{where}: ids are not dense 0..{n - 1}: {len(missing)} missing "
        f"(first {missing[0] if missing else 0}, largest id {max(id_to_text)})",
    )
    text_to_id = {t: i for i, t in id_to_text.items()}
    eot = text_to_id.get(EOT_TEXT)
    _require(eot is not None, f"{where}: no {EOT_TEXT} token")
    specials[eot] = EOT_TEXT

    token_bytes: list[bytes] = []
    for i in range(n):
        t = id_to_text[i]
        data = t.encode("utf-8") if i in specials else _symbols_to_bytes(t, where)
        _require(
            len(data) <= MAX_TOKEN_BYTES,
            f"{where}: token {i} is {len(data)} bytes long; "
            f"at most {MAX_TOKEN_BYTES} fit the image",
        )
        _require(len(data) > 0, f"{where}: token {i} is empty")
        token_bytes.append(data)

    byte_ids = [_NO_ID] * 256
    for b, sym in enumerate(BYTE_SYMBOLS):
        i = vocab.get(sym)
        if i is not None:
            byte_ids[b] = i
    if _NO_ID in byte_ids:
        _require(
            model.get("unk_token") is None,
            f"{where}: {byte_ids.count(_NO_ID)} byte symbols are missing and unk_token "
            f"{model.get('unk_token')!r} is set; the board cannot reproduce unknown-token handling",
        )

    raw_merges = model.get("merges")
    _require(isinstance(raw_merges, list), f"{where}: model merges is missing")
    merges: list[tuple[int, int, int]] = []
    for rank, entry in enumerate(raw_merges):
        left, right = _parse_merge(entry, rank)
        li, ri, mi = vocab.get(left), vocab.get(right), vocab.get(left + right)
        _require(
            li is not None and ri is not None,
            f"{where}: merge {rank} ({left!r}, {right!r}) uses a token that is not in the vocab",
        )
        _require(
            mi is not None,
            f"{where}: merge {rank} ({left!r}, {right!r}) makes {left + right!r}, "
            "which is not in the vocab",
        )
        merges.append((li, ri, mi))

    return TokenizerTables(
        vocab_size=n,
        eot_id=eot,
        token_bytes=token_bytes,
        merges=merges,
        byte_ids=byte_ids,
        special_ids=sorted(specials),
    )


def load_tokenizer(path: str) -> TokenizerTables:
    """Read and validate a tokenizer.json file (see `parse_tokenizer_json`)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerFormatError(f"{path} is not UTF-8: {e}") from None
    return parse_tokenizer_json(text, where=str(path))


def tokenizer_section(tables: TokenizerTables) -> bytes:
    """The KIND_TOKENIZER section payload, byte for byte as image_format.h lays it out."""
    n = tables.vocab_size
    _require(
        len(tables.token_bytes) == n,
        f"token_bytes has {len(tables.token_bytes)} entries for {n} tokens",
    )
    _require(len(tables.byte_ids) == 256, "byte_ids must have 256 entries")
    sentencepiece = tables.ranks is not None
    _require(not sentencepiece or len(tables.ranks) == len(tables.merges),  # type: ignore[arg-type]
             "sentencepiece tables need one rank per merge")
    out = bytearray(HEADER.pack(n, len(tables.merges), len(tables.special_ids),
                                SENTENCEPIECE_FLAG if sentencepiece else 0, *tables.byte_ids))
    out += struct.pack(f"<{len(tables.special_ids)}H", *tables.special_ids)
    out += bytes(-len(out) % 4)
    out += bytes(len(t) for t in tables.token_bytes)
    for t in tables.token_bytes:
        out += t
    out += bytes(-len(out) % 2)
    for m in tables.merges:
        out += struct.pack("<3H", *m)
    if sentencepiece:
        out += struct.pack(f"<{len(tables.merges)}H", *tables.ranks)  # type: ignore[misc]
    return bytes(out)
