"""A bounded libFuzzer run of the image loader + forward pass (tests/c/fuzz_image.c).

The harness is built with clang -fsanitize=fuzzer,address,undefined and
FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION (CRCs computed, not enforced, so the
mutations reach the layout checks and the forward pass). The run here is short
(20,000 inputs or 25 s, seeded with a generated image and some of its truncations); the
long run is documented at the top of tests/c/fuzz_image.c:

    mkdir -p fuzz-corpus && cp build/fuzz/seed.img fuzz-corpus/
    build/fuzz/fuzz_image fuzz-corpus -max_len=65536 -timeout=10 -rss_limit_mb=2048 -jobs=2

Skipped, with the reason printed, when clang or its libFuzzer runtime is missing
(.ci/run installs clang and libclang-rt-14-dev).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import zlib
from pathlib import Path

import cbuild
import pytest

FUZZ_DIR = cbuild.ROOT / "build" / "fuzz"
RUNS = 20000
SECONDS = 25  # whichever comes first: the suite must stay fast on a loaded machine


def _build_harness() -> Path:
    if not cbuild.have("clang"):
        pytest.skip("clang not found: install clang and libclang-rt-14-dev to run the fuzzer")
    eng, port = cbuild.ENGINE, cbuild.PORT_HOST
    sources = [*cbuild.engine_sources(), port / "port_host.c", cbuild.CTESTS / "fuzz_image.c"]
    headers = sorted(eng.glob("*.h")) + sorted(port.glob("*.h"))
    tag = zlib.crc32(b"".join(h.read_bytes() for h in headers))
    try:
        return cbuild.build(
            "fuzz_image", sources, FUZZ_DIR, compiler="clang", opt="-O1",
            defines={"FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION": "",
                     "LLM_HEADERS_TAG": f"{tag}u"},
            extra=["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"])
    except subprocess.CalledProcessError as e:
        if "libclang_rt.fuzzer" in (e.stderr or "") or "fuzzer" in (e.stderr or ""):
            pytest.skip(f"clang has no libFuzzer runtime (install libclang-rt-14-dev): "
                        f"{(e.stderr or '').strip()[:300]}")
        raise


def test_fuzz_loader_bounded(tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    harness = _build_harness()
    seed = tiny_model.image.read_bytes()
    shutil.copyfile(tiny_model.image, FUZZ_DIR / "seed.img")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "seed.img").write_bytes(seed)
    for n in (0, 64, 127, 128, 500, len(seed) // 2, len(seed) - 1):
        (corpus / f"cut{n}").write_bytes(seed[:n])
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    result = cbuild.run(
        harness, str(corpus), f"-runs={RUNS}", f"-max_total_time={SECONDS}", "-seed=1", f"-max_len={len(seed) + 64}",
        "-timeout=20", "-rss_limit_mb=2048", f"-artifact_prefix={artifacts}/",
        env={"ASAN_OPTIONS": "detect_leaks=1"}, timeout=600)
    tail = "\n".join((result.stderr or "").splitlines()[-40:])
    crashes = sorted(p.name for p in artifacts.iterdir())
    assert result.returncode == 0 and not crashes, f"fuzzer failed ({crashes}):\n{tail}"
    done = re.search(r"Done (\d+) runs", result.stderr or "")
    assert done and int(done.group(1)) >= 1000, tail
    print(done.group(0))
