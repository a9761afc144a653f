"""What a draft position and the certified head cost on the S3, as data:
tools/mpllm/draft_prices.json, written by the cost model (`python -m
mpllm.costmodel.prices --write`; tests/test_costmodel.py checks that the
committed file equals what the cost model computes now, so it cannot drift).

The converter needs three figures of a model's shape, and only these: the
draft prices (what draft k adds to a verify pass, as a fraction of a plain
step: the drafts table's min_odds), the verify loop's overhead in plain steps
(whether a drafter pays at all) and a plain step's modeled ms with the
certified head at a share of rows scored and with the dense head (whether
the certificate saves time). The file holds them for the shapes the tools
know (the bundled demos, the release model, llama2.c's stories models at
each weight format); any other shape is priced as the nearest of them, and
`Prices.exact` says so. `VERSION` (a hash of the file) keys the image cache:
new prices, new images. Reading the file imports nothing of the cost model.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["DATA", "KEYS", "Prices", "prices_for", "shape_key", "version"]

DATA = Path(__file__).with_name("draft_prices.json")
#: the shape fields the prices depend on (the engine's config keys)
KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn", "ple_dim", "vocab_out", "seq_len",
        "group", "weights")


def shape_key(cfg: Mapping[str, object]) -> dict[str, object]:
    """The priced fields of a shape from `_llm.Model.config()` (or any mapping with
    its keys): n_kv_heads 0 means n_heads; weights int4 unless named."""
    key: dict[str, object] = {k: int(cfg[k]) for k in KEYS[:-1] if k != "n_kv_heads"}  # type: ignore[call-overload]
    key["n_kv_heads"] = int(cfg.get("n_kv_heads", 0) or 0) or key["n_heads"]  # type: ignore[call-overload]
    key["weights"] = str(cfg.get("weights", "int4"))
    return {k: key[k] for k in KEYS}


@dataclass(frozen=True)
class Prices:
    """One tabulated shape's figures (see the module's docstring)."""

    name: str  # the shape's name in the file
    exact: bool  # the shape asked for is this one (else the nearest)
    draft: tuple[float, ...] | None  # None: the context holds no verify pass
    loop: tuple[float, float] | None  # (a pass of one position, the loop per token)
    head_rows: tuple[float, ...]  # the rows fractions of head_cert_ms: 0, 0.01, .. 1
    head_cert_ms: tuple[float, ...]
    head_dense_ms: float

    def head_step_ms(self, rows_fraction: float) -> tuple[float, float]:
        """A plain step's modeled ms with the certified head scoring
        `rows_fraction` of the rows (linear between the tabulated fractions), and
        with the dense head."""
        if not 0.0 <= rows_fraction <= 1.0:
            raise ValueError(f"rows_fraction {rows_fraction}: must be in 0..1")
        xs, ys = self.head_rows, self.head_cert_ms
        i = min(max(1, next((k for k, x in enumerate(xs) if x >= rows_fraction), len(xs) - 1)),
                len(xs) - 1)
        t = (rows_fraction - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1]), self.head_dense_ms


@lru_cache(maxsize=4)
def _read(path: Path) -> tuple[str, list[dict[str, object]]]:
    raw = path.read_bytes()
    return hashlib.sha256(raw).hexdigest()[:16], json.loads(raw)["shapes"]


def _load() -> tuple[str, list[dict[str, object]]]:
    return _read(DATA)


def version() -> str:
    """A hash of draft_prices.json: what the image cache keys on."""
    return _load()[0]


def _distance(a: Mapping[str, object], b: Mapping[str, object]) -> float:
    """How far two shapes are: the summed log-ratios of their sizes, a format
    apart counting as a doubling of one of them."""
    d = sum(abs(math.log2(int(a[k]) + 1) - math.log2(int(b[k]) + 1))  # type: ignore[call-overload]
            for k in KEYS[:-1])
    return d + (a["weights"] != b["weights"])


def prices_for(cfg: Mapping[str, object]) -> Prices:
    """The figures of the shape `cfg` (engine config keys), or of the nearest
    tabulated shape (`exact` False) when the file has none for it."""
    want = shape_key(cfg)
    entries = _load()[1]
    best = min(entries, key=lambda e: _distance(want, e["shape"]))  # type: ignore[arg-type]
    exact = best["shape"] == want
    draft = best["draft"]
    loop = best["loop"]
    head = best["head"]
    # a context too short for a story's prompt and a verify pass after it has no prices
    has_pass = want["seq_len"] >= int(best["min_seq_len"])  # type: ignore[call-overload]
    return Prices(str(best["name"]), exact,
                  tuple(draft) if has_pass else None,  # type: ignore[arg-type]
                  tuple(loop) if has_pass else None,  # type: ignore[arg-type]
                  tuple(head["rows"]), tuple(head["cert_ms"]),  # type: ignore[index]
                  float(head["dense_ms"]))  # type: ignore[index]
