"""The fuzz targets, their corpus, and how to run them.

Targets (each a libFuzzer run: C harnesses built with clang's
-fsanitize=fuzzer,address,undefined, Python ones under atheris):
  loader     the image loader and, for images it accepts, the forward pass
             (tests/fuzz/fuzz_loader.c)
  binding    the binding core's argument decoding, as both `_llm` bindings
             drive it (tests/fuzz/fuzz_binding.c, native/binding/llm_bind.c)
  tokenizer  the board's tokenizer, both encoders (CPython's unicodedata
             classes and the board's table) against `tokenizers`
             (tests/fuzz/fuzz_tokenizer.py)
  web        the web chat's handling of a page's message
             (tests/fuzz/fuzz_web.py, mpllm.web.server)
  tokenizer_section  the tokenizer section's two readers, the C loader and
             the board's Python, against each other
             (tests/fuzz/fuzz_tokenizer_section.py)
  checkpoint llama2.c's model.bin (v0, v1, v2): the reader and the
             converter's weights of what it accepts (tests/fuzz/fuzz_checkpoint.py)
  tokenizer_bin
             llama2.c's tokenizer.bin: the reader, its image section and the
             board's tokenizer of it against run.c's rule
             (tests/fuzz/fuzz_tokenizer_bin.py)

Corpus: tests/fuzz/corpus/<target>/, committed (small files: the loader's
inputs are edits to a small generated image, build/fuzz/micro.img, made
afresh by each run with the current converter). A run reads the corpus and
writes what it finds into a scratch directory; --grow then merges into the
corpus every new input that reaches code the corpus did not (libFuzzer
-merge=1), so the corpus grows only by what adds coverage.

    python tests/fuzz/fuzzrun.py --seconds 10                 # every target, 10 s each
    python tests/fuzz/fuzzrun.py web --runs 100000            # one target, N executions
    python tests/fuzz/fuzzrun.py --seconds 3600 --grow        # the long run; commit the
                                                              # corpus it grew
The suite runs every target for a few seconds (tests/test_fuzz_*.py). A crash
leaves its input in build/fuzz/artifacts/<target>/ and the exit status is 1;
reproduce it with the command printed (the harness run on that one file).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _p in (ROOT / "tests" / "helpers", ROOT / "tools", ROOT / "firmware" / "modules"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import cbuild
import setup_dev
from locking import locked

CORPUS = HERE / "corpus"
BUILD = ROOT / "build" / "fuzz"
ARTIFACTS = BUILD / "artifacts"
#: the model the loader's seeds and the binding's calls use: every section,
#: but small, so that an execution takes microseconds
MICRO_DIMS = {"vocab_in": 260, "vocab_out": 260, "dim": 16, "n_layers": 1, "n_heads": 1,
              "ffn": 16, "ple_dim": 16, "seq_len": 16, "group": 128, "tied_head": True}


@dataclass(frozen=True)
class Target:
    name: str
    harness: Path
    max_len: int  # bytes of one input
    suite_runs: int  # executions of the suite's short run: about 5 s on an idle machine
    dictionary: Path | None = None  # libFuzzer -dict: tokens worth inserting

    @property
    def corpus(self) -> Path:
        return CORPUS / self.name


TARGETS = {t.name: t for t in (
    Target("loader", HERE / "fuzz_loader.c", 256, 4000),
    Target("binding", HERE / "fuzz_binding.c", 512, 4000),
    Target("tokenizer", HERE / "fuzz_tokenizer.py", 256, 2500),
    Target("web", HERE / "fuzz_web.py", 4096, 50000, HERE / "web.dict"),
    Target("tokenizer_section", HERE / "fuzz_tokenizer_section.py", 4096, 1500),
    Target("checkpoint", HERE / "fuzz_checkpoint.py", 2048, 10000),
    Target("tokenizer_bin", HERE / "fuzz_tokenizer_bin.py", 8192, 15000),
)}


@dataclass(frozen=True)
class Result:
    target: str
    executions: int
    crashes: list[Path]  # the inputs that crashed, kept under build/fuzz/artifacts
    added: int  # inputs --grow merged into the corpus
    corpus_files: int
    corpus_bytes: int
    log: str

    def line(self) -> str:
        return (f"{self.target}: {self.executions} executions, {len(self.crashes)} crashes, "
                f"{self.added} added, corpus {self.corpus_files} files "
                f"({self.corpus_bytes} bytes)")


def micro_image() -> Path:
    """The small model image (build/fuzz/micro.img), made with the current
    converter: an older one may not open any more."""
    from mpllm.convert import convert
    from mpllm.formats.model import Config
    from mpllm.training.generate import write_test_model

    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / "micro.img"
    with locked(BUILD / "micro.lock"):  # parallel runs make it one at a time
        model_bin, tokenizer = write_test_model(BUILD / "micro", Config(**MICRO_DIMS), 7)
        convert(model_bin, tokenizer, out, progress=False)
    return out


def micro_llama2c_image() -> Path:
    """A small llama2.c-family image (build/fuzz/micro-llama2c.img: sentencepiece
    tokenizer, no PLE), made afresh like micro_image."""
    from llama2c_models import synthetic_vocab
    from mpllm.formats import llama2c
    from mpllm.formats.image import write_image
    from mpllm.formats.model import Config
    from mpllm.formats.rope import rope_table
    from mpllm.formats.tokenizer import tokenizer_section
    from mpllm.training.generate import make_weights

    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / "micro-llama2c.img"
    # 320 tokens: the synthetic vocabulary's 285 fixed pieces and some merged ones
    cfg = Config(**{**MICRO_DIMS, "vocab_in": 320, "vocab_out": 320, "ple_dim": 0,
                    "family": "llama2c", "n_kv_heads": 1,
                    "norm_eps": 1e-5, "group": 32})
    with locked(BUILD / "micro-llama2c.lock"):
        tables = llama2c.tokenizer_tables(*synthetic_vocab(cfg.vocab_out))
        write_image(out, make_weights(cfg, 7), tokenizer_section=tokenizer_section(tables),
                    rope=rope_table(cfg), source_sha256=bytes(32), eot_id=tables.eot_id)
    return out


def _build_c(target: Target) -> list[str]:
    clang = setup_dev.clang_fuzzer()  # raises Missing with the reason
    sources = [*cbuild.engine_sources(), cbuild.PORT_HOST / "port_host.c", target.harness]
    extra = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]
    if target.name == "binding":
        binding = ROOT / "native" / "binding"
        sources.append(binding / "llm_bind.c")
        extra += ["-I", str(binding)]
    exe = cbuild.build(f"fuzz_{target.name}", sources, BUILD, compiler=clang, opt="-O1",
                       defines={"FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION": ""}, extra=extra)
    return [str(exe)]


def _python_harness(target: Target) -> list[str]:
    import importlib.util

    if importlib.util.find_spec("atheris") is None:
        raise setup_dev.Missing("atheris is not installed (it comes with "
                                "`pip install -e '.[dev]'`)")
    return [sys.executable, str(target.harness)]


def atheris_fuzz(test_one_input: Callable[[bytes], None]) -> None:
    """A Python harness's main: atheris over sys.argv's libFuzzer flags."""
    import atheris

    # libFuzzer's -merge runs its first argument again through the shell: a
    # .py file is not executable, so it is this Python running the script
    atheris.Setup([shlex.join([sys.executable, sys.argv[0]]), *sys.argv[1:]], test_one_input)
    atheris.Fuzz()


def one_line(e: Exception) -> None:
    """A harness's check of an error the code under test raised on purpose:
    it says what is wrong in one line (or the harness fails)."""
    msg = str(e)
    if not msg or "\n" in msg:
        raise AssertionError(f"{type(e).__name__} without a one-line message: {msg!r}")


def command(target: Target) -> list[str]:
    """The harness as a command (built first for C). Raises setup_dev.Missing."""
    return _build_c(target) if target.harness.suffix == ".c" else _python_harness(target)


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def run(name: str, *, seconds: float, runs: int = 0, grow: bool = False,
        corpus: Path | None = None, seed: int = 0) -> Result:
    """Fuzz one target for `seconds` (or `runs` executions, whichever ends
    first) over its corpus; with grow, merge what adds coverage into it.
    Raises setup_dev.Missing when clang or atheris is missing."""
    target = TARGETS[name]
    corpus = corpus or target.corpus
    corpus.mkdir(parents=True, exist_ok=True)
    cmd = command(target)
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:allocator_may_return_null=1"}
    if target.harness.suffix == ".c":  # the C harnesses' model
        env["MPLLM_FUZZ_IMAGE"] = str(micro_image())
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        scratch, artifacts = Path(tmp) / "new", Path(tmp) / "artifacts"
        scratch.mkdir()
        artifacts.mkdir()
        flags = [f"-max_total_time={max(1, round(seconds))}", f"-max_len={target.max_len}",
                 "-timeout=20", "-rss_limit_mb=2048", f"-seed={seed}", "-print_final_stats=1",
                 f"-artifact_prefix={artifacts}/"]
        if runs:
            flags.append(f"-runs={runs}")
        if target.dictionary:
            flags.append(f"-dict={target.dictionary}")
        dirs = [scratch, corpus]
        r = subprocess.run([*cmd, *flags, *map(str, dirs)], capture_output=True, text=True,
                           env=env, cwd=tmp, check=False, timeout=seconds + 600)
        log = r.stdout + r.stderr
        kept = ARTIFACTS / name  # the crash inputs outlive the run
        if _files(artifacts):
            kept.mkdir(parents=True, exist_ok=True)
        crashes = [Path(shutil.move(str(p), str(kept / p.name))) for p in _files(artifacts)]
        if r.returncode != 0 and not crashes:
            raise RuntimeError(f"fuzz target {name} failed (exit {r.returncode}) without a "
                               f"crash input:\n{log[-4000:]}")
        added = 0
        if grow and not crashes and _files(scratch):  # (libFuzzer merges nothing silently)
            had = {p.name for p in _files(corpus)}
            m = subprocess.run([*cmd, "-merge=1", f"-max_len={target.max_len}", "-timeout=20",
                                str(corpus), str(scratch)], capture_output=True, text=True,
                               env=env, cwd=tmp, check=False, timeout=3600)
            # (the merge's inner runs are the harness run again: none ran, nothing merged)
            if m.returncode != 0 or "MERGE-INNER" not in m.stdout + m.stderr:
                raise RuntimeError(f"merging into {corpus} failed (exit {m.returncode}):\n"
                                   f"{(m.stdout + m.stderr)[-4000:]}")
            added = len({p.name for p in _files(corpus)} - had)
    done = re.search(r"stat::number_of_executed_units: (\d+)", log)
    files = _files(corpus)
    return Result(name, int(done.group(1)) if done else 0, crashes, added, len(files),
                  sum(p.stat().st_size for p in files), log)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tests/fuzz/fuzzrun.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", metavar="TARGET",
                    help=f"which ({', '.join(TARGETS)}); default every one")
    ap.add_argument("--seconds", type=float, default=10.0, help="per target (default 10)")
    ap.add_argument("--runs", type=int, default=0,
                    help="executions per target at most (default: no limit)")
    ap.add_argument("--grow", action="store_true",
                    help="merge new inputs that add coverage into tests/fuzz/corpus/<target>/")
    ap.add_argument("--seed", type=int, default=0,
                    help="libFuzzer's random seed (default 0: a new one each run)")
    args = ap.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        ap.error(f"unknown target {unknown[0]!r}; the targets are {', '.join(TARGETS)}")
    if not args.seconds > 0 or args.runs < 0:
        ap.error("--seconds must be > 0 and --runs >= 0")
    failed = False
    for name in args.targets or list(TARGETS):
        print(f"{name}: fuzzing for {args.seconds:g} s"
              + (f" or {args.runs} executions" if args.runs else "") + " ...", flush=True)
        try:
            result = run(name, seconds=args.seconds, runs=args.runs, grow=args.grow,
                         seed=args.seed)
        except setup_dev.Missing as e:
            print(f"{name}: not run: {e}")
            failed = True
            continue
        print(result.line(), flush=True)
        for crash in result.crashes:
            failed = True
            how = " ".join(command(TARGETS[name]))
            print(f"  CRASH {crash}\n  reproduce: MPLLM_FUZZ_IMAGE={BUILD / 'micro.img'} "
                  f"{how} {crash}")
        if result.crashes:
            print("\n".join(result.log.splitlines()[-30:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
