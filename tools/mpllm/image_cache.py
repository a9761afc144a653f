"""Converted images, cached: model.bin + tokenizer.json are converted once and
the image is kept under $MPLLM_CACHE (default $XDG_CACHE_HOME/mpllm or
~/.cache/mpllm), keyed by the sources' sha256, the image format version and
the drafter's story count. The flasher and the host board share it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    """Downloads, clones and converted images: $MPLLM_CACHE, else the user cache's mpllm/."""
    env = os.environ.get("MPLLM_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mpllm"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pinned_choice(model_bin: Path, weights: str = "auto",
                  model_sha256: str | None = None) -> tuple[str, str]:
    """(weights, why) a conversion of model_bin uses: `weights` as asked,
    except that "auto" becomes the format a pinned model's pins name for
    exactly these bytes (mpllm.models.pinned_weights; why says so), else
    ("auto", ""). `model_sha256`: model_bin's, if already known."""
    if weights != "auto":
        return weights, ""
    from .models import pinned_weights

    pinned = pinned_weights(model_sha256 or sha256_file(model_bin))
    return pinned if pinned is not None else (weights, "")


def cached_image_path(model_bin: Path, tokenizer: Path, cache: Path,
                      weights: str = "auto", fit_bytes: int | None = None) -> Path:
    """Where the image converted from these two files is cached: keyed by their hashes
    and the image format version, so a newer format never reads a stale image, the
    weights the conversion uses (pinned_choice), the drafter's story count
    (convert.DRAFTER_STORIES) and rule (drafting.TABLE_RULE),
    and the version of the cost model's figures the converter reads
    (draft_prices.json: the drafts table's min_odds, whether the drafter and the
    certified head pay), so new prices convert again and nothing else of the
    cost model does. fit_bytes (auto's formats limited to a board's model
    partition) keys it too, where auto chooses."""
    from .convert import DRAFTER_STORIES
    from .draft_prices import version
    from .drafting import TABLE_RULE
    from .formats.image import VERSION

    model_sha = sha256_file(model_bin)
    weights = pinned_choice(model_bin, weights, model_sha)[0]
    fits = f"-fits{fit_bytes}" if weights == "auto" and fit_bytes is not None else ""
    key = hashlib.sha256((model_sha + sha256_file(tokenizer)
                          + f"image-v{VERSION}-weights-{weights}{fits}"
                          + f"-drafter{DRAFTER_STORIES}-{TABLE_RULE}"
                          + f"-prices{version()}").encode()).hexdigest()
    return cache / "images" / f"{key[:16]}.img"


def converted(model_bin: Path, tokenizer: Path, cache: Path,
              out: Callable[[str], None] = print, weights: str = "auto",
              fit_bytes: int | None = None) -> Path:
    """The cached image of these sources, converting them first if needed (with
    progress; convert writes atomically, so no partial image is ever cached),
    in the weights asked for, or for a pinned model's bytes the ones its pins
    name (pinned_choice); auto only among the formats whose image fits
    `fit_bytes` (a board's model partition). Raises convert.ConvertError or
    OSError."""
    from .convert import DRAFTER_STORIES, convert

    img = cached_image_path(model_bin, tokenizer, cache, weights, fit_bytes)
    if img.is_file():
        out(f"model image: {img} (already converted from these files)")
        return img
    img.parent.mkdir(parents=True, exist_ok=True)
    weights, why = pinned_choice(model_bin, weights)
    out(f"convert {model_bin} {tokenizer} -> {img}{drafter_note()}")
    if why:
        out(f"weights: {weights}, as its pins say: {why}")
    rep = convert(model_bin, tokenizer, img, progress=True, drafter_stories=DRAFTER_STORIES,
                  weights=weights, fit_bytes=fit_bytes)
    out(rep.size_table())
    if rep.family == "llama2c":
        out(rep.weights_table())
    return img


def drafter_note() -> str:
    from .convert import DRAFTER_STORIES

    return f" (with the n-gram drafter: the model writes {DRAFTER_STORIES} stories on this PC)"


class ImageFileError(ValueError):
    """A model image the tools must not use; the one-line message says why."""


def check_image_file(path: str | os.PathLike[str], what: str = "--image") -> Path:
    """`path` as a Path if it is a regular file holding a valid model image (header,
    section table and every section's CRC, what the engine checks at open);
    else ImageFileError saying what is wrong. The one check of a user's image,
    shared by flash (both boards), serve, chat and bench."""
    from .formats.image import ImageFormatError, verify_image

    p = Path(path)
    where = f"{what} {p}"
    if not p.exists():
        raise ImageFileError(f"{where}: file not found")
    if p.is_dir():
        raise ImageFileError(f"{where} is a directory, not a model image file")
    if not p.is_file():
        raise ImageFileError(f"{where} is not a regular file (a device or a pipe), so not a "
                             f"model image")
    try:
        verify_image(p)
    except ImageFormatError as e:
        raise ImageFileError(f"{where} is not a valid mpllm model image ({e}); convert the "
                             f"model with tools/convert.py") from None
    except OSError as e:
        raise ImageFileError(f"{where}: cannot read it ({e.strerror or e})") from None
    return p
