"""Shared pytest fixtures: generated test models (by shape name) and the golden sets;
the rule for a missing tool; the run's own environment.

Models are generated from a fixed seed per shape, converted once, and cached for
the whole session. Under pytest-xdist the workers share one cache directory
(guarded by a file lock), so the release-shaped model is built once per run.

A test whose tool is missing (clang, Chromium, the esp-web-tools bundle, ...)
calls missing_tool(reason): skipped with the reason, except under CI=true,
where `python tools/setup_dev.py` has installed everything and it fails.

The user's settings do not reach the tests: each run has its own MPLLM_CACHE,
and the user's other MPLLM_* variables are removed (_run_environment).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
# The tests run from a checkout whether or not `pip install -e .` was done (the
# in-place `_llm` is in build/inplace: tests/helpers/engine_ext.py).
# tests/helpers holds the modules the tests share (builds, the serial peer, the
# replay double, browser and web clients), imported by name.
for _p in (ROOT / "tools", ROOT / "firmware" / "modules", ROOT / "build" / "inplace",
           ROOT / "tests" / "helpers"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import ctrl_c
import setup_dev
import unix_micropython
from locking import locked as _locked  # (the tests' name for it)
from mpllm import image_cache
from mpllm.formats.model import Config, QMatrix, Weights

# The tools the tests start (and Ctrl-C into) get Ctrl-C as a terminal's
# foreground job has it, however pytest was started: a shell starts a
# background job (`.ci/run &`) with SIGINT ignored, which every child keeps.
ctrl_c.sigint_as_a_terminal_has_it()

# Where the user's cache is, read before _run_environment replaces it: the
# esp-web-tools bundle that set-up fetched lives there.
USER_CACHE = image_cache.default_cache_dir()
# MPLLM_* variables that name a tool or ask for a longer run, not a setting:
# kept for the tests. Every other one is removed.
KEPT_MPLLM_VARS = ("MPLLM_CHROMIUM", "MPLLM_FUZZ_EXAMPLES", "MPLLM_XTENSA_CC",
                   "MPLLM_QEMU_XTENSA")


def missing_tool(reason: str) -> NoReturn:
    """A tool the test needs is missing: skipped with `reason`, except in CI
    (CI=true), where set-up installed every tool, so it fails."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: `python tools/setup_dev.py` should have got it)")
    pytest.skip(reason)


T = TypeVar("T")


def need_tool(find: Callable[[], T]) -> T:
    """find() (one of setup_dev's finders); its Missing becomes missing_tool."""
    try:
        return find()
    except setup_dev.Missing as e:
        missing_tool(str(e))


def web_tools_tarball() -> Path:
    """The pinned esp-web-tools tarball that set-up fetched into the user's cache."""
    return need_tool(lambda: setup_dev.web_tools_tarball(USER_CACHE))


@pytest.fixture(scope="session", autouse=True)
def _run_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Before any other fixture: this run's own image cache instead of the
    user's MPLLM_CACHE or ~/.cache/mpllm (a user's cache must not change a
    result, nor a test write into it), this run's own $XDG_DATA_HOME (where
    the chat saves its stories), and none of the user's MPLLM_* settings."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("MPLLM_")]:
            if name not in KEPT_MPLLM_VARS:
                mp.delenv(name)
        mp.setenv("MPLLM_CACHE", str(tmp_path_factory.mktemp("mpllm-cache")))
        mp.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
        yield

DATA = ROOT / "tests" / "data"
GOLDEN = DATA / "golden"


def _cfg(vin: int, vout: int, d: int, n_layers: int, n_heads: int, ffn: int, ple: int,
         seq: int, *, tied: bool = True) -> Config:
    return Config(vocab_in=vin, vocab_out=vout, dim=d, n_layers=n_layers, n_heads=n_heads,
                  ffn=ffn, ple_dim=ple, seq_len=seq, group=128, tied_head=tied)


# name -> (config, seed). "release" has the published model's exact shape.
MODEL_SHAPES: dict[str, tuple[Config, int]] = {
    "tiny": (_cfg(300, 280, 32, 2, 2, 24, 32, 64), 101),
    # untied head and odd ffn / ple widths: exercises padding and the head section
    "tiny_untied": (_cfg(300, 270, 32, 2, 2, 23, 33, 48, tied=False), 102),
    "small": (_cfg(1024, 900, 64, 3, 4, 44, 64, 128), 103),
    "release": (_cfg(32768, 25353, 96, 6, 4, 66, 128, 256), 104),
}


@dataclass(frozen=True)
class ModelFiles:
    name: str
    config: Config  # of model.bin (vocab_in = source rows)
    seed: int
    model_bin: Path
    tokenizer_json: Path
    image: Path


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # xdist workers each get basetemp/popen-gwN; their parent is shared by the run.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    d = root / "mpllm-models"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def test_model(model_cache_dir: Path) -> Callable[[str], ModelFiles]:
    """test_model(name) -> ModelFiles with model.bin, tokenizer.json and the converted image.

    Names: see MODEL_SHAPES ("tiny", "tiny_untied", "small", "release")."""
    from mpllm.convert import convert
    from mpllm.training.generate import write_test_model

    made: dict[str, ModelFiles] = {}

    def get(name: str) -> ModelFiles:
        if name in made:
            return made[name]
        if name not in MODEL_SHAPES:
            raise KeyError(f"unknown test model {name!r}; known: {sorted(MODEL_SHAPES)}")
        cfg, seed = MODEL_SHAPES[name]
        d = model_cache_dir / name
        done = d / "done"
        with _locked(model_cache_dir / f"{name}.lock"):
            if not done.exists():
                d.mkdir(exist_ok=True)
                model_bin, tok = write_test_model(d, cfg, seed)
                convert(model_bin, tok, d / "model.img", progress=False)
                done.write_text("ok")
        made[name] = ModelFiles(name, cfg, seed, d / "model.bin", d / "tokenizer.json",
                               d / "model.img")
        return made[name]

    return get


@pytest.fixture(scope="session")
def tiny_model(test_model: Callable[[str], ModelFiles]) -> ModelFiles:
    return test_model("tiny")


@pytest.fixture(scope="session")
def small_model(test_model: Callable[[str], ModelFiles]) -> ModelFiles:
    return test_model("small")


@pytest.fixture(scope="session")
def release_model(test_model: Callable[[str], ModelFiles]) -> ModelFiles:
    return test_model("release")


@pytest.fixture(scope="session")
def demo_image(model_cache_dir: Path) -> Path:
    """The bundled demo model converted with an n-gram drafter from 20 of its own
    stories (converted once per run, shared by the xdist workers)."""
    from mpllm.convert import convert

    out = model_cache_dir / "demo-drafts20.img"
    with _locked(model_cache_dir / "demo.lock"):
        if not out.exists():
            demo = ROOT / "models" / "demo"
            convert(demo / "model.bin", demo / "tokenizer.json", out, progress=False,
                    drafter_stories=20, drafter_always=True)
    return out


@pytest.fixture(scope="session")
def llama2c_image(model_cache_dir: Path) -> Callable[[str], Path]:
    """llama2c_image(name) -> the image of a generated llama2.c-shaped model (random
    weights of the stories260K shape, written by mpllm.formats.image; names:
    llama2c_models.LLAMA2C_SHAPES, "untied", "tied", "long"), built once per run."""
    from llama2c_models import LLAMA2C_SHAPES, write_llama2c_image

    def get(name: str) -> Path:
        if name not in LLAMA2C_SHAPES:
            raise KeyError(f"unknown llama2.c test model {name!r}; known: "
                           f"{sorted(LLAMA2C_SHAPES)}")
        out = model_cache_dir / f"llama2c-{name}.img"
        with _locked(model_cache_dir / f"llama2c-{name}.lock"):
            if not out.exists():
                write_llama2c_image(out, name)
        return out

    return get


@dataclass(frozen=True)
class Stories15m:
    model_bin: Path  # the stories15M-shaped checkpoint (legacy v0, as published)
    tokenizer_bin: Path
    image: Path


@pytest.fixture(scope="session")
def stories15m_image(model_cache_dir: Path) -> Stories15m:
    """A stories15M-shaped llama2.c checkpoint with random weights
    (tests/helpers/stories15m.py) converted once per run (a minute: its 4
    drafter stories; shared by the xdist workers) as flash.py converts
    stories15M for the N16R8 (models/stories15m.json: int4, the one format
    whose image fits the model partition), its quality not measured (random
    weights have none) and its n-gram drafter kept whatever it pays, so that
    default decoding drafts. (mpllm.image_cache converts with 200 drafter
    stories and measures every format: many minutes at this size.)"""
    from mpllm.convert import convert
    from stories15m import write_stories15m

    d = model_cache_dir / "stories15m"
    out = d / "model.img"
    with _locked(model_cache_dir / "stories15m.lock"):
        if not out.exists():
            model_bin, tok = write_stories15m(d)
            convert(model_bin, tok, out, progress=False, weights="int4", quality_positions=0,
                    drafter_stories=4, drafter_always=True)
    return Stories15m(d / "stories15M.bin", d / "tokenizer.bin", out)


@pytest.fixture(scope="session")
def engine_image(test_model: Callable[[str], ModelFiles],
                 llama2c_image: Callable[[str], Path]) -> Callable[[str], Path]:
    """engine_image(name) -> an image path by name, for tests run on both families:
    a MODEL_SHAPES name (esp32-ai) or "llama2c_" + an LLAMA2C_SHAPES name."""

    def get(name: str) -> Path:
        if name.startswith("llama2c_"):
            return llama2c_image(name.removeprefix("llama2c_"))
        return test_model(name).image

    return get


@pytest.fixture(scope="session")
def stories260k_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real stories260K (../shared/llama2c) at int8 (convert.py's choice),
    fp32 and int4, with the llama2c demo's 512-token tokenizer."""
    from llama2c_models import STORIES260K_BIN
    from mpllm.convert import convert

    if not STORIES260K_BIN.is_file():
        pytest.skip("../shared/llama2c/stories260K.bin is not here")
    tok = ROOT / "models" / "llama2c-demo" / "tokenizer.bin"
    out = {}
    for weights in ("fp32", "int8", "int4"):
        out[weights] = tmp_path_factory.mktemp("s260k") / f"{weights}.img"
        convert(STORIES260K_BIN, tok, out[weights], progress=False, weights=weights,
                quality_positions=0)
    return out


@dataclass(frozen=True)
class GoldenSet:
    name: str
    dir: Path
    model_bin: Path
    tokenizer_json: Path
    meta: dict
    prompt_ids: list[int]
    generated_ids: list[int]
    logits: np.ndarray  # f32 [N, vout]


GOLDEN_SETS = ("small", "medium")


@pytest.fixture(scope="module")
def micropython() -> Path:
    """MicroPython's unix port with the real `_llm` (skips without MICROPY_DIR)."""
    return unix_micropython.unix_port()


def load_golden(name: str) -> GoldenSet:
    d = GOLDEN / name
    if not (d / "meta.json").is_file():
        pytest.fail(f"golden set {name!r} missing: expected it under tests/data/golden/{name}")
    meta = json.loads((d / "meta.json").read_text())
    lines = (d / "tokens.txt").read_text().splitlines()
    prompt, generated = ([int(x) for x in line.split()] for line in lines[:2])
    logits = np.fromfile(d / "logits.f32", dtype="<f4").reshape(len(generated), meta["vout"])
    return GoldenSet(name, d, d / "model.bin", d / "tokenizer.json", meta, prompt, generated,
                     logits)


@pytest.fixture(scope="session", params=GOLDEN_SETS)
def golden(request: pytest.FixtureRequest) -> GoldenSet:
    """Each committed golden set in turn (tests/data/golden/{small,medium})."""
    return load_golden(request.param)


@pytest.fixture(scope="session")
def golden_sets() -> dict[str, GoldenSet]:
    return {name: load_golden(name) for name in GOLDEN_SETS}


def same_weights(a: Weights, b: Weights) -> None:
    """Exact equality, tensor by tensor (dtype and bytes)."""
    assert a.config == b.config

    def check(x: object, y: object, what: str) -> None:
        if isinstance(x, QMatrix):
            assert isinstance(y, QMatrix), what
            assert x.group == y.group, what
            assert x.q.dtype == y.q.dtype == np.int8, what
            assert x.q.shape == y.q.shape and x.q.tobytes() == y.q.tobytes(), what
            assert y.scales.dtype == np.float16, what
            assert x.scales.tobytes() == y.scales.tobytes(), what
        elif x is None:
            assert y is None, what
        else:
            assert np.asarray(y).dtype == np.float32, what
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), what

    for f in ("tok_emb", "ple_model_proj", "ple_proj_norm", "ple_table", "out_norm", "head"):
        check(getattr(a, f), getattr(b, f), f)
    assert len(a.layers) == len(b.layers)
    for i, (la, lb) in enumerate(zip(a.layers, b.layers)):
        for f in dataclasses.fields(la):
            check(getattr(la, f.name), getattr(lb, f.name), f"layer {i} {f.name}")
