"""A bounded atheris (libFuzzer) run of the plain-Python tokenizer against the
`tokenizers` oracle: tests/fuzz/fuzz_tokenizer.py (its docstring has the long run)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent / "fuzz" / "fuzz_tokenizer.py"
RUNS = 20000


def test_atheris_tokenizer_short_run(tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris not installed (it comes with `pip install -e '.[dev]'`)")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(["Once upon a time", "Tom's dog didn't  run!\n",
                              "caf\u00e9 \u00fcber 42 \U0001f600", "<|endoftext|> x"]):
        (corpus / f"seed{i}").write_text(seed, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(HARNESS), f"-runs={RUNS}", "-max_len=256", "-timeout=20",
         str(corpus)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    done = re.search(r"Done (\d+) runs", log)
    assert done and int(done.group(1)) >= RUNS, log[-2000:]
    assert not list(tmp_path.glob("crash-*")), log[-2000:]
