"""Release assets: what a maker needs to put mpllm on a board without ESP-IDF.

The release workflow (.github/workflows/firmware.yml) builds firmware.bin with
mpllm.board.firmware_build and the model image with `model-image`, then runs
`assets` and `site`:

    python -m mpllm.board.release pins                      # versions, for the workflow
    python -m mpllm.board.release model-image --out dist    # release model -> image
    python -m mpllm.board.release assets --firmware dist/firmware.bin \\
        --image dist/mpllm-model.img --version v0.1.0 --out dist
    python -m mpllm.board.release web-tools                 # fetch + verify esp-web-tools
    python -m mpllm.board.release site --assets dist --out site

`assets` writes, beside firmware.bin and the model image:
  * mpllm-n16r8-merged.bin: firmware and model in one file for offset 0x0
    (what `esptool write-flash 0x0 FILE` or any single-file flasher takes);
  * release-manifest.json: every asset's size, sha256 and flash offset
    (`tools/flash.py --firmware URL` checks downloads against it);
  * manifest.json: the esp-web-tools manifest the browser flasher reads.
Every offset comes from the board's partitions.csv (formats.partitions); none
is written down here.

Only the standard library is imported at module level, so `pins` runs with a
bare `PYTHONPATH=tools python3`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from .. import __version__, checkout, image_cache
from ..atomic import atomic_path, atomic_write_bytes
from ..formats.partitions import FlashRegion, PartitionError, flash_regions, load_partitions
from . import firmware_pins as pins
from .firmware_build import ToolError
from .release_manifest import (
    FIRMWARE_ASSET,
    MERGED_ASSET,
    MODEL_ASSET,
    RELEASE_MANIFEST,
    WEB_MANIFEST,
    Asset,
    ReleaseError,
    parse_release_manifest,
    release_manifest,
    web_manifest,
)

ROOT = checkout.ROOT
PARTITION_TABLE = ROOT / pins.BOARD_DIR / "partitions.csv"
WEB_DIR = ROOT / "firmware" / "web"

# esp-web-tools, vendored into the web page at release time (never loaded from
# a CDN). The integrity is npm's sha512 of the published tarball: a registry
# that serves other bytes under this version is refused.
ESP_WEB_TOOLS = "esp-web-tools"
ESP_WEB_TOOLS_VERSION = "10.4.0"
ESP_WEB_TOOLS_INTEGRITY = ("sha512-3pwkeFFm5Fj7UQo8SJNYK5RXrtNCpq6X9QoI6bMT4GBZWgrJqjn0YvM9"
                           "ihG74BtMoSFYXfmDtkehuxe50PTMPQ==")
# Where `site` puts it; the pages import it from this path.
WEB_TOOLS_DIR = "vendor/esp-web-tools"
# The parts of the package the page needs: the prebuilt browser bundle and its licence.
_WEB_TOOLS_FILES = re.compile(r"^package/(dist/web/[A-Za-z0-9_.-]+\.js|LICENSE)$")
# firmware/web files that are the page (everything else there is for developers).
_PAGE_SUFFIXES = (".html", ".js", ".css", ".svg")

# Padding between the firmware and the model in the merged image: erased flash
# reads as 0xFF, so this is what a separate write of the two would leave.
_ERASED = b"\xff"


def board_regions(table: Path = PARTITION_TABLE) -> tuple[FlashRegion, FlashRegion]:
    """(firmware, model) regions of the board's partition table."""
    try:
        return flash_regions(load_partitions(table), pins.MODEL_PARTITION)
    except PartitionError as e:
        raise ReleaseError(f"board partition table: {e}") from None


def write_json(path: Path, data: dict) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())


# ---------------------------------------------------------------------------
# the assets


def _asset(path: Path, name: str, kind: str, offset: int) -> Asset:
    return Asset(name, kind, offset, path.stat().st_size, image_cache.sha256_file(path))


def _check_fits(path: Path, region: FlashRegion, what: str) -> None:
    size = path.stat().st_size
    if size == 0:
        raise ReleaseError(f"{what} {path} is empty")
    if size > region.limit:
        raise ReleaseError(f"{what} {path} is {size} bytes; it has {region.limit} bytes from "
                           f"{region.offset:#x} on (partitions.csv)")


def check_firmware(path: Path, region: FlashRegion) -> None:
    if not path.is_file():
        raise ReleaseError(f"firmware file not found: {path}")
    with open(path, "rb") as f:
        if f.read(1) != b"\xe9":  # every ESP32 boot image starts with 0xE9
            raise ReleaseError(f"{path} is not an ESP32 firmware image (no 0xE9 magic byte); "
                               f"use build-{pins.BOARD}/firmware.bin")
    _check_fits(path, region, "firmware")


def check_model_image(path: Path, region: FlashRegion) -> None:
    if not path.is_file():
        raise ReleaseError(f"model image not found: {path}")
    _check_fits(path, region, "model image")
    from ..formats.image import ImageFormatError, verify_image  # numpy: only here

    try:
        verify_image(path)
    except ImageFormatError as e:
        raise ReleaseError(f"{path} is not a valid mpllm model image: {e}") from None


def build_assets(firmware: Path, image: Path, out: Path, version: str,
                 table: Path = PARTITION_TABLE) -> list[Asset]:
    """Write every release asset into `out`; returns them (manifests excluded)."""
    fw_region, model_region = board_regions(table)
    check_firmware(firmware, fw_region)
    check_model_image(image, model_region)
    out.mkdir(parents=True, exist_ok=True)
    fw_out, img_out, merged_out = out / FIRMWARE_ASSET, out / MODEL_ASSET, out / MERGED_ASSET
    for src, dest in ((firmware, fw_out), (image, img_out)):
        if src.resolve() != dest.resolve():
            with atomic_path(dest) as tmp:
                shutil.copyfile(src, tmp)
    with atomic_path(merged_out) as tmp, open(tmp, "wb") as f:
        f.write(fw_out.read_bytes())
        gap = model_region.offset - fw_region.offset - fw_out.stat().st_size
        f.write(_ERASED * gap)
        with open(img_out, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)
    assets = [_asset(fw_out, FIRMWARE_ASSET, "firmware", fw_region.offset),
              _asset(img_out, MODEL_ASSET, "model", model_region.offset),
              _asset(merged_out, MERGED_ASSET, "merged", fw_region.offset)]
    write_json(out / RELEASE_MANIFEST, release_manifest(assets, version))
    write_json(out / WEB_MANIFEST, web_manifest(version, assets[0], assets[1]))
    return assets


def model_image(out: Path, cache: Path) -> Path:
    """The release model (downloaded and verified against models/release.json),
    converted with its n-gram drafter exactly as tools/flash.py converts it."""
    from . import flash  # the converter and its numpy: only for this command

    run = flash.Runner(dry_run=False)
    pinned = {p.name: p for p in flash.load_release(flash.RELEASE_JSON)}
    model_bin = flash.fetch_pinned(pinned["model.bin"], cache / "release", run)
    tok = flash.fetch_pinned(pinned["tokenizer.json"], cache / "release", run)
    img = flash.image_for(model_bin, tok, cache, run)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / MODEL_ASSET
    with atomic_path(dest) as tmp:
        shutil.copyfile(img, tmp)
    return dest


# ---------------------------------------------------------------------------
# esp-web-tools, vendored


def npm_integrity(path: Path) -> str:
    """npm's integrity string (sha512, base64) of a file."""
    h = hashlib.sha512()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha512-" + base64.b64encode(h.digest()).decode()


def web_tools_tarball(cache: Path, *, offline: bool) -> Path:
    """The pinned esp-web-tools tarball, verified; fetched with `npm pack` into
    the cache unless it is there already (offline: never fetched)."""
    dest = cache / "npm" / f"{ESP_WEB_TOOLS}-{ESP_WEB_TOOLS_VERSION}.tgz"
    if dest.is_file() and npm_integrity(dest) == ESP_WEB_TOOLS_INTEGRITY:
        return dest
    if offline:
        raise ReleaseError(f"{ESP_WEB_TOOLS} {ESP_WEB_TOOLS_VERSION} is not in {dest.parent}: "
                           f"fetch it once with `python -m mpllm.board.release web-tools` "
                           f"(needs npm and the npm registry)")
    npm = shutil.which("npm")
    if npm is None:
        raise ReleaseError("npm is not installed; it fetches esp-web-tools from the npm "
                           "registry (install Node.js)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        r = subprocess.run([npm, "pack", f"{ESP_WEB_TOOLS}@{ESP_WEB_TOOLS_VERSION}",
                            "--pack-destination", tmp, "--silent"],
                           capture_output=True, text=True, check=False)
        got = sorted(Path(tmp).glob("*.tgz"))
        if r.returncode != 0 or len(got) != 1:
            raise ReleaseError(f"npm pack {ESP_WEB_TOOLS}@{ESP_WEB_TOOLS_VERSION} failed "
                               f"(exit {r.returncode}): {r.stderr.strip()}")
        have = npm_integrity(got[0])
        if have != ESP_WEB_TOOLS_INTEGRITY:
            raise ReleaseError(f"{ESP_WEB_TOOLS} {ESP_WEB_TOOLS_VERSION} from the registry has "
                               f"integrity {have}, pinned is {ESP_WEB_TOOLS_INTEGRITY}; "
                               f"nothing was kept")
        with atomic_path(dest) as t:
            shutil.copyfile(got[0], t)
    return dest


def vendor_web_tools(tarball: Path, dest: Path) -> list[Path]:
    """Unpack esp-web-tools' browser bundle (and licence) into `dest`."""
    if npm_integrity(tarball) != ESP_WEB_TOOLS_INTEGRITY:
        raise ReleaseError(f"{tarball} is not the pinned {ESP_WEB_TOOLS} "
                           f"{ESP_WEB_TOOLS_VERSION} tarball")
    written = []
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            m = _WEB_TOOLS_FILES.match(member.name)
            if not m or not member.isfile():
                continue
            rel = PurePosixPath(m.group(1))
            target = dest / (rel.name if rel.name == "LICENSE" else rel.relative_to("dist/web"))
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member)
            assert data is not None  # a regular file always has data
            atomic_write_bytes(target, data.read())
            written.append(target)
    if not (dest / "install-button.js").is_file():
        raise ReleaseError(f"{tarball} has no dist/web/install-button.js")
    return written


# ---------------------------------------------------------------------------
# the web site


def page_files(web_dir: Path = WEB_DIR) -> list[Path]:
    return sorted(p for p in web_dir.iterdir() if p.is_file() and p.suffix in _PAGE_SUFFIXES)


def assemble_site(assets: Path, out: Path, web_tools: Path, web_dir: Path = WEB_DIR) -> None:
    """The static site: the pages, the flashed assets with both manifests, and
    the vendored esp-web-tools. Serve `out` over HTTPS (or localhost)."""
    listed = parse_release_manifest((assets / RELEASE_MANIFEST).read_text(),
                                    str(assets / RELEASE_MANIFEST))
    needed = [a.name for a in listed if a.kind in ("firmware", "model")]
    needed += [RELEASE_MANIFEST, WEB_MANIFEST]
    missing = [n for n in needed if not (assets / n).is_file()]
    if missing:
        raise ReleaseError(f"{assets} lacks {', '.join(missing)} (run `assets` first)")
    out.mkdir(parents=True, exist_ok=True)
    for src in page_files(web_dir):
        atomic_write_bytes(out / src.name, src.read_bytes())
    for name in needed:
        with atomic_path(out / name) as tmp:
            shutil.copyfile(assets / name, tmp)
    vendor_web_tools(web_tools, out / WEB_TOOLS_DIR)


# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mpllm.board.release",
                                 description="Make the mpllm release assets and web flasher.")
    ap.add_argument("--cache", help="cache directory (default $MPLLM_CACHE, else "
                    "~/.cache/mpllm)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("pins", help="print the pinned versions as NAME=VALUE lines (for "
                   "$GITHUB_OUTPUT)")
    p = sub.add_parser("model-image", help="download the release model, convert it into "
                       f"OUT/{MODEL_ASSET}")
    p.add_argument("--out", required=True, help="directory to write the image into")
    p = sub.add_parser("assets", help="firmware + image -> every release asset and manifest")
    p.add_argument("--firmware", required=True, help="the built firmware.bin")
    p.add_argument("--image", required=True, help="the converted model image")
    p.add_argument("--version", default=f"v{__version__}",
                   help="release version (default: the package's, v%(default)s)")
    p.add_argument("--out", required=True, help="directory for the assets")
    p = sub.add_parser("web-tools", help=f"fetch and verify {ESP_WEB_TOOLS} "
                       f"{ESP_WEB_TOOLS_VERSION} into the cache (npm pack)")
    p.add_argument("--offline", action="store_true", help="only check the cached copy")
    p = sub.add_parser("site", help="assemble the web flasher and chat site")
    p.add_argument("--assets", required=True, help="directory that `assets` wrote")
    p.add_argument("--out", required=True, help="directory for the site")
    p.add_argument("--offline", action="store_true",
                   help=f"use the cached {ESP_WEB_TOOLS} only (no npm)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cache = Path(args.cache).expanduser().resolve() if args.cache else \
        image_cache.default_cache_dir()
    try:
        if args.command == "pins":
            print(f"micropython={pins.MICROPYTHON_TAG}")
            print(f"esp_idf={pins.ESP_IDF_VERSION}")
            print(f"board={pins.BOARD}")
        elif args.command == "model-image":
            dest = model_image(Path(args.out), cache)
            print(f"{dest}: {dest.stat().st_size} bytes")
        elif args.command == "assets":
            for a in build_assets(Path(args.firmware), Path(args.image), Path(args.out),
                                  args.version):
                print(f"{a.name:24} {a.kind:8} at {a.offset:#08x} {a.size:>10} bytes  "
                      f"sha256 {a.sha256}")
        elif args.command == "web-tools":
            print(web_tools_tarball(cache, offline=args.offline))
        elif args.command == "site":
            tarball = web_tools_tarball(cache, offline=args.offline)
            assemble_site(Path(args.assets), Path(args.out), tarball)
            print(f"site in {args.out}")
    except (ReleaseError, ToolError, OSError) as e:  # ToolError: flash's, in model-image
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
