"""The N8's refusal of a model too large for it (test_flash's release model,
test_stories15m's stories15M): one check for every such model."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpllm.board import firmware_pins as pins
from mpllm.board import flash


def refused_on_the_n8_at_once(model: str, pins_json: Path, dry: bool,
                              monkeypatch: pytest.MonkeyPatch,
                              capfd: pytest.CaptureFixture[str]) -> None:
    """`flash.py --board n8 --model MODEL` (with --dry-run or without) stops
    before anything is downloaded: the weights `pins_json` pins are more than
    the N8's model partition (and fit the N16R8's)."""
    monkeypatch.setattr(flash, "port_missing", lambda port: False)
    monkeypatch.setattr(flash.urllib.request, "urlopen",
                        lambda *a, **k: pytest.fail("downloaded"))
    floor = flash.pinned_image_floor(pins_json)
    n8 = pins.BOARDS["n8"]
    assert floor is not None and n8.model_bytes < floor < pins.BOARDS["n16r8"].model_bytes
    rc = flash.main(["--board", "n8", "--port", "/dev/ttyUSB0", "--model", model]
                    + (["--dry-run"] if dry else []))
    out, err = capfd.readouterr()
    said = (f"--model {model} cannot fit --board n8: its image holds at least {floor:,} bytes "
            f"of weights, the board's 'model' partition {n8.model_bytes:,} (--board n16r8 "
            f"takes it; --board n8 takes demo, llama2c-demo, stories260k)")
    if dry:
        assert rc == 0 and f"missing: {said}" in out and "stop first" in out
    else:
        assert rc == 2 and err.startswith(f"error: {said}") and "download" not in out
