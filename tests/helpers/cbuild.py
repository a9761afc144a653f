"""Compile the project's C sources into test programs and shared libraries.

One helper for every C test: the engine's unit tests, the PIE model tests, the
sanitizer runs and the fuzzers. Flags are the engine's own (setup.py): C11, -Wall -Wextra
-Werror, and -ffp-contract=off on every float path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "native" / "engine"
PORT_HOST = ROOT / "native" / "port" / "host"
CTESTS = ROOT / "tests" / "c"

BASE_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-g"]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer"]


def engine_sources() -> list[Path]:
    """The portable engine's sources: native/engine/sources.txt, the one list
    every build compiles (setup.py, micropython.mk, micropython.cmake)."""
    lines = (ENGINE / "sources.txt").read_text().splitlines()
    return [ENGINE / n.strip() for n in lines if n.strip() and not n.startswith("#")]


def have(compiler: str) -> bool:
    return shutil.which(compiler) is not None


def build(
    name: str,
    sources: list[Path],
    out_dir: Path,
    *,
    defines: dict[str, str] | None = None,
    compiler: str = "gcc",
    opt: str = "-O2",
    sanitize: bool = False,
    extra: list[str] | None = None,
    shared: bool = False,
) -> Path:
    """Compile `sources` into out_dir/name (an executable, or a .so if shared).

    Raises subprocess.CalledProcessError with the compiler's output on failure.
    The build is skipped when an identical command already produced the file.
    """
    flags = [*BASE_FLAGS, opt]
    if sanitize:
        flags += SANITIZE_FLAGS
    if shared:
        flags += ["-shared", "-fPIC"]
    for key, value in (defines or {}).items():
        flags.append(f"-D{key}={value}" if value else f"-D{key}")
    flags += ["-I", str(ENGINE), "-I", str(PORT_HOST)]
    flags += extra or []
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / (name + (".so" if shared else ""))
    cmd = [compiler, *flags, *map(str, sources), "-o", str(out), "-lm"]
    digest = hashlib.sha256(" ".join(cmd).encode())
    # Headers change kernels too: hash every header the build can include.
    headers = sorted({*ENGINE.glob("*.h"), *PORT_HOST.glob("*.h"), *PORT_HOST.parent.glob("*.h"),
                      *CTESTS.glob("*.h")})
    for src in [*sources, *headers]:
        digest.update(Path(src).read_bytes())
    stamp = out.with_suffix(out.suffix + ".stamp")
    if out.exists() and stamp.exists() and stamp.read_text() == digest.hexdigest():
        return out
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(
            result.returncode, cmd, output=result.stdout, stderr=result.stderr
        )
    stamp.write_text(digest.hexdigest())
    return out


def build_flavours(name: str, sources: list[Path], out_dir: Path) -> dict[str, Path]:
    """The same program twice, keyed by flavour: "plain" (-O2) and "sanitize"
    (ASan+UBSan at -O1, as `name`_san), for tests parametrized over both."""
    return {
        "plain": build(name, sources, out_dir),
        "sanitize": build(f"{name}_san", sources, out_dir, opt="-O1", sanitize=True),
    }


def run(program: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a built program; the caller asserts on returncode and output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([str(program), *args], check=False, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


#: what the PIE-kernel build of the engine adds: the kernels and the host model
#: of the S3's vector unit they run on
PIE_SOURCES = ["kernels_pie.c", "pie_model.c"]


def engine_run(pie: bool, simd: bool = True, cross: str | None = None) -> Path:
    """tests/c/engine_run.c on the host port, with the reference kernels or the PIE
    ones (`pie`): it prints a run's token ids and a hash of every logits vector.
    simd=False: without the host's vector lanes (simd.h), the board's scalar loops.
    cross: an ARM64 cross compiler (setup_dev.arm64_tools): a static ARM64 Linux
    program, NEON lanes unless simd=False, for qemu-aarch64 to run."""
    sources = engine_sources()
    sources += [PORT_HOST / "port_host.c", CTESTS / "engine_run.c"]
    defines = {"LLM_PORT_NAME": '"host"'}
    if pie:
        sources += [ENGINE / s for s in PIE_SOURCES]
        defines["LLM_KERNELS_PIE"] = ""
    if not simd:
        defines["LLM_NO_SIMD"] = ""
    name = (("engine_run_pie" if pie else "engine_run_ref") + ("" if simd else "_scalar")
            + ("_arm64" if cross else ""))
    if cross:
        return build(name, sources, ROOT / "build" / "ctests", defines=defines, compiler=cross,
                     extra=["-static"])
    return build(name, sources, ROOT / "build" / "ctests", defines=defines)


def ids_and_hash(out: str) -> tuple[str, str]:
    """engine_run's token ids and logits hash, from its output."""
    ids = re.search(r"^ids (.*)$", out, re.MULTILINE)
    digest = re.search(r"^logits_fnv1a64 (\S+ over \d+ heads)$", out, re.MULTILINE)
    assert ids and digest, out
    return ids.group(1), digest.group(1)
