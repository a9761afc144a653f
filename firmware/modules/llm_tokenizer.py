"""llm_tokenizer: the image's tokenizer in plain Python, on the board (frozen
next to llm.py), on MicroPython unix and on CPython.

Tokenizer(section) encodes text into token ids and decodes ids into bytes
over the image's KIND_TOKENIZER section, read in place; Utf8Decoder streams
a token's bytes into text. llm.py (the generation loop) uses both, and
re-exports them as llm.Tokenizer and llm.Utf8Decoder. check_section is the
twin of the C loader's check of the section (native/engine/image.c): the
same rules in the same order with the same words. The same file runs
unmodified on MicroPython 1.28 and CPython 3.10+: no `re`, no dataclasses,
no typing imports.
"""
#
# Format: KIND_TOKENIZER section of the model image (native/engine/image_format.h).
#
# Encoding follows Hugging Face `tokenizers` for a ByteLevel(add_prefix_space=
# false, use_regex=true) pre-tokenizer and a BPE model:
#   - split the text into pieces with the GPT-2 pattern
#       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
#     (hand-written below: MicroPython's `re` has no classes, lookahead or
#     Unicode properties);
#   - map each piece to its UTF-8 bytes, one single-byte token per byte;
#   - merge pairs in the order `tokenizers` does: always the pending pair of
#     lowest rank, the leftmost among equal ranks, with its queue semantics
#     (a stale entry is skipped when the pair at its position no longer makes
#     the same token).
#
# Non-ASCII text. The pattern classifies characters as letters (\p{L}),
# numbers (\p{N}), whitespace (\s) or other. ASCII is classified exactly
# everywhere, and so are the 25 non-ASCII whitespace characters.
#   - CPython: other non-ASCII characters are classified with `unicodedata`,
#     so encode() equals `tokenizers` for every string (for characters
#     assigned in the running Python's Unicode version; newer ones count as
#     "other" here and may be letters in `tokenizers`).
#   - MicroPython has no `unicodedata`. A built-in table (_TOK_RUNS) lists the
#     non-letter runs of the blocks in _TOK_COVERED (Latin-1 to Arabic, Latin
#     Extended Additional, Greek Extended, punctuation, symbols, arrows, box
#     drawing, dingbats, CJK punctuation, kana, fullwidth forms, variation
#     selectors, emoji), generated from Unicode 14 data, so encode() is exact
#     there too; any other non-ASCII character counts as a letter. A wrong
#     class only changes how text is split into pieces, never the text:
#     decode(encode(s)) == s holds for every string on every runtime.
#
# "<|endoftext|>" typed in a prompt is encoded as ordinary text (like
# `tokenizers` with encode_special_tokens=True), never as the special id: a
# user's prompt cannot end the story by accident. The special id appears
# only when the model produces it; decode()/token_bytes() give its literal
# text, and the generation loop stops on eot_id instead of printing it.
#
# Decoding: token_bytes(id) is the raw bytes of one token; a token may end in
# the middle of a UTF-8 character. Stream with Utf8Decoder (feed() the bytes
# of each token, print what it returns, flush() at the end); invalid or
# truncated sequences become U+FFFD exactly as bytes.decode("utf-8",
# "replace") and `tokenizers`' decoder do.
#
# Memory (release tokenizer: 25,353 tokens, 25,096 merges): the section stays
# where it is (flash on the board) and is read in place; RAM holds a merge
# hash table of u16 ranks (2 bytes x the power of two >= 2 x merges: 128 KiB),
# the 256 byte ids, and every 16th text offset (6 KiB).

_TOK_L = 1  # letter
_TOK_N = 2  # number
_TOK_W = 3  # whitespace
_TOK_O = 4  # anything else
_TOK_NO_ID = 0xFFFF
_TOK_EOT_TEXT = b"<|endoftext|>"
_TOK_STRIDE = 16  # one stored text offset per this many tokens
_TOK_SENTENCEPIECE = 1  # header flag: llama2.c's sentencepiece rules (see encode)


def _tok_ascii_classes():
    t = bytearray(128)
    for c in range(128):
        if 0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A:
            t[c] = _TOK_L
        elif 0x30 <= c <= 0x39:
            t[c] = _TOK_N
        elif c == 0x20 or 0x09 <= c <= 0x0D:
            t[c] = _TOK_W
        else:
            t[c] = _TOK_O
    return bytes(t)


_TOK_ASCII = _tok_ascii_classes()

# fmt: off
# Blocks whose classes _TOK_RUNS covers exactly (inclusive code point ranges).
_TOK_COVERED = (
    (0x80, 0x6FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
    (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F000, 0x1FAFF),
)
# Non-letter runs inside _TOK_COVERED: (first, last, class) flattened, sorted.
# Generated from unicodedata (Unicode 14.0); tests/test_llm_tokenizer.py checks it.
_TOK_RUNS = (
    0x80, 0x84, 4, 0x85, 0x85, 3, 0x86, 0x9F, 4, 0xA0, 0xA0, 3, 0xA1, 0xA9, 4, 0xAB, 0xB1, 4,
    0xB2, 0xB3, 2, 0xB4, 0xB4, 4, 0xB6, 0xB8, 4, 0xB9, 0xB9, 2, 0xBB, 0xBB, 4, 0xBC, 0xBE, 2,
    0xBF, 0xBF, 4, 0xD7, 0xD7, 4, 0xF7, 0xF7, 4, 0x2C2, 0x2C5, 4, 0x2D2, 0x2DF, 4,
    0x2E5, 0x2EB, 4, 0x2ED, 0x2ED, 4, 0x2EF, 0x36F, 4, 0x375, 0x375, 4, 0x378, 0x379, 4,
    0x37E, 0x37E, 4, 0x380, 0x385, 4, 0x387, 0x387, 4, 0x38B, 0x38B, 4, 0x38D, 0x38D, 4,
    0x3A2, 0x3A2, 4, 0x3F6, 0x3F6, 4, 0x482, 0x489, 4, 0x530, 0x530, 4, 0x557, 0x558, 4,
    0x55A, 0x55F, 4, 0x589, 0x5CF, 4, 0x5EB, 0x5EE, 4, 0x5F3, 0x61F, 4, 0x64B, 0x65F, 4,
    0x660, 0x669, 2, 0x66A, 0x66D, 4, 0x670, 0x670, 4, 0x6D4, 0x6D4, 4, 0x6D6, 0x6E4, 4,
    0x6E7, 0x6ED, 4, 0x6F0, 0x6F9, 2, 0x6FD, 0x6FE, 4, 0x1F16, 0x1F17, 4, 0x1F1E, 0x1F1F, 4,
    0x1F46, 0x1F47, 4, 0x1F4E, 0x1F4F, 4, 0x1F58, 0x1F58, 4, 0x1F5A, 0x1F5A, 4,
    0x1F5C, 0x1F5C, 4, 0x1F5E, 0x1F5E, 4, 0x1F7E, 0x1F7F, 4, 0x1FB5, 0x1FB5, 4,
    0x1FBD, 0x1FBD, 4, 0x1FBF, 0x1FC1, 4, 0x1FC5, 0x1FC5, 4, 0x1FCD, 0x1FCF, 4,
    0x1FD4, 0x1FD5, 4, 0x1FDC, 0x1FDF, 4, 0x1FED, 0x1FF1, 4, 0x1FF5, 0x1FF5, 4,
    0x1FFD, 0x1FFF, 4, 0x2000, 0x200A, 3, 0x200B, 0x2027, 4, 0x2028, 0x2029, 3,
    0x202A, 0x202E, 4, 0x202F, 0x202F, 3, 0x2030, 0x205E, 4, 0x205F, 0x205F, 3,
    0x2060, 0x206F, 4, 0x2070, 0x2070, 2, 0x2072, 0x2073, 4, 0x2074, 0x2079, 2,
    0x207A, 0x207E, 4, 0x2080, 0x2089, 2, 0x208A, 0x208F, 4, 0x209D, 0x2101, 4,
    0x2103, 0x2106, 4, 0x2108, 0x2109, 4, 0x2114, 0x2114, 4, 0x2116, 0x2118, 4,
    0x211E, 0x2123, 4, 0x2125, 0x2125, 4, 0x2127, 0x2127, 4, 0x2129, 0x2129, 4,
    0x212E, 0x212E, 4, 0x213A, 0x213B, 4, 0x2140, 0x2144, 4, 0x214A, 0x214D, 4,
    0x214F, 0x214F, 4, 0x2150, 0x2182, 2, 0x2185, 0x2189, 2, 0x218A, 0x245F, 4,
    0x2460, 0x249B, 2, 0x249C, 0x24E9, 4, 0x24EA, 0x24FF, 2, 0x2500, 0x2775, 4,
    0x2776, 0x2793, 2, 0x2794, 0x2BFF, 4, 0x3000, 0x3000, 3, 0x3001, 0x3004, 4,
    0x3007, 0x3007, 2, 0x3008, 0x3020, 4, 0x3021, 0x3029, 2, 0x302A, 0x3030, 4,
    0x3036, 0x3037, 4, 0x3038, 0x303A, 2, 0x303D, 0x3040, 4, 0x3097, 0x309C, 4,
    0x30A0, 0x30A0, 4, 0x30FB, 0x30FB, 4, 0xFE00, 0xFE0F, 4, 0xFF00, 0xFF0F, 4,
    0xFF10, 0xFF19, 2, 0xFF1A, 0xFF20, 4, 0xFF3B, 0xFF40, 4, 0xFF5B, 0xFF65, 4,
    0xFFBF, 0xFFC1, 4, 0xFFC8, 0xFFC9, 4, 0xFFD0, 0xFFD1, 4, 0xFFD8, 0xFFD9, 4,
    0xFFDD, 0xFFEF, 4, 0x1F000, 0x1F0FF, 4, 0x1F100, 0x1F10C, 2, 0x1F10D, 0x1FAFF, 4,
)
# fmt: on

_tok_unicodedata = None  # the module, or False where there is none (MicroPython)


def _tok_class(cp):
    """Class of a non-ASCII code point (see the notes above)."""
    global _tok_unicodedata
    if (
        cp == 0x85
        or cp == 0xA0
        or cp == 0x1680
        or 0x2000 <= cp <= 0x200A
        or cp == 0x2028
        or cp == 0x2029
        or cp == 0x202F
        or cp == 0x205F
        or cp == 0x3000
    ):
        return _TOK_W
    if _tok_unicodedata is None:
        try:
            import unicodedata

            _tok_unicodedata = unicodedata
        except ImportError:
            _tok_unicodedata = False
    if _tok_unicodedata:
        cat = _tok_unicodedata.category(chr(cp))
        if cat[0] == "L":
            return _TOK_L
        if cat[0] == "N":
            return _TOK_N
        return _TOK_O
    return _tok_table_class(cp)


def _tok_table_class(cp):
    """Class from the built-in table: exact inside _TOK_COVERED, else a letter."""
    runs = _TOK_RUNS
    lo = 0
    hi = len(runs) // 3
    while lo < hi:  # first run whose last code point is >= cp
        mid = (lo + hi) // 2
        if runs[3 * mid + 1] < cp:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(runs) // 3 and runs[3 * lo] <= cp:
        return runs[3 * lo + 2]
    return _TOK_L


def _tok_u16(buf, off):
    return buf[off] | buf[off + 1] << 8


def _tok_u32(buf, off):
    return buf[off] | buf[off + 1] << 8 | buf[off + 2] << 16 | buf[off + 3] << 24


_TOK_WHERE = "section 'tokenizer': "


def check_section(buf, vocab_out=-1):
    """Check a KIND_TOKENIZER payload by the rules native/engine/image.c's
    check_tokenizer applies, in the same order and with the same messages
    (its twin: tests/test_tokenizer_section_agrees.py holds them equal), so an
    image one reader accepts the other accepts. vocab_out: the image header's,
    when known (-1: only the range of a u16 id is checked). Raises ValueError
    on the first rule broken (the rule that merge ids are below n_vocab is
    checked by Tokenizer's table loop, the last step of both); returns
    (n_vocab, n_merges, n_special, sentencepiece, lengths_off, starts,
    merges_off), starts holding every _TOK_STRIDE-th token's text offset."""
    size = len(buf)
    if size < 16 + 512:
        raise ValueError(f"{_TOK_WHERE}{size} bytes, too small for its header")
    n = _tok_u32(buf, 0)
    if vocab_out >= 0 and n != vocab_out:
        raise ValueError(f"{_TOK_WHERE}n_vocab {n} != vocab_out {vocab_out}")
    if n == 0 or n > 65536:
        raise ValueError(f"{_TOK_WHERE}n_vocab {n} out of range 1..65536")
    n_merges = _tok_u32(buf, 4)
    n_special = _tok_u32(buf, 8)
    flags = _tok_u32(buf, 12)
    if flags & ~_TOK_SENTENCEPIECE:
        raise ValueError(f"{_TOK_WHERE}unknown flags {flags:#x} (newer format?)")
    sp = flags & _TOK_SENTENCEPIECE != 0
    if n_special == 0:
        raise ValueError(f"{_TOK_WHERE}no special tokens (needs an end-of-text id)")
    for b in range(256):
        i = _tok_u16(buf, 16 + 2 * b)
        if i != _TOK_NO_ID and i >= n:
            raise ValueError(f"{_TOK_WHERE}byte {b} maps to id {i} >= n_vocab {n}")
    off = 16 + 512
    if 2 * n_special > size - off:
        raise ValueError(f"{_TOK_WHERE}special ids run past the end")
    for k in range(n_special):
        i = _tok_u16(buf, off + 2 * k)
        if i >= n:
            raise ValueError(f"{_TOK_WHERE}special id {i} >= n_vocab {n}")
    if sp and n_special < 2:
        raise ValueError(f"{_TOK_WHERE}sentencepiece needs BOS and EOS ids")
    off += 2 * n_special
    off += -off % 4
    lengths_off = off
    if off > size or n > size - off:
        raise ValueError(f"{_TOK_WHERE}token lengths run past the end")
    # Every _TOK_STRIDE-th token's text offset: token_bytes() adds up at
    # most _TOK_STRIDE - 1 lengths instead of RAM for n offsets.
    from array import array

    starts = array("I", bytes(4 * ((n + _TOK_STRIDE - 1) // _TOK_STRIDE)))
    pos = lengths_off + n
    for i in range(0, n, _TOK_STRIDE):
        starts[i // _TOK_STRIDE] = pos
        # sliced, not viewed: MicroPython's _llm.Section lends no buffer
        chunk = buf[lengths_off + i : lengths_off + min(i + _TOK_STRIDE, n)]
        if min(chunk) == 0:
            k = 0
            while chunk[k]:
                k += 1
            raise ValueError(f"{_TOK_WHERE}token {i + k} has no text")
        pos += sum(chunk)
    if pos > size:
        raise ValueError(f"{_TOK_WHERE}token texts run past the end")
    merges_off = pos + (pos & 1)
    # sentencepiece: a u16 rank per merge follows the merges
    need = (8 if sp else 6) * n_merges
    if merges_off > size or need != size - merges_off:
        remain = size - merges_off if merges_off <= size else 0
        raise ValueError(f"{_TOK_WHERE}{n_merges} merges need {need} bytes after the texts, "
                         f"{remain} remain")
    if not sp:
        eot = False
        lo = lengths_off
        for i in [_tok_u16(buf, 16 + 512 + 2 * k) for k in range(n_special)]:
            first = i - i % _TOK_STRIDE
            at = starts[first // _TOK_STRIDE] + (sum(buf[lo + first : lo + i]) if i > first else 0)
            if bytes(buf[at : at + buf[lo + i]]) == _TOK_EOT_TEXT:
                eot = True
        if not eot:
            raise ValueError(f"{_TOK_WHERE}no special token is <|endoftext|>")
    return n, n_merges, n_special, sp, lengths_off, starts, merges_off


class Tokenizer:
    """Byte-level BPE encoder/decoder over a KIND_TOKENIZER section.

    Tokenizer(section, vocab_out=-1): `section` holds exactly the section
    payload: any bytes-like object (bytes, bytearray, a memoryview of mapped
    memory) or MicroPython's _llm.Section (indexing and slicing only); it is
    kept and read in place, not copied. vocab_out: the image header's, when
    known. Raises ValueError on a malformed section (check_section's rules,
    the C loader's).
    """

    def __init__(self, section, vocab_out=-1):
        buf = section
        lay = check_section(buf, vocab_out)
        n, n_merges, n_special, sp, lengths_off, starts, merges_off = lay
        self._buf = buf
        self._lengths_off = lengths_off
        self._starts = starts
        self._merges_off = merges_off
        self._ranks_off = merges_off + 6 * n_merges if sp else -1
        self.sentencepiece = sp
        self.vocab_size = n
        self.n_merges = n_merges
        self._byte_ids = [_tok_u16(buf, 16 + 2 * b) for b in range(256)]
        specials = [_tok_u16(buf, 16 + 512 + 2 * k) for k in range(n_special)]
        self.special_ids = specials
        if sp:
            # llama2.c: BOS starts every text and a story ends where the model
            # writes BOS again (a new text) or EOS.
            self.bos_id = specials[0]
            self.eot_id = specials[1]
            self.stop_ids = (specials[0], specials[1])
            self._codepoint_ids = self._single_codepoint_ids()
        else:
            eot = -1
            for i in specials:
                if self.token_bytes(i) == _TOK_EOT_TEXT:
                    eot = i  # the last one, as check_section found one
            self.bos_id = -1
            self.eot_id = eot
            self.stop_ids = (eot,)

        # Merge lookup: an open-addressing table of rank + 1 (0 = empty slot),
        # at most half full, keyed by a hash of the pair; the pair itself is
        # read back from the section to confirm a hit. Not a dict: a
        # MicroPython dict only grows when completely full, so 25k inserts
        # with linear probing took 13 us each even on a PC.
        from array import array

        size = 16
        while size < 2 * n_merges:
            size *= 2
        mask = size - 1
        wide = n_merges >= 0xFFFF
        table = array("I" if wide else "H", bytes((4 if wide else 2) * size))
        o = merges_off
        for r in range(n_merges):
            left = buf[o] | buf[o + 1] << 8
            right = buf[o + 2] | buf[o + 3] << 8
            merged = buf[o + 4] | buf[o + 5] << 8
            if left >= n or right >= n or merged >= n:
                bad = left if left >= n else right if right >= n else merged
                raise ValueError(f"{_TOK_WHERE}merge {r} uses id {bad} >= n_vocab {n}")
            h = (left * 5003 ^ right * 2749) & mask
            while True:
                e = table[h]
                if e == 0:
                    break
                o2 = merges_off + 6 * (e - 1)
                if (buf[o2] | buf[o2 + 1] << 8) == left and (
                    buf[o2 + 2] | buf[o2 + 3] << 8
                ) == right:
                    break  # a repeated pair keeps its last rank, as `tokenizers` does
                h = (h + 1) & mask
            table[h] = r + 1
            o += 6
        self._table = table
        self._mask = mask

    def _single_codepoint_ids(self):
        """sentencepiece: the id of each token whose text is one character
        (byte-fallback tokens excluded: their text is a raw byte), keyed by
        its UTF-8 bytes: the symbols encoding starts from."""
        fallback = set(self._byte_ids)
        buf = self._buf
        lo = self._lengths_off
        pos = self._starts[0]
        ids = {}
        for i in range(self.vocab_size):
            size = buf[lo + i]
            if size <= 4 and i not in fallback:
                c = buf[pos]
                if size == (1 if c < 0x80 else 2 if c < 0xE0 else 3 if c < 0xF0 else 4):
                    ids[bytes(buf[pos : pos + size])] = i
            pos += size
        return ids

    def _rank(self, left, right):
        """Index of the merge (left, right) in the table, or -1 if there is none
        (its priority: the index itself, or its stored rank for sentencepiece)."""
        table = self._table
        mask = self._mask
        buf = self._buf
        mo = self._merges_off
        h = (left * 5003 ^ right * 2749) & mask
        while True:
            e = table[h]
            if e == 0:
                return -1
            o = mo + 6 * (e - 1)
            if (buf[o] | buf[o + 1] << 8) == left and (buf[o + 2] | buf[o + 3] << 8) == right:
                return e - 1
            h = (h + 1) & mask

    def token_bytes(self, i):
        """Raw bytes of token `i` (a special token gives its literal text)."""
        if i < 0 or i >= self.vocab_size:
            raise ValueError(f"token id {i} out of range 0..{self.vocab_size - 1}")
        buf = self._buf
        lo = self._lengths_off
        first = i - i % _TOK_STRIDE
        pos = self._starts[first // _TOK_STRIDE]
        if i > first:  # the lengths before it, summed in one call (it is per story token)
            pos += sum(buf[lo + first : lo + i])
        return bytes(buf[pos : pos + buf[lo + i]])

    def token_id(self, data):
        """The id of the token whose text is the bytes `data`, as the merges
        build it (what encode() makes of them as one piece), else -1.
        sentencepiece: the merges start from characters, not bytes (see
        encode), and no space is put in front."""
        out = []
        if self.sentencepiece:
            self._merge(self._sp_symbols(data), out)
        else:
            self._bpe(data, 0, len(data), out)
        if len(out) == 1 and self.token_bytes(out[0]) == data:
            return out[0]
        return -1

    def first_bytes(self, n):
        """The first byte of the texts of tokens 0..n-1, in one pass (a
        bytearray: token_bytes() for each would re-add offsets every time)."""
        n = min(n, self.vocab_size)
        buf = self._buf
        lengths = self._lengths_off
        out = bytearray(n)
        pos = self._starts[0]
        for i in range(n):
            out[i] = buf[pos]
            pos += buf[lengths + i]
        return out

    def decode(self, ids):
        """Text of a token sequence; bad UTF-8 becomes U+FFFD (see Utf8Decoder)."""
        d = Utf8Decoder()
        parts = []
        prev = -1
        bos = self.bos_id
        for i in ids:
            if i == bos:  # sentencepiece: BOS starts a text, it is not text
                prev = i
                continue
            t = self.token_bytes(i)
            if bos >= 0 and prev == bos and t[:1] == b" ":
                t = t[1:]  # llama2.c: the text after BOS starts without its prefix space
            parts.append(d.feed(t))
            prev = i
        parts.append(d.flush())
        return "".join(parts)

    def encode(self, text, ends=None, bos=True):
        """Token ids of `text` (a str); see the module notes for non-ASCII text.

        ends (a list): gets the number of ids after each pre-tokenizer piece.
        Merges never cross pieces, so the ids up to the end of a piece stay
        the same when text is added, once that piece cannot grow or split:
        every piece but the last two (a prompt typed so far is prefilled up
        to there).

        sentencepiece (llama2.c's rules): BOS, then the text with one space
        in front, as single characters (a character the vocabulary lacks as
        its UTF-8 bytes, one byte-fallback token each), merged pair by pair,
        always the pair whose merged token scores best, the leftmost among
        equals. Merges cross the whole text, so `ends` gets one entry.
        bos=False (sentencepiece only): `text` goes on a text already begun
        (a co-writing line after the story so far): no BOS and no space put
        in front."""
        if self.sentencepiece:
            return self._encode_sentencepiece(text, ends, bos)
        b = text.encode("utf-8")
        n = len(b)
        # Class of the character starting at each byte; 0 on continuation bytes.
        k = bytearray(n)
        ascii_cls = _TOK_ASCII
        i = 0
        while i < n:
            c = b[i]
            if c < 0x80:
                k[i] = ascii_cls[c]
                i += 1
                continue
            if c < 0xE0:
                cp = (c & 0x1F) << 6 | (b[i + 1] & 0x3F)
                w = 2
            elif c < 0xF0:
                cp = (c & 0x0F) << 12 | (b[i + 1] & 0x3F) << 6 | (b[i + 2] & 0x3F)
                w = 3
            else:
                cp = (
                    (c & 0x07) << 18
                    | (b[i + 1] & 0x3F) << 12
                    | (b[i + 2] & 0x3F) << 6
                    | (b[i + 3] & 0x3F)
                )
                w = 4
            k[i] = _tok_class(cp)
            i += w

        out = []
        i = 0
        while i < n:
            start = i
            c = b[i]
            if c == 0x27 and i + 1 < n:  # contractions, case-sensitive as in GPT-2
                x = b[i + 1]
                if x == 0x73 or x == 0x74 or x == 0x6D or x == 0x64:  # s t m d
                    self._bpe(b, start, i + 2, out, ends)
                    i += 2
                    continue
                if i + 2 < n:
                    y = b[i + 2]
                    if (
                        (x == 0x72 and y == 0x65)
                        or (x == 0x76 and y == 0x65)  # re ve
                        or (x == 0x6C and y == 0x6C)
                    ):  # ll
                        self._bpe(b, start, i + 3, out, ends)
                        i += 3
                        continue
            if c == 0x20 and i + 1 < n and k[i + 1] != _TOK_W:
                i += 1  # the optional leading space of a letter/number/other run
            cls = k[i]
            if cls != _TOK_W:
                i += 1
                while i < n and (k[i] == 0 or k[i] == cls):
                    i += 1
                self._bpe(b, start, i, out, ends)
                continue
            # Whitespace run. Followed by a non-space character, it gives up
            # its last character (which then leads the next piece) unless
            # that would leave it empty: \s+(?!\S)|\s+.
            last = i
            i += 1
            while i < n and (k[i] == 0 or k[i] == _TOK_W):
                if k[i]:
                    last = i
                i += 1
            if i < n and last > start:
                i = last
            self._bpe(b, start, i, out, ends)
        return out

    def _encode_sentencepiece(self, text, ends, bos):
        out = [self.bos_id] if bos else []
        if text:
            self._merge(self._sp_symbols((" " + text if bos else text).encode("utf-8")), out)
        if ends is not None:
            ends.append(len(out))
        return out

    def _sp_symbols(self, b):
        """sentencepiece's starting symbols of the UTF-8 bytes b: one per
        character, or the byte-fallback tokens of its bytes when the
        vocabulary lacks it."""
        syms = []
        ids = self._codepoint_ids
        byte_ids = self._byte_ids
        i = 0
        n = len(b)
        while i < n:
            c = b[i]
            w = 1 if c < 0x80 else 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            t = ids.get(b[i : i + w], -1)
            if t >= 0:
                syms.append(t)
            else:
                for k in range(i, min(i + w, n)):
                    if byte_ids[b[k]] != _TOK_NO_ID:
                        syms.append(byte_ids[b[k]])
            i += w
        return syms

    def _bpe(self, b, start, end, out, ends=None):
        byte_ids = self._byte_ids
        syms = []
        for p in range(start, end):
            t = byte_ids[b[p]]
            if t != _TOK_NO_ID:  # a byte without a token is dropped, as `tokenizers` does
                syms.append(t)
        self._merge(syms, out)
        if ends is not None:
            ends.append(len(out))

    def _merge(self, syms, out):
        """Merge the symbol ids `syms` (consumed) and append the result to out."""
        n = len(syms)
        if n < 2:
            out.extend(syms)
            return
        rank = self._rank
        ro = self._ranks_off  # sentencepiece: priority = stored rank, else the index
        buf = self._buf
        mo = self._merges_off + 4
        nxt = list(range(1, n + 1))
        nxt[n - 1] = -1
        prv = list(range(-1, n - 1))
        # Queue entries are rank * n + position: min() picks the lowest rank,
        # then the leftmost position, like the `tokenizers` heap.
        queue = []
        for p in range(n - 1):
            m = rank(syms[p], syms[p + 1])
            if m >= 0:
                queue.append((m if ro < 0 else _tok_u16(buf, ro + 2 * m)) * n + p)
        while queue:
            e = min(queue)
            queue.remove(e)
            r = e // n
            p = e - r * n
            if syms[p] < 0:
                continue
            q = nxt[p]
            if q < 0:
                continue
            m = rank(syms[p], syms[q])
            if m < 0:
                continue
            new = _tok_u16(buf, mo + 6 * m)
            if ro < 0:
                if _tok_u16(buf, mo + 6 * r) != new:
                    continue  # stale entry: this position now holds another pair
            elif _tok_u16(buf, ro + 2 * m) != r:
                continue  # stale: the pair here now has another priority (it is queued with it)
            syms[p] = new
            syms[q] = -1
            q = nxt[q]
            nxt[p] = q
            if q >= 0:
                prv[q] = p
                m = rank(new, syms[q])
                if m >= 0:
                    queue.append((m if ro < 0 else _tok_u16(buf, ro + 2 * m)) * n + p)
            pp = prv[p]
            if pp >= 0:
                m = rank(syms[pp], new)
                if m >= 0:
                    queue.append((m if ro < 0 else _tok_u16(buf, ro + 2 * m)) * n + pp)
        for s in syms:
            if s >= 0:
                out.append(s)


class Utf8Decoder:
    """Incremental UTF-8 decoder for streaming tokens.

    feed(bytes) returns the text completed so far and keeps an unfinished
    character for the next call; flush() ends the stream. Ill-formed input
    becomes U+FFFD per maximal ill-formed subsequence, the same text that
    bytes.decode("utf-8", "replace") gives for the whole stream.
    `pending` holds the bytes of a character not finished yet (empty between
    characters: then a piece's text depends on its bytes alone).
    """

    def __init__(self):
        self.pending = b""

    def feed(self, data):
        if not self.pending:
            # The usual piece, plain ASCII with nothing pending, is its own
            # text: decoded once, no scan here. The lengths agree only for
            # ASCII (MicroPython's decode lets some ill-formed bytes through,
            # e.g. surrogates and overlong forms, so it is not trusted beyond).
            try:
                text = str(data, "utf-8")
                if len(text) == len(data):
                    return text
            except ValueError:  # UnicodeError: not well-formed, scanned below
                pass
        buf = self.pending + bytes(data)
        n = len(buf)
        parts = []
        run = 0  # start of the current well-formed run
        i = 0
        while i < n:
            c = buf[i]
            if c < 0x80:
                i += 1
                continue
            if 0xC2 <= c <= 0xDF:
                need = 1
                lo = 0x80
                hi = 0xBF
            elif 0xE0 <= c <= 0xEF:
                need = 2
                lo = 0xA0 if c == 0xE0 else 0x80
                hi = 0x9F if c == 0xED else 0xBF
            elif 0xF0 <= c <= 0xF4:
                need = 3
                lo = 0x90 if c == 0xF0 else 0x80
                hi = 0x8F if c == 0xF4 else 0xBF
            else:
                need = 0
            j = i + 1
            ok = need > 0
            while ok and j < n and j - i <= need:
                if not lo <= buf[j] <= hi:
                    ok = False
                    break
                lo = 0x80
                hi = 0xBF
                j += 1
            if ok and j - i == need + 1:
                i = j
                continue
            if ok:  # ran out of input mid-character: keep it for the next feed
                parts.append(buf[run:i].decode("utf-8"))
                self.pending = buf[i:]
                return "".join(parts)
            parts.append(buf[run:i].decode("utf-8"))
            parts.append("\ufffd")
            i = j
            run = j
        parts.append(buf[run:n].decode("utf-8"))
        self.pending = b""
        return "".join(parts)

    def flush(self):
        """End of stream: an unfinished character becomes one U+FFFD."""
        left = self.pending
        self.pending = b""
        return "\ufffd" if left else ""
