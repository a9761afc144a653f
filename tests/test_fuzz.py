"""Every fuzz target (tests/fuzz/fuzzrun.py: the image loader, the binding's
argument decoding, the tokenizer's two encoders, the web chat's messages,
the tokenizer section's two readers, llama2.c's checkpoints and tokenizer.bin)
runs for a few seconds over its committed corpus, with 0 crashes; the corpus
grows only by what adds coverage; a crash is reported with its input.

The long run, and growing the corpus: `python tests/fuzz/fuzzrun.py --seconds
3600 --grow` (tests/fuzz/fuzzrun.py). A target whose tool (clang and its
libFuzzer runtime, atheris) is missing is skipped, and fails under CI=true.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import need_tool

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import fuzzrun

#: a cap on each short run, which is counted in executions (Target.suite_runs),
#: not in seconds: libFuzzer's clock starts before a Python harness has
#: imported what it fuzzes, and a loaded machine must not leave it no time
CAP_SECONDS = 120


@pytest.mark.parametrize("name", list(fuzzrun.TARGETS))
def test_short_run_finds_no_crash(name: str) -> None:
    runs = fuzzrun.TARGETS[name].suite_runs
    result = need_tool(lambda: fuzzrun.run(name, seconds=CAP_SECONDS, runs=runs, seed=1))
    print(result.line())
    assert result.crashes == [], "\n".join(
        [result.line(), *map(str, result.crashes), *result.log.splitlines()[-40:]])
    # every committed input ran, and then new ones
    assert result.executions > result.corpus_files > 0, result.log[-3000:]


def test_grow_adds_what_is_new_to_the_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # a run that found nothing (here: one execution, of the empty input) adds
    # nothing (before, this failed: libFuzzer's merge of nothing says nothing)
    none = need_tool(lambda: fuzzrun.run("web", seconds=CAP_SECONDS, runs=1, grow=True,
                                         corpus=corpus, seed=1))
    assert none.added == none.corpus_files == 0
    # from one message the fuzzer finds others (from nothing, "{" and "}" are
    # rare: thousands of runs find none)
    (corpus / "turn").write_text('{"type": "turn", "text": "Once"}')
    first = need_tool(lambda: fuzzrun.run("web", seconds=CAP_SECONDS, runs=3000, grow=True,
                                          corpus=corpus, seed=1))
    assert first.added > 0 and first.corpus_files == first.added + 1
    sizes = [p.stat().st_size for p in corpus.iterdir()]
    assert max(sizes) <= fuzzrun.TARGETS["web"].max_len
    # the same run again finds nothing new: merged inputs only add coverage
    again = fuzzrun.run("web", seconds=CAP_SECONDS, runs=1, grow=True, corpus=corpus, seed=1)
    assert again.added == 0 and again.corpus_files == first.corpus_files


CRASHER = '''
import sys
sys.path.insert(0, {fuzz!r})
import fuzzrun


def test_one_input(data: bytes) -> None:
    if data.startswith(b"boom"):
        raise ValueError("boom")


if __name__ == "__main__":
    fuzzrun.atheris_fuzz(test_one_input)
'''


def test_a_crash_is_reported_with_its_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    harness = tmp_path / "fuzz_crasher.py"
    harness.write_text(CRASHER.format(fuzz=str(fuzzrun.HERE)))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "seed").write_bytes(b"boom!")
    target = replace(fuzzrun.TARGETS["tokenizer"], name="crasher", harness=harness)
    monkeypatch.setitem(fuzzrun.TARGETS, "crasher", target)
    monkeypatch.setattr(fuzzrun, "ARTIFACTS", tmp_path / "artifacts")
    monkeypatch.setattr(fuzzrun.Target, "corpus", property(lambda t: corpus))
    result = need_tool(lambda: fuzzrun.run("crasher", seconds=CAP_SECONDS, seed=1))
    assert len(result.crashes) == 1 and result.crashes[0].read_bytes().startswith(b"boom")
    assert fuzzrun.main(["crasher", "--seconds", str(CAP_SECONDS)]) == 1
    out = capsys.readouterr().out
    assert "1 crashes" in out and "CRASH " in out and "reproduce: " in out
    assert str(harness) in out


def test_the_readme_command_runs_a_c_target_outside_pytest(tmp_path: Path) -> None:
    """`python tests/fuzz/fuzzrun.py loader` as the README says it, from the
    checkout, in a shell whose Python path is its own (before, the C targets
    stopped with "No module named 'conftest'": the micro image's lock was
    imported from the tests' conftest)."""
    import os
    import subprocess

    need_tool(lambda: fuzzrun.command(fuzzrun.TARGETS["loader"]))  # clang's libFuzzer, built
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "tests/fuzz/fuzzrun.py", "loader", "--runs", "50",
                        "--seconds", str(CAP_SECONDS)], cwd=fuzzrun.ROOT, env=env,
                       capture_output=True, text=True, timeout=CAP_SECONDS + 300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert re.search(r"^loader: \d+ executions, 0 crashes", r.stdout, re.MULTILINE), r.stdout
