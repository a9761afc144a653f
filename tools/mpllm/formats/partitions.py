"""Read an ESP-IDF partition table CSV (the board's partitions.csv).

The flash tool takes the offsets it writes to from here, and the tests check the
table against the facts the firmware relies on (alignment, fits the flash, the
`model` partition holds a release image, the free tail MicroPython turns into
its filesystem). Only the CSV syntax ESP-IDF's gen_esp32part accepts for the
columns we use is understood: name, type, subtype, offset, size, flags.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from .align import align_up

# ESP-IDF places the partition table itself at 0x8000 (one 4 KiB sector);
# partitions start after it.
TABLE_OFFSET = 0x8000
TABLE_END = 0x9000
SECTOR = 0x1000  # every data partition: flash erase sector
APP_ALIGN = 0x10000  # app partitions: MMU page (ESP-IDF rejects anything else)

TYPES = {"app": 0x00, "data": 0x01}
SUBTYPES = {
    0x00: {"factory": 0x00, "test": 0x20, **{f"ota_{i}": 0x10 + i for i in range(16)}},
    0x01: {"ota": 0x00, "phy": 0x01, "nvs": 0x02, "coredump": 0x03, "nvs_keys": 0x04,
           "efuse": 0x05, "undefined": 0x06, "esphttpd": 0x80, "fat": 0x81,
           "spiffs": 0x82, "littlefs": 0x83},
}


class PartitionError(ValueError):
    """The table cannot be parsed or breaks a layout rule; the message says where."""


@dataclass(frozen=True)
class Partition:
    name: str
    type: int
    subtype: int
    offset: int
    size: int
    flags: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size


def _number(text: str, where: str) -> int:
    t = text.strip()
    mult = 1
    if t[-1:].upper() == "K":
        mult, t = 1024, t[:-1]
    elif t[-1:].upper() == "M":
        mult, t = 1024 * 1024, t[:-1]
    try:
        return int(t, 0) * mult
    except ValueError:
        raise PartitionError(f"{where}: {text.strip()!r} is not a number") from None


def parse_partitions(text: str, source: str = "partitions.csv") -> list[Partition]:
    """Parse CSV text; offsets left empty are placed like ESP-IDF does."""
    parts: list[Partition] = []
    next_free = TABLE_END
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            raise PartitionError(f"{where}: expected name, type, subtype, offset, size[, flags]"
                                 f", got {raw.strip()!r}")
        name, ptype, psub, poff, psize = cols[:5]
        flags = ",".join(c for c in cols[5:] if c)
        if not name or len(name) > 16:
            raise PartitionError(f"{where}: partition name must be 1..16 characters: {name!r}")
        if ptype in TYPES:
            type_id = TYPES[ptype]
        else:
            type_id = _number(ptype, f"{where} type")
        known = SUBTYPES.get(type_id, {})
        if psub in known:
            sub_id = known[psub]
        elif psub:
            sub_id = _number(psub, f"{where} subtype")
        else:
            raise PartitionError(f"{where}: subtype is empty")
        if not 0 <= type_id <= 0xFE or not 0 <= sub_id <= 0xFE:
            raise PartitionError(f"{where}: type/subtype out of range 0..0xFE")
        align = APP_ALIGN if type_id == TYPES["app"] else SECTOR
        if poff:
            offset = _number(poff, f"{where} offset")
        else:
            offset = align_up(next_free, align)
        if not psize:
            raise PartitionError(f"{where}: size is empty")
        size = _number(psize, f"{where} size")
        if size <= 0:
            raise PartitionError(f"{where}: size must be positive")
        parts.append(Partition(name, type_id, sub_id, offset, size, flags))
        next_free = offset + size
    if not parts:
        raise PartitionError(f"{source}: no partitions")
    return parts


def load_partitions(path: str | os.PathLike[str]) -> list[Partition]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise PartitionError(f"cannot read partition table {p}: {e.strerror}") from None
    return parse_partitions(text, str(p))


def check_layout(parts: list[Partition], flash_bytes: int) -> None:
    """Raise PartitionError unless every partition is aligned, inside the flash,
    after the table, uniquely named and not overlapping another."""
    seen: set[str] = set()
    for p in parts:
        if p.name in seen:
            raise PartitionError(f"partition name {p.name!r} is used twice")
        seen.add(p.name)
        align = APP_ALIGN if p.type == TYPES["app"] else SECTOR
        if p.offset % align:
            raise PartitionError(f"{p.name}: offset {p.offset:#x} is not {align:#x}-aligned")
        if p.size % SECTOR:
            raise PartitionError(f"{p.name}: size {p.size:#x} is not a multiple of "
                                 f"{SECTOR:#x}")
        if p.offset < TABLE_END:
            raise PartitionError(f"{p.name}: offset {p.offset:#x} overlaps the bootloader "
                                 f"or the partition table (first free offset {TABLE_END:#x})")
        if p.end > flash_bytes:
            raise PartitionError(f"{p.name}: ends at {p.end:#x}, past the end of "
                                 f"{flash_bytes // (1024 * 1024)} MiB of flash")
    ordered = sorted(parts, key=lambda q: q.offset)
    for a, b in itertools.pairwise(ordered):
        if b.offset < a.end:
            raise PartitionError(f"{a.name} ({a.offset:#x}..{a.end:#x}) overlaps "
                                 f"{b.name} ({b.offset:#x}..{b.end:#x})")


def find(parts: list[Partition], name: str) -> Partition:
    for p in parts:
        if p.name == name:
            return p
    raise PartitionError(f"no partition named {name!r} (have: "
                         f"{', '.join(p.name for p in parts)})")


def app_partition(parts: list[Partition]) -> Partition:
    """The first app partition: where MicroPython's makeimg.py puts the app."""
    for p in parts:
        if p.type == TYPES["app"]:
            return p
    raise PartitionError("no app partition")


def free_tail(parts: list[Partition], flash_bytes: int) -> tuple[int, int]:
    """(offset, size) of the filesystem MicroPython's esp32 port creates at boot
    when the table lists no "vfs"/"ffat" partition: from the end of the last
    partition to the end of flash (ports/esp32/main.c, boardctrl_startup)."""
    if any(p.name in ("vfs", "ffat") and p.type == TYPES["data"] for p in parts):
        return (0, 0)
    end = max(p.end for p in parts)
    return (end, max(0, flash_bytes - end))


# On the ESP32-S3 the second-stage bootloader sits at 0x0, and MicroPython's
# build merges bootloader + partition table + app into one firmware.bin that
# is written there (ports/esp32/makeimg.py).
FIRMWARE_OFFSET = 0x0


@dataclass(frozen=True)
class FlashRegion:
    """Where one file goes on the board's flash, and how much room it has."""

    what: str  # "firmware" or "model"
    offset: int
    limit: int  # bytes the file may take from `offset` on

    @property
    def end(self) -> int:
        return self.offset + self.limit


def flash_regions(parts: list[Partition], model_partition: str) -> tuple[FlashRegion, FlashRegion]:
    """(firmware, model): the two writes that put mpllm on a board, from its
    partition table. The firmware may fill everything before the model
    partition (bootloader, table, app); the model image its own partition.
    flash.py, the release assets and the web flasher's manifest all take
    their offsets from here."""
    model = find(parts, model_partition)
    app = app_partition(parts)
    if not FIRMWARE_OFFSET < app.offset < model.offset:
        raise PartitionError(f"the app partition ({app.offset:#x}) must lie between the "
                             f"bootloader ({FIRMWARE_OFFSET:#x}) and the {model.name!r} "
                             f"partition ({model.offset:#x})")
    return (FlashRegion("firmware", FIRMWARE_OFFSET, model.offset - FIRMWARE_OFFSET),
            FlashRegion("model", model.offset, model.size))
