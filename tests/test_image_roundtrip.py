"""Model image writer/reader: exact round trips, the packed layouts, and damage detection."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import same_weights
from mpllm.formats.image import (
    ImageFormatError,
    pack_q4,
    pack_rows,
    read_image,
    unpack_q4,
    unpack_rows,
    write_image,
)
from mpllm.formats.model import Config, QMatrix, Weights
from mpllm.formats.rope import rope_table
from mpllm.training.generate import make_weights

SHAPES = {
    "tiny": Config(300, 280, 32, 2, 2, 24, 32, 64, 128),
    "odd_untied": Config(300, 270, 32, 2, 2, 23, 33, 48, 128, tied_head=False),
    "group32": Config(200, 190, 64, 2, 4, 40, 48, 32, 32),
    "release": Config(25353, 25353, 96, 6, 4, 66, 128, 256, 128),
    # llama2.c's stories260K shape: no PLE, 4 kv heads for 8 query heads
    "llama2c_untied": Config(512, 512, 64, 5, 8, 172, 0, 512, 64, tied_head=False,
                             family="llama2c", n_kv_heads=4, norm_eps=1e-5),
    "llama2c_tied": Config(512, 512, 64, 5, 8, 172, 0, 512, 64, family="llama2c",
                           n_kv_heads=4, norm_eps=1e-5),
}

# The section order of native/engine/image_format.h, written out independently.
LAYER_NAMES = ["attn_norm", "qkv", "attn_proj", "ffn_norm", "gate", "up", "down", "ple_gate",
               "ple_proj", "ple_norm"]


def expected_names(cfg: Config) -> list[str]:
    ple = cfg.family == "esp32ai"
    names = ["tokenizer", "rope", "embed"]
    names += ["ple_rows", "ple_model_proj", "ple_proj_norm"] if ple else []
    fields = LAYER_NAMES if ple else LAYER_NAMES[:7]
    names += [f"L{i}.{f}" for i in range(cfg.n_layers) for f in fields]
    names += ["out_norm"] + ([] if cfg.tied_head else ["head"]) + ["head_tiles", "drafts", "weights"]
    return names


def fake_tokenizer_section(n_vocab: int) -> bytes:
    """The smallest section both readers accept (llm_tokenizer.check_section, image.c):
    no byte tokens, no merges, one-byte texts, and the last id the <|endoftext|> special."""
    eot = b"<|endoftext|>"
    head = struct.pack("<4I", n_vocab, 0, 1, 0) + b"\xff" * 512 + struct.pack("<HH", n_vocab - 1, 0)
    for first in range(1, 16):  # token 0's length: a section that ends off a 16-byte boundary
        texts = b"a" * (first + n_vocab - 2) + eot  # (the image pads after it: tested)
        body = bytes([first] + [1] * (n_vocab - 2) + [len(eot)]) + texts
        section = head + body + b"\0" * (len(body) % 2)
        if len(section) % 16:
            return section
    raise AssertionError("unreachable: lengths 1..15 cover every residue")


def write(path: Path, cfg: Config, seed: int = 1, **kw: object):
    w = make_weights(cfg, seed)
    kw.setdefault("tokenizer_section", fake_tokenizer_section(cfg.vocab_out))
    kw.setdefault("rope", rope_table(cfg))
    kw.setdefault("source_sha256", bytes(range(32)))
    return w, write_image(path, w, **kw)


def table(data: bytes) -> list[tuple[str, int, int, int, int]]:
    n = struct.unpack_from("<I", data, 20)[0]
    out = []
    for i in range(n):
        name, kind, off, size, crc = struct.unpack_from("<16s4I", data, 128 + 32 * i)
        out.append((name.rstrip(b"\0").decode(), kind, off, size, crc))
    return out


def reseal(data: bytearray) -> bytearray:
    """Recompute the header CRC (header with the CRC field zeroed, then the table)."""
    n = struct.unpack_from("<I", data, 20)[0]
    struct.pack_into("<I", data, 24, 0)
    crc = zlib.crc32(bytes(data[:128 + 32 * n]))
    struct.pack_into("<I", data, 24, crc)
    return data


@pytest.fixture(scope="module")
def tiny_image(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    p = tmp_path_factory.mktemp("img") / "tiny.img"
    write(p, SHAPES["tiny"], vocab_in_source=300)
    return p.read_bytes()


# ---- round trips ------------------------------------------------------------------- #

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_round_trip_exact(tmp_path: Path, shape: str) -> None:
    cfg = SHAPES[shape]
    calls: list[tuple[str, int, int]] = []
    p = tmp_path / "m.img"
    w, rep = write(p, cfg, eot_id=cfg.vocab_out - 1, vocab_in_source=cfg.vocab_in + 7,
                   progress=lambda *a: calls.append(a))
    data = p.read_bytes()
    assert rep.file_bytes == len(data)
    img = read_image(p)
    same_weights(w, img.weights)
    assert img.config == cfg
    assert img.rope.dtype == np.float32 and img.rope.tobytes() == rope_table(cfg).tobytes()
    assert img.tokenizer_section == fake_tokenizer_section(cfg.vocab_out)
    h = img.header
    assert (h.vocab_rows, h.config.vocab_out, h.vocab_in_source) == (
        cfg.vocab_in, cfg.vocab_out, cfg.vocab_in + 7)
    assert h.eot_id == cfg.vocab_out - 1 and h.source_sha256 == bytes(range(32))
    assert h.tied_head == cfg.tied_head and h.file_bytes == len(data)
    # the raw header, read independently of the module
    assert data[:8] == b"MPLLMIMG"
    assert struct.unpack_from("<4I", data, 8) == (5, 128, len(data), len(expected_names(cfg)))
    assert struct.unpack_from("<12I", data, 28)[1:] == (
        cfg.vocab_in, cfg.vocab_out, cfg.vocab_in + 7, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.ffn,
        cfg.ple_dim, cfg.seq_len, cfg.group, struct.unpack("<I", struct.pack("<f", 1e4))[0])
    arch, kv_heads = (0, cfg.n_heads) if cfg.family == "esp32ai" else (1, 4)
    eps = 1e-6 if cfg.family == "esp32ai" else 1e-5
    assert struct.unpack_from("<2IfI", data, 112) == (
        arch, kv_heads, struct.unpack("<f", struct.pack("<f", eps))[0], 0)
    # q rows, then kv_dim k rows and kv_dim v rows
    kv_dim = kv_heads * (cfg.dim // cfg.n_heads)
    assert img.weights.layers[0].qkv.rows == cfg.dim + 2 * kv_dim
    # sections: spec order, 16-aligned, tightly laid out, CRCs of exactly the payload
    entries = table(data)
    assert [e[0] for e in entries] == expected_names(cfg)
    assert [tuple(s) for s in img.sections] == entries
    pos = 128 + 32 * len(entries)
    for name, _kind, off, size, crc in entries:
        assert off % 16 == 0, name
        assert pos <= off < pos + 16, name
        assert not any(data[pos:off]), name
        assert zlib.crc32(data[off:off + size]) == crc, name
        pos = off + size
    assert pos == len(data)
    # progress: one call per section, monotone, ending at the file size
    assert [c[0] for c in calls] == expected_names(cfg)
    done = [c[1] for c in calls]
    assert done == sorted(done) and done[-1] == len(data) and calls[0][2] == len(data)
    # bytes are deterministic
    again = tmp_path / "again.img"
    write(again, cfg, eot_id=cfg.vocab_out - 1, vocab_in_source=cfg.vocab_in + 7)
    assert again.read_bytes() == data
    assert sorted(x.name for x in tmp_path.iterdir()) == ["again.img", "m.img"]


def test_read_from_bytes(tiny_image: bytes) -> None:
    assert read_image(tiny_image).config == SHAPES["tiny"]
    assert read_image(memoryview(tiny_image)).config == SHAPES["tiny"]


# ---- packed layouts against the spec, written as plain loops ------------------------ #

def random_q(rows: int, cols: int, group: int, seed: int = 0) -> QMatrix:
    rng = np.random.default_rng(seed)
    q = rng.integers(-8, 8, size=(rows, cols), dtype=np.int8)
    s = rng.uniform(-1, 1, size=(rows, -(-cols // group))).astype(np.float16)
    return QMatrix(q, s, group)


@pytest.mark.parametrize("rows,cols,group", [(3, 96, 128), (2, 23, 128), (4, 100, 32),
                                             (1, 64, 64), (5, 33, 96)])
def test_pack_q4_layout(rows: int, cols: int, group: int) -> None:
    m = random_q(rows, cols, group)
    b = pack_q4(m)
    padded = -(-cols // 32) * 32
    row_bytes = padded // 2
    assert struct.unpack_from("<4I", b) == (rows, cols, group, row_bytes)
    ng = -(-cols // group)
    assert len(b) == 16 + rows * row_bytes + rows * ng * 4

    def code(r: int, c: int) -> int:
        return int(m.q[r, c]) + 8 if c < cols else 8

    for r in range(rows):
        for blk in range(padded // 32):
            for k in range(16):
                byte = b[16 + r * row_bytes + 16 * blk + k]
                assert byte == code(r, 32 * blk + k) | code(r, 32 * blk + k + 16) << 4
        for g in range(ng):
            (s,) = struct.unpack_from("<f", b, 16 + rows * row_bytes + 4 * (r * ng + g))
            assert s == float(m.scales[r, g])
    back = unpack_q4(b)
    assert back.q.tobytes() == m.q.tobytes() and back.scales.tobytes() == m.scales.tobytes()


@pytest.mark.parametrize("rows,cols,group", [(3, 768, 128), (2, 23, 128), (4, 66, 32),
                                             (2, 33, 32)])
def test_pack_rows_layout(rows: int, cols: int, group: int) -> None:
    m = random_q(rows, cols, group, seed=3)
    b = pack_rows(m)
    ncode, ng = (cols + 1) // 2, -(-cols // group)
    rb = -(-(ncode + 2 * ng) // 16) * 16
    assert struct.unpack_from("<4I", b) == (rows, cols, group, rb)
    assert len(b) == 16 + rows * rb
    for r in range(rows):
        rec = b[16 + r * rb:16 + (r + 1) * rb]
        for j in range(cols):
            nib = rec[j >> 1] >> (4 * (j & 1)) & 0xF
            assert nib == int(m.q[r, j]) + 8
        scales = np.frombuffer(rec[ncode:ncode + 2 * ng], "<f2")
        assert scales.tobytes() == m.scales[r].astype("<f2").tobytes()
        assert not any(rec[ncode + 2 * ng:])
    back = unpack_rows(b)
    assert back.q.tobytes() == m.q.tobytes() and back.scales.tobytes() == m.scales.tobytes()


def test_release_row_records_are_400_bytes() -> None:
    # One PLE row (768 int4 + 6 fp16 scales) is read per token; keep it compact.
    b = pack_rows(random_q(2, 768, 128))
    assert struct.unpack_from("<4I", b)[3] == 400


def test_pack_rejects_straddling_group_and_bad_values() -> None:
    with pytest.raises(ValueError, match="group 48 is neither a multiple of 32"):
        pack_q4(random_q(2, 96, 48))
    bad = random_q(2, 32, 128)
    bad.q[0, 0] = 9
    with pytest.raises(ValueError, match="-8..7"):
        pack_rows(bad)


def test_unpack_q4_rejects_bad_padding_and_non_fp16_scales() -> None:
    b = bytearray(pack_q4(random_q(2, 23, 128)))
    b[16 + 15] = 0x88 ^ 0x10  # column 31 of row 0 is padding: must stay code 8
    with pytest.raises(ImageFormatError, match="padding columns must hold code 8"):
        unpack_q4(bytes(b))
    b = bytearray(pack_q4(random_q(2, 32, 128)))
    struct.pack_into("<f", b, 16 + 2 * 16, 0.1)  # 0.1 is not an fp16 value
    with pytest.raises(ImageFormatError, match="not an fp16 value"):
        unpack_q4(bytes(b))
    struct.pack_into("<f", b, 16 + 2 * 16, float("inf"))
    with pytest.raises(ImageFormatError, match="non-finite scale"):
        unpack_q4(bytes(b))


def test_unpack_rows_rejects_dirty_padding() -> None:
    b = bytearray(pack_rows(random_q(2, 32, 128)))
    b[16 + 31] = 1  # row 0: 16 code bytes + 2 scale bytes, then padding
    with pytest.raises(ImageFormatError, match="row padding bytes must be zero"):
        unpack_rows(bytes(b))


# ---- damage ------------------------------------------------------------------------ #

def test_header_byte_flip_detected(tiny_image: bytes) -> None:
    for off in (44, 64, 90, 127):  # dim, seq_len, sha256, reserved
        b = bytearray(tiny_image)
        b[off] ^= 0x01
        with pytest.raises(ImageFormatError, match="header CRC mismatch"):
            read_image(bytes(b))


def test_table_byte_flip_detected(tiny_image: bytes) -> None:
    for entry in (0, 3, 10):
        for field in (0, 17, 21, 25, 29):  # name, kind, offset, size, crc
            b = bytearray(tiny_image)
            b[128 + 32 * entry + field] ^= 0x40
            with pytest.raises(ImageFormatError, match="header CRC mismatch"):
                read_image(bytes(b))


@pytest.mark.parametrize("name", ["tokenizer", "rope", "embed", "ple_rows", "ple_model_proj",
                                  "ple_proj_norm", "L0.qkv", "L1.down", "L1.ple_norm",
                                  "out_norm"])
def test_payload_byte_flip_detected(tiny_image: bytes, name: str) -> None:
    entry = next(e for e in table(tiny_image) if e[0] == name)
    for rel in (0, entry[3] // 2, entry[3] - 1):
        b = bytearray(tiny_image)
        b[entry[2] + rel] ^= 0x80
        with pytest.raises(ImageFormatError, match=f"section '{name}' CRC mismatch"):
            read_image(bytes(b))


def test_truncation_and_trailing_bytes(tiny_image: bytes) -> None:
    for cut in (len(tiny_image) - 1, len(tiny_image) // 2, 200):
        with pytest.raises(ImageFormatError, match=rf"truncated: .* {len(tiny_image)} bytes, "
                                                   rf"the file has {cut}"):
            read_image(tiny_image[:cut])
    with pytest.raises(ImageFormatError, match="file too short for an image header"):
        read_image(tiny_image[:100])
    with pytest.raises(ImageFormatError, match="trailing bytes: .* the file has"):
        read_image(tiny_image + b"\0" * 16)


def _mutated(data: bytes, fn) -> bytes:
    b = bytearray(data)
    fn(b)
    return bytes(reseal(b))


def _swap_entries(b: bytearray, i: int, j: int) -> None:
    ei, ej = bytes(b[128 + 32 * i:160 + 32 * i]), bytes(b[128 + 32 * j:160 + 32 * j])
    b[128 + 32 * i:160 + 32 * i], b[128 + 32 * j:160 + 32 * j] = ej, ei


def _set_name(b: bytearray, i: int, name: bytes) -> None:
    b[128 + 32 * i:144 + 32 * i] = name.ljust(16, b"\0")


def _add_offset(b: bytearray, i: int, delta: int) -> None:
    off = struct.unpack_from("<I", b, 128 + 32 * i + 20)[0]
    struct.pack_into("<I", b, 128 + 32 * i + 20, off + delta)


HEADER_DAMAGE = {
    "magic": (lambda b: b.__setitem__(slice(0, 8), b"MPLLMIMX"), r"bad magic b'MPLLMIMX'"),
    "version": (lambda b: struct.pack_into("<I", b, 8, 4),
                "image format version 4; this reader knows version 5: convert the model again"),
    "header_bytes": (lambda b: struct.pack_into("<I", b, 12, 256), "header_bytes 256"),
    "flags": (lambda b: struct.pack_into("<I", b, 28, 3), "unknown flag bits 0x2"),
    "reserved": (lambda b: b.__setitem__(124, 7), "header reserved field is 0x00000007, must be 0"),
    "arch": (lambda b: struct.pack_into("<I", b, 112, 2),
             r"arch 2 is unknown \(0: esp32-ai, 1: llama2.c\)"),
    "arch_llama_with_ple": (lambda b: struct.pack_into("<I", b, 112, 1),
                            r"image header: ple_dim = 32, a llama2c model has no PLE \(0\)"),
    "kv_heads_zero": (lambda b: struct.pack_into("<I", b, 116, 0),
                      "image header: n_kv_heads = 0 does not divide n_heads 2"),
    "kv_heads_not_dividing": (lambda b: struct.pack_into("<I", b, 116, 3),
                              "image header: n_kv_heads = 3 does not divide n_heads 2"),
    "kv_heads_esp32ai": (lambda b: struct.pack_into("<I", b, 116, 1),
                         r"image header: n_kv_heads = 1, an esp32-ai model has n_heads \(2\)"),
    "norm_eps_nan": (lambda b: struct.pack_into("<f", b, 120, float("nan")),
                     "image header: norm_eps nan must be positive and finite"),
    "norm_eps_negative": (lambda b: struct.pack_into("<f", b, 120, -0.5),
                          "image header: norm_eps -0.5 must be positive and finite"),
    "n_sections": (lambda b: struct.pack_into("<I", b, 20, 0), "section count 0 out of range"),
    "n_sections_wrong": (lambda b: struct.pack_into("<I", b, 20, 29),
                         "29 sections, a 2-layer tied-head model has 30"),
    "huge_layers": (lambda b: struct.pack_into("<I", b, 48, 2**31 - 1),
                    "30 sections, a 2147483647-layer tied-head model has"),
    "heads": (lambda b: struct.pack_into("<I", b, 52, 3),
              "image header: impossible dimensions: dim 32 is not divisible by n_heads 3"),
    "rows_lt_out": (lambda b: struct.pack_into("<I", b, 32, 279),
                    "output vocab 280 exceeds input vocab 279"),
    "rows_gt_source": (lambda b: struct.pack_into("<I", b, 40, 279),
                       "vocab_rows 300 exceeds vocab_in_source 279"),
    "eot": (lambda b: struct.pack_into("<I", b, 76, 280), "eot_id 280 outside"),
    "order": (lambda b: _swap_entries(b, 4, 5),
              "section 4 is 'ple_proj_norm', expected 'ple_model_proj'"),
    "unknown_name": (lambda b: _set_name(b, 3, b"ple_table"), "unknown section name 'ple_table'"),
    "duplicate": (lambda b: _set_name(b, 5, b"ple_model_proj"),
                  "missing section 'ple_proj_norm'"),
    "name_padding": (lambda b: b.__setitem__(128 + 32 * 1 + 10, 0x41), "is not NUL-padded"),
    "kind": (lambda b: struct.pack_into("<I", b, 128 + 32 * 2 + 16, 3),
             "section 'embed' has kind 3, expected 2"),
    "misaligned": (lambda b: _add_offset(b, 2, 4), "'embed' at offset .* is not 16-byte aligned"),
    "gap": (lambda b: _add_offset(b, 2, 16), "section 'embed' at offset .* expected .* gap"),
}


@pytest.mark.parametrize("case", sorted(HEADER_DAMAGE))
def test_header_and_table_damage_has_own_message(tiny_image: bytes, case: str) -> None:
    fn, pattern = HEADER_DAMAGE[case]
    with pytest.raises(ImageFormatError, match=pattern):
        read_image(_mutated(tiny_image, fn))


def test_padding_bytes_must_be_zero(tiny_image: bytes) -> None:
    # padding is covered by no CRC, so the reader checks it is zero
    entries = table(tiny_image)
    _name, _k, off, size, _c = entries[0]
    gap_at = off + size
    assert entries[1][2] > gap_at, "tokenizer section should be followed by padding"
    b = bytearray(tiny_image)
    b[gap_at] = 1
    with pytest.raises(ImageFormatError, match="non-zero padding before section 'rope'"):
        read_image(bytes(b))


def test_section_payload_shape_checked(tmp_path: Path) -> None:
    # a consistent image (valid CRCs) whose q4 header disagrees with the image header
    cfg = SHAPES["tiny"]
    p = tmp_path / "m.img"
    write(p, cfg)
    b = bytearray(p.read_bytes())
    entry = next(e for e in table(bytes(b)) if e[0] == "L0.gate")
    i = [e[0] for e in table(bytes(b))].index("L0.gate")
    struct.pack_into("<I", b, entry[2] + 8, 256)  # q4 header group 128 -> 256
    struct.pack_into("<I", b, 128 + 32 * i + 28, zlib.crc32(b[entry[2]:entry[2] + entry[3]]))
    with pytest.raises(ImageFormatError, match="section 'L0.gate': .* group 256, the header's "
                                               "config needs .* group 128"):
        read_image(bytes(reseal(b)))


def test_tokenizer_vocab_checked(tmp_path: Path) -> None:
    cfg = SHAPES["tiny"]
    with pytest.raises(ValueError, match="n_vocab == vocab_out"):
        write(tmp_path / "m.img", cfg, tokenizer_section=fake_tokenizer_section(281))
    assert not list(tmp_path.iterdir())


def test_bad_arguments_leave_no_file(tmp_path: Path) -> None:
    cfg = SHAPES["tiny"]
    with pytest.raises(ValueError, match="rope must be float32"):
        write(tmp_path / "m.img", cfg, rope=np.zeros((64, 16), np.float64))
    with pytest.raises(ValueError, match="eot_id 280 outside"):
        write(tmp_path / "m.img", cfg, eot_id=280)
    w = make_weights(cfg, 1)
    w.layers[1].up = w.layers[1].gate.take_rows(3)
    with pytest.raises(ValueError, match=r"L1.up: .* expected a \[24, 32\] QMatrix"):
        write_image(tmp_path / "m.img", w, tokenizer_section=fake_tokenizer_section(280),
                    rope=rope_table(cfg), source_sha256=bytes(32))
    assert not list(tmp_path.iterdir())


def test_failure_mid_write_leaves_no_file(tmp_path: Path) -> None:
    cfg = SHAPES["tiny"]

    def boom(name: str, done: int, total: int) -> None:
        if name == "L1.qkv":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write(tmp_path / "m.img", cfg, progress=boom)
    assert not list(tmp_path.iterdir())


def test_config_replace_roundtrip_untied_head_present(tmp_path: Path) -> None:
    cfg = dataclasses.replace(SHAPES["tiny"], tied_head=False)
    _w, rep = write(tmp_path / "m.img", cfg)
    assert [s.name for s in rep.sections[-4:]] == ["head", "head_tiles", "drafts", "weights"]
    assert read_image(tmp_path / "m.img").weights.head.q.shape == (280, 32)


def test_too_many_layers_for_the_section_table(tmp_path: Path) -> None:
    cfg = dataclasses.replace(SHAPES["tiny"], n_layers=51)  # 10 + 510 sections > 512
    with pytest.raises(ValueError, match="51 layers need 520 sections, the format allows 512"):
        write(tmp_path / "m.img", cfg)
    assert not list(tmp_path.iterdir())


def _refused_by_writer(tmp_path: Path, w: Weights, match: str) -> None:
    cfg = w.config
    with pytest.raises(ValueError, match=match):
        write_image(tmp_path / "m.img", w, tokenizer_section=fake_tokenizer_section(cfg.vocab_out),
                    rope=rope_table(cfg), source_sha256=bytes(32))
    assert not list(tmp_path.iterdir())


def test_non_finite_weights_rejected_by_writer(tmp_path: Path) -> None:
    w = make_weights(SHAPES["tiny"], 1)
    w.layers[0].ffn_norm[3] = np.nan
    _refused_by_writer(tmp_path, w, "L0.ffn_norm: non-finite values")


def test_llama2c_weights_hold_no_ple(tmp_path: Path) -> None:
    w = make_weights(SHAPES["llama2c_tied"], 1)
    assert w.ple_table is None and all(ly.ple_gate is None for ly in w.layers)
    w.ple_proj_norm = np.ones(4, np.float32)
    _refused_by_writer(tmp_path, w, "ple_proj_norm: a llama2c model has no PLE")


def test_llama2c_header_count_and_names(tmp_path: Path) -> None:
    """A llama2c image: 3 + 7 per layer + the tail (out_norm, head, head_tiles,
    drafts, weights); a PLE section name is unknown there."""
    cfg = SHAPES["llama2c_untied"]
    write(tmp_path / "m.img", cfg)
    data = (tmp_path / "m.img").read_bytes()
    assert len(table(data)) == 3 + 7 * 5 + 5
    bad = _mutated(data, lambda b: _set_name(b, 3, b"ple_rows"))
    with pytest.raises(ImageFormatError, match="unknown section name 'ple_rows'"):
        read_image(bad)
    # ple_dim must stay 0 for the llama2.c arch
    with pytest.raises(ImageFormatError, match=r"ple_dim = 8, a llama2c model has no PLE"):
        read_image(_mutated(data, lambda b: struct.pack_into("<I", b, 60, 8)))
