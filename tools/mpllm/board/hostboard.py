"""The host board: the board's own `llm.py` on the PC, over the CPython `_llm` engine.

    from mpllm.board import hostboard
    llm = hostboard.open_demo()        # converts models/demo once, then reuses the image
    llm.story("Once upon a time")

Images converted from model.bin + tokenizer.json are cached under
$MPLLM_CACHE (default $XDG_CACHE_HOME/mpllm or ~/.cache/mpllm), in the same
`images/` layout as `tools/flash.py --board host`, keyed by the sources'
sha256: editing either source file gives a new image, the same files reuse it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

from .. import checkout, image_cache

DEMO_DIR = checkout.DEMO_DIR


class HostBoardError(RuntimeError):
    """The host board cannot start; the message says why and what to do."""


def cache_dir() -> Path:
    """Where converted images live (shared with tools/flash.py)."""
    return image_cache.default_cache_dir()


def import_llm() -> ModuleType:
    """The `llm` module and its engine, from an install or from this checkout."""
    try:
        return checkout.import_llm()
    except checkout.NotBuilt as e:
        raise HostBoardError(str(e)) from None


def demo_sources(demo_dir: Path = DEMO_DIR) -> tuple[Path, Path]:
    """(model.bin, tokenizer.json) of the bundled demo model."""
    model_bin, tok = demo_dir / "model.bin", demo_dir / "tokenizer.json"
    for p in (model_bin, tok):
        if not p.is_file():
            raise HostBoardError(
                f"demo model file missing: {p} (run from a checkout of mpllm, or pass "
                f"--image with a converted model image)"
            )
    return model_bin, tok


def named_sources(name: str, cache: Path | None = None) -> tuple[Path, Path]:
    """(model, tokenizer) of a model named as mpllm.models names it: a bundled
    one's files, or a pinned one's (release, stories260k, stories15m), downloaded once
    into the cache's models/NAME and verified (the flasher's download, shared
    with `tools/flash.py --board host --model NAME`)."""
    from ..models import NAMED_MODELS

    named = NAMED_MODELS.get(name)
    if named is None:
        raise HostBoardError(f"--model {name}: no such model ({', '.join(NAMED_MODELS)})")
    if named.files is None:
        assert named.pins is not None
        from .firmware_build import Runner, ToolError
        from .flash import fetch_pins

        cache = cache_dir() if cache is None else cache
        try:
            return fetch_pins(named.pins, cache / "models" / name, Runner(False, say))
        except ToolError as e:
            raise HostBoardError(str(e)) from None
    for p in named.files:
        if not p.is_file():
            raise HostBoardError(f"--model {name}: file missing: {p} (run from a checkout "
                                 "of mpllm)")
    return named.files


def say(text: str) -> None:
    # Progress goes to stderr, so that stdout carries only the story.
    print(text, file=sys.stderr, flush=True)


def ensure_image(model_bin: Path, tokenizer_json: Path, cache: Path | None = None) -> Path:
    """The cached image converted from these two files, converting them if needed.

    The first conversion shows its progress on stderr."""
    from ..convert import ConvertError

    cache = cache_dir() if cache is None else cache
    # Checked here first so that a cached image is reused without a word.
    cached = image_cache.cached_image_path(model_bin, tokenizer_json, cache)
    if cached.is_file():
        return cached
    say(f"Converting {model_bin} + {tokenizer_json.name} into a model image "
         f"(first run only; cached in {cache / 'images'})")
    try:
        return image_cache.converted(model_bin, tokenizer_json, cache, say)
    except (ConvertError, OSError) as e:
        raise HostBoardError(f"conversion failed: {e}") from None


def open_image(image: str | os.PathLike[str]) -> ModuleType:
    """`llm` with the image at `image` loaded (replacing any other open model)."""
    llm = import_llm()
    path = Path(image)
    if not path.is_file():
        raise HostBoardError(f"model image not found: {path}")
    llm.load(str(path))
    return llm


def open_sources(model_bin: Path, tokenizer_json: Path, cache: Path | None = None) -> ModuleType:
    """`llm` with the (cached) image of model.bin + tokenizer.json loaded.

    A cached image the engine rejects (damaged on disk, or written by an
    older converter) is converted again once."""
    llm = import_llm()
    import _llm

    img = ensure_image(model_bin, tokenizer_json, cache)
    try:
        llm.load(str(img))
    except _llm.Error as e:
        say(f"the cached image {img} cannot be used ({e}); converting again")
        img.unlink(missing_ok=True)
        img = ensure_image(model_bin, tokenizer_json, cache)
        llm.load(str(img))
    return llm


def open_demo(cache: Path | None = None) -> ModuleType:
    """`llm` with the bundled demo model loaded (converted on first use)."""
    model_bin, tok = demo_sources()
    return open_sources(model_bin, tok, cache)
