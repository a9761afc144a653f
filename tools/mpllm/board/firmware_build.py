"""Build the mpllm firmware: the ONE place the build commands are written.

`tools/flash.py` calls build() on a user's PC; the release workflow
(.github/workflows/firmware.yml) runs this module's command line inside
Espressif's ESP-IDF container. Both therefore run the same commands against
the versions pinned in firmware_pins.py, and cannot drift apart.

    python -m mpllm.board.firmware_build --out dist          # clone + build + copy
    python -m mpllm.board.firmware_build --micropython DIR   # an existing checkout
    python -m mpllm.board.firmware_build --dry-run           # print the commands

Only the standard library is used: the IDF container's Python has nothing
else, and PYTHONPATH=tools is all it needs to import this.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import checkout, image_cache  # both: standard library only
from ..atomic import atomic_path
from . import firmware_pins as pins

ROOT = checkout.ROOT
USER_C_MODULES = ROOT / pins.USER_C_MODULES


def board_dir(board: pins.BoardPins) -> Path:
    """The board's definition folder (absolute: the port resolves it from its own folder)."""
    return ROOT / board.board_dir


def build_subdir(board: pins.BoardPins) -> str:
    """Where the esp32 port builds the board, inside the MicroPython checkout."""
    return f"ports/esp32/build-{board.board}"


class ToolError(RuntimeError):
    """A step failed or cannot start; the message says why and what to do."""


class IdfMissing(ToolError):
    """ESP-IDF is not set up in this shell (so nothing can be built)."""


class Runner:
    """Runs (or, in a dry run, only prints) external commands."""

    def __init__(self, dry_run: bool, out: Callable[[str], None] = print) -> None:
        self.dry_run = dry_run
        self.out = out

    def show(self, cmd: Sequence[str], cwd: Path | None = None) -> None:
        prefix = f"(cd {shlex.quote(str(cwd))} && " if cwd else ""
        suffix = ")" if cwd else ""
        self.out(f"$ {prefix}{shlex.join(str(c) for c in cmd)}{suffix}")

    def run(self, cmd: Sequence[str], what: str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> None:
        """Run with output streaming to the terminal; raise ToolError on failure."""
        self.show(cmd, cwd)
        if self.dry_run:
            return
        try:
            rc = subprocess.run([str(c) for c in cmd], check=False, cwd=cwd,
                                env=env).returncode
        except FileNotFoundError:
            raise ToolError(f"{what}: {cmd[0]} is not installed or not on PATH") from None
        if rc != 0:
            raise ToolError(f"{what} failed (exit {rc}): {shlex.join(str(c) for c in cmd)}")

    def capture(self, cmd: Sequence[str], what: str) -> str:
        """Run, echo and return combined output; raise ToolError on failure."""
        self.show(cmd)
        try:
            r = subprocess.run([str(c) for c in cmd], check=False, capture_output=True,
                               text=True)
        except FileNotFoundError:
            raise ToolError(f"{what}: {cmd[0]} is not installed or not on PATH") from None
        text = r.stdout + r.stderr
        for line in text.splitlines():
            self.out(f"  {line}")
        if r.returncode != 0:
            raise ToolError(f"{what} failed (exit {r.returncode}); it said:\n{text.strip()}")
        return text


def idf_environment(env: dict[str, str]) -> tuple[Path, str]:
    """(IDF_PATH, version) of the ESP-IDF set up in this shell, or IdfMissing."""
    how = (f"Install ESP-IDF {pins.ESP_IDF_VERSION} and run its export script in this shell "
           f"(. $IDF_PATH/export.sh, or export.ps1 on Windows).")
    idf_path = env.get("IDF_PATH")
    if not idf_path:
        raise IdfMissing(f"ESP-IDF not found: IDF_PATH is not set. {how}")
    if not Path(idf_path, "tools", "idf.py").is_file():
        raise IdfMissing(f"ESP-IDF not found: IDF_PATH={idf_path} has no tools/idf.py. {how}")
    if shutil.which("idf.py", path=env.get("PATH")) is None:
        raise IdfMissing(f"ESP-IDF is at {idf_path} but idf.py is not on PATH (the export "
                        f"script was not run in this shell). {how}")
    version = "unknown"
    vfile = Path(idf_path, "tools", "cmake", "version.cmake")
    if vfile.is_file():
        parts = dict(re.findall(r"set\(IDF_VERSION_(MAJOR|MINOR|PATCH)\s+(\d+)\)",
                                vfile.read_text()))
        if len(parts) == 3:
            version = f"v{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    return Path(idf_path), version


def micropython_version(mp_dir: Path) -> str | None:
    cfg = mp_dir / "py" / "mpconfig.h"
    if not cfg.is_file():
        return None
    text = cfg.read_text(errors="replace")
    nums = [re.search(rf"#define MICROPY_VERSION_{k} \((\d+)\)", text) for k in
            ("MAJOR", "MINOR", "MICRO")]
    if not all(nums):
        return None
    return "v" + ".".join(m.group(1) for m in nums if m)


def default_checkout(cache: Path) -> Path:
    """Where a MicroPython clone of the pinned tag is kept between builds."""
    return cache / f"micropython-{pins.MICROPYTHON_TAG}"


def build(micropython: Path | None, cache: Path, run: Runner, env: dict[str, str], *,
          fetch_submodules: bool = True, board: pins.BoardPins = pins.DEFAULT_BOARD) -> Path:
    """Build MicroPython with `board` and our module; return the merged firmware.bin.

    micropython: a checkout to build in, or None for a clone of the pinned tag
    under `cache` (made on first use). fetch_submodules=False skips `make
    submodules` (it clones from GitHub) for a checkout that has them already."""
    if micropython is not None:
        mp_dir = micropython.resolve()
        # checked in a dry run too: looking is not doing
        if not mp_dir.is_dir():
            raise ToolError(f"--micropython {micropython}: no such folder")
        if not (mp_dir / "ports" / "esp32" / "Makefile").is_file():
            raise ToolError(f"--micropython {micropython} is not a MicroPython checkout "
                            f"(no ports/esp32/Makefile)")
    else:
        mp_dir = default_checkout(cache)
    try:
        idf_path, idf_version = idf_environment(env)
    except IdfMissing as e:
        if not run.dry_run:
            raise
        run.out(f"note: {e}\n      (dry run: continuing to show the build commands)")
        idf_version = pins.ESP_IDF_VERSION
    else:
        run.out(f"ESP-IDF {idf_version} at {idf_path}")
    if idf_version != pins.ESP_IDF_VERSION:
        run.out(f"warning: this firmware is pinned to ESP-IDF {pins.ESP_IDF_VERSION} (what "
                f"MicroPython {pins.MICROPYTHON_TAG} recommends); you have {idf_version}")
    if not (mp_dir / "py" / "mpconfig.h").is_file():
        if micropython is not None:
            raise ToolError(f"--micropython {mp_dir} has no py/mpconfig.h")
        else:
            run.run(["git", "clone", "--depth", "1", "--branch", pins.MICROPYTHON_TAG,
                     pins.MICROPYTHON_GIT, mp_dir], "cloning MicroPython")
    if not run.dry_run:
        have = micropython_version(mp_dir)
        if have != pins.MICROPYTHON_TAG:
            run.out(f"warning: {mp_dir} is MicroPython {have}, the firmware is pinned to "
                    f"{pins.MICROPYTHON_TAG}")
    port = mp_dir / "ports" / "esp32"
    # The port resolves BOARD_DIR and USER_C_MODULES from its own directory:
    # both must be absolute (they are: ROOT is resolved).
    board_arg = f"BOARD_DIR={board_dir(board)}"
    mods = f"USER_C_MODULES={USER_C_MODULES}"
    run.run(["make", "-C", mp_dir / "mpy-cross"], "building mpy-cross", env=env)
    if fetch_submodules:
        run.run(["make", "-C", port, board_arg, "submodules"],
                "fetching the esp32 port's submodules", env=env)
    run.run(["make", "-C", port, board_arg, mods], f"building the firmware ({board.board})",
            env=env)
    fw = mp_dir / build_subdir(board) / "firmware.bin"
    if not run.dry_run and not fw.is_file():
        raise ToolError(f"the build finished but {fw} is missing")
    return fw


def add_board_argument(ap: argparse.ArgumentParser, *, extra: Sequence[str] = (),
                       required: bool = False) -> None:
    """--board: one of firmware_pins.BOARDS (and `extra` names, e.g. host)."""
    names = [*pins.BOARDS, *extra]
    what = "; ".join(f"{b.name}: {b.what}" for b in pins.BOARDS.values())
    ap.add_argument("--board", choices=names, required=required,
                    default=None if required else pins.DEFAULT_BOARD.name,
                    help=f"{what}" + ("" if required else
                                      f" (default {pins.DEFAULT_BOARD.name})"))


def add_checkout_arguments(ap: argparse.ArgumentParser) -> None:
    """--micropython and --cache, which tools/flash.py takes too."""
    ap.add_argument("--micropython", help=f"MicroPython checkout to build in (default: a "
                    f"clone of {pins.MICROPYTHON_TAG} under the cache directory)")
    ap.add_argument("--cache", help="cache directory (default $MPLLM_CACHE, else "
                    "~/.cache/mpllm)")


def cache_dir(args: argparse.Namespace) -> Path:
    """The cache directory --cache names, or the default one."""
    if args.cache:
        return Path(args.cache).expanduser().resolve()
    return image_cache.default_cache_dir()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m mpllm.board.firmware_build",
        description=f"Build the mpllm firmware (MicroPython {pins.MICROPYTHON_TAG}, ESP-IDF "
                    f"{pins.ESP_IDF_VERSION}, one of our boards, the native module _llm). "
                    f"ESP-IDF must be set up in this shell. tools/flash.py and the release "
                    f"workflow both build through this.")
    add_board_argument(ap)
    add_checkout_arguments(ap)
    ap.add_argument("--out", help="copy the built firmware.bin into this directory")
    ap.add_argument("--no-submodules", action="store_true",
                    help="skip `make submodules` (needs GitHub): the checkout has them already")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands without running them")
    return ap


def exit_status(body: Callable[[], None]) -> int:
    """Run a command's body: 0, or 2 with one line for a ToolError, or 130 on
    Ctrl-C (the exit statuses flash.py and this script share)."""
    try:
        body()
    except ToolError as e:  # FlashError, or a build step's failure
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run = Runner(args.dry_run)
    cache = cache_dir(args)

    def body() -> None:
        mp = Path(args.micropython) if args.micropython else None
        fw = build(mp, cache, run, dict(os.environ), fetch_submodules=not args.no_submodules,
                   board=pins.BOARDS[args.board])
        if args.out:
            dest = Path(args.out) / "firmware.bin"
            run.out(f"copy {fw} -> {dest}")
            if not run.dry_run:
                dest.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(dest) as tmp:
                    shutil.copyfile(fw, tmp)
                run.out(f"{dest}: {dest.stat().st_size} bytes")

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
