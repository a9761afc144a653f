"""llm: the thin loop that runs on the board, on MicroPython unix and on CPython.

The heavy lifting (the forward pass, sampling) is the native module `_llm`.
This module turns text into token ids and back, and drives the generation
loop. The same file must run unmodified on MicroPython 1.28 (ESP32-S3 and
unix port) and on CPython 3.10+, so it sticks to what both have: no `re`, no
dataclasses, no typing imports, and few imports at module level.

Layout of this file:
  1. Tokenizer  -- plain-Python byte-level BPE over the image's tokenizer
                   section (owned by the tokenizer work; self-contained:
                   names starting with `_tok`/`_TOK` or listed in its block).
  2. Generation -- generate/story/chat around `_llm` (below the tokenizer).
"""

# ============================================================================
# 1. Tokenizer
# ============================================================================
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
# Generated from unicodedata (Unicode 14.0); tests/test_tokenizer.py checks it.
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


class Tokenizer:
    """Byte-level BPE encoder/decoder over a KIND_TOKENIZER section.

    Tokenizer(section): `section` is any bytes-like object holding exactly the
    section payload (bytes, bytearray or a memoryview of mapped flash); it is
    kept and read in place, not copied. Raises ValueError on a malformed
    section.
    """

    def __init__(self, section):
        buf = section
        size = len(buf)
        if size < 16 + 512:
            raise ValueError(f"tokenizer section is {size} bytes, too short for its header")
        n = _tok_u32(buf, 0)
        n_merges = _tok_u32(buf, 4)
        n_special = _tok_u32(buf, 8)
        if _tok_u32(buf, 12) != 0:
            raise ValueError("tokenizer section: reserved field is not 0 (newer format?)")
        if n == 0 or n > 65536:
            raise ValueError(f"tokenizer section: vocabulary size {n} out of range 1..65536")
        if n_special == 0:
            raise ValueError("tokenizer section: no special tokens (needs <|endoftext|>)")
        off = 16 + 512 + 2 * n_special
        off += -off % 4
        lengths_off = off
        if lengths_off + n > size:
            raise ValueError("tokenizer section truncated in the token lengths")
        text_off = lengths_off + n
        # Every _TOK_STRIDE-th token's text offset: token_bytes() adds up at
        # most _TOK_STRIDE - 1 lengths instead of RAM for n offsets.
        from array import array

        starts = array("I", bytes(4 * ((n + _TOK_STRIDE - 1) // _TOK_STRIDE)))
        mv = memoryview(buf)
        pos = text_off
        for i in range(0, n, _TOK_STRIDE):
            starts[i // _TOK_STRIDE] = pos
            chunk = mv[lengths_off + i : lengths_off + min(i + _TOK_STRIDE, n)]
            if min(chunk) == 0:
                raise ValueError(
                    f"tokenizer section: a token in {i}..{i + _TOK_STRIDE - 1} has no text"
                )
            pos += sum(chunk)
        merges_off = pos + (-pos % 2)
        if merges_off + 6 * n_merges != size:
            raise ValueError(
                f"tokenizer section is {size} bytes, its tables need {merges_off + 6 * n_merges}"
            )
        self._buf = buf
        self._lengths_off = lengths_off
        self._starts = starts
        self._merges_off = merges_off
        self.vocab_size = n
        self.n_merges = n_merges

        byte_ids = []
        for b in range(256):
            i = _tok_u16(buf, 16 + 2 * b)
            if i != _TOK_NO_ID and i >= n:
                raise ValueError(f"tokenizer section: byte {b} maps to id {i} >= {n}")
            byte_ids.append(i)
        self._byte_ids = byte_ids

        specials = []
        eot = -1
        for k in range(n_special):
            i = _tok_u16(buf, 16 + 512 + 2 * k)
            if i >= n:
                raise ValueError(f"tokenizer section: special id {i} >= {n}")
            specials.append(i)
            if self.token_bytes(i) == _TOK_EOT_TEXT:
                eot = i
        if eot < 0:
            raise ValueError("tokenizer section: no special token is <|endoftext|>")
        self.special_ids = specials
        self.eot_id = eot

        # Merge lookup: an open-addressing table of rank + 1 (0 = empty slot),
        # at most half full, keyed by a hash of the pair; the pair itself is
        # read back from the section to confirm a hit. Not a dict: a
        # MicroPython dict only grows when completely full, so 25k inserts
        # with linear probing took 13 us each even on a PC.
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
            if left >= n or right >= n or (buf[o + 4] | buf[o + 5] << 8) >= n:
                raise ValueError(f"tokenizer section: merge {r} uses an id >= {n}")
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

    def _rank(self, left, right):
        """Rank of the merge (left, right), or -1 if there is none."""
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

    @classmethod
    def from_image(cls, image):
        """Tokenizer from a whole model image (bytes-like), found by section name."""
        if len(image) < 128 or bytes(image[0:8]) != b"MPLLMIMG":
            raise ValueError("not an mpllm model image (bad magic)")
        table = _tok_u32(image, 12)
        count = _tok_u32(image, 20)
        for k in range(count):
            e = table + 32 * k
            if e + 32 > len(image):
                raise ValueError("model image truncated in its section table")
            if bytes(image[e : e + 16]).rstrip(b"\0") == b"tokenizer":
                off = _tok_u32(image, e + 20)
                size = _tok_u32(image, e + 24)
                if off + size > len(image):
                    raise ValueError("model image truncated in its tokenizer section")
                return cls(memoryview(image)[off : off + size])
        raise ValueError("model image has no tokenizer section")

    def token_bytes(self, i):
        """Raw bytes of token `i` (a special token gives its literal text)."""
        if i < 0 or i >= self.vocab_size:
            raise ValueError(f"token id {i} out of range 0..{self.vocab_size - 1}")
        buf = self._buf
        lo = self._lengths_off
        first = i - i % _TOK_STRIDE
        pos = self._starts[first // _TOK_STRIDE]
        for k in range(first, i):
            pos += buf[lo + k]
        return bytes(buf[pos : pos + buf[lo + i]])

    def decode(self, ids):
        """Text of a token sequence; bad UTF-8 becomes U+FFFD (see Utf8Decoder)."""
        d = Utf8Decoder()
        parts = []
        for i in ids:
            parts.append(d.feed(self.token_bytes(i)))
        parts.append(d.flush())
        return "".join(parts)

    def encode(self, text):
        """Token ids of `text` (a str); see the module notes for non-ASCII text."""
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
                    self._bpe(b, start, i + 2, out)
                    i += 2
                    continue
                if i + 2 < n:
                    y = b[i + 2]
                    if (
                        (x == 0x72 and y == 0x65)
                        or (x == 0x76 and y == 0x65)  # re ve
                        or (x == 0x6C and y == 0x6C)
                    ):  # ll
                        self._bpe(b, start, i + 3, out)
                        i += 3
                        continue
            if c == 0x20 and i + 1 < n and k[i + 1] != _TOK_W:
                i += 1  # the optional leading space of a letter/number/other run
            cls = k[i]
            if cls != _TOK_W:
                i += 1
                while i < n and (k[i] == 0 or k[i] == cls):
                    i += 1
                self._bpe(b, start, i, out)
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
            self._bpe(b, start, i, out)
        return out

    def _bpe(self, b, start, end, out):
        byte_ids = self._byte_ids
        syms = []
        for p in range(start, end):
            t = byte_ids[b[p]]
            if t != _TOK_NO_ID:  # a byte without a token is dropped, as `tokenizers` does
                syms.append(t)
        n = len(syms)
        if n < 2:
            out.extend(syms)
            return
        rank = self._rank
        buf = self._buf
        mo = self._merges_off + 4
        nxt = list(range(1, n + 1))
        nxt[n - 1] = -1
        prv = list(range(-1, n - 1))
        # Queue entries are rank * n + position: min() picks the lowest rank,
        # then the leftmost position, like the `tokenizers` heap.
        queue = []
        for p in range(n - 1):
            r = rank(syms[p], syms[p + 1])
            if r >= 0:
                queue.append(r * n + p)
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
            r2 = rank(syms[p], syms[q])
            if r2 < 0:
                continue
            new = _tok_u16(buf, mo + 6 * r)
            if _tok_u16(buf, mo + 6 * r2) != new:
                continue  # stale entry: this position now holds another pair
            syms[p] = new
            syms[q] = -1
            q = nxt[q]
            nxt[p] = q
            if q >= 0:
                prv[q] = p
                r3 = rank(new, syms[q])
                if r3 >= 0:
                    queue.append(r3 * n + p)
            pp = prv[p]
            if pp >= 0:
                r3 = rank(syms[pp], new)
                if r3 >= 0:
                    queue.append(r3 * n + pp)
        for s in syms:
            if s >= 0:
                out.append(s)


class Utf8Decoder:
    """Incremental UTF-8 decoder for streaming tokens.

    feed(bytes) returns the text completed so far and keeps an unfinished
    character for the next call; flush() ends the stream. Ill-formed input
    becomes U+FFFD per maximal ill-formed subsequence, the same text that
    bytes.decode("utf-8", "replace") gives for the whole stream.
    """

    def __init__(self):
        self._pending = b""

    def feed(self, data):
        buf = self._pending + bytes(data)
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
                self._pending = buf[i:]
                return "".join(parts)
            parts.append(buf[run:i].decode("utf-8"))
            parts.append("\ufffd")
            i = j
            run = j
        parts.append(buf[run:n].decode("utf-8"))
        self._pending = b""
        return "".join(parts)

    def flush(self):
        """End of stream: an unfinished character becomes one U+FFFD."""
        left = self._pending
        self._pending = b""
        return "\ufffd" if left else ""


# ============================================================================
# 2. Generation (generate/story/chat around _llm) goes below this line.
# ============================================================================

# The loop is deliberately thin: one `_llm.Model` held open for the session,
# the prompt encoded here, one engine call per token, each token's bytes
# streamed through a Utf8Decoder. Everything numeric happens in the engine.
#
# Context: prompt + story must fit seq_len positions (256 for the release
# model). The last story token never needs to be fed back, so a prompt of n
# tokens leaves room for seq_len - n story tokens.
#
# Non-ASCII prompts are accepted everywhere (see the tokenizer notes above):
# the text is always kept exactly; only for characters outside _TOK_COVERED
# may MicroPython split the prompt into different tokens than CPython, and so
# tell a different story from the same seed.

import sys
import time

try:  # MicroPython: microsecond ticks that wrap, compared with ticks_diff
    _ticks_us = time.ticks_us
    _ticks_diff = time.ticks_diff
except AttributeError:  # CPython
    _perf_counter = time.perf_counter

    def _ticks_us():
        return int(_perf_counter() * 1000000)

    def _ticks_diff(end, start):
        return end - start


def _ms_since(start):
    """Wall milliseconds since a _ticks_us() reading."""
    return _ticks_diff(_ticks_us(), start) / 1000


# Defaults like upstream's firmware sampler; max_tokens fits a default prompt
# into the 256-token context with room to spare.
MAX_TOKENS = 200
TEMPERATURE = 0.8
TOP_K = 40
_OPTIONS = ("max_tokens", "temperature", "top_k", "seed", "draft")
#: drafted tokens one verify pass checks at most (the engine takes 8 positions:
#: the last token and up to 7 drafts)
MAX_DRAFT = 7


def prompt_lookup(context, max_len, max_ngram=3):
    """A drafter: the tokens that followed the latest earlier occurrence of the
    context's last n tokens (n = 3, 2, 1), at most max_len of them; [] if none."""
    n_ctx = len(context)
    n = min(max_ngram, n_ctx - 1)
    while n > 0:
        start = n_ctx - n - 1
        while start >= 0:
            k = 0
            while k < n and context[start + k] == context[n_ctx - n + k]:
                k += 1
            if k == n:
                return list(context[start + n:start + n + max_len])
            start -= 1
        n -= 1
    return []

STOP_EOT = "eot"  # the model wrote <|endoftext|>
STOP_BUDGET = "budget"  # max_tokens story tokens were written
STOP_CONTEXT = "context"  # prompt + story filled the context
STOP_INTERRUPTED = "interrupted"  # Ctrl-C, or the caller stopped iterating
STOP_ERROR = "error"  # an exception ended it

_model = None  # the open _llm.Model
_source = None  # what it was opened from (None: the binding's default)
_tokenizer = None
_eot_id = 0
_seq_len = 0
_vocab_out = 0
_last = {}  # stats of the last (or running) generation


def load(image=None, plain=None, fast=None):
    """Open the model once and return it (an `_llm.Model`); later calls reuse it.

    image=None: on the board, the flash `model` partition (the binding's
    default); elsewhere the model already open. On the host give the path
    of a converted image (tools/chat.py does this for you). Another image
    closes the open one first.
    plain=True turns the engine's speed-ups off (the certified head scores
    every row, nothing runs on the second core): the same stories, slower;
    False turns them back on; None leaves the setting as it is.
    fast=True (opt-in, LOSSY): attention over an int8 KV cache with a cheap
    exp; stories differ from exact mode's (bench.py --fast --quality
    measures by how much). Not together with plain=True.
    """
    global _model, _source, _tokenizer, _eot_id, _seq_len, _vocab_out
    if plain and fast:
        raise ValueError("plain (the exact reference) and fast (lossy) exclude each other")
    if _model is not None and (image is None or image is _source or image == _source):
        _set_modes(_model, plain, fast)
        return _model
    unload()
    import _llm

    try:
        model = _llm.Model() if image is None else _llm.Model(image)
    except TypeError as e:
        if image is not None:
            raise
        raise TypeError(
            "no model image: this runtime has no default model, so call "
            "llm.load(path_to_image) first (on a PC, python tools/chat.py "
            "converts and loads the demo model) (" + str(e) + ")"
        )
    try:
        cfg = model.config()
        tok = Tokenizer(model.tokenizer())
        if tok.eot_id != cfg["eot_id"]:
            raise ValueError(
                f"model image is inconsistent: its tokenizer's <|endoftext|> is id "
                f"{tok.eot_id}, its config says {cfg['eot_id']}"
            )
    except BaseException:
        model.close()
        raise
    try:
        _set_modes(model, plain, fast)
    except BaseException:
        model.close()
        raise
    _model = model
    _source = image
    _tokenizer = tok
    _eot_id = cfg["eot_id"]
    _seq_len = cfg["seq_len"]
    _vocab_out = cfg["vocab_out"]
    try:  # the tokenizer built its merge table: give the garbage back now
        import gc

        gc.collect()
    except ImportError:
        pass
    return model


def _set_modes(model, plain, fast):
    """plain= / fast= of load() (None: leave as it is). Fast mode changes the
    KV cache's form, so changing it starts the context over."""
    if fast is not None and bool(fast) != model.fast():
        was_plain = model.plain()
        model.reset()
        try:
            if fast:
                model.set_plain(False)
            model.set_fast(bool(fast))
        except BaseException:
            model.set_plain(was_plain)  # refused: the modes as they were
            raise
    if plain is not None:
        model.set_plain(plain)


def mode():
    """Which engine mode the open model runs: "plain" (the exact reference,
    every speed-up off), "exact" (the default) or "fast" (lossy, opt-in)."""
    model = load()
    return "fast" if model.fast() else "plain" if model.plain() else "exact"


def unload():
    """Close the model and drop the tokenizer (frees their memory)."""
    global _model, _source, _tokenizer
    model = _model
    _model = None
    _source = None
    _tokenizer = None
    if model is not None:
        model.close()


def tokenizer():
    """The open model's Tokenizer (opens the default model if none is open)."""
    load()
    return _tokenizer


def _fresh_seed():
    """A new non-zero sampling seed (30 bits: a small int on MicroPython)."""
    s = 0
    try:
        import os

        b = os.urandom(4)
        s = b[0] | b[1] << 8 | b[2] << 16 | (b[3] & 0x3F) << 24
    except (ImportError, AttributeError, OSError, NotImplementedError):
        pass
    if not s:
        s = _ticks_us() & 0x3FFFFFFF
    return s or 1


def _options(options):
    """(max_tokens, temperature, top_k, seed) from keyword options, checked."""
    for name in options:
        if name not in _OPTIONS:
            raise TypeError(f"unknown option {name!r}; the options are: " + ", ".join(_OPTIONS))
    max_tokens = options.get("max_tokens", MAX_TOKENS)
    temperature = options.get("temperature", TEMPERATURE)
    top_k = options.get("top_k", TOP_K)
    seed = options.get("seed", None)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise TypeError(f"max_tokens must be an int, not {type(max_tokens).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature must be a number, not {type(temperature).__name__}")
    if not temperature >= 0 or temperature > 3.0e38:  # `not >=` also catches NaN
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int, not {type(top_k).__name__}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 means all tokens), got {top_k}")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
        if seed < 0 or seed >> 64:
            raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    return max_tokens, float(temperature), top_k, seed


def _prompt_ids(prompt):
    """Token ids of a prompt, or a clear error why it cannot start a story."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, not {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError("empty prompt: give the story a beginning, e.g. 'Once upon a time'")
    tok = _tokenizer
    ids = tok.encode(prompt)
    if tok.decode(ids) != prompt:  # a byte without a token would be dropped silently
        raise ValueError("prompt has characters this model's tokenizer cannot represent")
    n = len(ids)
    if n >= _seq_len:
        raise ValueError(
            f"prompt too long: it is {n} tokens and the context holds {_seq_len}, "
            f"so a prompt can have at most {_seq_len - 1} (leaving room for the story)"
        )
    return ids


def generate(prompt, **options):
    """Write a story after `prompt`; returns an iterator of text pieces.

    Options (keyword only):
      max_tokens   story tokens at most (default 200; <|endoftext|> not counted)
      temperature  0 = greedy, else sample from softmax(logits / temperature)
                   (default 0.8, like upstream)
      top_k        sample among the k most likely tokens, 0 = all (default 40)
      seed         sampling seed: the same seed gives the same story on the
                   PC and on the board. Default: a fresh one per story (see
                   stats()["seed"]). seed=0 is greedy (the engine's rule).
      draft        speculative decoding: "auto" (the default: "ngram" when
                   the image has a drafter table and the model is not in
                   plain mode, else None), None or "none" (off), "ngram"
                   (the image's self-distilled n-gram table, Model.draft),
                   "lookup" (prompt_lookup), or a function (context ids, n)
                   -> up to n guessed next ids. The engine checks a guess
                   and the tokens after it in one pass and keeps what plain
                   decoding would have written, so the story is the same;
                   only the number of passes changes
                   (stats()["tokens_per_pass"]).

    The story stops at <|endoftext|> (never yielded), after max_tokens
    tokens, or when prompt + story fill the context; stats() then says
    which. The pieces concatenate to the story's text (prompt excluded).
    Raises ValueError/TypeError at once for a bad prompt or option.
    """
    max_tokens, temperature, top_k, seed = _options(options)
    model = load()
    # the engine's own rules for the sampler (top_k's limit is _llm.MAX_TOP_K),
    # checked now rather than once the story has started
    model.reset()
    model.sampler(temperature, top_k, 0)
    draft = drafter(model, options.get("draft", "auto"))
    ids = _prompt_ids(prompt)
    if temperature == 0:
        seed = None
    elif seed is None:
        seed = _fresh_seed()
    return _run(model, ids, max_tokens, temperature, top_k, seed, draft)


def drafter(model, draft="auto"):
    """The drafting function a draft= option names (None: decode plainly)."""
    if draft == "none":
        draft = None
    if draft is not None and not callable(draft) and draft not in ("auto", "ngram", "lookup"):
        raise ValueError(
            f"draft must be 'auto', 'ngram', 'lookup', None or a function, not {draft!r}")
    if not (hasattr(model, "verify") and hasattr(model, "rewind")):
        return None  # an engine without verify passes decodes plainly
    has_table = hasattr(model, "draft") and model.config().get("max_draft", 0) > 0
    if draft == "auto":
        plain = model.plain() if hasattr(model, "plain") else False
        draft = "ngram" if has_table and not plain else None
    if draft == "ngram":
        if not has_table:
            raise ValueError("draft='ngram': this image has no n-gram drafter table "
                             "(convert it without --drafter-stories 0)")
        return lambda context, n: model.draft(context[-3:], n)
    if draft == "lookup":
        return prompt_lookup
    return draft


def _run(model, ids, max_tokens, temperature, top_k, seed, draft=None):
    global _last
    start = _ticks_us()
    n_prompt = len(ids)
    stats = {
        "stop": None,
        "prompt_tokens": n_prompt,
        "tokens": 0,
        "max_tokens": max_tokens,
        "seq_len": _seq_len,
        "temperature": temperature,
        "top_k": top_k,
        "seed": seed,
        "ttft_ms": None,
        "engine_ttft_ms": None,
        "engine_ms_per_token": None,
        "wall_ms": None,
        "tok_per_s": None,
        "head_rows_fraction": None,
        "produced": 0,
        "passes": 0,
        "drafted": 0,
        "accepted": 0,
        "tokens_per_pass": None,
    }
    _last = stats
    budget = min(max_tokens, _seq_len - n_prompt)
    token_bytes = _tokenizer.token_bytes
    eot = _eot_id
    decoder = Utf8Decoder()
    stop = STOP_INTERRUPTED
    n = 0
    at_prefill = None
    try:
        model.reset()
        if seed is None:
            model.sampler(0.0, 0, 0)
        else:
            model.sampler(temperature, top_k, seed)
        token = model.prefill(ids)
        stats["ttft_ms"] = _ms_since(start)
        at_prefill = model.stats()
        following = decode_tokens(model, token, budget - 1, draft, list(ids), eot, stats)
        while token != eot:
            n += 1
            stats["tokens"] = n
            piece = decoder.feed(token_bytes(token))
            if piece:
                yield piece
            if n >= budget:
                break
            token = next(following)
        if token == eot:
            stop = STOP_EOT
        elif n >= max_tokens:
            stop = STOP_BUDGET
        else:
            stop = STOP_CONTEXT
        piece = decoder.flush()
        if piece:
            yield piece
    except Exception:
        stop = STOP_ERROR  # the engine raised: pass it on, but say so in stats()
        raise
    finally:
        wall = _ms_since(start)
        stats["stop"] = stop
        stats["wall_ms"] = wall
        if wall > 0:
            stats["tok_per_s"] = n * 1000 / wall
        if at_prefill is not None:
            stats["engine_ttft_ms"] = at_prefill["ttft_ms"]
            end = model.stats()
            produced = stats["produced"]
            if produced > 0:
                stats["engine_ms_per_token"] = (end["total_ms"] - at_prefill["total_ms"]) / produced
            if stats["passes"]:
                stats["tokens_per_pass"] = produced / stats["passes"]
            if end.get("heads") and "head_rows" in end:  # (a test double has no counters)
                stats["head_rows_fraction"] = end["head_rows"] / (end["heads"] * _vocab_out)


def decode_tokens(model, token, n, draft=None, context=None, eot=None, counts=None):
    """The n tokens plain decoding writes after `token` (the engine's last
    choice, not yet fed), one at a time: model.step, or with a drafter
    (function (context ids, n) -> guesses; `context` the ids fed so far)
    verify passes that feed the token and up to MAX_DRAFT guesses at once
    and keep what plain decoding would have chosen, so the tokens are the
    same. No guess is kept past `eot`. `counts` (a dict) gets produced
    (tokens the engine chose), passes, drafted and accepted added to it."""
    if counts is None:
        counts = {}
    for key in ("produced", "passes", "drafted", "accepted"):
        counts.setdefault(key, 0)
    cfg = model.config()
    seq_len = cfg["seq_len"]
    vocab = cfg["vocab_out"]
    ahead = []  # tokens a verify pass chose beyond the one it yielded
    made = 0
    while made < n:
        if ahead:
            token = ahead.pop(0)
        elif draft is None:
            token = model.step(token)
            counts["produced"] += 1
        else:
            context.append(token)
            n_guess = min(MAX_DRAFT, min(n - made, seq_len - model.pos()) - 1)
            guess = list(draft(context, n_guess))[:n_guess] if n_guess > 0 else []
            for g in guess:  # a guess is a token id of this model, or an error now
                if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < vocab:
                    raise ValueError(f"the drafter returned {g!r}, not a token id 0..{vocab - 1}")
            at = model.pos()
            got = model.verify([token] + guess)
            a = 0  # guesses kept
            while a < len(guess) and guess[a] == got[a] and got[a] != eot:
                a += 1
            model.rewind(at + a + 1)
            context.extend(guess[:a])
            counts["passes"] += 1
            counts["drafted"] += len(guess)
            counts["accepted"] += a
            counts["produced"] += a + 1
            ahead = got[1:a + 1]
            token = got[0]
        made += 1
        yield token


def stats():
    """Numbers of the last generation (a copy; filled in as it runs).

    stop: "eot", "budget", "context", "interrupted", "error" (None while
    running);
    prompt_tokens, tokens (story tokens, <|endoftext|> not counted),
    max_tokens, seq_len, temperature, top_k, seed (None when greedy);
    ttft_ms (wall clock to the first story token, prompt included),
    engine_ttft_ms (the engine's own prefill time), engine_ms_per_token
    (engine time per story token after the first), wall_ms and tok_per_s
    (round trip: story tokens per wall-clock second, output included),
    head_rows_fraction (share of the head's rows the engine scored: the
    certified head skips rows that cannot be chosen; 1.0 in plain mode);
    with a drafter: passes (verify passes), drafted and accepted (guessed
    tokens, and those the engine agreed with), tokens_per_pass.
    """
    return dict(_last)


def stop_message(s=None):
    """Why the last story stopped, as story() prints it ("" for <|endoftext|>)."""
    if s is None:
        s = _last
    stop = s.get("stop")
    if stop == STOP_BUDGET:
        return f"[stopped: token budget {s['max_tokens']} reached]"
    if stop == STOP_CONTEXT:
        return f"[stopped: context full ({s['seq_len']} tokens)]"
    if stop == STOP_INTERRUPTED:
        return "[stopped: interrupted]"
    if stop == STOP_ERROR:
        return "[stopped: error]"
    return ""


def _write(text):
    sys.stdout.write(text)
    flush = getattr(sys.stdout, "flush", None)
    if flush is not None:
        flush()


def _shown(text):
    """`text` safe for a terminal: control characters other than newline and
    tab become U+FFFD. A byte-level model can emit any byte; raw, ESC would
    drive the terminal and 0x04 ends mpremote's output early."""
    for c in text:
        if (c < " " and c != "\n" and c != "\t") or "\x7f" <= c <= "\x9f":
            break
    else:
        return text  # the usual case: nothing to replace, nothing allocated
    out = []
    for c in text:
        if (c < " " and c != "\n" and c != "\t") or "\x7f" <= c <= "\x9f":
            c = "\ufffd"
        out.append(c)
    return "".join(out)


def story(prompt="Once upon a time", **options):
    """Print a story that starts with `prompt`, as it is written.

    Takes generate()'s options. Control characters in the story are shown
    as U+FFFD (generate() gives the raw text). After the story, says why it
    stopped unless the model ended it itself. Ctrl-C stops the story (and is raised again
    after the note, so a script can still be interrupted).
    """
    pieces = generate(prompt, **options)
    _write(prompt)
    try:
        for piece in pieces:
            _write(_shown(piece))
    except KeyboardInterrupt:
        pieces.close()
        _write("\n" + stop_message() + "\n")
        raise
    finally:
        pieces.close()  # MicroPython does not close an abandoned generator
    note = stop_message()
    _write("\n" + note + "\n" if note else "\n")


def chat(**options):
    """Ask for story beginnings and tell the stories, until told to stop.

    Takes generate()'s options (a seed then gives every story the same seed).
    An empty line, Ctrl-D or Ctrl-C at the prompt leaves; Ctrl-C during a
    story stops only that story.
    """
    _options(options)  # a bad option fails now, not after the first prompt
    load()
    _write(
        "Type the beginning of a story and press Enter.\n"
        "An empty line or Ctrl-D leaves; Ctrl-C stops a story.\n"
    )
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            _write("\n")
            return
        line = line.strip()
        if not line:
            return
        try:
            story(line, **options)
        except KeyboardInterrupt:
            pass  # story() has said it stopped; back to the prompt
        except ValueError as e:
            _write(str(e) + "\n")
