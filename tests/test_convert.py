"""The converter, end to end: CLI, size table, row trimming, release size budget, bad input."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, ModelFiles, same_weights
from mpllm.convert import convert, main, trim_vocab_rows
from mpllm.formats.esp32ai import read_model_bin, write_model_bin
from mpllm.formats.image import read_image
from mpllm.formats.tokenizer import load_tokenizer, tokenizer_section
from mpllm.training.tokenizers import synthetic_tokenizer_json

# The image must fit a 13 MiB partition with room to spare; the release-shaped
# image (25,353 rows kept of 32,768) must stay within this: 12.2 MB for the weights and
# tables, plus the certified head's row order and tile boxes (25,353 x 2 B of order and
# 199 tiles x 196 B: ~90 KB).
RELEASE_IMAGE_BUDGET = 12_200_000 + 2 * 25_353 + 199 * (2 * 96 + 4) + 64
Cap = pytest.CaptureFixture[str]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "convert.py"), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def fingerprint(model: Path, tok: Path) -> bytes:
    return hashlib.sha256(hashlib.sha256(model.read_bytes()).digest()
                          + hashlib.sha256(tok.read_bytes()).digest()).digest()


def test_cli_converts_and_prints_size_table(tiny_model: ModelFiles, tmp_path: Path) -> None:
    out = tmp_path / "tiny.img"
    r = run_cli(str(tiny_model.model_bin), str(tiny_model.tokenizer_json), "-o", str(out),
                "--drafter-stories", "0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("section"))
    rows = {line.split()[0]: line.split() for line in lines[header + 1:]
            if line.split() and not line.startswith(("fingerprint", "wrote"))}
    # per-layer sections are grouped per kind (one line each, count = n_layers)
    assert rows["L*.qkv"][1:3] == ["q4", "2"]
    assert "L0.qkv" not in rows and "L1.qkv" not in rows
    size = out.stat().st_size
    assert rows["total"][2] == f"{size:,}"
    # the table's lines add up to the file size
    listed = sum(int(v[-2].replace(",", "")) for k, v in rows.items() if k != "total")
    assert listed == size
    assert f"wrote {out} ({size:,} bytes)" in r.stdout
    img = read_image(out)
    assert img.header.source_sha256 == fingerprint(tiny_model.model_bin,
                                                   tiny_model.tokenizer_json)
    # identical to what the in-process API (and the fixture) produced
    assert out.read_bytes() == tiny_model.image.read_bytes()


def test_cli_help_and_module_entry() -> None:
    r = run_cli("--help")
    assert r.returncode == 0 and "tokenizer.bin" in r.stdout and "-o OUT" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mpllm.convert", "--help"], capture_output=True,
                       text=True, cwd=ROOT / "tools", timeout=60, check=False)
    assert r.returncode == 0 and "model_bin" in r.stdout


def test_release_shaped_image_fits_budget(release_model: ModelFiles) -> None:
    img = read_image(release_model.image)
    size = release_model.image.stat().st_size
    print(f"release-shaped image: {size} bytes")
    assert size <= RELEASE_IMAGE_BUDGET, f"release-shaped image is {size} bytes"
    h, c = img.header, img.header.config
    assert (h.vocab_rows, c.vocab_out, h.vocab_in_source) == (25353, 25353, 32768)
    assert (c.dim, c.n_layers, c.n_heads, c.ffn, c.ple_dim, c.seq_len) == (
        96, 6, 4, 66, 128, 256)
    assert h.tied_head
    # per-token lookups: one 400-byte PLE record, one 48-byte embedding row
    sec = {s.name: s for s in img.sections}
    assert sec["ple_rows"].size == 16 + 25353 * 400
    assert sec["embed"].size == 16 + 25353 * (48 + 4)


def test_rows_above_tokenizer_size_dropped(release_model: ModelFiles) -> None:
    src = read_model_bin(release_model.model_bin)
    img = read_image(release_model.image)
    assert src.config.vocab_in == 32768 and img.config.vocab_in == 25353
    # exactly the first vocab_out rows survive, bit for bit; everything else is untouched
    same_weights(trim_vocab_rows(src, 25353), img.weights)
    assert img.weights.tok_emb.q.shape == (25353, 96)
    assert img.weights.ple_table.q.shape == (25353, 768)


def test_untied_head_and_odd_shapes(test_model, tmp_path: Path) -> None:
    m = test_model("tiny_untied")
    img = read_image(m.image)
    assert [s.name for s in img.sections[-4:]] == ["head", "head_tiles", "drafts", "weights"]
    assert not img.header.tied_head
    src = read_model_bin(m.model_bin)
    same_weights(trim_vocab_rows(src, m.config.vocab_out), img.weights)


def test_golden_model_converts(golden, tmp_path: Path) -> None:
    out = tmp_path / f"{golden.name}.img"
    rep = convert(golden.model_bin, golden.tokenizer_json, out, progress=False)
    img = read_image(out)
    dims = golden.meta["dims"]
    assert rep.rows_dropped == dims["vocab_in"] - dims["vocab_out"]
    assert img.config.vocab_in == img.config.vocab_out == dims["vocab_out"]
    assert img.header.vocab_in_source == dims["vocab_in"]
    assert img.header.eot_id == 0
    tables = load_tokenizer(str(golden.tokenizer_json))
    assert img.tokenizer_section == tokenizer_section(tables)
    same_weights(trim_vocab_rows(read_model_bin(golden.model_bin), dims["vocab_out"]),
                 img.weights)


def test_legacy_header_converts_to_same_weights(tiny_model: ModelFiles, tmp_path: Path) -> None:
    w = read_model_bin(tiny_model.model_bin)
    legacy = tmp_path / "legacy.bin"
    write_model_bin(w, legacy, legacy=True)
    out = tmp_path / "legacy.img"
    convert(legacy, tiny_model.tokenizer_json, out, progress=False)
    a, b = read_image(out), read_image(tiny_model.image)
    same_weights(b.weights, a.weights)
    assert a.rope.tobytes() == b.rope.tobytes()
    assert a.header.source_sha256 == fingerprint(legacy, tiny_model.tokenizer_json)
    assert a.header.source_sha256 != b.header.source_sha256


def test_progress_callback(tiny_model: ModelFiles, tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    rep = convert(tiny_model.model_bin, tiny_model.tokenizer_json, tmp_path / "p.img",
                  progress=lambda *a: seen.append(a))
    assert seen[0][0] == "tokenizer" and seen[-1][1] == seen[-1][2] == rep.file_bytes


def _expect_failure(capsys: Cap, tmp_path: Path, model: Path, tok: Path, pattern: str,
                    out: Path | None = None) -> None:
    out = out or tmp_path / "out.img"
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    rc = main([str(model), str(tok), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ")
    assert re.search(pattern, err), err
    # nothing new, nothing changed (not even a temp file)
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_cli_bad_input_exit_code(tiny_model: ModelFiles, tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"GGUF" + tiny_model.model_bin.read_bytes()[4:])
    r = run_cli(str(bad), str(tiny_model.tokenizer_json), "-o", str(tmp_path / "o.img"))
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "bad magic b'GGUF'" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.bin"]


def test_tokenizer_size_mismatch(tiny_model: ModelFiles, tmp_path: Path, capsys: Cap) -> None:
    tok = tmp_path / "tok.json"
    tok.write_text(synthetic_tokenizer_json(281, 1))
    _expect_failure(capsys, tmp_path, tiny_model.model_bin, tok,
                    r"tokenizer size mismatch: .* has 281 tokens but .*output vocab is 280")


def test_legacy_header_tokenizer_larger_than_model(
    tiny_model: ModelFiles, tmp_path: Path, capsys: Cap
) -> None:
    legacy = tmp_path / "legacy.bin"
    write_model_bin(read_model_bin(tiny_model.model_bin), legacy, legacy=True)
    tok = tmp_path / "tok.json"
    tok.write_text(synthetic_tokenizer_json(301, 1))  # model has only 300 rows
    _expect_failure(capsys, tmp_path, legacy, tok, r"output vocab 301 exceeds input vocab 300")


def test_bad_tokenizer_json(tiny_model: ModelFiles, tmp_path: Path, capsys: Cap) -> None:
    tok = tmp_path / "tok.json"
    tok.write_text("{not json")
    _expect_failure(capsys, tmp_path, tiny_model.model_bin, tok, r"not valid JSON")
    doc = json.loads(tiny_model.tokenizer_json.read_text())
    doc["model"]["type"] = "WordPiece"
    tok.write_text(json.dumps(doc))
    _expect_failure(capsys, tmp_path, tiny_model.model_bin, tok, r"(?i)bpe")


def test_missing_inputs(tiny_model: ModelFiles, tmp_path: Path, capsys: Cap) -> None:
    _expect_failure(capsys, tmp_path, tmp_path / "nope.bin", tiny_model.tokenizer_json,
                    r"model file not found: .*nope\.bin")
    _expect_failure(capsys, tmp_path, tiny_model.model_bin, tmp_path / "nope.json",
                    r"tokenizer file not found: .*nope\.json")
    _expect_failure(capsys, tmp_path, tiny_model.model_bin, tiny_model.tokenizer_json,
                    r"cannot write .*x\.img: the folder .*no does not exist",
                    out=tmp_path / "no" / "x.img")


def test_existing_output_untouched_on_failure(
    tiny_model: ModelFiles, tmp_path: Path, capsys: Cap
) -> None:
    out = tmp_path / "keep.img"
    out.write_bytes(b"previous image")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(tiny_model.model_bin.read_bytes()[:-5])
    _expect_failure(capsys, tmp_path, bad, tiny_model.tokenizer_json, r"truncated tensor stream",
                    out=out)
    assert out.read_bytes() == b"previous image"


def test_output_must_not_overwrite_input(
    tiny_model: ModelFiles, tmp_path: Path, capsys: Cap
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(tiny_model.model_bin.read_bytes())
    _expect_failure(capsys, tmp_path, model, tiny_model.tokenizer_json,
                    r"would overwrite an input", out=model)


def test_main_in_process_returns_2(tmp_path: Path, capsys: Cap) -> None:
    assert main([str(tmp_path / "a.bin"), str(tmp_path / "b.json"), "-o",
                 str(tmp_path / "c.img"), "-q"]) == 2
    assert "model file not found" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_builds_the_drafter_by_default(tiny_model: ModelFiles, tmp_path: Path) -> None:
    out = tmp_path / "tiny.img"
    r = run_cli(str(tiny_model.model_bin), str(tiny_model.tokenizer_json), "-o", str(out))
    assert r.returncode == 0, r.stderr
    # the drafter is measured on 200 stories by default; on this random tiny model it does
    # not pay, so it is left out and the converter says so (the demo keeps its drafter:
    # test_convert_llama2c.py::test_the_demo_keeps_its_drafter)
    assert re.search(r"drafter left out: [\d.]+ tokens per pass, a pass costs [\d.]+ steps",
                     r.stdout), r.stdout
    drafts = read_image(out).drafts
    assert drafts.max_draft == 0 and drafts.entries == 0
    bad = run_cli(str(tiny_model.model_bin), str(tiny_model.tokenizer_json), "-o",
                  str(tmp_path / "x.img"), "--drafter-stories", "-1")
    assert bad.returncode == 2 and "--drafter-stories -1: must be >= 0" in bad.stderr
    assert not (tmp_path / "x.img").exists()


def test_an_esp32ai_model_keeps_its_int4(tiny_model: ModelFiles, tmp_path: Path) -> None:
    """--weights int8 / fp32 on an esp32-ai model.bin: refused with a one-line
    message, nothing written; auto and int4 give its int4 image."""
    for fmt in ("int8", "fp32"):
        out = tmp_path / f"{fmt}.img"
        r = run_cli(str(tiny_model.model_bin), str(tiny_model.tokenizer_json), "-o", str(out),
                    "--weights", fmt, "--drafter-stories", "0")
        assert r.returncode == 2 and not out.exists()
        assert r.stderr == (f"error: --weights {fmt}: an esp32-ai model keeps the int4 weights "
                            "it was trained and quantized with (its model.bin has no float "
                            "weights to make int8 or fp32 from); use --weights int4 or auto\n")
    rep = convert(tiny_model.model_bin, tiny_model.tokenizer_json, tmp_path / "i4.img",
                  progress=False, weights="int4")
    assert rep.weights == "int4" and not rep.choice.tried
