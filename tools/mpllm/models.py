"""The models the tools know by name: `tools/flash.py --model NAME` and
`tools/chat.py --model NAME` take one of these instead of a model file.

A named model is either bundled (its model file and tokenizer are in the
checkout's models/) or pinned (models/NAME.json lists files to download,
each with its size and sha256; the flasher refuses any other bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .checkout import MODELS as MODELS_DIR


@dataclass(frozen=True)
class NamedModel:
    name: str
    what: str  # one line for --help and messages
    files: tuple[Path, Path] | None = None  # (model, tokenizer) in the checkout
    pins: Path | None = None  # JSON of pinned downloads (see mpllm.board.flash.load_pins)


NAMED_MODELS: dict[str, NamedModel] = {m.name: m for m in (
    NamedModel("demo", "the bundled esp32-ai-family demo model (models/demo)",
               files=(MODELS_DIR / "demo" / "model.bin", MODELS_DIR / "demo" / "tokenizer.json")),
    NamedModel("llama2c-demo", "the bundled llama2.c-format demo model (models/llama2c-demo)",
               files=(MODELS_DIR / "llama2c-demo" / "model.bin",
                      MODELS_DIR / "llama2c-demo" / "tokenizer.bin")),
    NamedModel("release", "the esp32-ai release model, downloaded (models/release.json)",
               pins=MODELS_DIR / "release.json"),
    NamedModel("stories260k", "llama2.c's published stories260K with tok512, downloaded "
               "(models/stories260k.json)", pins=MODELS_DIR / "stories260k.json"),
)}


def names_help() -> str:
    """The names, each with what it is, for --help."""
    return "; ".join(f"{m.name}: {m.what}" for m in NAMED_MODELS.values())
