"""Put mpllm on a board: fetch and verify the model, convert it, build the
firmware, check the chip, write both at their partition offsets, verify by hash.

    python tools/flash.py --board n16r8 --port /dev/ttyACM0
    python tools/flash.py --board n16r8 --port COM5 --only model --model m.bin --tokenizer t.json
    python tools/flash.py --board n16r8 --dry-run          # print every command, touch nothing
    python tools/flash.py --board n16r8 --port COM5 --firmware URL --image URL   # no toolchain
    python tools/flash.py --board n8 --port /dev/ttyUSB0  # no PSRAM: llama2.c's stories260K
    python tools/flash.py --board host                     # the same preparation for the PC
    python tools/flash.py --board host --model stories260k # a model by name (mpllm.models)
    python tools/flash.py --board n16r8 --port COM5 --model stories15m  # llama2.c's stories15M

esptool, git, make and pip do the work under their own names (each run as a
subprocess whose output streams to the terminal, which is also the progress
display); this module decides what to run, checks what they report and stops
with a clear message before anything is written when something is off. The
firmware build itself is firmware_build's (the release workflow runs the same).
--firmware URL / --image URL take a release's assets instead of building or
converting: each is checked against the release's release-manifest.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import checkout, image_cache
from ..formats.partitions import (
    PartitionError,
    app_partition,
    check_layout,
    flash_regions,
    load_partitions,
)
from ..image_cache import sha256_file
from ..models import NAMED_MODELS, names_help
from . import firmware_build
from . import firmware_pins as pins
from . import release_manifest as release
from .firmware_build import Runner, ToolError, exit_status

ROOT = checkout.ROOT
RELEASE_JSON = ROOT / "models" / "release.json"
DEMO_DIR = checkout.DEMO_DIR
DEFAULT_BAUD = 460800
# A release manifest is a few hundred bytes; anything much larger is not one.
MANIFEST_LIMIT = 1 << 20
RELEASES_HINT = (f"Or skip the build: pass --firmware with the URL of the {release.FIRMWARE_ASSET} "
                 f"asset of an mpllm release (on the project's GitHub releases page; it is "
                 f"checked against the release's {release.RELEASE_MANIFEST}), or --firmware FILE "
                 f"for a firmware.bin built elsewhere.")


class FlashError(ToolError):
    """Stops the run before anything (more) is written; the message says why and what to do."""


# ---------------------------------------------------------------------------
# release model files


@dataclass(frozen=True)
class PinnedFile:
    name: str
    url: str
    size: int
    sha256: str


def load_release(path: Path) -> list[PinnedFile]:
    """The pinned files of models/release.json (the ones flash needs: model.bin and
    tokenizer.json), sorted by name; see load_pins."""
    return sorted(load_pins(path), key=lambda p: p.name)


def load_pins(path: Path) -> tuple[PinnedFile, PinnedFile]:
    """(model, tokenizer) pins of a model's JSON (models/release.json,
    models/stories260k.json): its `model` and `tokenizer` keys name the two
    files (default model.bin and tokenizer.json). Accepts `files` as a list of
    {name,...} or a {name: {...}} map; a file without a url gets the Hugging
    Face resolve URL of `repo`@`revision`."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise FlashError(f"cannot read the release pins {path}: {e.strerror}") from None
    except ValueError as e:
        raise FlashError(f"{path} is not valid JSON: {e}") from None
    files = data.get("files")
    if isinstance(files, dict):
        files = [{"name": k, **v} for k, v in files.items()]
    if not isinstance(files, list):
        raise FlashError(f"{path}: no 'files' list")
    repo = data.get("repo") or data.get("hf_repo")
    revision = data.get("revision") or data.get("commit") or "main"
    wanted = (str(data.get("model", "model.bin")), str(data.get("tokenizer", "tokenizer.json")))
    out: dict[str, PinnedFile] = {}
    for f in files:
        name = f.get("name") or f.get("path")
        if name not in wanted:
            continue
        url = f.get("url")
        if not url:
            if not repo:
                raise FlashError(f"{path}: {name} has no url and the file names no repo")
            url = f"https://huggingface.co/{repo}/resolve/{revision}/{name}"
        try:
            size = int(f["size"])
            sha = str(f["sha256"]).lower()
        except (KeyError, ValueError, TypeError):
            raise FlashError(f"{path}: {name} needs an integer size and a sha256") from None
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise FlashError(f"{path}: {name}: sha256 {sha!r} is not 64 hex digits")
        out[name] = PinnedFile(name, url, size, sha)
    if set(out) != set(wanted):
        raise FlashError(f"{path}: needs pins for {wanted[0]} and {wanted[1]}, has "
                         f"{sorted(out)}")
    return out[wanted[0]], out[wanted[1]]


def _why(e: OSError) -> object:
    """What went wrong with a download, in a few words (HTTP 404 Not Found, Connection refused)."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    return getattr(e, "reason", None) or getattr(e, "strerror", None) or e


def _progress_bar(total: int, desc: str):  # tqdm bar, or None without tqdm
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, leave=False)


class DownloadError(FlashError):
    """A pinned file could not be fetched (no network, a server's error); what
    was received is kept in its .part file for the next run to resume."""


def fetch_pinned(pin: PinnedFile, dest_dir: Path, run: Runner) -> Path:
    """Return dest_dir/name holding exactly the pinned bytes, downloading if needed.

    The download goes to dest_dir/name.part and is renamed to its name only
    once its size and sha256 match the pin: a run stopped part way (Ctrl-C,
    the network gone) leaves the .part, and the next run resumes it (an HTTP
    range request; a server that ignores it sends the whole file again). A
    download that does not match is deleted; nothing unverified gets the name."""
    dest = dest_dir / pin.name
    if run.dry_run:
        run.out(f"download {pin.url} -> {dest} (verify {pin.size} bytes, sha256 {pin.sha256})")
        return dest
    if dest.is_file():
        if dest.stat().st_size == pin.size and sha256_file(dest) == pin.sha256:
            run.out(f"{pin.name}: cached copy verified ({pin.size} bytes, sha256 ok)")
            return dest
        run.out(f"{pin.name}: the copy in {dest_dir} does not match its pin "
                f"({pin.size} bytes, sha256 {pin.sha256}); downloading it again")
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest_dir / (pin.name + ".part")
    h = hashlib.sha256()
    have = part.stat().st_size if part.is_file() else 0
    if have >= pin.size:  # a .part as long as the file is a finished one that failed: anew
        have = 0
    if have:
        with open(part, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    request = urllib.request.Request(pin.url)
    if have:
        request.add_header("Range", f"bytes={have}-")
    bar = None
    n = have
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            # said once the server answers: with no network, the error is the one line
            if have and r.status != 206:  # the whole file, not the rest: start over
                h, n = hashlib.sha256(), 0
            run.out(f"download {pin.url} ({pin.size} bytes"
                    + (f", resuming after {n})" if n else ")"))
            bar = _progress_bar(pin.size, pin.name)
            if bar is not None:
                bar.update(n)
            with open(part, "ab" if n else "wb") as f:
                while True:
                    block = r.read(1 << 16)
                    if not block:
                        break
                    n += len(block)
                    if n > pin.size:
                        break
                    h.update(block)
                    f.write(block)
                    if bar is not None:
                        bar.update(len(block))
                f.flush()
                os.fsync(f.fileno())  # on disk before it is renamed to its name
    except (urllib.error.URLError, OSError) as e:
        kept = part.stat().st_size if part.is_file() else 0
        resume = f" ({kept} of {pin.size} bytes kept in {part}: run again to resume)" \
            if kept else ""
        raise DownloadError(f"cannot download {pin.name} from {pin.url}: {_why(e)}"
                            f"{resume}") from None
    finally:
        if bar is not None:
            bar.close()
    if n != pin.size or h.hexdigest() != pin.sha256:
        part.unlink(missing_ok=True)
        what = (f"is larger than its pinned size {pin.size}" if n > pin.size else
                f"has {n} bytes, pinned size is {pin.size}" if n != pin.size else
                f"has sha256 {h.hexdigest()}, which does not match the pinned {pin.sha256}")
        raise FlashError(f"download of {pin.name} from {pin.url} {what}; nothing was kept")
    os.replace(part, dest)
    run.out(f"{pin.name}: {pin.size} bytes, sha256 verified")
    return dest


# ---------------------------------------------------------------------------
# release assets (--firmware URL, --image URL)


def is_url(text: str, what: str) -> bool:
    """True for an http(s) URL; False for a local path. Any other URL (ftp://,
    file://, ...) is a FlashError naming `what`: taken as a file name it would
    only be "not found" under a mangled name."""
    scheme = urllib.parse.urlsplit(text).scheme.lower()
    if scheme in ("http", "https"):
        return True
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):  # not C:\... (a Windows drive)
        raise FlashError(f"{what} {text}: only http:// and https:// URLs, or a local file, "
                         f"are supported (not {scheme}://)")
    return False


def _check_reachable(url: str) -> int | None:
    """Ask for `url` without downloading it (HEAD); its size if the server says.
    What a dry run can check of a download."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                    timeout=60) as r:
            length = r.headers.get("Content-Length")
    except (urllib.error.URLError, OSError) as e:
        reason = _why(e)
        raise FlashError(f"cannot reach {url}: {reason}") from None
    return int(length) if length and length.isdigit() else None


def _read_url(url: str, limit: int) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            data = r.read(limit + 1)
    except (urllib.error.URLError, OSError) as e:
        reason = _why(e)
        raise FlashError(f"cannot download {url}: {reason}") from None
    if len(data) > limit:
        raise FlashError(f"{url} is larger than {limit} bytes: not a release manifest")
    return data


def fetch_release_asset(url: str, kind: str, cache: Path, run: Runner) -> Path:
    """Download a release asset (`kind`: firmware or model) and verify its size
    and sha256 against the release-manifest.json published beside it. Returns
    the verified file, kept in the cache under its hash."""
    base, _, name = url.rpartition("/")
    manifest_url = f"{base}/{release.RELEASE_MANIFEST}"
    # The manifest (a few hundred bytes) is read in a dry run too: it is how
    # a dry run knows the asset is a release's, and that both can be reached.
    text = _read_url(manifest_url, MANIFEST_LIMIT).decode("utf-8", errors="replace")
    try:
        assets = release.parse_release_manifest(text, manifest_url)
    except release.ReleaseError as e:
        raise FlashError(str(e)) from None
    entry = next((a for a in assets if a.name == name), None)
    if entry is None:
        raise FlashError(f"{manifest_url} lists no {name!r} (it has "
                         f"{', '.join(a.name for a in assets)}); nothing was downloaded")
    if entry.kind != kind:
        want = next((a.name for a in assets if a.kind == kind), "?")
        raise FlashError(f"{name} is the release's {entry.kind} asset, not its {kind}; "
                         f"use {base}/{want}")
    dest_dir = cache / "release-assets" / entry.sha256[:16]
    if run.dry_run:
        size = _check_reachable(url)
        if size is not None and size != entry.size:
            raise FlashError(f"{url} is {size} bytes; {manifest_url} says {entry.size}")
        run.out(f"checked {manifest_url} (lists {name}, {entry.size} bytes) and {url} "
                f"(reachable); would download it -> {dest_dir / name} and verify its size "
                f"and sha256")
        return dest_dir / name
    pin = PinnedFile(name, url, entry.size, entry.sha256)
    return fetch_pinned(pin, dest_dir, run)


# ---------------------------------------------------------------------------
# model image


def _check_local(path: Path, what: str) -> Path:
    if not path.is_file():
        why = "is a directory" if path.is_dir() else \
            "is not a regular file" if path.exists() else "not found"
        raise FlashError(f"{what} file {why}: {path}")
    return path


def _smaller_hint(img: Path) -> str:
    """For an image too big for its partition whose matrices are int8 or fp32
    (a llama2.c checkpoint converted by --weights auto, or named): how to make
    the smaller int4 image of the same checkpoint. "" otherwise."""
    from ..formats.image import KIND_F32M, KIND_Q8, ImageFormatError, read_header

    try:
        with open(img, "rb") as f:
            _, sections = read_header(f.read())
    except (OSError, ImageFormatError):
        return ""
    if not any(s.kind in (KIND_Q8, KIND_F32M) for s in sections):
        return ""
    return (" (its matrices are int8 or fp32; the checkpoint's int4 image is about half the "
            "size of int8's: tools/convert.py MODEL.bin TOKENIZER.bin -o IMG --weights int4, "
            "then --image IMG)")


def check_image(img: Path, limit: int | None = None) -> None:
    """The one check of an image before it is used, for both boards: a valid
    model image (what the engine would check at boot), within `limit` bytes
    (the model partition) if given."""
    size = img.stat().st_size if img.is_file() else 0
    if limit is not None and size > limit:  # first: no need to read all of a huge file
        raise FlashError(f"model image {img} is {size} bytes; the '{pins.MODEL_PARTITION}' "
                         f"partition holds {limit}{_smaller_hint(img)}. Nothing was written.")
    try:
        image_cache.check_image_file(img, "model image")
    except image_cache.ImageFileError as e:
        raise FlashError(f"{e}. Nothing was written.") from None


def image_for(model_bin: Path, tokenizer: Path, cache: Path, run: Runner,
              limit: int | None = None) -> Path:
    """Convert once per source pair (mpllm.image_cache); a checkpoint's weights
    chosen (auto) among the formats whose image fits `limit` bytes, the
    board's model partition."""
    if run.dry_run:
        img = cache / "images" / "<sha256 of the sources>.img"
        run.out(f"convert {model_bin} {tokenizer} -> {img}{image_cache.drafter_note()}")
        return img
    from ..convert import ConvertError

    try:
        return image_cache.converted(model_bin, tokenizer, cache, run.out, fit_bytes=limit)
    except (ConvertError, OSError) as e:
        raise FlashError(f"conversion failed: {e}") from None


def model_sources(args: argparse.Namespace, cache: Path, run: Runner,
                  default: tuple[Path, Path] | None,
                  board: pins.BoardPins = pins.DEFAULT_BOARD) -> Path | tuple[Path, Path]:
    """What the model image comes from, checked (in a dry run too): --image (a
    file, or a release URL: downloaded and verified), else (model.bin,
    tokenizer.json) from --model/--tokenizer, `default`, or the board's
    default model (pinned ones downloaded and verified; in a dry run only
    shown)."""
    if args.image:
        if is_url(args.image, "--image"):
            return fetch_release_asset(args.image, "model", cache, run)
        return _check_local(Path(args.image), "--image")
    named = NAMED_MODELS.get(args.model) if args.model and not args.tokenizer else None
    if not args.model and default is None and board.default_model != "release":
        named = NAMED_MODELS[board.default_model]
    if named is not None:
        if named.files is not None:
            return (_check_local(named.files[0], f"--model {named.name}"),
                    _check_local(named.files[1], f"--model {named.name}"))
        assert named.pins is not None
        return fetch_pins(named.pins, cache / "models" / named.name, run)
    if bool(args.model) != bool(args.tokenizer):
        raise FlashError(f"--model and --tokenizer go together (a model file needs its "
                         f"tokenizer); --model alone names a model: {', '.join(NAMED_MODELS)}")
    if args.model:
        return (_check_local(Path(args.model), "--model"),
                _check_local(Path(args.tokenizer), "--tokenizer"))
    if default is not None:
        return _check_local(default[0], "model"), _check_local(default[1], "tokenizer")
    return fetch_pins(Path(args.release), cache / "release", run)


def fetch_pins(pins_json: Path, dest: Path, run: Runner) -> tuple[Path, Path]:
    """(model, tokenizer) of a pins JSON, downloaded into `dest` and verified
    (in a dry run only shown). When a download fails, the one-line error also
    says how to place the files by hand: their names, sizes and folder."""
    model, tokenizer = load_pins(pins_json)
    try:
        return fetch_pinned(model, dest, run), fetch_pinned(tokenizer, dest, run)
    except DownloadError as e:
        def verified(p: PinnedFile) -> bool:
            f = dest / p.name
            return f.is_file() and f.stat().st_size == p.size and sha256_file(f) == p.sha256

        # a file there that does not match its pin is as missing as an absent one
        missing = [p for p in (model, tokenizer) if not verified(p)]
        files = " and ".join(f"{p.name} ({p.size:,} bytes, {p.url}"
                             + ("; the one there does not match" if (dest / p.name).exists()
                                else "") + ")" for p in missing)
        raise DownloadError(f"{e}. No network? Put {files} in {dest} by hand and run this "
                            f"again (they are checked against {pins_json.name})") from None


def resolve_model(sources: Path | tuple[Path, Path], cache: Path, run: Runner,
                  limit: int | None = None) -> Path:
    """The image of `sources` (model_sources()): as is, or converted; checked
    (check_image) unless a dry run has not made it."""
    img = sources if isinstance(sources, Path) else image_for(*sources, cache, run, limit)
    if img.is_file() or not run.dry_run:
        check_image(img, limit)
    return img


# ---------------------------------------------------------------------------
# firmware build


def build_firmware(args: argparse.Namespace, cache: Path, run: Runner,
                   env: dict[str, str], board: pins.BoardPins) -> Path:
    """Build MicroPython with `board` and our module (firmware_build); return firmware.bin."""
    mp = Path(args.micropython) if args.micropython else None
    try:
        return firmware_build.build(mp, cache, run, env, board=board)
    except firmware_build.IdfMissing as e:  # no toolchain: say where a built firmware is
        raise FlashError(f"{e} {RELEASES_HINT}") from None


# ---------------------------------------------------------------------------
# esptool


def esptool_major() -> int | None:
    try:
        from importlib.metadata import version
        return int(version("esptool").split(".")[0])
    except Exception:  # noqa: BLE001 - not installed or an odd version string
        return None


def esptool_cmd(major: int | None) -> Callable[[str], str]:
    """esptool 5 spells commands with dashes; 4.x with underscores."""
    if major is not None and major < 5:
        return lambda name: name.replace("-", "_")
    return lambda name: name


@dataclass(frozen=True)
class ChipInfo:
    chip: str
    flash_bytes: int | None
    psram: str | None


def parse_chip_report(text: str) -> ChipInfo:
    """Read esptool's flash-id report (4.x: 'Chip is ...', 5.x: 'Chip type: ...')."""
    m = re.search(r"^\s*Chip (?:is|type:)\s*(.+?)\s*$", text, re.MULTILINE)
    if not m:
        raise FlashError("esptool did not report a chip type; is a board connected in "
                         "bootloader mode on that port?")
    chip = m.group(1)
    flash = None
    fm = re.search(r"Detected flash size:\s*(\d+)\s*([KM])B", text)
    if fm:
        flash = int(fm.group(1)) * (1024 if fm.group(2) == "K" else 1024 * 1024)
    pm = re.search(r"Embedded PSRAM[^,\n]*", text)
    return ChipInfo(chip, flash, pm.group(0).strip() if pm else None)


def check_chip(info: ChipInfo, skip_psram: bool,
               board: pins.BoardPins = pins.DEFAULT_BOARD) -> None:
    if not info.chip.upper().startswith(pins.CHIP):
        raise FlashError(f"the board on this port is a {info.chip}, not an {pins.CHIP}: this "
                         f"firmware would not run on it. Nothing was written.")
    if info.flash_bytes is None:
        raise FlashError("esptool could not detect the flash size; nothing was written")
    if info.flash_bytes < board.flash_bytes:
        raise FlashError(f"the board has {info.flash_bytes // (1024 * 1024)} MB of flash; "
                         f"--board {board.name} needs {board.flash_bytes // (1024 * 1024)} MB "
                         f"(an {board.label}). Nothing was written.")
    if board.psram_bytes and info.psram is None and not skip_psram:
        raise FlashError(f"esptool reports no embedded PSRAM; --board {board.name} needs "
                         f"{board.psram_bytes // (1024 * 1024)} MB of octal PSRAM (an "
                         f"{board.label}). A board without PSRAM takes --board n8; if your "
                         f"module has PSRAM that esptool cannot see, pass --skip-psram-check. "
                         f"Nothing was written.")


# ---------------------------------------------------------------------------
# the two boards




def pinned_image_floor(pins_json: Path) -> int | None:
    """Bytes a pinned model's image holds at least, from the architecture its
    pins JSON records: for an esp32-ai model (models/release.json) the int4
    codes and scales of its weights, the rows the tokenizer can produce only;
    for a llama2.c one (family "llama2c", models/stories15m.json) its matrices
    in the format the pins name, int4 at convert.py's default group (one
    scale a row) unless they say otherwise, as the image stores them (it
    adds the tokenizer, RoPE, head tiles and drafter). None when the
    JSON records no architecture (then the converted image is checked)."""
    from ..formats.esp32ai import Config, expected_size

    try:
        data = json.loads(pins_json.read_text())
        a = data["architecture"]
        if a.get("family") == "llama2c":
            return _llama2c_floor(a, str(data.get("weights", "int4")))
        rows = min(int(a["vocab_in"]), int(a["vocab_out"]))
        cfg = Config(vocab_in=rows, vocab_out=int(a["vocab_out"]), dim=int(a["dim"]),
                     n_layers=int(a["n_layers"]), n_heads=int(a["n_heads"]), ffn=int(a["ffn"]),
                     ple_dim=int(a["ple_dim"]), seq_len=int(a["seq_len"]),
                     group=int(a["group"]), tied_head=bool(a["tied_head"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return expected_size(cfg, header_bytes=0)


def _llama2c_floor(a: dict[str, object], weights: str) -> int:
    """The matrices' bytes of a llama2.c architecture (pinned_image_floor):
    each matrix section of its image (formats.image.section_plan) as the
    image stores it, its section header left out."""
    from ..formats.align import align_up
    from ..formats.image import (
        KIND_Q4,
        Q4_HEADER_BYTES,
        f32m_size,
        q4_size,
        q8_size,
        section_plan,
    )
    from ..formats.model import Config
    from ..quantize import int8_group

    def n(key: str) -> int:
        return int(a[key])  # type: ignore[call-overload]

    cfg = Config(vocab_in=n("vocab_size"), vocab_out=n("vocab_size"), dim=n("dim"),
                 n_layers=n("n_layers"), n_heads=n("n_heads"), ffn=n("hidden_dim"), ple_dim=0,
                 seq_len=n("seq_len"), group=align_up(n("dim"), 32),  # one scale a row
                 tied_head=bool(a.get("shared_classifier", True)), family="llama2c",
                 n_kv_heads=n("n_kv_heads"))
    fmt = "int4" if weights == "auto" else weights
    size = {"int4": lambda r, c: q4_size(r, c, cfg.group),
            "int8": lambda r, c: q8_size(r, c, int8_group(c)), "fp32": f32m_size}[fmt]
    return sum(size(rows, cols) - Q4_HEADER_BYTES
               for _name, kind, (rows, cols) in section_plan(cfg) if kind == KIND_Q4)


def _fitting(model_limit: int, but: str) -> list[str]:
    """The named models other than `but` whose image can fit a partition of
    model_limit bytes (the bundled ones, and the pinned ones whose floor fits)."""
    out = []
    for n, m in NAMED_MODELS.items():
        floor = pinned_image_floor(m.pins) if m.pins is not None else None
        if n != but and (floor is None or floor <= model_limit):
            out.append(n)
    return out


def port_missing(port: str) -> bool:
    """A device path (/dev/...) that does not exist; other names (COM5,
    socket://, rfc2217://) cannot be checked without opening them."""
    return port.startswith("/dev/") and not os.path.exists(port)


def preflight(args: argparse.Namespace, run: Runner, env: dict[str, str],
              board: pins.BoardPins, model_limit: int) -> list[str]:
    """What a run of flash_board needs, checked before anything is downloaded,
    converted or built: esptool, the port, git, make and ESP-IDF for a build,
    and a pinned model's size against the model partition. The problems found,
    each in a few words (a real run stops on them, a dry run lists them)."""
    problems = []
    # the model first: the one problem that no install mends
    if args.only in (None, "model") and not args.image and not args.tokenizer:
        name = args.model or board.default_model
        named = NAMED_MODELS.get(name)
        pins_json = Path(args.release) if name == "release" else \
            named.pins if named is not None else None
        floor = pinned_image_floor(pins_json) if pins_json is not None else None
        if floor is not None and floor > model_limit:
            problems.append(f"--model {name} cannot fit --board {board.name}: its image holds "
                            f"at least {floor:,} bytes of weights, the board's "
                            f"'{pins.MODEL_PARTITION}' partition {model_limit:,} (--board "
                            f"n16r8 takes it; --board {board.name} takes "
                            f"{', '.join(_fitting(model_limit, name))})")
    if esptool_major() is None:
        problems.append("esptool is not installed: pip install 'mpllm[board]' (or pip "
                        "install esptool)")
    if args.port and port_missing(args.port):
        problems.append(f"--port {args.port}: no such device (is the board plugged in? "
                        f"python -m serial.tools.list_ports lists the ports)")
    if args.only in (None, "firmware") and not args.firmware:
        cache = firmware_build.cache_dir(args)
        clone = args.micropython is None and not (
            firmware_build.default_checkout(cache) / "py" / "mpconfig.h").is_file()
        path = env.get("PATH")
        if clone and shutil.which("git", path=path) is None:
            problems.append(f"git is not on PATH (the build clones MicroPython "
                            f"{pins.MICROPYTHON_TAG} with it)")
        if shutil.which("make", path=path) is None:
            problems.append("make is not on PATH (the firmware build runs it)")
        try:
            firmware_build.idf_environment(env)
        except firmware_build.IdfMissing as e:
            problems.append(f"{e} {RELEASES_HINT}")
    return problems


def flash_board(args: argparse.Namespace, run: Runner, env: dict[str, str],
                board: pins.BoardPins) -> None:
    table_path = firmware_build.board_dir(board) / "partitions.csv"
    try:
        parts = load_partitions(table_path)
        check_layout(parts, board.flash_bytes)
        fw_region, model_region = flash_regions(parts, pins.MODEL_PARTITION)
        app = app_partition(parts)
    except PartitionError as e:
        raise FlashError(f"board partition table: {e}") from None
    run.out(f"partitions ({table_path.relative_to(ROOT)}): firmware at {fw_region.offset:#x} "
            f"(app {app.offset:#x}, {app.size} bytes), model at {model_region.offset:#x} "
            f"({model_region.limit} bytes)")
    if not args.port and not run.dry_run:
        raise FlashError("no --port given: name the board's serial port, e.g. --port "
                         "/dev/ttyACM0 or --port COM5 (list them with: python -m "
                         "serial.tools.list_ports)")
    # (each in a few words, joined into one line: no full stop of its own)
    problems = [p.rstrip(".") for p in preflight(args, run, env, board, model_region.limit)]
    if problems and not run.dry_run:
        raise FlashError("; ".join(problems) + ". Nothing was downloaded, built or written.")
    for problem in problems:
        run.out(f"missing: {problem}")
    if not args.port:
        run.out("no --port given: the commands below show PORT where the board's serial port "
                "goes (a real run needs --port)")
    port = args.port or "PORT"
    cache = firmware_build.cache_dir(args)
    writes: list[tuple[int, Path, str]] = []

    # Everything that can fail without a board is done before the board is touched.
    if args.only in (None, "model"):
        # the engine would refuse a bad image at boot: refuse it before writing
        img = resolve_model(model_sources(args, cache, run, None, board), cache, run,
                            model_region.limit)
        writes.append((model_region.offset, img, "model image"))
    if args.only in (None, "firmware"):
        if not args.firmware:
            fw = build_firmware(args, cache, run, env, board)
        elif is_url(args.firmware, "--firmware"):
            fw = fetch_release_asset(args.firmware, "firmware", cache, run)
        else:
            fw = _check_local(Path(args.firmware), "--firmware")
        if fw.is_file():
            with open(fw, "rb") as f:
                if f.read(1) != b"\xe9":  # every ESP32 boot image starts with 0xE9
                    raise FlashError(f"{fw} is not an ESP32 firmware image (no 0xE9 magic "
                                     f"byte); use {firmware_build.build_subdir(board)}/"
                                     f"firmware.bin. Nothing was written.")
            if fw.stat().st_size > fw_region.limit:
                raise FlashError(f"firmware {fw} is {fw.stat().st_size} bytes and would run "
                                 f"into the model partition at {model_region.offset:#x}. "
                                 f"Nothing was written.")
        writes.insert(0, (fw_region.offset, fw, "firmware"))

    major = esptool_major()
    if major is None and not run.dry_run:
        raise FlashError("esptool is not installed: pip install 'mpllm[board]' (or pip "
                         "install esptool)")
    cmd = esptool_cmd(major)
    esptool = [sys.executable, "-m", "esptool"]
    if run.dry_run:
        run.show([*esptool, "--port", port, cmd("flash-id")])
        run.out(f"(check: chip is an {pins.CHIP}, flash >= {board.flash_bytes // 2**20} MB"
                + (", embedded PSRAM)" if board.psram_bytes else ")"))
    else:
        report = run.capture([*esptool, "--port", port, cmd("flash-id")],
                             "reading the chip with esptool")
        info = parse_chip_report(report)
        check_chip(info, args.skip_psram_check, board)
        mb = (info.flash_bytes or 0) // 2**20
        run.out(f"board: {info.chip}, {mb} MB flash, {info.psram or 'PSRAM not reported'}")

    base = [*esptool, "--chip", "esp32s3", "--port", port, "--baud", str(args.baud)]
    pairs: list[str] = []
    for offset, path, _ in writes:
        pairs += [f"{offset:#x}", str(path)]
    if args.erase_all:
        run.run([*base, cmd("erase-flash")], "erasing the whole flash")
    run.run([*base, cmd("write-flash"), *pairs], "writing " + " and ".join(w[2] for w in writes))
    run.run([*base, cmd("verify-flash"), *pairs],
            "verifying what was written (esptool compares the flash's MD5 with the files)")
    run.out("")
    if run.dry_run:
        what = " and ".join(f"the {w[2]} ({w[1].name}) at {w[0]:#x}" for w in writes)
        stop = (f", but it would stop first, before anything is downloaded or built: "
                f"{'; '.join(problems)}" if problems else "")
        run.out(f"Dry run: nothing was downloaded, built or written. A real run would check "
                f"the chip on {port}, write {what} and verify them{stop}. After it:")
    else:
        run.out("Done. Next:")
    run.out(f"  mpremote connect {port} repl")
    run.out('  >>> import llm; llm.story("Once upon a time")')


def prepare_host(args: argparse.Namespace, run: Runner) -> None:
    """Host board: build the CPython _llm with pip and convert the demo model.
    The arguments (and a given image) are checked before pip runs."""
    cache = firmware_build.cache_dir(args)
    sources = model_sources(args, cache, run,
                            (DEMO_DIR / "model.bin", DEMO_DIR / "tokenizer.json"))
    if isinstance(sources, Path):
        check_image(sources)
    run.run([sys.executable, "-m", "pip", "install", "-e", str(ROOT)],
            "building the CPython _llm (pip install -e .)")
    # converting needs the _llm pip just built (the drafter's stories)
    img = sources if isinstance(sources, Path) else resolve_model(sources, cache, run)
    run.out("")
    if run.dry_run:
        run.out(f"Dry run: nothing was built, downloaded or converted. A real run would build "
                f"the CPython _llm with pip and make the model image {img}. After it:")
    else:
        run.out(f"Done: model image {img}. Next:")
    # the checkout's chat.py as this shell reaches it (from elsewhere, tools/chat.py is no file)
    here = Path.cwd().resolve() == ROOT.resolve()
    chat_py = "tools/chat.py" if here else shlex.quote(str(ROOT / "tools" / "chat.py"))
    run.out(f'  python {chat_py} --board host --image {img} "Once upon a time"')


# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="flash",
        description="Flash mpllm (MicroPython firmware + model image) onto an ESP32-S3 "
                    "board, or prepare the host board.")
    firmware_build.add_board_argument(ap, extra=["host"], required=True)
    ap.add_argument("--port", help="serial port of the board (e.g. /dev/ttyACM0, COM5)")
    ap.add_argument("--baud", type=int, default=DEFAULT_BAUD,
                    help=f"esptool baud rate (default {DEFAULT_BAUD}; native USB ignores it)")
    ap.add_argument("--only", choices=["firmware", "model"],
                    help="write only this part (the other stays as it is on the board)")
    ap.add_argument("--model", metavar="NAME|FILE",
                    help="a model by name instead of the board's default (host: demo, "
                         + ", ".join(f"{b.name}: {b.default_model}" for b in pins.BOARDS.values())
                         + f"): {names_help()}; or, with --tokenizer, a local model.bin "
                         "(an esp32-ai model or a llama2.c checkpoint)")
    ap.add_argument("--tokenizer", help="local tokenizer.json, or a llama2.c tokenizer.bin "
                                        "(with --model FILE)")
    ap.add_argument("--image", help="an already converted model image (skips conversion), or "
                    f"the URL of a release's {release.MODEL_ASSET} (downloaded and checked "
                    f"against the release's {release.RELEASE_MANIFEST})")
    ap.add_argument("--firmware", help="a built firmware.bin (skips the MicroPython build), or "
                    f"the URL of a release's {release.FIRMWARE_ASSET} (downloaded and checked "
                    f"against the release's {release.RELEASE_MANIFEST}; no ESP-IDF needed)")
    firmware_build.add_checkout_arguments(ap)
    ap.add_argument("--release", default=str(RELEASE_JSON), help=argparse.SUPPRESS)
    ap.add_argument("--erase-all", action="store_true",
                    help="erase the whole flash first (also the filesystem); off by default")
    ap.add_argument("--skip-psram-check", action="store_true",
                    help="flash even if esptool reports no embedded PSRAM")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every command and step without running or writing anything; "
                         "check what can be checked (local files, the MicroPython checkout, "
                         "that --firmware/--image URLs answer)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run = Runner(args.dry_run)
    if args.dry_run:
        run.out("dry run: nothing is downloaded, built or written, only checked (local "
                "files, --firmware/--image URLs, the MicroPython checkout)")

    def body() -> None:
        if args.board == "host":
            if args.only or args.firmware or args.port:
                raise FlashError("--only, --firmware and --port are for a board, not --board "
                                 "host")
            prepare_host(args, run)
        else:
            flash_board(args, run, dict(os.environ), pins.BOARDS[args.board])

    return exit_status(body)
