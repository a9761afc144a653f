"""The models the tools know by name: `tools/flash.py --model NAME` and
`tools/chat.py --model NAME` take one of these instead of a model file.

A named model is either bundled (its model file and tokenizer are in the
checkout's models/) or pinned (models/NAME.json lists files to download,
each with its size and sha256; the flasher refuses any other bytes).
"""

from __future__ import annotations

import json
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
    NamedModel("stories15m", "llama2.c's published stories15M with its 32,000-token "
               "tokenizer.bin, downloaded, for the N16R8 (models/stories15m.json)",
               pins=MODELS_DIR / "stories15m.json"),
)}


#: The llama2.c models the S3 cost model prices by their shape alone
#: (`bench.py --model-s3 --shape NAME`; mpllm.costmodel.llama.SHAPES holds each
#: shape under these names, tests/test_costmodel.py holds the two equal): data
#: here, so the bench's command line offers them without the cost model.
PRICED_SHAPES = ("stories260k", "stories15m", "stories42m")
#: Published rows-scored share of the certified head for greedy on the real
#: release model: 8,427-8,749 of 25,353 rows (esp32-ai board runs, CERT_SEED
#: and action_bench notes). The headline uses 0.34, the range is shown. The
#: cost model's input (costmodel.s3 hands these on) and bench.py --model-s3's
#: --rows-fraction default.
RELEASE_GREEDY_FRACTION = 0.34
RELEASE_GREEDY_RANGE = (8427 / 25353, 8749 / 25353)


def pinned_weights(model_sha256: str) -> tuple[str, str] | None:
    """(weights, why) when these model bytes are a pinned model's whose pins
    name the weight format it is converted to (models/stories15m.json: int4,
    the one format whose image fits the N16R8), else None. Keyed by the
    bytes, not the name, so every tool that converts the published file
    (flash.py, chat.py, serve.py, bench.py through mpllm.image_cache) makes
    the same image of it."""
    for m in NAMED_MODELS.values():
        if m.pins is None:
            continue
        try:
            data = json.loads(m.pins.read_text())
        except (OSError, ValueError):
            continue  # (a broken pins file is flash.load_pins' to report)
        if not isinstance(data, dict) or "weights" not in data:
            continue
        files = data.get("files")
        entries = ([{"name": k, **v} for k, v in files.items()] if isinstance(files, dict)
                   else files if isinstance(files, list) else [])
        for f in entries:
            if (isinstance(f, dict) and f.get("name") == data.get("model")
                    and str(f.get("sha256", "")).lower() == model_sha256.lower()):
                return str(data["weights"]), str(data.get("weights_why", ""))
    return None


def names_help() -> str:
    """The names, each with what it is, for --help."""
    return "; ".join(f"{m.name}: {m.what}" for m in NAMED_MODELS.values())
