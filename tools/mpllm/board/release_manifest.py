"""The release manifest (release-manifest.json: every asset's name, kind,
flash offset, size and sha256) and the esp-web-tools manifest (manifest.json):
what tools/mpllm/board/release.py writes and tools/flash.py --firmware URL
reads back, defined once for both."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from . import firmware_pins as pins

# Asset names, as published on a release and as the web page fetches them.
FIRMWARE_ASSET = "firmware.bin"
MODEL_ASSET = "mpllm-model.img"
MERGED_ASSET = "mpllm-n16r8-merged.bin"
RELEASE_MANIFEST = "release-manifest.json"
WEB_MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
KINDS = ("firmware", "model", "merged")


class ReleaseError(ValueError):
    """An input or a manifest is not what a release needs; the message says what."""


@dataclass(frozen=True)
class Asset:
    name: str
    kind: str  # one of KINDS
    offset: int  # where it is written on the flash
    size: int
    sha256: str


def release_manifest(assets: list[Asset], version: str) -> dict:
    return {
        "schema": MANIFEST_SCHEMA,
        "project": "mpllm",
        "version": version,
        "board": pins.BOARD,
        "chip": pins.CHIP,
        "flash_bytes": pins.FLASH_BYTES,
        "micropython": pins.MICROPYTHON_TAG,
        "esp_idf": pins.ESP_IDF_VERSION,
        "files": [{"name": a.name, "kind": a.kind, "offset": a.offset, "size": a.size,
                   "sha256": a.sha256} for a in assets],
    }


def parse_release_manifest(text: str, source: str) -> list[Asset]:
    """The assets a release manifest lists; ReleaseError names what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ReleaseError(f"{source} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise ReleaseError(f"{source} is not an mpllm release manifest (schema "
                           f"{MANIFEST_SCHEMA} expected)")
    if data.get("board") != pins.BOARD:
        raise ReleaseError(f"{source} is for board {data.get('board')!r}, not {pins.BOARD}")
    files = data.get("files")
    if not isinstance(files, list) or not files:
        raise ReleaseError(f"{source}: no 'files' list")
    out = []
    for i, f in enumerate(files):
        where = f"{source}: files[{i}]"
        if not isinstance(f, dict):
            raise ReleaseError(f"{where} is not an object")
        name, kind, sha = f.get("name"), f.get("kind"), f.get("sha256")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ReleaseError(f"{where}: name {name!r} is not a plain file name")
        if kind not in KINDS:
            raise ReleaseError(f"{where} ({name}): kind {kind!r} is not one of {KINDS}")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ReleaseError(f"{where} ({name}): sha256 {sha!r} is not 64 hex digits")
        size, offset = f.get("size"), f.get("offset")
        if not isinstance(size, int) or size <= 0 or not isinstance(offset, int) or offset < 0:
            raise ReleaseError(f"{where} ({name}): needs a positive integer size and an "
                               f"integer offset")
        out.append(Asset(name, kind, offset, size, sha))
    return out


def web_manifest(version: str, firmware: Asset, model: Asset) -> dict:
    """The esp-web-tools manifest: both parts at their partition offsets.

    Erasing is never offered: the firmware and the model are written over
    what was there, and MicroPython's filesystem after the model survives,
    as with tools/flash.py. No Improv Wi-Fi step: the firmware has none."""
    return {
        "name": f"mpllm for {pins.CHIP} N16R8",
        "version": version,
        "new_install_prompt_erase": False,
        "new_install_improv_wait_time": 0,
        "builds": [{
            "chipFamily": pins.CHIP,
            "parts": [{"path": firmware.name, "offset": firmware.offset},
                      {"path": model.name, "offset": model.offset}],
        }],
    }
