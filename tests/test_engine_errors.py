"""The loader refuses every damaged image cleanly, with the right status and message.

Three layers:
  * Python, through `_llm.Model(bytes)`: one bit flipped in EVERY byte of a small
    image, truncation at EVERY length, and hand-made images with valid checksums
    but impossible contents (each needs its own specific message);
  * the C program tests/c/engine_check.c under ASan + UBSan (+ LeakSanitizer):
    bit flips and truncations again, argument and context errors, and a sweep of
    port capacities (placement fallbacks must not change a single logits bit);
  * the fuzzer (tests/test_fuzz.py, target "loader").
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import cbuild
import engine_ext
import numpy as np
import pytest

_llm = engine_ext.load()

HEADER = struct.Struct("<8s16IfI32s2IfI")
SECTION = struct.Struct("<16s4I")
HEADER_BYTES, SECTION_BYTES = 128, 32
# field index in HEADER.unpack() order
F = {name: i for i, name in enumerate(
    ["magic", "version", "header_bytes", "file_bytes", "n_sections", "header_crc32", "flags",
     "vocab_rows", "vocab_out", "vocab_in_source", "dim", "n_layers", "n_heads", "ffn",
     "ple_dim", "seq_len", "group", "rope_theta", "eot_id", "sha", "arch", "n_kv_heads",
     "norm_eps", "reserved"])}


class Img:
    """A mutable image: header fields, section table and bytes, re-signed on demand."""

    def __init__(self, data: bytes) -> None:
        self.data = bytearray(data)
        self.header = list(HEADER.unpack_from(data, 0))
        n = self.header[F["n_sections"]]
        self.sections = [list(SECTION.unpack_from(data, HEADER_BYTES + SECTION_BYTES * i))
                         for i in range(n)]

    def index(self, name: str) -> int:
        names = [s[0].rstrip(b"\0").decode() for s in self.sections]
        return names.index(name)

    def payload(self, name: str) -> memoryview:
        _n, _k, off, size, _c = self.sections[self.index(name)]
        return memoryview(self.data)[off:off + size]

    def signed(self, *, section_crcs: bool = True) -> bytes:
        """Bytes with the table and header CRCs recomputed (section CRCs too if asked)."""
        if section_crcs:
            for s in self.sections:
                s[4] = zlib.crc32(self.data[s[2]:s[2] + s[3]])
        table = b"".join(SECTION.pack(*s) for s in self.sections)
        h = list(self.header)
        h[F["n_sections"]] = len(self.sections)
        h[F["header_crc32"]] = 0
        crc = zlib.crc32(table, zlib.crc32(HEADER.pack(*h)))
        h[F["header_crc32"]] = crc
        out = bytearray(self.data)
        head = HEADER.pack(*h) + table
        out[:len(head)] = head
        return bytes(out)


def open_error(data: bytes | bytearray) -> str:
    with pytest.raises(_llm.Error) as info:
        _llm.Model(bytes(data))
    return str(info.value)


@pytest.fixture(scope="module")
def tiny_bytes(tiny_model) -> bytes:  # type: ignore[no-untyped-def]
    return tiny_model.image.read_bytes()


def test_intact_image_opens(tiny_bytes: bytes) -> None:
    with _llm.Model(tiny_bytes) as m:
        assert m.config()["dim"] == 32


def test_every_single_bit_flip_is_refused(tiny_bytes: bytes) -> None:
    img = Img(tiny_bytes)
    n = len(img.sections)
    table_end = HEADER_BYTES + SECTION_BYTES * n
    owner = np.full(len(tiny_bytes), -1, np.int64)  # section index per byte, -1 = padding
    for i, (_name, _k, off, size, _c) in enumerate(img.sections):
        owner[off:off + size] = i
    names = [s[0].rstrip(b"\0").decode() for s in img.sections]
    data = bytearray(tiny_bytes)
    counts: dict[str, int] = {}
    for at in range(len(data)):
        data[at] ^= 1 << (at % 8)
        msg = open_error(data)
        data[at] ^= 1 << (at % 8)
        if at < 8:
            want = ("bad image: bad magic",)
        elif at < 12:
            want = ("unsupported version:",)
        elif at < 16:
            want = ("bad image: header_bytes",)
        elif at < 20:
            want = ("bad image: image is",)
        elif at < 24:  # n_sections: out of range, table past the end, or the CRC
            want = ("bad image: n_sections", "bad image: section table",
                    "checksum mismatch: header")
        elif at < table_end:
            want = ("checksum mismatch: header/section-table",)
        elif owner[at] >= 0:
            want = (f"checksum mismatch: section '{names[owner[at]]}' CRC-32",)
        else:
            want = ("bad image: padding before section",)
        assert msg.startswith(want), f"byte {at}: {msg!r}, expected one of {want}"
        kind = want[0].split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    assert counts.get("checksum mismatch", 0) > len(data) // 2
    assert counts.get("bad image", 0) > 0


def test_every_truncation_is_refused(tiny_bytes: bytes) -> None:
    for n in range(len(tiny_bytes)):
        msg = open_error(tiny_bytes[:n])
        if n < HEADER_BYTES:
            assert msg == (f"bad image: image is {n} bytes, shorter than its 128-byte header"), n
        else:
            assert msg == (f"bad image: image is {n} bytes but its header says "
                           f"{len(tiny_bytes)} (truncated or padded)"), n
    assert open_error(tiny_bytes + bytes(16)).startswith("bad image: image is")


# (description, mutation of an Img, expected message prefix); checksums are redone
# after each mutation, so only the specific check can catch it.
def _set(field: str, value: object) -> Callable[[Img], None]:
    def f(img: Img) -> None:
        img.header[F[field]] = value
    return f


def _swap_sections(img: Img) -> None:
    img.sections[4], img.sections[5] = img.sections[5], img.sections[4]


def _rename(img: Img) -> None:
    img.sections[2][0] = b"embedding".ljust(16, b"\0")


def _kind(img: Img) -> None:
    img.sections[img.index("L0.qkv")][1] = 1


def _misalign(img: Img) -> None:
    img.sections[img.index("out_norm")][2] += 4


def _shift(img: Img) -> None:
    img.sections[img.index("out_norm")][2] += 16


def _nan_norm(img: Img) -> None:
    img.payload("L1.ffn_norm")[4:8] = struct.pack("<f", float("nan"))


def _inf_scale(img: Img) -> None:
    p = img.payload("L0.up")
    rows, _cols, _g, row_bytes = struct.unpack_from("<4I", p, 0)
    p[16 + rows * row_bytes:16 + rows * row_bytes + 4] = struct.pack("<f", float("inf"))


def _nan_ple_scale(img: Img) -> None:
    p = img.payload("ple_rows")
    _rows, cols, _g, row_bytes = struct.unpack_from("<4I", p, 0)
    at = 16 + 3 * row_bytes + (cols + 1) // 2
    p[at:at + 2] = struct.pack("<e", float("nan"))


def _q4_rows(img: Img) -> None:
    p = img.payload("L0.gate")
    struct.pack_into("<I", p, 0, struct.unpack_from("<I", p, 0)[0] + 1)


def _q4_row_bytes(img: Img) -> None:
    p = img.payload("L0.down")
    struct.pack_into("<I", p, 12, struct.unpack_from("<I", p, 12)[0] + 16)


def _q4_group(img: Img) -> None:
    struct.pack_into("<I", img.payload("L1.qkv"), 8, 64)


def _tok_vocab(img: Img) -> None:
    p = img.payload("tokenizer")
    struct.pack_into("<I", p, 0, struct.unpack_from("<I", p, 0)[0] - 1)


def _tok_merge(img: Img) -> None:
    p = img.payload("tokenizer")
    struct.pack_into("<H", p, len(p) - 2, 0xFFFE)


# head_tiles of the tiny model: 280 rows, 32 columns, 3 tiles of 128
_T_ORDER, _T_SCALES, _T_BOXES = 16, 16 + 560, 16 + 560 + 16


def _tiles_repeat(img: Img) -> None:
    p = img.payload("head_tiles")
    struct.pack_into("<H", p, _T_ORDER + 2, struct.unpack_from("<H", p, _T_ORDER)[0])


def _tiles_scale(img: Img) -> None:
    struct.pack_into("<f", img.payload("head_tiles"), _T_SCALES, 1.5)


def _tiles_negative_half(img: Img) -> None:
    struct.pack_into("<b", img.payload("head_tiles"), _T_BOXES + 32, -1)


def _tiles_narrow(img: Img) -> None:
    p = img.payload("head_tiles")
    p[_T_BOXES:_T_BOXES + 64] = bytes(64)  # tile 0's box: the single point 0


def _tiles_count(img: Img) -> None:
    struct.pack_into("<I", img.payload("head_tiles"), 8, 2)


def _fine_scale(img: Img) -> None:
    p = img.payload("L0.up")
    rows, cols = struct.unpack_from("<2I", p, 0)
    struct.pack_into("<f", p, 16 + rows * ((cols + 31) // 32 * 16), 0.1)  # not an fp16 value


CASES: list[tuple[str, Callable[[Img], None], str]] = [
    ("scale not fp16", _fine_scale,
     "bad image: section 'L0.up': scale of row 0 is not an fp16 value widened to f32"),
    ("tiles order repeat", _tiles_repeat, "bad image: head_tiles: order[1] ="),
    ("tiles scale", _tiles_scale,
     "bad image: section 'head_tiles': tile 0 scale 0x3fc00000 is not a positive normal power"),
    ("tiles half < 0", _tiles_negative_half,
     "bad image: section 'head_tiles': tile 0 column 0 has a negative half-range"),
    ("tiles box too narrow", _tiles_narrow, "bad image: head_tiles: token"),
    ("tiles count", _tiles_count, "bad image: section 'head_tiles': 2 tiles of 128 rows"),
    ("version 4", _set("version", 4),
     "unsupported version: image format version 4; this engine reads 5: convert the model again"),
    ("header_bytes 256", _set("header_bytes", 256), "bad image: header_bytes is 256"),
    ("unknown flag", _set("flags", 3), "bad image: unknown flag bits 0x2"),
    ("reserved field", _set("reserved", 1),
     "bad image: header reserved field is 0x00000001, must be 0"),
    ("unknown arch", _set("arch", 2), "bad config: arch 2 is unknown (0: esp32-ai, 1: llama2.c)"),
    ("llama arch with PLE", _set("arch", 1),
     "bad config: ple_dim = 32, a llama2.c image has no PLE (0)"),
    ("zero kv heads", _set("n_kv_heads", 0), "bad config: n_kv_heads = 0 does not divide n_heads"),
    ("kv heads not dividing", _set("n_kv_heads", 3),
     "bad config: n_kv_heads = 3 does not divide n_heads 2"),
    ("esp32-ai kv heads", _set("n_kv_heads", 1),
     "bad config: n_kv_heads = 1, an esp32-ai image has n_heads (2)"),
    ("nan norm_eps", _set("norm_eps", float("nan")),
     "bad config: norm_eps must be positive and finite"),
    ("zero norm_eps", _set("norm_eps", 0.0), "bad config: norm_eps must be positive and finite"),
    ("zero dim", _set("dim", 0), "bad config: dim = 0, must be in 1..8192"),
    ("zero layers", _set("n_layers", 0), "bad config: n_layers = 0"),
    ("zero seq_len", _set("seq_len", 0), "bad config: seq_len = 0"),
    ("huge vocab", _set("vocab_rows", 1 << 30), "bad config: vocab_rows = 1073741824"),
    ("dim % heads", _set("n_heads", 3), "bad config: dim 32 is not a multiple of n_heads 3"),
    ("odd head dim", _set("n_heads", 32), "bad config: head_dim 1 is odd"),
    ("vocab_out > rows", _set("vocab_out", 281), "bad config: vocab_out 281 > vocab_rows 280"),
    ("eot out of vocab", _set("eot_id", 280), "bad config: eot_id 280 is not below vocab_out"),
    ("nan theta", _set("rope_theta", float("nan")), "bad config: rope_theta"),
    ("rows > source", _set("vocab_in_source", 279), "bad config: vocab_rows 280 exceeds"),
    ("group 16", _set("group", 16), "bad config: group 16 is neither a multiple of 32"),
    ("sections swapped", _swap_sections,
     "bad image: section 4 is named 'ple_proj_norm', expected 'ple_model_proj'"),
    ("section renamed", _rename, "bad image: section 2 is named 'embedding', expected 'embed'"),
    ("wrong kind", _kind, "bad image: section 'L0.qkv' has kind 1 (F32), expected Q4"),
    ("misaligned", _misalign, "bad image: section 'out_norm' offset"),
    ("gap", _shift, "bad image: section 'out_norm' at offset"),
    ("NaN norm", _nan_norm, "bad image: section 'L1.ffn_norm': value 1 is NaN or Inf"),
    ("Inf scale", _inf_scale, "bad image: section 'L0.up': scale of row 0 is NaN or Inf"),
    ("NaN fp16 scale", _nan_ple_scale, "bad image: section 'ple_rows': scale of row 3 is NaN"),
    ("q4 rows", _q4_rows, "bad image: section 'L0.gate': shape [25, 32], config needs [24, 32]"),
    ("q4 row_bytes", _q4_row_bytes, "bad image: section 'L0.down': row_bytes 32, layout needs 16"),
    ("q4 group", _q4_group, "bad image: section 'L1.qkv': group 64, the header says 128"),
    ("tokenizer vocab", _tok_vocab, "bad image: section 'tokenizer': n_vocab 279 != vocab_out"),
    ("tokenizer merge", _tok_merge, "bad image: section 'tokenizer': merge"),
]


@pytest.mark.parametrize("what,mutate,want", CASES, ids=[c[0] for c in CASES])
def test_specific_message(tiny_bytes: bytes, what: str, mutate: Callable[[Img], None],
                          want: str) -> None:
    img = Img(tiny_bytes)
    assert _llm.Model(img.signed()).config()["vocab_rows"] == 280  # re-signing alone is fine
    mutate(img)
    msg = open_error(img.signed())
    assert msg.startswith(want), f"{what}: {msg!r}"


def test_extra_and_missing_sections(tiny_bytes: bytes) -> None:
    img = Img(tiny_bytes)
    n = len(img.sections)  # 6 + 10 per layer + out_norm + head_tiles + drafts + weights
    assert n == 6 + 10 * 2 + 4
    img.sections.pop()
    assert open_error(img.signed()) == (f"bad image: {n - 1} sections, a 2-layer tied-head "
                                        f"model has {n}")
    img = Img(tiny_bytes)
    img.header[F["flags"]] = 0  # says untied: a head section would be needed
    assert open_error(img.signed()) == (f"bad image: {n} sections, a 2-layer untied-head "
                                        f"model has {n + 1}")


def test_untied_image_needs_its_head(test_model) -> None:  # type: ignore[no-untyped-def]
    data = test_model("tiny_untied").image.read_bytes()
    img = Img(data)
    img.header[F["flags"]] = 1  # claims tied: one section too many
    assert "tied-head model has" in open_error(img.signed())


def _set_name(img: Img, i: int, name: bytes) -> None:
    img.sections[i][0] = name.ljust(16, b"\0")


LLAMA2C_CASES = [  # (what, mutate, the C loader's message, image.py's message)
    ("kv heads not dividing", _set("n_kv_heads", 3),
     "bad config: n_kv_heads = 3 does not divide n_heads 8",
     "image header: n_kv_heads = 3 does not divide n_heads 8"),
    ("zero kv heads", _set("n_kv_heads", 0),
     "bad config: n_kv_heads = 0 does not divide n_heads 8",
     "image header: n_kv_heads = 0 does not divide n_heads 8"),
    ("PLE width", _set("ple_dim", 8), "bad config: ple_dim = 8, a llama2.c image has no PLE (0)",
     "image header: ple_dim = 8, a llama2c model has no PLE (0)"),
    ("arch esp32-ai", _set("arch", 0), "bad config: ple_dim = 0, must be in 1..65536",
     "image header: impossible dimension: ple_dim = 0"),
    ("unknown arch", _set("arch", 7), "bad config: arch 7 is unknown",
     "arch 7 is unknown (0: esp32-ai, 1: llama2.c)"),
    ("inf eps", _set("norm_eps", float("inf")), "bad config: norm_eps must be positive and finite",
     "image header: norm_eps inf must be positive and finite"),
    ("reserved", _set("reserved", 0x100), "bad image: header reserved field is 0x00000100",
     "header reserved field is 0x00000100, must be 0"),
    # all 8 kv heads: a valid header, but qkv holds q + 2 * 4 heads' rows
    ("kv heads vs qkv", _set("n_kv_heads", 8),
     "bad image: section 'L0.qkv': shape [128, 64], config needs [192, 64]",
     "section 'L0.qkv': [128, 64] group 64, the header's config needs [192, 64]"),
    # a PLE section where a llama2.c image has its first layer
    ("PLE section", lambda img: _set_name(img, 3, b"ple_rows"),
     "bad image: section 3 is named 'ple_rows', expected 'L0.attn_norm'",
     "unknown section name 'ple_rows'"),
]


@pytest.mark.parametrize("what,mutate,c_msg,py_msg", LLAMA2C_CASES,
                         ids=[c[0] for c in LLAMA2C_CASES])
def test_llama2c_bad_fields_refused_by_both_loaders(llama2c_image, what: str,  # type: ignore[no-untyped-def]
                                                    mutate: Callable[[Img], None], c_msg: str,
                                                    py_msg: str) -> None:
    from mpllm.formats.image import ImageFormatError, read_image

    img = Img(llama2c_image("untied").read_bytes())
    with _llm.Model(img.signed()) as m:  # re-signing alone is fine
        assert m.config()["arch"] == "llama2c"
    mutate(img)
    data = img.signed()
    msg = open_error(data)
    assert msg.startswith(c_msg), f"{what}: {msg!r}"
    with pytest.raises(ImageFormatError) as err:
        read_image(data)
    assert str(err.value).startswith(py_msg), f"{what}: {err.value}"


def test_path_errors(tmp_path: Path, tiny_bytes: bytes) -> None:
    import errno

    # OSError itself, as on MicroPython (tests/test_bindings.py)
    with pytest.raises(OSError) as missing:
        _llm.Model(tmp_path / "missing.img")
    with pytest.raises(OSError) as directory:
        _llm.Model(tmp_path)
    assert (missing.value.errno, directory.value.errno) == (errno.ENOENT, errno.EISDIR)
    empty = tmp_path / "empty.img"
    empty.write_bytes(b"")
    with pytest.raises(_llm.Error, match=r"^bad argument: model image '.*empty.img' is empty"):
        _llm.Model(str(empty))
    with pytest.raises(TypeError, match="path .* or a bytes-like image"):
        _llm.Model(12)
    good = tmp_path / "good.img"
    good.write_bytes(tiny_bytes)
    with _llm.Model(good) as m:
        assert m.pos() == 0


def test_misaligned_buffer_is_copied(tiny_bytes: bytes) -> None:
    buf = bytearray(len(tiny_bytes) + 1)
    buf[1:] = tiny_bytes
    view = memoryview(buf)[1:]
    with _llm.Model(view) as a, _llm.Model(tiny_bytes) as b:
        assert a.prefill([1, 2, 3]) == b.prefill([1, 2, 3])
        assert a.logits() == b.logits()


def _engine_check() -> Path:
    eng, port = cbuild.ENGINE, cbuild.PORT_HOST
    binding = cbuild.ROOT / "native" / "binding"
    sources = [*cbuild.engine_sources(), port / "port_host.c", binding / "llm_bind.c",
               cbuild.CTESTS / "engine_check.c"]
    # cbuild's stamp covers the sources and the command: a define carrying a hash of
    # the headers makes a header change rebuild too
    headers = sorted(eng.glob("*.h")) + sorted(port.glob("*.h")) + sorted(binding.glob("*.h"))
    tag = zlib.crc32(b"".join(h.read_bytes() for h in headers))
    return cbuild.build("engine_check", sources, cbuild.ROOT / "build" / "ctests",
                        sanitize=True, opt="-O1", defines={"LLM_HEADERS_TAG": f"{tag}u"},
                        # every llm_open_with call counted (engine_check.c: opens_made)
                        extra=["-I", str(binding), "-Wl,--wrap=llm_open_with"])


@pytest.mark.parametrize("name", ["tiny", "tiny_untied", "llama2c_tied"])
def test_c_engine_check_under_sanitizers(engine_image, name: str) -> None:  # type: ignore[no-untyped-def]
    program = _engine_check()
    result = cbuild.run(program, str(engine_image(name)),
                        env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
                             "UBSAN_OPTIONS": "print_stacktrace=1"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "0 failures" in result.stdout, out
    assert "capacity sweep:" in result.stdout and "bit flips" in result.stdout, out
    # every plan was checked against its open, and Model() opened once at most
    plans = re.search(r"plans: (\d+) checked against their opens; Model\(\) opened at most "
                      r"(\d+) time", result.stdout)
    assert plans and int(plans[1]) > 0 and plans[2] == "1", out
    assert "plan reuse: the checks kept for the same bytes, refused for others" in result.stdout, out
    fit = re.search(r"fitting context: (\d+) caps by the seq_len, (\d+) by a story's context "
                    r"\((\d+)\), (\d+) with every weight in RAM, (\d+) the longest that opens, "
                    r"(\d+) refused", result.stdout)
    assert fit, out
    by_seq, by_story, story, in_ram, longest, refused = (int(n) for n in fit.groups())
    assert by_seq > 0 and in_ram > 0 and longest > 0 and refused > 0, out
    # a story's context is a choice apart only where the seq_len is longer (llama2c: 512)
    assert (by_story > 0) == (story == 256), out
    # tiny's V rows (dim 32) cannot outgrow int16 dots: the float V waits for plain mode
    placed_by_plain = "plain memory: the float V (" in result.stdout
    assert placed_by_plain == name.startswith("tiny"), out
    assert "k_dots memory: its scratch placed once, refused without room" in result.stdout, out
    assert ("preload hook: counted by the host port when on, never when off, same tokens"
            in result.stdout), out
    assert "head gives way: at " in result.stdout, out
    assert "logits identical" in result.stdout, out
    assert "sampled split: 24 top-40 tokens identical" in result.stdout, out
