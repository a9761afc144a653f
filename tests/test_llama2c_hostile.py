"""Hostile llama2.c checkpoints through the converter's command line (issue 37):
every header field of v0, v1 and v2 set to 0, -1, 1, 2^31-1 and just past
what the engine holds (mpllm.formats.limits, held equal to the loader's by
tests/test_image_format_agrees.py), in both modes (the default, with the
drafter and the quality figure, and `-q --drafter-stories 0`): one line naming
the field, exit status 2, no output file. The header is refused before any
weight or the tokenizer is read, so the whole file runs in seconds.
"""

from __future__ import annotations

import re
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from mpllm.convert import main as convert_main
from mpllm.formats import limits
from mpllm.formats import llama2c as fmt
from mpllm.formats.image import read_image

TOKENIZER = ROOT / "models" / "llama2c-demo" / "tokenizer.bin"  # 512 tokens
#: no field 0, 1 or -1, so that each of those values is a change
BASE = fmt.Llama2cConfig(dim=16, hidden_dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         vocab_size=512, seq_len=8, shared_classifier=False)
I32_MAX = 2**31 - 1
#: a field just past the engine's limit (for this file's dim 16 and 4 heads)
PAST = {"dim": limits.MAX_DIM + 1, "hidden_dim": limits.MAX_FFN + 1,
        "n_layers": limits.MAX_LAYERS + 1, "n_heads": BASE.dim + 1,
        "n_kv_heads": BASE.n_heads + 1, "vocab_size": limits.MAX_TOKENS + 1,
        "seq_len": limits.MAX_SEQ_LEN + 1, "group_size": fmt.MAX_GROUP_SIZE + 1, "version": 3,
        "shared_classifier": 2}
MODES = {"default": [], "quiet": ["-q", "--drafter-stories", "0"]}


def _checkpoint(cfg: fmt.Llama2cConfig = BASE) -> fmt.Llama2cCheckpoint:
    rng = np.random.default_rng(3)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.2, shape).astype(np.float32)

    layers = {n: w(cfg.n_layers, *cfg.matrix_shape(n)) for n in fmt.LAYER_MATRICES}
    return fmt.Llama2cCheckpoint(0, cfg, w(cfg.vocab_size, cfg.dim), 1 + w(cfg.n_layers, cfg.dim),
                                 1 + w(cfg.n_layers, cfg.dim), 1 + w(cfg.dim), layers,
                                 None if cfg.shared_classifier else w(cfg.vocab_size, cfg.dim))


def _offsets(version: int) -> dict[str, tuple[int, str]]:
    """Each header field's (offset, struct format) in a file of `version`."""
    first = 0 if version == 0 else 8
    out = {name: (first + 4 * i, "<i") for i, name in enumerate(fmt.FIELDS)}
    if version:
        out["version"] = (4, "<i")
        out["shared_classifier"] = (36, "<B")
    if version == 2:
        out["group_size"] = (37, "<i")
    return out


def _cases() -> list[tuple[int, str, int]]:
    cases = []
    for version in (0, 1, 2):
        good = fmt.checkpoint_bytes(_checkpoint(), version, group_size=16)
        for field, (at, form) in _offsets(version).items():
            was = struct.unpack_from(form, good, at)[0]
            values = [0, -1, 1, I32_MAX, PAST[field]]
            if form == "<B":
                values = [0, 255, 1, PAST[field]]  # a byte: -1 is 255
            for v in values:
                # (a v1 file of context 1 is a model the engine runs: no RoPE table is stored)
                if v != was and not (version and field == "seq_len" and v == 1):
                    cases.append((version, field, v))
    return cases


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, bytes]:
    return {v: fmt.checkpoint_bytes(_checkpoint(), v, group_size=16) for v in (0, 1, 2)}


def _run(tmp: Path, model: bytes, mode: str, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int, str, Path]:
    (tmp / "model.bin").write_bytes(model)
    out = tmp / "out.img"
    rc = convert_main([str(tmp / "model.bin"), str(TOKENIZER), "-o", str(out), *MODES[mode]])
    cap = capsys.readouterr()
    return rc, cap.err, out


def _refused(tmp: Path, rc: int, err: str, out: Path) -> str:
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "tokenizer" not in err, err
    assert not out.exists()
    assert sorted(p.name for p in tmp.iterdir()) == ["model.bin"]  # no staging file either
    return err


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("version", "field", "value"), _cases())
def test_every_header_mutation_is_refused_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[int, bytes],
        version: int, field: str, value: int, mode: str) -> None:
    data = bytearray(files[version])
    at, form = _offsets(version)[field]
    struct.pack_into(form, data, at, value)
    err = _refused(tmp_path, *_run(tmp_path, bytes(data), mode, capsys))
    # the field and the value the file states (a flag's "flag 255" names the field too)
    assert re.search(rf"\b{field}( flag)? {value}\b", err), err


def _v0_header(**change: int) -> bytes:
    dims = [getattr(BASE, f) for f in fmt.FIELDS]
    for k, v in change.items():
        dims[fmt.FIELDS.index(k)] = v
    return struct.pack("<7i", *dims)


#: the campaign's own cases: (what, model bytes, what the message says)
CAMPAIGN = {
    "context 65,537": (
        lambda: _v0_header(seq_len=65537),
        rf"seq_len 65537 is out of range: the engine holds 1\.\.{limits.MAX_SEQ_LEN}"),
    "context 1,048,576": (
        lambda: _v0_header(seq_len=1 << 20), r"seq_len 1048576 is out of range"),
    "FFN width 100,000": (
        lambda: _v0_header(hidden_dim=100000),
        (rf"hidden_dim 100000 is out of range: the engine holds 1\.\.{limits.MAX_FFN} "
        r"\(LLM_MAX_FFN\)")),
    "head size 2,048": (
        lambda: _v0_header(dim=2048, n_heads=1, n_kv_heads=1),
        (rf"dim 2048 / n_heads 1 makes heads of 2048: the engine holds at most "
        rf"{limits.MAX_HEAD_DIM}")),
    "200 layers": (
        lambda: _v0_header(n_layers=200),
        (rf"n_layers 200 is out of range: the engine holds 1\.\.{limits.MAX_LAYERS} "
        r"\(LLM_MAX_LAYERS: 512 sections\)")),
    "n_kv_heads > n_heads": (lambda: _v0_header(n_kv_heads=8), r"n_kv_heads 8 is out of range"),
    "n_heads not dividing dim": (
        lambda: _v0_header(n_heads=3), r"n_heads 3 does not split dim 16 into heads"),
    "27 bytes": (lambda: _v0_header()[:27], r"27 bytes, too short for a llama2.c header"),
    "empty": (lambda: b"", r"0 bytes, too short for a llama2.c header"),
    "v0 header, no weights": (
        lambda: _v0_header(),
        (r"truncated in tok_embeddings .* the header \(version 0, dim 16, hidden_dim 32, "
        r"n_layers 2")),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(CAMPAIGN))
def test_the_campaigns_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                             mode: str) -> None:
    make, message = CAMPAIGN[case]
    err = _refused(tmp_path, *_run(tmp_path, make(), mode, capsys))
    assert re.search(message, err), err


#: whole v1 files (no RoPE table: the sizes add up) the old converter took:
#: with -q it wrote an image the engine refuses, by default it wrote one and
#: then ended in the engine's traceback (200 layers: a ValueError traceback)
WHOLE = {"context 65,537": ({"seq_len": 65537}, "seq_len 65537 is out of range"),
         "context 1,048,576": ({"seq_len": 1 << 20}, "seq_len 1048576 is out of range"),
         "200 layers": ({"n_layers": 200}, "n_layers 200 is out of range")}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(WHOLE))
def test_whole_files_past_the_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     case: str, mode: str) -> None:
    change, message = WHOLE[case]
    ck = _checkpoint(fmt.Llama2cConfig(**dict(BASE.__dict__, **change)))
    err = _refused(tmp_path, *_run(tmp_path, fmt.checkpoint_bytes(ck, 1), mode, capsys))
    assert message in err, err


def test_limits_are_the_largest_values_converted() -> None:
    """At each limit the header passes, one past it it is refused (the C side
    of the same numbers: tests/test_image_format_agrees.py)."""
    wide = fmt.Llama2cConfig(dim=limits.MAX_DIM, hidden_dim=limits.MAX_FFN,
                             n_layers=limits.MAX_LAYERS, n_heads=limits.MAX_DIM // 256,
                             n_kv_heads=1, vocab_size=limits.MAX_TOKENS,
                             seq_len=limits.MAX_SEQ_LEN, shared_classifier=True)
    assert fmt.check_config(wide, "m") == wide
    for field in ("dim", "hidden_dim", "n_layers", "vocab_size", "seq_len"):
        past = dict(wide.__dict__, **{field: getattr(wide, field) + 1})
        with pytest.raises(fmt.CheckpointError, match=rf"{field} \d+ is out of range"):
            fmt.check_config(fmt.Llama2cConfig(**past), "m")
    with pytest.raises(fmt.CheckpointError, match="makes heads of 258"):
        fmt.check_config(fmt.Llama2cConfig(**dict(wide.__dict__, dim=258 * 4, n_heads=4)), "m")


def test_an_image_at_the_context_and_layer_limits_opens(tmp_path: Path) -> None:
    """The converter's largest context and layer count are the engine's: the
    image of a v1 checkpoint at both limits opens and runs."""
    import engine_ext
    from mpllm.convert import convert

    cfg = fmt.Llama2cConfig(dim=16, hidden_dim=32, n_layers=limits.MAX_LAYERS, n_heads=4,
                            n_kv_heads=2, vocab_size=512, seq_len=limits.MAX_SEQ_LEN,
                            shared_classifier=True)
    (tmp_path / "big.bin").write_bytes(fmt.checkpoint_bytes(_checkpoint(cfg), 1))
    convert(tmp_path / "big.bin", TOKENIZER, tmp_path / "big.img", progress=False)
    header = read_image(tmp_path / "big.img").weights.config
    assert (header.seq_len, header.n_layers) == (limits.MAX_SEQ_LEN, limits.MAX_LAYERS)
    # (a context of 64 of the 65,536: the whole KV cache would be ~200 MB)
    with engine_ext.load().Model(str(tmp_path / "big.img"), context=64) as m:
        assert m.config()["n_layers"] == limits.MAX_LAYERS
        assert 0 <= m.prefill([1, 300]) < 512


def test_a_context_too_short_to_draft_in_converts_with_an_empty_drafter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Contexts of 1 and 2 positions (before: "ValueError: starts is empty" or
    "context full" from the drafter): the image is written, without guesses."""
    import engine_ext

    engine_ext.load()  # the in-place _llm, current, for the drafter and the quality figure
    for seq_len in (1, 2):
        ck = _checkpoint(fmt.Llama2cConfig(**dict(BASE.__dict__, seq_len=seq_len)))
        rc, err, out = _run(tmp_path, fmt.checkpoint_bytes(ck, 0), "default", capsys)
        assert rc == 0 and "Traceback" not in err, err
        assert out.is_file()
        out.unlink()


@pytest.mark.parametrize("mode", list(MODES))
def test_v2_scales_that_overflow_are_one_clean_error_and_no_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[int, bytes],
        mode: str) -> None:
    """A v2 file whose codes times scales overflow float32: the clean error
    alone (before, numpy's "overflow encountered in multiply" came first)."""
    data = bytearray(files[2])
    # tok_embeddings' codes follow the header and the norms; their scales follow the codes
    codes = fmt.V1_HEADER_BYTES + 4 * (2 * BASE.n_layers + 1) * BASE.dim
    n = BASE.vocab_size * BASE.dim
    data[codes:codes + 16] = bytes([127]) * 16
    struct.pack_into("<f", data, codes + n, 3e38)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning printed to the user fails the test
        err = _refused(tmp_path, *_run(tmp_path, bytes(data), mode, capsys))
    assert "tok_embeddings: a code times its scale (3e+38) overflows float32" in err, err
