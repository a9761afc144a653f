"""tools/flash.py: the commands it runs, and every way it refuses before writing.

No board, network or toolchain here: esptool is replaced (for the tests that
need a board) by a stub package put first on PYTHONPATH, so `python -m esptool`
runs the stub, which logs its arguments and prints what a real esptool would.
Downloads come from an http.server on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from mpllm.board import firmware_pins as pins
from mpllm.board import flash, release
from mpllm.formats.partitions import find, load_partitions
from n8_refusal import refused_on_the_n8_at_once

ROOT = Path(__file__).resolve().parent.parent
TABLE = load_partitions(ROOT / pins.BOARD_DIR / "partitions.csv")
MODEL_OFFSET = find(TABLE, "model").offset
MODEL_SIZE = find(TABLE, "model").size

REPORT_S3 = """esptool v5.6.0
Connected to ESP32-S3 on /dev/ttyFAKE:
Chip type:          ESP32-S3 (QFN56) (revision v0.2)
Features:           Wi-Fi, BT 5 (LE), Dual Core + LP Core, 240MHz, Embedded PSRAM 8MB (AP_3v3)
Crystal frequency:  40MHz
MAC:                aa:bb:cc:dd:ee:ff
Flash Memory Information:
=========================
Manufacturer: c8
Device: 4018
Detected flash size: 16MB
"""

STUB_MAIN = r'''
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_ESPTOOL_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
cmd = next(a for a in args if a in ("flash-id", "write-flash", "verify-flash", "erase-flash"))
if cmd == "flash-id":
    sys.stdout.write(os.environ["FAKE_ESPTOOL_REPORT"])
    sys.exit(0)
if cmd == "verify-flash" and os.environ.get("FAKE_ESPTOOL_VERIFY_FAIL"):
    print("Verifying 0x200000 ... Verification failed (digest mismatch).")
    sys.exit(2)
print(cmd, "ok (stub)")
'''


@pytest.fixture
def fake_esptool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stub `esptool` package first on PYTHONPATH; returns the call log path."""
    pkg = tmp_path / "stub" / "esptool"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(STUB_MAIN)
    log = tmp_path / "esptool.log"
    log.write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "stub"))
    monkeypatch.setenv("FAKE_ESPTOOL_LOG", str(log))
    monkeypatch.setenv("FAKE_ESPTOOL_REPORT", REPORT_S3)
    # the stub's board is plugged in: its /dev/ttyFAKE counts as a port
    monkeypatch.setattr(flash, "port_missing", lambda port: False)
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def local_parts(tmp_path: Path, tiny_model) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    fw = tmp_path / "firmware.bin"
    fw.write_bytes(b"\xe9" + bytes(4095))  # an ESP32 boot image starts with 0xE9
    img = tmp_path / "model.img"
    img.write_bytes(tiny_model.image.read_bytes())  # a real (small) model image
    return fw, img


def test_refuses_what_the_board_could_not_boot(local_parts: tuple[Path, Path], tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    fw, img = local_parts
    bad_img = tmp_path / "bad.img"
    data = bytearray(img.read_bytes())
    data[-1] ^= 0xFF  # last section's payload: its CRC no longer matches
    bad_img.write_bytes(bytes(data))
    rc = flash.main(["--board", "n16r8", "--port", "/dev/null", "--firmware", str(fw),
                     "--image", str(bad_img), "--dry-run"])
    err = capfd.readouterr().err
    assert rc == 2 and "is not a valid mpllm model image" in err and "CRC mismatch" in err
    bad_fw = tmp_path / "notfw.bin"
    bad_fw.write_bytes(b"MZ" + bytes(100))
    rc = flash.main(["--board", "n16r8", "--port", "/dev/null", "--firmware", str(bad_fw),
                     "--image", str(img), "--dry-run"])
    err = capfd.readouterr().err
    assert rc == 2 and "is not an ESP32 firmware image" in err


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    # the run's MPLLM_CACHE (conftest) or a user's would take precedence
    monkeypatch.delenv("MPLLM_CACHE", raising=False)
    monkeypatch.delenv("IDF_PATH", raising=False)
    return cache


def files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.exists() else []


# ---------------------------------------------------------------------------
# dry run


def test_dry_run_prints_build_and_esptool_commands(capfd: pytest.CaptureFixture[str],
                                                   tmp_path: Path,
                                                   isolated_cache: Path) -> None:
    rel = tmp_path / "release.json"
    rel.write_text(json.dumps({"repo": "owner/repo", "revision": "abc", "files": [
        {"name": "model.bin", "size": 10, "sha256": "a" * 64},
        {"name": "tokenizer.json", "size": 20, "sha256": "b" * 64}]}))
    rc = flash.main(["--board", "n16r8", "--dry-run", "--port", "/dev/ttyACM0",
                     "--release", str(rel)])
    out = capfd.readouterr().out
    assert rc == 0, out
    lines = [ln[2:] for ln in out.splitlines() if ln.startswith("$ ")]
    mp = isolated_cache / "mpllm" / f"micropython-{pins.MICROPYTHON_TAG}"
    board = f"BOARD_DIR={ROOT / pins.BOARD_DIR}"
    assert f"git clone --depth 1 --branch {pins.MICROPYTHON_TAG} {pins.MICROPYTHON_GIT} {mp}" \
        in lines
    assert f"make -C {mp}/mpy-cross" in lines
    assert f"make -C {mp}/ports/esp32 {board} submodules" in lines
    assert (f"make -C {mp}/ports/esp32 {board} "
            f"USER_C_MODULES={ROOT / 'native/micropython/micropython.cmake'}") in lines
    esptool = [ln for ln in lines if " -m esptool " in ln]
    assert [ln.split(" -m esptool ")[1].split()[-1] for ln in esptool[:1]] == ["flash-id"]
    fw = f"{mp}/ports/esp32/build-{pins.BOARD}/firmware.bin"
    write = [ln for ln in esptool if " write-flash " in ln]
    verify = [ln for ln in esptool if " verify-flash " in ln]
    assert len(write) == 1 and len(verify) == 1
    assert "--chip esp32s3 --port /dev/ttyACM0 --baud 460800" in write[0]
    tail = write[0].split(" write-flash ")[1].split()
    assert tail[:3] == ["0x0", fw, f"{MODEL_OFFSET:#x}"] and MODEL_OFFSET == 0x200000
    assert verify[0].split(" verify-flash ")[1] == write[0].split(" write-flash ")[1]
    assert "https://huggingface.co/owner/repo/resolve/abc/model.bin" in out
    assert "mpremote connect /dev/ttyACM0 repl" in out
    assert 'import llm; llm.story("Once upon a time")' in out
    assert "ESP-IDF not found" in out  # said, even though a dry run goes on
    assert files_under(isolated_cache) == []


def test_dry_run_only_model_with_local_files(capfd: pytest.CaptureFixture[str],
                                             local_parts: tuple[Path, Path]) -> None:
    fw, img = local_parts
    rc = flash.main(["--board", "n16r8", "--dry-run", "--only", "model", "--image", str(img)])
    out = capfd.readouterr().out
    assert rc == 0, out
    assert "make " not in out and "firmware.bin" not in out
    write = [ln for ln in out.splitlines() if " write-flash " in ln]
    assert write[0].endswith(f"write-flash {MODEL_OFFSET:#x} {img}")
    rc = flash.main(["--board", "n16r8", "--dry-run", "--only", "firmware", "--firmware",
                     str(fw)])
    out = capfd.readouterr().out
    assert rc == 0
    assert next(ln for ln in out.splitlines() if " write-flash " in ln).endswith(
        f"write-flash 0x0 {fw}")
    assert "convert " not in out and "download " not in out


def test_dry_run_host_board(capfd: pytest.CaptureFixture[str]) -> None:
    rc = flash.main(["--board", "host", "--dry-run"])
    out = capfd.readouterr().out
    assert rc == 0, out
    assert f"-m pip install -e {ROOT}" in out
    assert f"convert {ROOT / 'models/demo/model.bin'} {ROOT / 'models/demo/tokenizer.json'}" \
        in out
    assert "tools/chat.py --board host" in out


def test_host_board_next_command_runs_from_anywhere(capfd: pytest.CaptureFixture[str],
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the checkout, the next command names chat.py by its path (before:
    "python tools/chat.py", no such file from there)."""
    monkeypatch.chdir(tmp_path)
    assert flash.main(["--board", "host", "--dry-run"]) == 0
    assert f"  python {ROOT / 'tools' / 'chat.py'} --board host --image " in \
        capfd.readouterr().out


# ---------------------------------------------------------------------------
# with a (fake) board


def test_flash_writes_and_verifies_at_partition_offsets(
        fake_esptool: Path, local_parts: tuple[Path, Path],
        capfd: pytest.CaptureFixture[str]) -> None:
    fw, img = local_parts
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--firmware", str(fw),
                     "--image", str(img)])
    out = capfd.readouterr()
    assert rc == 0, out.err
    seq = calls(fake_esptool)
    assert [c[-1] if c[-1] == "flash-id" else next(a for a in c if a.endswith("-flash"))
            for c in seq] == ["flash-id", "write-flash", "verify-flash"]
    pairs = ["0x0", str(fw), f"{MODEL_OFFSET:#x}", str(img)]
    assert seq[1][-4:] == pairs and seq[2][-4:] == pairs
    assert seq[1][:6] == ["--chip", "esp32s3", "--port", "/dev/ttyFAKE", "--baud", "460800"]
    assert "ESP32-S3 (QFN56)" in out.out and "mpremote connect /dev/ttyFAKE repl" in out.out


@pytest.mark.parametrize("report,message", [
    (REPORT_S3.replace("ESP32-S3 (QFN56) (revision v0.2)", "ESP32-D0WD-V3 (revision v3.1)"),
     "is a ESP32-D0WD-V3 (revision v3.1), not an ESP32-S3"),
    (REPORT_S3.replace("Detected flash size: 16MB", "Detected flash size: 8MB"),
     "has 8 MB of flash; --board n16r8 needs 16 MB (an N16R8)"),
    (REPORT_S3.replace(", Embedded PSRAM 8MB (AP_3v3)", ""), "reports no embedded PSRAM"),
    ("Chip is ESP32 (revision v1.0)\nDetected flash size: 4MB\n", "not an ESP32-S3"),
    ("A fatal error occurred: Failed to connect\n", "did not report a chip type"),
])
def test_wrong_board_writes_nothing(fake_esptool: Path, local_parts: tuple[Path, Path],
                                    monkeypatch: pytest.MonkeyPatch,
                                    capfd: pytest.CaptureFixture[str],
                                    report: str, message: str) -> None:
    monkeypatch.setenv("FAKE_ESPTOOL_REPORT", report)
    fw, img = local_parts
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--firmware", str(fw),
                     "--image", str(img)])
    err = capfd.readouterr().err
    assert rc == 2
    assert message in err
    assert [c[-1] for c in calls(fake_esptool)] == ["flash-id"]


def test_esptool_4_report_is_understood() -> None:
    info = flash.parse_chip_report(
        "Chip is ESP32-S3 (QFN56) (revision v0.2)\n"
        "Features: WiFi, BLE, Embedded PSRAM 8MB (AP_3v3)\n"
        "Detected flash size: 16MB\n")
    assert info == flash.ChipInfo("ESP32-S3 (QFN56) (revision v0.2)", 16 * 2**20,
                                  "Embedded PSRAM 8MB (AP_3v3)")
    flash.check_chip(info, skip_psram=False)
    assert flash.esptool_cmd(4)("write-flash") == "write_flash"
    assert flash.esptool_cmd(5)("write-flash") == "write-flash"


def test_the_board_without_psram_takes_any_s3_with_8_mb() -> None:
    n8 = pins.BOARDS["n8"]
    no_psram = flash.parse_chip_report("Chip is ESP32-S3 (QFN56) (revision v0.2)\n"
                                       "Features: WiFi, BLE\nDetected flash size: 8MB\n")
    flash.check_chip(no_psram, skip_psram=False, board=n8)  # no PSRAM asked for
    with pytest.raises(flash.FlashError, match="no embedded PSRAM.*takes --board n8"):
        flash.check_chip(flash.ChipInfo(no_psram.chip, 16 * 2**20, None), skip_psram=False)
    small = flash.ChipInfo(no_psram.chip, 4 * 2**20, None)
    with pytest.raises(flash.FlashError, match="has 4 MB of flash; --board n8 needs 8 MB"):
        flash.check_chip(small, skip_psram=False, board=n8)


def test_dry_run_n8_builds_its_board_and_writes_stories260k(
        capfd: pytest.CaptureFixture[str], isolated_cache: Path) -> None:
    """--board n8 (no PSRAM): its own board folder and build, its own
    partition table (5 MiB model partition), and by default llama2.c's
    stories260K (the release model would not fit)."""
    n8 = pins.BOARDS["n8"]
    rc = flash.main(["--board", "n8", "--dry-run", "--port", "/dev/ttyUSB0"])
    out = capfd.readouterr().out
    assert rc == 0, out
    mp = isolated_cache / "mpllm" / f"micropython-{pins.MICROPYTHON_TAG}"
    assert f"BOARD_DIR={ROOT / n8.board_dir} USER_C_MODULES=" in out
    assert f"model at {MODEL_OFFSET:#x} ({n8.model_bytes} bytes)" in out
    assert f"{mp}/ports/esp32/build-MPLLM_N8/firmware.bin" in out
    model, tok = flash.load_pins(ROOT / "models" / "stories260k.json")
    assert f"download {model.url} " in out and f"download {tok.url} " in out
    assert "(check: chip is an ESP32-S3, flash >= 8 MB)" in out
    assert files_under(isolated_cache) == []


def test_failed_verification_is_an_error(fake_esptool: Path, local_parts: tuple[Path, Path],
                                         monkeypatch: pytest.MonkeyPatch,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKE_ESPTOOL_VERIFY_FAIL", "1")
    fw, img = local_parts
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--firmware", str(fw),
                     "--image", str(img)])
    out = capfd.readouterr()
    assert rc == 2
    assert "verifying what was written" in out.err and "Verification failed" in out.out


# ---------------------------------------------------------------------------
# refusals before the board is touched


def test_no_port(local_parts: tuple[Path, Path], fake_esptool: Path,
                 capfd: pytest.CaptureFixture[str]) -> None:
    fw, img = local_parts
    rc = flash.main(["--board", "n16r8", "--firmware", str(fw), "--image", str(img)])
    assert rc == 2
    assert "no --port given" in capfd.readouterr().err
    assert calls(fake_esptool) == []


def test_image_too_large(tmp_path: Path, fake_esptool: Path, local_parts: tuple[Path, Path],
                         capfd: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.img"
    with open(big, "wb") as f:
        f.truncate(MODEL_SIZE + 1)
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "model",
                     "--image", str(big)])
    err = capfd.readouterr().err
    assert rc == 2
    assert f"is {MODEL_SIZE + 1} bytes; the 'model' partition holds {MODEL_SIZE}" in err
    assert calls(fake_esptool) == []


def test_an_int8_image_too_large_says_how_to_make_the_int4_one(llama2c_image) -> None:
    """A llama2.c image whose int8 or fp32 matrices overflow the partition (a
    stories15M-shaped checkpoint that --weights auto made int8: 17.9 MB against
    the N16R8's 13 MiB) is refused with the command that makes its int4 image;
    an int4 image too large gets no such hint (there is no smaller format)."""
    for name, hint in (("int8", True), ("fp32", True), ("untied", False)):
        img = llama2c_image(name)
        with pytest.raises(flash.FlashError) as e:
            flash.check_image(img, img.stat().st_size - 1)
        assert f"is {img.stat().st_size} bytes; the 'model' partition holds" in str(e.value)
        assert ("-o IMG --weights int4, then --image IMG)" in str(e.value)) == hint, name


def test_firmware_overlapping_the_model(tmp_path: Path, fake_esptool: Path,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    fw = tmp_path / "fw.bin"
    with open(fw, "wb") as f:
        f.write(b"\xe9")  # a boot image's magic, so only its size is wrong
        f.truncate(MODEL_OFFSET + 16)
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "firmware",
                     "--firmware", str(fw)])
    assert rc == 2
    assert "would run into the model partition" in capfd.readouterr().err
    assert calls(fake_esptool) == []


def test_missing_local_files(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    rc = flash.main(["--board", "n16r8", "--port", "X", "--only", "model", "--model",
                     str(tmp_path / "nope.bin"), "--tokenizer", str(tmp_path / "t.json")])
    assert rc == 2 and "--model file not found" in capfd.readouterr().err
    rc = flash.main(["--board", "n16r8", "--port", "X", "--only", "model", "--model", "m.bin"])
    assert rc == 2 and "--model and --tokenizer go together" in capfd.readouterr().err


def test_esp_idf_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_esptool: Path,
                         capfd: pytest.CaptureFixture[str], isolated_cache: Path) -> None:
    mp = tmp_path / "micropython"
    (mp / "ports" / "esp32").mkdir(parents=True)
    (mp / "ports" / "esp32" / "Makefile").write_text("")
    args = ["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "firmware",
            "--micropython", str(mp)]
    rc = flash.main(args)
    err = capfd.readouterr().err
    assert rc == 2
    assert "ESP-IDF not found: IDF_PATH is not set" in err and pins.ESP_IDF_VERSION in err
    assert "--firmware FILE" in err
    # and where a built one is: a release's assets
    assert f"--firmware with the URL of the {release.FIRMWARE_ASSET} asset" in err
    assert release.RELEASE_MANIFEST in err
    idf = tmp_path / "esp-idf"
    (idf / "tools").mkdir(parents=True)
    (idf / "tools" / "idf.py").write_text("")
    monkeypatch.setenv("IDF_PATH", str(idf))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rc = flash.main(args)
    assert rc == 2
    assert "idf.py is not on PATH" in capfd.readouterr().err
    assert calls(fake_esptool) == []
    assert files_under(isolated_cache) == []


# ---------------------------------------------------------------------------
# downloads


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _release(path: Path, base: str, files: dict[str, bytes], *,
             wrong: str | None = None, size_off: int = 0) -> Path:
    pins_list = []
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        if name == wrong:
            sha = hashlib.sha256(data + b"x").hexdigest()
        pins_list.append({"name": name, "url": f"{base}/{name}", "sha256": sha,
                          "size": len(data) + (size_off if name == wrong else 0)})
    path.write_text(json.dumps({"files": pins_list}))
    return path


def _serve_tiny(http_dir: tuple[str, Path], tmp_path: Path, tiny_model) -> Path:  # type: ignore[no-untyped-def]
    """The tiny model's files served, and release pins of them (the JSON's path)."""
    base, root = http_dir
    files = {"model.bin": tiny_model.model_bin.read_bytes(),
             "tokenizer.json": tiny_model.tokenizer_json.read_bytes()}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return _release(tmp_path / "release.json", base, files)


@pytest.mark.parametrize("size_off,message", [(0, "does not match the pinned"),
                                              (5, "pinned size is")])
def test_download_hash_or_size_mismatch_keeps_nothing(
        http_dir: tuple[str, Path], tmp_path: Path, tiny_model, fake_esptool: Path,
        capfd: pytest.CaptureFixture[str], size_off: int, message: str) -> None:
    base, root = http_dir
    files = {"model.bin": tiny_model.model_bin.read_bytes(),
             "tokenizer.json": tiny_model.tokenizer_json.read_bytes()}
    for name, data in files.items():
        (root / name).write_bytes(data)
    rel = _release(tmp_path / "release.json", base, files, wrong="model.bin", size_off=size_off)
    cache = tmp_path / "cache"
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "model",
                     "--release", str(rel), "--cache", str(cache)])
    err = capfd.readouterr().err
    assert rc == 2
    assert "download of model.bin" in err and message in err and "nothing was kept" in err
    assert files_under(cache) == []
    assert calls(fake_esptool) == []


def test_download_convert_and_flash_model(http_dir: tuple[str, Path], tmp_path: Path,
                                          tiny_model, fake_esptool: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    root = http_dir[1]
    rel = _serve_tiny(http_dir, tmp_path, tiny_model)
    cache = tmp_path / "cache"
    args = ["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "model", "--release",
            str(rel), "--cache", str(cache)]
    assert flash.main(args) == 0, capfd.readouterr().err
    images = list((cache / "images").glob("*.img"))
    assert len(images) == 1
    # the fixture's own conversion, but flash.py's converter writes its 200 stories and
    # keeps the drafter and the certified head only where they pay (on this random
    # tiny model neither does: test_convert_llama2c holds that rule)
    from mpllm.formats.image import read_image

    got, want = read_image(images[0]), read_image(tiny_model.image)
    names = [s.name for s in got.sections]
    assert names == [s.name for s in want.sections]
    at = names.index("head_tiles")
    assert got.sections[:at] == want.sections[:at]
    assert got.head_tiles.n_tiles in (0, want.head_tiles.n_tiles)
    write = next(c for c in calls(fake_esptool) if "write-flash" in c)
    assert write[-2:] == [f"{MODEL_OFFSET:#x}", str(images[0])]
    # a second run uses the verified cache: no new files, same image
    shutil.rmtree(root)
    root.mkdir()
    assert flash.main(args) == 0
    assert "cached copy verified" in capfd.readouterr().out
    assert sorted(p.name for p in files_under(cache)) == sorted(
        ["model.bin", "tokenizer.json", images[0].name])


# ---------------------------------------------------------------------------
# release assets by URL (no toolchain, no converter)


@pytest.fixture
def served_release(http_dir: tuple[str, Path], local_parts: tuple[Path, Path]) -> tuple[str, Path]:
    base, root = http_dir
    fw, img = local_parts
    release.build_assets(fw, img, root, "v0.0.1")
    return base, root


def test_firmware_and_image_from_release_urls(served_release: tuple[str, Path], tmp_path: Path,
                                              fake_esptool: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    base, root = served_release
    cache = tmp_path / "cache"
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--cache", str(cache),
                     "--firmware", f"{base}/{release.FIRMWARE_ASSET}",
                     "--image", f"{base}/{release.MODEL_ASSET}"])
    out = capfd.readouterr()
    assert rc == 0, out.err
    write = next(c for c in calls(fake_esptool) if "write-flash" in c)
    fw_path, img_path = Path(write[-3]), Path(write[-1])
    assert write[-4::2] == ["0x0", f"{MODEL_OFFSET:#x}"]
    assert fw_path.read_bytes() == (root / release.FIRMWARE_ASSET).read_bytes()
    assert img_path.read_bytes() == (root / release.MODEL_ASSET).read_bytes()
    assert cache in fw_path.parents and cache in img_path.parents
    assert "sha256 verified" in out.out


def test_release_download_that_does_not_match_keeps_nothing(
        served_release: tuple[str, Path], tmp_path: Path, fake_esptool: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    base, root = served_release
    fw = root / release.FIRMWARE_ASSET
    fw.write_bytes(b"\xe9" + b"\x01" * (fw.stat().st_size - 1))  # same size, other bytes
    cache = tmp_path / "cache"
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "firmware",
                     "--cache", str(cache), "--firmware", f"{base}/{release.FIRMWARE_ASSET}"])
    err = capfd.readouterr().err
    assert rc == 2 and "does not match the pinned" in err and "nothing was kept" in err
    assert files_under(cache) == [] and calls(fake_esptool) == []


@pytest.mark.parametrize("asset,message", [
    (release.MODEL_ASSET, "is the release's model asset, not its firmware"),
    (release.MERGED_ASSET, "is the release's merged asset, not its firmware"),
    ("other.bin", "lists no 'other.bin'"),
])
def test_release_url_of_the_wrong_asset(served_release: tuple[str, Path], tmp_path: Path,
                                        fake_esptool: Path, capfd: pytest.CaptureFixture[str],
                                        asset: str, message: str) -> None:
    base, _ = served_release
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "firmware",
                     "--cache", str(tmp_path / "c"), "--firmware", f"{base}/{asset}"])
    assert rc == 2 and message in capfd.readouterr().err
    assert calls(fake_esptool) == []


def test_release_url_without_a_manifest(http_dir: tuple[str, Path], tmp_path: Path,
                                        fake_esptool: Path,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    base, _ = http_dir
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "firmware",
                     "--cache", str(tmp_path / "c"), "--firmware", f"{base}/firmware.bin"])
    err = capfd.readouterr().err
    assert rc == 2 and f"cannot download {base}/{release.RELEASE_MANIFEST}" in err


def test_dry_run_with_release_urls(served_release: tuple[str, Path],
                                   capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base, _ = served_release
    url = f"{base}/{release.FIRMWARE_ASSET}"
    rc = flash.main(["--board", "n16r8", "--dry-run", "--only", "firmware", "--firmware", url,
                     "--cache", str(tmp_path / "c")])
    out = capfd.readouterr().out
    assert rc == 0, out
    assert f"checked {base}/{release.RELEASE_MANIFEST} (lists {release.FIRMWARE_ASSET}" in out
    assert f"and {url} (reachable); would download it" in out
    assert "make " not in out and files_under(tmp_path / "c") == []


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound, then closed: nothing listens there now
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--firmware", "--image"])
def test_dry_run_checks_urls(flag: str, served_release: tuple[str, Path], tmp_path: Path,
                             capfd: pytest.CaptureFixture[str]) -> None:
    """A dry run asks a --firmware/--image URL (and its release's manifest) whether it is
    there: a closed loopback port, a missing asset or an asset the manifest does not list
    fail as the real run would, in one line."""
    base, root = served_release
    only = "firmware" if flag == "--firmware" else "model"
    asset = release.FIRMWARE_ASSET if flag == "--firmware" else release.MODEL_ASSET
    cache = tmp_path / "c"
    common = ["--board", "n16r8", "--dry-run", "--only", only, "--cache", str(cache)]
    closed = f"http://127.0.0.1:{_closed_port()}/{asset}"
    assert flash.main([*common, flag, closed]) == 2
    err = capfd.readouterr().err
    assert err.startswith("error: cannot download http://127.0.0.1:") and "refused" in err
    assert err.count("\n") == 1
    (root / asset).unlink()  # the manifest lists it, the server has it no more
    assert flash.main([*common, flag, f"{base}/{asset}"]) == 2
    err = capfd.readouterr().err
    assert err == f"error: cannot reach {base}/{asset}: HTTP 404 File not found\n"
    assert files_under(cache) == []


def test_dry_run_checks_local_inputs(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """What a dry run can check without doing it, it checks: a --model or --tokenizer
    that does not exist, a --micropython folder that does not exist."""
    nope = tmp_path / "nope.bin"
    for board in (["--board", "host"], ["--board", "n16r8", "--only", "model"]):
        rc = flash.main([*board, "--dry-run", "--model", str(nope), "--tokenizer", str(nope)])
        err = capfd.readouterr().err
        assert rc == 2 and err == f"error: --model file not found: {nope}\n", board
    rc = flash.main(["--board", "n16r8", "--dry-run", "--only", "firmware", "--micropython",
                     str(tmp_path / "no-mp")])
    assert rc == 2
    assert capfd.readouterr().err == f"error: --micropython {tmp_path / 'no-mp'}: no such folder\n"
    rc = flash.main(["--board", "n16r8", "--dry-run", "--only", "firmware", "--micropython",
                     str(tmp_path)])
    assert rc == 2 and "is not a MicroPython checkout" in capfd.readouterr().err


@pytest.mark.parametrize("url", ["ftp://example.org/firmware.bin", "file:///tmp/firmware.bin"])
def test_only_http_urls(url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    rc = flash.main(["--board", "n16r8", "--dry-run", "--only", "firmware", "--firmware", url,
                     "--cache", str(tmp_path)])
    err = capfd.readouterr().err
    assert rc == 2
    assert err == (f"error: --firmware {url}: only http:// and https:// URLs, or a local "
                   f"file, are supported (not {url.split(':')[0]}://)\n")


def _corrupted(img: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "corrupted.img"
    data = bytearray(img.read_bytes())
    data[-1] ^= 0xFF  # last section's payload: its CRC no longer matches
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("dry_run", [True, False])
def test_host_board_refuses_a_corrupted_image_before_pip(
        dry_run: bool, local_parts: tuple[Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """--board host checks --image as --board n16r8 does (one check), and before it
    reinstalls the package: nothing runs."""
    _, img = local_parts
    ran: list[list[str]] = []
    monkeypatch.setattr(flash.Runner, "run", lambda self, cmd, *a, **k: ran.append(cmd))
    bad = _corrupted(img, tmp_path)
    rc = flash.main(["--board", "host", "--image", str(bad)] + ["--dry-run"] * dry_run)
    err = capfd.readouterr().err
    assert rc == 2 and ran == []
    assert err.startswith(f"error: model image {bad} is not a valid mpllm model image (")
    assert "CRC mismatch" in err and err.count("\n") == 1
    for board in (["--board", "host"], ["--board", "n16r8", "--only", "model"]):
        for what, path in (("is a directory", tmp_path), ("is not a regular file", "/dev/null")):
            assert flash.main([*board, "--image", str(path), "--dry-run"]) == 2
            assert capfd.readouterr().err == f"error: --image file {what}: {path}\n"
    assert ran == []
    assert flash.main(["--board", "host", "--image", str(img)]) == 0
    assert ran and ran[0][-3:] == ["install", "-e", str(ROOT)]


# ---------------------------------------------------------------------------
# models by name (--model NAME): llama2.c's stories260K, the bundled demos


def test_dry_run_stories260k_downloads_the_pinned_files(capfd: pytest.CaptureFixture[str],
                                                        isolated_cache: Path) -> None:
    """--model stories260k: the published files, each verified against its
    pinned size and sha256 (models/stories260k.json), then converted; on the
    host board then the chat command, on the N16R8 then the flash commands."""
    model, tok = flash.load_pins(ROOT / "models" / "stories260k.json")
    assert (model.name, model.size) == ("stories260K.bin", 1056540)
    assert model.url == ("https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K/"
                         "stories260K.bin")
    assert tok.url.endswith("/stories260K/tok512.bin") and tok.size == 6227
    dest = isolated_cache / "mpllm" / "models" / "stories260k"
    for board in (["--board", "host"], ["--board", "n16r8", "--port", "/dev/ttyACM0"]):
        rc = flash.main([*board, "--dry-run", "--model", "stories260k"])
        out = capfd.readouterr().out
        assert rc == 0, out
        for pin in (model, tok):
            assert (f"download {pin.url} -> {dest / pin.name} (verify {pin.size} bytes, "
                    f"sha256 {pin.sha256})") in out
        assert f"convert {dest / model.name} {dest / tok.name} -> " in out
        assert ("tools/chat.py --board host" in out) == (board[1] == "host")
        assert ("write-flash" in out) == (board[1] == "n16r8")
    assert files_under(isolated_cache) == []


def test_dry_run_llama2c_demo_by_name(capfd: pytest.CaptureFixture[str]) -> None:
    rc = flash.main(["--board", "host", "--dry-run", "--model", "llama2c-demo"])
    out = capfd.readouterr().out
    demo = ROOT / "models" / "llama2c-demo"
    assert rc == 0 and f"convert {demo / 'model.bin'} {demo / 'tokenizer.bin'} -> " in out
    rc = flash.main(["--board", "host", "--dry-run", "--model", "no-such-model"])
    err = capfd.readouterr().err
    assert rc == 2 and "--model and --tokenizer go together" in err and "stories260k" in err


@pytest.mark.parametrize("wrong", [None, "tok512.bin"])
def test_stories260k_download_convert_and_flash(http_dir: tuple[str, Path], tmp_path: Path,
                                                fake_esptool: Path, wrong: str | None,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    """The download path of --model stories260k, served from 127.0.0.1 (a
    llama2.c v0 checkpoint and its tokenizer.bin under the published names):
    verified, converted into a llama2c image and written; a file that does
    not match its pin is refused and nothing is kept or written."""
    from mpllm.formats.image import read_image
    from mpllm.models import NAMED_MODELS, NamedModel

    base, root = http_dir
    demo = ROOT / "models" / "llama2c-demo"
    files = {"stories260K.bin": (demo / "model.bin").read_bytes(),
             "tok512.bin": (demo / "tokenizer.bin").read_bytes()}
    for name, data in files.items():
        (root / name).write_bytes(data)
    pins_json = _release(tmp_path / "stories260k.json", base, files, wrong=wrong)
    data = json.loads(pins_json.read_text())
    pins_json.write_text(json.dumps({**data, "model": "stories260K.bin",
                                     "tokenizer": "tok512.bin"}))
    monkeypatch.setitem(NAMED_MODELS, "stories260k",
                        NamedModel("stories260k", "served here", pins=pins_json))
    cache = tmp_path / "cache"
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "model",
                     "--model", "stories260k", "--cache", str(cache)])
    err = capfd.readouterr().err
    if wrong:
        assert rc == 2 and f"download of {wrong}" in err and "nothing was kept" in err
        assert [p.name for p in files_under(cache)] == ["stories260K.bin"]  # verified
        assert calls(fake_esptool) == []
        return
    assert rc == 0, err
    images = list((cache / "images").glob("*.img"))
    assert len(images) == 1
    img = read_image(images[0])
    # (whether the drafter is stored is the converter's measured choice: test_convert_llama2c)
    assert img.weights.config.family == "llama2c"
    write = next(c for c in calls(fake_esptool) if "write-flash" in c)
    assert write[-2:] == [f"{MODEL_OFFSET:#x}", str(images[0])]


def test_stories15m_download_converts_as_int4_and_flashes(
        http_dir: tuple[str, Path], tmp_path: Path, fake_esptool: Path, stories15m_image,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """--model stories15m on the N16R8, served from 127.0.0.1 (a stories15M-
    shaped checkpoint and tokenizer.bin under the published names, pinned as
    models/stories15m.json pins them): verified, converted in the weights its
    pins name (int4: the only format that fits the model partition; its
    quality measured, no other format tried) and written. (Two drafter
    stories instead of 200 keep it to a minute.)"""
    import mpllm.convert
    from mpllm.formats.image import read_image
    from mpllm.models import NAMED_MODELS, NamedModel

    base, root = http_dir
    files = {"stories15M.bin": stories15m_image.model_bin.read_bytes(),
             "tokenizer.bin": stories15m_image.tokenizer_bin.read_bytes()}
    for name, data in files.items():
        (root / name).write_bytes(data)
    served = json.loads(_release(tmp_path / "pins.json", base, files).read_text())
    pins_json = tmp_path / "stories15m.json"
    published = json.loads((ROOT / "models" / "stories15m.json").read_text())
    pins_json.write_text(json.dumps({**published, "files": served["files"]}))
    monkeypatch.setitem(NAMED_MODELS, "stories15m",
                        NamedModel("stories15m", "served here", pins=pins_json))
    monkeypatch.setattr(mpllm.convert, "DRAFTER_STORIES", 2)
    cache = tmp_path / "cache"
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyFAKE", "--only", "model",
                     "--model", "stories15m", "--cache", str(cache)])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert f"weights: int4, as its pins say: {published['weights_why']}" in out
    images = list((cache / "images").glob("*.img"))
    assert len(images) == 1
    img = read_image(images[0])
    choice = img.weights_choice
    assert img.weights.config.dim == 288 and choice.positions == 256
    assert [t.name for t in choice.tried] == ["int4"] and choice.chosen == choice.tried[0].kind
    assert images[0].stat().st_size < pins.BOARDS["n16r8"].model_bytes
    write = next(c for c in calls(fake_esptool) if "write-flash" in c)
    assert write[-2:] == [f"{MODEL_OFFSET:#x}", str(images[0])]


# ---------------------------------------------------------------------------
# checks first, then work


def test_no_esptool_fails_at_once_before_any_download(
        http_dir: tuple[str, Path], tmp_path: Path, tiny_model, isolated_cache: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """flash.py --board n16r8 without esptool: one error naming it (and
    everything else missing: ESP-IDF here) before anything is downloaded,
    converted or built."""
    rel = _serve_tiny(http_dir, tmp_path, tiny_model)
    monkeypatch.setattr(flash, "esptool_major", lambda: None)
    monkeypatch.setattr(flash, "port_missing", lambda port: False)
    served = []
    monkeypatch.setattr(flash.urllib.request, "urlopen",
                        lambda *a, **k: served.append(a) or pytest.fail("downloaded"))
    rc = flash.main(["--board", "n16r8", "--port", "/dev/ttyACM0", "--release", str(rel)])
    out, err = capfd.readouterr()
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("error: esptool is not installed: pip install 'mpllm[board]'")
    assert "ESP-IDF not found" in err and err.endswith(
        "Nothing was downloaded, built or written.\n")
    assert served == [] and "download" not in out and "convert" not in out
    assert files_under(isolated_cache) == []
    # the dry run checks the same, says so, goes on, and ends with what would happen
    rc = flash.main(["--board", "n16r8", "--dry-run", "--release", str(rel)])
    out = capfd.readouterr().out
    assert rc == 0 and served == [] and files_under(isolated_cache) == []
    assert "missing: esptool is not installed" in out and "Done" not in out
    assert "no --port given: the commands below show PORT" in out
    last = out.rstrip().splitlines()[-3]
    assert last.startswith("Dry run: nothing was downloaded, built or written. A real run would "
                           "check the chip on PORT, write the firmware (firmware.bin) at 0x0 "
                           "and the model image")
    assert "but it would stop first, before anything is downloaded or built: esptool" in last


def test_missing_build_tools_and_port_are_said_first(
        tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    idf = tmp_path / "esp-idf"
    (idf / "tools").mkdir(parents=True)
    (idf / "tools" / "idf.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "idf.py").write_text("")
    (bin_dir / "idf.py").chmod(0o755)
    monkeypatch.setenv("IDF_PATH", str(idf))
    monkeypatch.setenv("PATH", str(bin_dir))  # idf.py, but no git, no make
    rc = flash.main(["--board", "n16r8", "--port", str(tmp_path / "ttyNONE"), "--only",
                     "firmware"])
    err = capfd.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "git is not on PATH (the build clones MicroPython" in err
    assert "make is not on PATH" in err and "ESP-IDF" not in err
    assert f"--port {tmp_path / 'ttyNONE'}: no such device" not in err  # not a /dev name
    rc = flash.main(["--board", "n16r8", "--port", "/dev/mpllm-no-such-port", "--only",
                     "firmware"])
    err = capfd.readouterr().err
    assert rc == 2 and "--port /dev/mpllm-no-such-port: no such device" in err
    assert files_under(isolated_cache) == []


@pytest.mark.parametrize("dry", [False, True])
def test_the_release_model_is_refused_on_the_n8_at_once(
        dry: bool, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # the weights of the rows the tokenizer produces: 11.6 MB, over the N8's 5 MiB
    # and within the N16R8's 13 MiB (whose image is 13.02 MB with its tables)
    refused_on_the_n8_at_once("release", ROOT / "models" / "release.json", dry, monkeypatch,
                              capfd)
    assert files_under(isolated_cache) == []
