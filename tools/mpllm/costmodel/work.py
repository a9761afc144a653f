"""Work: one stage's cost drivers (`Work`), the certified head's counts
(`HeadCounts`), the calibrated constants that price them (`Fit`) and the
price itself: seconds per stage, memory, compute, two-core overlap and
hand-offs (`stage_breakdown`, `stage_seconds`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .builds import Build
from .s3 import (
    CORES,
    CPU_HZ,
    FLASH_BPS,
    PIE_CYCLES,
    S_LINE32,
    S_LINE64,
    SCALAR_DOT_MACS_PER_S,
    TILE_ROWS,
)
from .shape import Shape, stream_lines

__all__ = ["Fit", "HeadCounts", "Work", "stage_breakdown", "stage_seconds"]


@dataclass
class Work:
    """One stage's cost drivers for one token.

    `serial` runs on one core, `split` is shared by both; each holds scalar
    int8 MACs ("mac"), other scalar ops ("ops"), PIE instructions ("pie") and
    measured cycles ("cycles")."""

    serial: dict[str, float] = field(default_factory=dict)
    split: dict[str, float] = field(default_factory=dict)
    lines: dict[int, float] = field(default_factory=dict)  # PSRAM line fills by line size
    lines_split: dict[int, float] = field(default_factory=dict)  # ... of the split work
    flash_bytes: float = 0.0
    handoffs: float = 0.0
    bytes: dict[str, float] = field(default_factory=dict)  # tier -> bytes touched (display)
    handoff_s: float = 0.0  # seconds of those hand-offs, priced by the build's mechanism

    def handoff(self, n: float, seconds_each: float) -> None:
        """n hand-offs to the second core and back, each costing seconds_each."""
        self.handoffs += n
        self.handoff_s += n * seconds_each

    def compute(self, *, split: bool = False, **kinds: float) -> None:
        target = self.split if split else self.serial
        for k, v in kinds.items():
            target[k] = target.get(k, 0.0) + v

    def psram(self, nlines: float, line: int, nbytes: float, *, split: bool = False) -> None:
        target = self.lines_split if split else self.lines
        target[line] = target.get(line, 0.0) + nlines
        self.bytes["psram"] = self.bytes.get("psram", 0.0) + nbytes

    def flash(self, nbytes: float, line: int) -> None:
        self.flash_bytes += stream_lines(nbytes, line) * line
        self.bytes["flash"] = self.bytes.get("flash", 0.0) + nbytes

    def sram(self, nbytes: float) -> None:
        self.bytes["sram"] = self.bytes.get("sram", 0.0) + nbytes

    def scaled(self, k: float) -> Work:
        return Work({a: v * k for a, v in self.serial.items()},
                    {a: v * k for a, v in self.split.items()},
                    {a: v * k for a, v in self.lines.items()},
                    {a: v * k for a, v in self.lines_split.items()}, self.flash_bytes * k,
                    self.handoffs * k, {a: v * k for a, v in self.bytes.items()},
                    self.handoff_s * k)

    def add(self, o: Work) -> None:
        for mine, theirs in ((self.serial, o.serial), (self.split, o.split),
                             (self.lines, o.lines), (self.lines_split, o.lines_split),
                             (self.bytes, o.bytes)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + v
        self.flash_bytes += o.flash_bytes
        self.handoffs += o.handoffs
        self.handoff_s += o.handoff_s


@dataclass(frozen=True)
class Fit:
    """The calibrated constants (see the package docstring): c_op, overlap and
    newlib erff fitted, the line fills pinned to the published bus rates
    (s3.S_LINE32/S_LINE64), C_MAC_I8 and the dependent float op derived."""

    c_op: float  # cycles per scalar op (not a MAC)
    s_line32: float = S_LINE32  # seconds per 32-byte PSRAM line fill
    s_line64: float = S_LINE64  # seconds per 64-byte PSRAM line fill
    overlap: float = 0.5  # share of the ideal two-core memory/compute overlap achieved
    erff_cycles: float = 250.0  # newlib erff (fitted on the stock PLE stage)
    chain_cycles: float = 7.0  # per dependent float op, derived after the fit (SOFTMAX_PAIR_*)

    @property
    def c_mac_i8(self) -> float:
        """Cycles per scalar int8 MAC: esp32-ai's single-core scalar int8 dot
        ran at SCALAR_DOT_MACS_PER_S with its weights in PSRAM, one weight
        byte per MAC; take out that byte's share of a 32-byte line fill."""
        return CPU_HZ / SCALAR_DOT_MACS_PER_S - self.s_line32 * CPU_HZ / 32

    def psram_bps(self, line: int) -> float:
        """Pure memory bandwidth of the line fills (bytes/s) for a line size."""
        return line / (self.s_line32 if line == 32 else self.s_line64)

    def as_dict(self) -> dict[str, float]:
        return {"c_mac_i8": self.c_mac_i8, "c_op": self.c_op, "s_line32": self.s_line32,
                "s_line64": self.s_line64, "overlap": self.overlap,
                "newlib_erff_cycles": self.erff_cycles, "chain_op_cycles": self.chain_cycles,
                "psram_MBps_line32": self.psram_bps(32) / 1e6,
                "psram_MBps_line64": self.psram_bps(64) / 1e6}


@dataclass
class HeadCounts:
    """What one certified head evaluation scores, averaged per token. When the
    engine measured them (`head_rows` etc. in stats()), these are its figures;
    otherwise they follow from a rows fraction (`from_fraction`)."""

    rows: float
    tiles: float
    waves: float
    handoffs: float
    source: str = "analytic"

    @classmethod
    def from_fraction(cls, b: Build, s: Shape, fraction: float) -> HeadCounts:
        rows = fraction * s.vocab_out
        tiles = min(float(s.n_tiles), max(1.0, rows / TILE_ROWS))
        rest = max(0.0, tiles - b.first_wave_tiles)
        handoffs = (float(rest > 0) if b.wave_tiles is None
                    else float(math.ceil(rest / b.wave_tiles)))
        waves = (1.0 if b.first_wave_tiles else 0.0) + handoffs
        return cls(rows, tiles, waves, handoffs)


def stage_breakdown(w: Work, fit: Fit) -> dict[str, float]:
    """Seconds of one stage: memory, compute, the part of the split work's
    memory that the other core's compute hid ("overlap", negative), hand-offs.

    Two cores streaming from one bus: while one computes on its line the bus
    can fill the other's, so ideally a split stage takes max(M, (M + C)/2)
    for M bus seconds and C compute seconds in total, i.e. M + C/2 less
    min(M, C)/2; the fitted `overlap` is the share of that achieved."""
    def cycles(d: Mapping[str, float]) -> float:
        return (d.get("mac", 0.0) * fit.c_mac_i8 + d.get("ops", 0.0) * fit.c_op
                + d.get("pie", 0.0) * PIE_CYCLES + d.get("cycles", 0.0)
                + d.get("erff", 0.0) * fit.erff_cycles + d.get("chain", 0.0) * fit.chain_cycles)

    def fills(lines: Mapping[int, float]) -> float:
        return lines.get(32, 0.0) * fit.s_line32 + lines.get(64, 0.0) * fit.s_line64

    m_split, c_split = fills(w.lines_split), cycles(w.split) / CPU_HZ
    return {"memory": fills(w.lines) + m_split + w.flash_bytes / FLASH_BPS,
            "compute": cycles(w.serial) / CPU_HZ + c_split / CORES,
            "overlap": -fit.overlap * min(m_split, c_split) / CORES,
            "handoffs": w.handoff_s}


def stage_seconds(w: Work, fit: Fit) -> float:
    return sum(stage_breakdown(w, fit).values())


def scale_memory(work: Mapping[str, Work], bulk: float, flash: float) -> dict[str, Work]:
    """Our build with its PSRAM line fills scaled by measured/formula bulk bytes
    and flash bytes by measured/formula flash bytes (1.0 once check_bytes
    passed: the engine's counters drive the prediction)."""
    out = {}
    for st, w in work.items():
        c = dataclasses.replace(w, lines={k: v * bulk for k, v in w.lines.items()},
                                lines_split={k: v * bulk for k, v in w.lines_split.items()},
                                flash_bytes=w.flash_bytes * flash)
        out[st] = c
    return out
