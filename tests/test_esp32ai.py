"""esp32-ai model.bin reader/writer: round trips and one specific error per kind of damage."""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import same_weights
from mpllm.convert import main as convert_main
from mpllm.formats.esp32ai import (
    ModelFormatError,
    encode_model_bin,
    read_model_bin,
    write_model_bin,
)
from mpllm.formats.model import Config
from mpllm.training.generate import SCALE_HIGH, SCALE_LOW, make_weights

TINY = Config(vocab_in=300, vocab_out=280, dim=32, n_layers=2, n_heads=2, ffn=24, ple_dim=32,
              seq_len=64, group=128)


# ---- independent layout walker (does not use the module under test) ---------------- #

def tensor_offsets(cfg: Config, header: int = 56) -> dict[str, int]:
    """Byte offset of every tensor record, computed from the model.bin layout directly."""
    d, lp, g = cfg.dim, cfg.n_layers * cfg.ple_dim, cfg.group
    out, pos = {}, header

    def q(name: str, rows: int, cols: int) -> None:
        nonlocal pos
        out[name] = pos
        pos += 4 + rows * ((cols + 1) // 2) + rows * -(-cols // g) * 2

    def f(name: str, n: int) -> None:
        nonlocal pos
        out[name] = pos
        pos += 4 * n

    q("tok_emb", cfg.vocab_in, d)
    q("ple_model_proj", lp, d)
    f("ple_proj_norm", cfg.ple_dim)
    q("ple_table", cfg.vocab_in, lp)
    for i in range(cfg.n_layers):
        f(f"{i}.attn_norm", d)
        q(f"{i}.qkv", 3 * d, d)
        q(f"{i}.attn_proj", d, d)
        f(f"{i}.ffn_norm", d)
        q(f"{i}.gate", cfg.ffn, d)
        q(f"{i}.up", cfg.ffn, d)
        q(f"{i}.down", d, cfg.ffn)
        q(f"{i}.ple_gate", cfg.ple_dim, d)
        q(f"{i}.ple_proj", d, cfg.ple_dim)
        f(f"{i}.ple_norm", d)
    f("out_norm", d)
    if not cfg.tied_head:
        q("head", cfg.vocab_out, d)
    out["end"] = pos
    return out


@pytest.fixture(scope="module")
def tiny_bin() -> bytes:
    return encode_model_bin(make_weights(TINY, 5))


# ---- round trips ------------------------------------------------------------------- #

@pytest.mark.parametrize("cfg", [
    TINY,
    dataclasses.replace(TINY, tied_head=False, vocab_out=250),
    # odd widths: nibble padding at the end of every row of down / ple_proj / ple_table
    dataclasses.replace(TINY, ffn=23, ple_dim=33),
    # several groups per row (ple_table has 64 columns: 2 groups of 32)
    dataclasses.replace(TINY, group=32),
    dataclasses.replace(TINY, n_layers=3, ple_dim=64, group=64),
], ids=["tied", "untied", "odd", "group32", "group64"])
def test_round_trip_v1(tmp_path: Path, cfg: Config) -> None:
    w = make_weights(cfg, 1)
    p = tmp_path / "model.bin"
    write_model_bin(w, p)
    data = p.read_bytes()
    assert len(data) == tensor_offsets(cfg)["end"]
    assert data[:4] == b"PLE\0"
    back = read_model_bin(p)
    same_weights(w, back)
    # re-encoding what was read gives the same bytes
    assert encode_model_bin(back) == data
    assert not list(tmp_path.glob(".*tmp"))


def test_round_trip_legacy(tmp_path: Path) -> None:
    w = make_weights(TINY, 2)
    p = tmp_path / "legacy.bin"
    write_model_bin(w, p, legacy=True)
    data = p.read_bytes()
    assert data[:4] == b"PLE1"
    assert struct.unpack_from("<8if", data, 4) == (300, 32, 2, 2, 24, 32, 64, 128, 10000.0)
    assert len(data) == tensor_offsets(TINY, header=40)["end"]
    same_weights(w, read_model_bin(data, vocab_out=280))
    # the legacy stream equals the v1 stream after the header
    assert data[40:] == encode_model_bin(w)[56:]


def test_golden_model_bin_round_trips(golden) -> None:
    data = golden.model_bin.read_bytes()
    w = read_model_bin(data)
    dims = golden.meta["dims"]
    got = dataclasses.asdict(w.config)
    # the family fields model.bin does not carry: an esp32-ai model's fixed values
    assert (got.pop("family"), got.pop("n_kv_heads"), got.pop("norm_eps")) == (
        "esp32ai", 0, float(np.float32(1e-6)))
    assert got == {**dims, "vocab_in": dims["vocab_in"]}
    assert encode_model_bin(w) == data


def test_release_shape_size_and_speed() -> None:
    import time

    cfg = Config(vocab_in=32768, vocab_out=25353, dim=96, n_layers=6, n_heads=4, ffn=66,
                 ple_dim=128, seq_len=256, group=128)
    data = encode_model_bin(make_weights(cfg, 3))
    assert len(data) == 14_912_348  # the published model.bin's size
    t = time.perf_counter()
    w = read_model_bin(data)
    elapsed = time.perf_counter() - t
    assert w.ple_table.q.shape == (32768, 768)
    assert elapsed < 2.0, f"reading a release-sized model.bin took {elapsed:.2f} s"


def test_larger_header_is_skipped(tiny_bin: bytes) -> None:
    data = bytearray(tiny_bin[:56]) + b"\xee" * 8 + tiny_bin[56:]
    struct.pack_into("<I", data, 8, 64)
    same_weights(read_model_bin(tiny_bin), read_model_bin(bytes(data)))


def test_zero_scale_is_accepted_and_means_zero(tiny_bin: bytes) -> None:
    off = tensor_offsets(TINY)["tok_emb"] + 4 + 300 * 16  # first scale of tok_emb
    data = bytearray(tiny_bin)
    data[off:off + 2] = b"\0\0"
    w = read_model_bin(bytes(data))
    assert not w.tok_emb.dequantize()[0].any()


def test_vocab_out_argument_must_match_v1_header(tiny_bin: bytes) -> None:
    with pytest.raises(ModelFormatError, match=r"output vocab mismatch.*280.*281"):
        read_model_bin(tiny_bin, vocab_out=281)


# ---- malformed inputs: each has its own message ------------------------------------ #

def _patch(data: bytes, fmt: str, off: int, *vals: object) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, off, *vals)
    return bytes(b)


def _scale_at(data: bytes, off: int, bits: int) -> bytes:
    return _patch(data, "<H", off, bits)


OFF = tensor_offsets(TINY)
QKV1_SCALE = OFF["1.qkv"] + 4 + 96 * 16 + 2 * 5  # row 5's scale of layer 1's qkv

# name -> (make bad bytes from good, regex the message must match)
MALFORMED = {
    "bad_magic": (lambda d: b"GGUF" + d[4:], r"bad magic b'GGUF'"),
    "version": (lambda d: _patch(d, "<I", 4, 2), r"unsupported model\.bin version 2"),
    "flags": (lambda d: _patch(d, "<I", 12, 1 | 4), r"unknown flag bits 0x4"),
    "header_small": (lambda d: _patch(d, "<I", 8, 40), r"header size 40 out of range"),
    "header_big": (lambda d: _patch(d, "<I", 8, 10**8), r"header size 100000000 out of range"),
    "short_header": (lambda d: d[:30], r"truncated header: 30 bytes"),
    "zero_dim": (lambda d: _patch(d, "<i", 24, 0), r"dim = 0 \(must be positive\)"),
    "negative_layers": (lambda d: _patch(d, "<i", 28, -2), r"n_layers = -2"),
    "heads_divide": (lambda d: _patch(d, "<i", 32, 3), r"dim 32 is not divisible by n_heads 3"),
    "odd_head_dim": (lambda d: _patch(d, "<i", 32, 32), r"head dim 1 .* is odd"),
    "vout_gt_vin": (lambda d: _patch(d, "<I", 20, 301), r"output vocab 301 exceeds input vocab"),
    "group_layout": (lambda d: _patch(d, "<i", 48, 48),
                     r"group 48: it is neither a multiple of 32 nor >= the 64 columns of ple_"),
    "group_prefix": (lambda d: _patch(d, "<i", OFF["ple_table"], 64),
                     r"ple_table: tensor group prefix 64 does not match the header group 128"),
    "truncated_ple": (lambda d: d[:OFF["ple_table"] + 1000],
                      r"truncated tensor stream: ple_table needs"),
    "truncated_layer": (lambda d: d[:OFF["1.down"] + 10],
                        r"truncated tensor stream: layers\[1\]\.down needs"),
    "truncated_tail": (lambda d: d[:-1], r"truncated tensor stream: out_norm needs"),
    "trailing": (lambda d: d + b"\0" * 3, r"3 trailing bytes after the last tensor"),
    "nan_scale": (lambda d: _scale_at(d, QKV1_SCALE, 0x7E00),
                  r"layers\[1\]\.qkv: scale of row 5 group 0 is nan"),
    "inf_scale": (lambda d: _scale_at(d, QKV1_SCALE, 0xFC00),
                  r"layers\[1\]\.qkv: scale of row 5 group 0 is -inf"),
    "nan_norm": (lambda d: _patch(d, "<f", OFF["out_norm"] + 8, float("nan")),
                 r"out_norm: non-finite weight nan at index 2"),
    "theta": (lambda d: _patch(d, "<f", 52, -1.0), r"impossible rope_theta -1\.0"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_rejected_with_own_message(tiny_bin: bytes, case: str) -> None:
    make, pattern = MALFORMED[case]
    with pytest.raises(ModelFormatError, match=pattern):
        read_model_bin(make(tiny_bin))


def test_malformed_messages_are_distinct(tiny_bin: bytes) -> None:
    messages = {}
    for case, (make, _p) in MALFORMED.items():
        with pytest.raises(ModelFormatError) as e:
            read_model_bin(make(tiny_bin))
        messages[case] = str(e.value)
    assert len(set(messages.values())) == len(messages), messages


def test_legacy_needs_vocab_out(tiny_bin: bytes, tmp_path: Path) -> None:
    p = tmp_path / "legacy.bin"
    write_model_bin(make_weights(TINY, 5), p, legacy=True)
    with pytest.raises(ModelFormatError, match=r"legacy 'PLE1' header has no output vocab"):
        read_model_bin(p)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_convert_rejects_malformed_without_output(
    tiny_bin: bytes, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mpllm.training.tokenizers import synthetic_tokenizer_json

    make, pattern = MALFORMED[case]
    model = tmp_path / "model.bin"
    model.write_bytes(make(tiny_bin))
    tok = tmp_path / "tokenizer.json"
    tok.write_text(synthetic_tokenizer_json(280, 5))
    out = tmp_path / "out.img"
    rc = convert_main([str(model), str(tok), "-o", str(out), "-q"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ")
    assert re.search(pattern, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "tokenizer.json"]


# ---- the generator ------------------------------------------------------------------ #

def test_generator_is_seeded_and_in_range() -> None:
    a, b, c = (encode_model_bin(make_weights(TINY, s)) for s in (7, 7, 8))
    assert a == b and a != c
    w = make_weights(dataclasses.replace(TINY, tied_head=False), 7)
    mats = [w.tok_emb, w.ple_model_proj, w.ple_table, w.head]
    mats += [getattr(layer, f) for layer in w.layers for f in ("qkv", "down", "ple_proj")]
    for m in mats:
        assert m.q.min() == -7 and m.q.max() == 7
        s = m.scales.astype(np.float32)
        assert s.dtype == np.float32 and SCALE_LOW * 0.99 < s.min() and s.max() < SCALE_HIGH * 1.01
    norms = np.concatenate([w.ple_proj_norm, w.out_norm, w.layers[0].attn_norm])
    assert 0.5 <= norms.min() and norms.max() <= 1.5


def test_generator_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([sys.executable, "-m", "mpllm.training.generate", "--dims", "300", "280", "32",
                        "2", "2", "24", "32", "64", "--seed", "7", "-o", str(tmp_path / "m")],
                       capture_output=True, text=True, cwd=ROOT / "tools", timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m" / "model.bin").read_bytes() == encode_model_bin(make_weights(TINY, 7))
    from mpllm.formats.tokenizer import load_tokenizer

    assert load_tokenizer(str(tmp_path / "m" / "tokenizer.json")).vocab_size == 280
    r = subprocess.run([sys.executable, "-m", "mpllm.training.generate", "--dims", "300", "280", "30",
                        "2", "4", "24", "32", "64", "--seed", "7", "-o", str(tmp_path / "bad")],
                       capture_output=True, text=True, cwd=ROOT / "tools", timeout=120,
                       check=False)
    assert r.returncode == 2 and "not divisible by n_heads 4" in r.stderr
    assert not (tmp_path / "bad" / "model.bin").exists()
