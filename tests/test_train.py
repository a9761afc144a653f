"""tools/train.py end to end on a tiny corpus, and the committed demo model.

The tiny run goes through the same `main()` the demo recipe runs (corpus,
tokenizer, training, export, greedy check), with small dimensions so it takes
seconds. The demo-model tests check what is committed under models/demo: the
files agree with the recorded report, and the device numerics (H3's reference
on the converted image) write a story that ends with <|endoftext|>.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from mpllm.formats.esp32ai import read_model_bin
from mpllm.formats.tokenizer import load_tokenizer
from mpllm.reference.torch_model import TorchTwin
from mpllm.training import corpus

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "demo"
PROMPT = "Once upon a time"


def _train_module():
    """What tools/train.py runs (mpllm.interrupt.run of this module's main)."""
    from mpllm.training import train

    return train


TINY = ["--stories", "120", "--val-stories", "12", "--vocab", "420", "--layers", "2",
        "--dim", "32", "--heads", "2", "--ffn", "24", "--ple", "32", "--ctx", "96",
        "--batch", "4", "--steps", "36", "--warmup", "4", "--lr", "1e-2", "--threads", "1",
        "--log-every", "12", "--eval-every", "12", "--seed", "5"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("train")
    assert _train_module().main([*TINY, "--out", str(out)]) == 0
    report = json.loads((out / "train_report.json").read_text())
    return out, report


def test_tiny_training_learns(tiny_run: tuple[Path, dict]) -> None:
    _out, rep = tiny_run
    vocab = rep["config"]["vocab_out"]
    # starts near uniform guessing, ends well below it on held-out stories
    assert abs(rep["first_step_loss"] - np.log(vocab)) < 1.0
    assert rep["val_loss_fp32"] < rep["first_step_loss"] - 1.5
    assert rep["val_loss_int4"] < rep["first_step_loss"] - 1.5
    evals = [h["val"] for h in rep["history"]]
    assert len(evals) == 2 and evals[1] < evals[0]
    assert rep["steps"] == 36 and rep["seed"] == 5


def test_tiny_outputs_load(tiny_run: tuple[Path, dict]) -> None:
    out, rep = tiny_run
    w = read_model_bin(out / "model.bin")
    cfg = rep["config"]
    assert w.config.vocab_in == cfg["vocab_in"] == 448  # 420 rounded up to 64: spare rows
    assert w.config.vocab_out == cfg["vocab_out"] == 420
    assert (w.config.dim, w.config.n_layers, w.config.seq_len) == (32, 2, 96)
    tok = load_tokenizer(str(out / "tokenizer.json"))
    assert tok.vocab_size == 420 and tok.eot_id == 0
    for name, rec in rep["files"].items():
        data = (out / name).read_bytes()
        assert len(data) == rec["bytes"]
        assert hashlib.sha256(data).hexdigest() == rec["sha256"]
    # the greedy ids in the report are what the written model.bin produces
    g = rep["greedy"]
    assert TorchTwin.from_weights(w).generate(g["prompt_ids"], len(g["ids"]), eot=0) == g["ids"]


def test_training_is_deterministic(tiny_run: tuple[Path, dict], tmp_path: Path) -> None:
    out, _rep = tiny_run
    args = [*TINY, "--steps", "6", "--eval-every", "100", "--out", str(tmp_path / "a")]
    _train_module().main(args)
    _train_module().main([*args[:-1], str(tmp_path / "b")])
    for name in ("model.bin", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # same corpus and seed -> same tokenizer as the longer run
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


def test_cli_help_and_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    mod = _train_module()
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    assert "--steps" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--steps must be positive"):
        mod.main(["--steps", "0"])
    with pytest.raises(SystemExit, match="--vocab-in 100 is below --vocab"):
        mod.main(["--vocab-in", "100"])


def test_corpus_deterministic_and_varied() -> None:
    a = corpus.stories(300, 9)
    assert a == corpus.stories(300, 9)
    assert a[:50] == corpus.stories(50, 9)
    assert a != corpus.stories(300, 10)
    assert len(set(a)) == 300
    assert all(s.endswith((".", "!", "\"")) for s in a)
    assert all(corpus.EOT not in s for s in a)
    words = {w.strip('.,!?"').lower() for s in a for w in s.split()}
    assert len(words) > 800
    # many openings, not one template; many heroes; dialogue; paragraphs; lengths
    assert len({" ".join(s.split()[:2]) for s in a}) > 60
    assert sum(s.startswith("Once upon a time") for s in a) < 200
    assert len({m for s in a for m in re.findall(r"named (\w+)", s)}) > 120
    assert sum(s.count('"') >= 4 for s in a) > 250
    assert sum("\n\n" in s for s in a) > 150
    lengths = sorted(len(s) for s in a)
    assert lengths[-1] > 4 * lengths[0]
    # lines as a person types them: in lower case, or "and then ..."
    assert sum(bool(re.search(r"[.!?] (and then |[a-z])", s)) for s in a) > 10
    assert corpus.join_with_eot(a[:2]) == a[0] + corpus.EOT + a[1] + corpus.EOT
    with pytest.raises(ValueError):
        corpus.stories(-1, 0)
    with pytest.raises(TypeError):
        corpus.stories(3, "x")  # type: ignore[arg-type]


def test_windows_start_at_stories_and_end_long_ones() -> None:
    from mpllm.training.train import _windows

    # EOT (0) appended: story 2 is too long for ctx 4, so a second window ends with its EOT
    w = _windows([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]], 4).tolist()
    assert w == [[1, 2, 3, 0, 4], [4, 5, 6, 7, 8], [7, 8, 9, 10, 0]]
    # llama2.c: each story starts with BOS (9), the next story's BOS ends it
    w = _windows([[9, 1, 2, 3], [9, 4, 5, 6, 7, 8], [9, 11]], 4, None).tolist()
    assert w == [[9, 1, 2, 3, 9], [9, 4, 5, 6, 7], [5, 6, 7, 8, 9]]
    # a story that ends exactly at its window's last token gets no second window
    assert _windows([[1, 2, 3, 4], [5]], 4).tolist() == [[1, 2, 3, 4, 0]]


# --------------------------------------------------------------------------- #
# the committed demo model


@pytest.fixture(scope="module")
def demo_report() -> dict:
    for name in ("model.bin", "tokenizer.json", "train_report.json", "RECIPE.md"):
        assert (DEMO / name).is_file(), f"models/demo/{name} is missing"
    return json.loads((DEMO / "train_report.json").read_text())


def test_demo_files_match_report(demo_report: dict) -> None:
    for name, rec in demo_report["files"].items():
        data = (DEMO / name).read_bytes()
        assert len(data) == rec["bytes"], name
        assert hashlib.sha256(data).hexdigest() == rec["sha256"], name
    w = read_model_bin(DEMO / "model.bin")
    assert w.config.dim == 96 and w.config.n_heads == 4 and w.config.ffn == 66
    assert w.config.ple_dim == 128 and w.config.seq_len == 256 and w.config.group == 128
    assert (DEMO / "model.bin").stat().st_size <= 4 * 1024 * 1024
    recipe = (DEMO / "RECIPE.md").read_text()
    assert f"--steps {demo_report['steps']}" in recipe
    assert f"{demo_report['val_loss_int4']:.3f}" in recipe


def test_demo_story_on_device_numerics(demo_report: dict, tmp_path: Path) -> None:
    """Greedy from the prompt with H3's reference on the converted image: a
    readable story that ends with <|endoftext|> well inside the context."""
    from mpllm.convert import convert
    from mpllm.reference.forward import Reference
    from tokenizers import Tokenizer

    img = tmp_path / "demo.img"
    convert(DEMO / "model.bin", DEMO / "tokenizer.json", img, progress=False)
    ref = Reference.from_image(img)
    tok = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    prompt = tok.encode(PROMPT).ids
    n = ref.config.seq_len - len(prompt)
    ids: list[int] = []
    logits = ref.prefill(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(logits)))
        if ids[-1] == 0:
            break
        logits = ref.forward(ids[-1])
    assert ids[-1] == 0, "the demo story does not end with <|endoftext|>"
    assert len(prompt) + len(ids) <= 230
    text = PROMPT + tok.decode(ids[:-1])
    assert text.rstrip().endswith((".", "!", "\""))
    assert "Once upon a time" not in text[len(PROMPT):]  # one story, not a run-on
    # fp32 twin of the same file: same greedy story (the int8 activations of
    # the device path do not change a single pick on this prompt)
    twin_ids = TorchTwin.from_weights(read_model_bin(DEMO / "model.bin")).generate(
        prompt, n, eot=0)
    assert twin_ids == ids
    assert twin_ids == demo_report["greedy"]["ids"]


TINY_LLAMA2C = ["--family", "llama2c", "--stories", "160", "--val-stories", "12", "--vocab", "400",
                "--layers", "2", "--dim", "32", "--heads", "4", "--kv-heads", "2", "--ffn", "48",
                "--ctx", "96", "--batch", "4", "--steps", "40", "--warmup", "4", "--lr", "1e-2",
                "--threads", "1", "--log-every", "20", "--eval-every", "20", "--seed", "5"]


def test_tiny_llama2c_training_writes_what_llama2c_reads(tmp_path: Path) -> None:
    from mpllm.formats import llama2c
    from mpllm.reference.torch_llama import LlamaModel
    from mpllm.training.train import greedy_llama

    assert _train_module().main([*TINY_LLAMA2C, "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "train_report.json").read_text())
    assert rep["family"] == "llama2c" and rep["config"]["n_kv_heads"] == 2
    assert abs(rep["first_step_loss"] - np.log(400)) < 1.0
    # 40 tiny steps on the varied corpus: about 1.5 nats below guessing (4.5 of 6.0)
    assert rep["val_loss_fp32"] < rep["first_step_loss"] - 1.2
    ck = llama2c.read_checkpoint((tmp_path / "model.bin").read_bytes())
    assert ck.version == 0 and ck.config.n_kv_heads == 2 and ck.config.vocab_size == 400
    tables = llama2c.load_tokenizer_bin(tmp_path / "tokenizer.bin")
    assert tables.vocab_size == 400
    g = rep["greedy"]
    assert g["prompt_ids"][0] == llama2c.BOS_ID
    # the greedy ids in the report are what the written checkpoint produces
    model = LlamaModel.from_checkpoint(ck)
    assert greedy_llama(model, g["prompt_ids"], len(g["ids"]), (1, 2)) == g["ids"]


def test_llama2c_shapes_are_checked_before_training(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit, match="n_kv_heads 3 does not divide n_heads 4"):
        _train_module().main([*TINY_LLAMA2C, "--kv-heads", "3", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--qat-frac applies to --family ple"):
        _train_module().main([*TINY_LLAMA2C, "--qat-frac", "0.3", "--out", str(tmp_path)])
    assert not (tmp_path / "model.bin").exists()


LLAMA2C_DEMO = ROOT / "models" / "llama2c-demo"


def test_llama2c_demo_files_and_story() -> None:
    import llm_tokenizer
    from mpllm.formats import llama2c
    from mpllm.formats.tokenizer import tokenizer_section
    from mpllm.reference.llama2c import Llama2c

    rep = json.loads((LLAMA2C_DEMO / "train_report.json").read_text())
    for name, rec in rep["files"].items():
        data = (LLAMA2C_DEMO / name).read_bytes()
        assert len(data) == rec["bytes"]
        assert hashlib.sha256(data).hexdigest() == rec["sha256"]
    tok = llm_tokenizer.Tokenizer(tokenizer_section(
        llama2c.load_tokenizer_bin(LLAMA2C_DEMO / "tokenizer.bin")))
    g = rep["greedy"]
    assert tok.encode(PROMPT) == g["prompt_ids"]
    # llama2.c's forward pass in numpy (not the torch module that trained it) writes
    # the story the report recorded, and it ends by writing BOS
    model = Llama2c(LLAMA2C_DEMO / "model.bin")
    ids = model.generate([g["prompt_ids"]], len(g["ids"]))[0]
    assert ids == g["ids"] and ids[-1] == llama2c.BOS_ID
    text = tok.decode(g["prompt_ids"] + ids[:-1])
    assert text == g["text"] and text.startswith(PROMPT + ", there was")
