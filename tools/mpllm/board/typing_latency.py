"""How long Enter takes in the co-writing chat: the time from Enter to the
first character of the reply, with the line typed at a given speed, with and
without prefill-as-you-type (llm_chat.CoWriter.type_ahead).

    python -m mpllm.board.typing_latency [--image IMG] [--cps 5,10] [--json FILE]
                                         [--s3-report REPORT.json]

The host board is measured for real: llm.chat() runs in a child process on a
pseudo-terminal, the keys are typed into it at the speed asked for, and the
clock runs from the moment Enter is sent to the first byte of the reply. The
ids Enter still has to prefill are counted in process (the same CoWriter,
the same lines); with type-ahead they are the line's last two pre-tokenizer
pieces. For the ESP32-S3, with the cost model's report (`python tools/bench.py
--model-s3 --json REPORT.json`; this command imports no cost model), that
many ids are priced as passes of the layers over up to 8 positions each (the
report's pass_ms_by_m: a pass there also scores a head per position, so the
figure is an upper bound), "S3 modeled".
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..checkout import BOARD_PATHS, add_board_paths

LINES = ("Once upon a time there was a little dog named Max",
         "Max liked to run in the big green park",
         "One day he found a red ball under a tree",
         "He took the ball home to show his friend")
CHAT = ("import sys; sys.path[:0] = {paths!r}; import llm; llm.load({image!r}); "
        "llm.chat(seed=7, max_tokens={max_tokens}, type_ahead={typed}, stories=None)")


def enter_latency_ms(image: str, cps: float | None, typed: bool, max_tokens: int = 20,
                     lines: tuple[str, ...] = LINES) -> list[float]:
    """Enter-to-first-reply-byte times (ms), one per line, of a chat on a pty;
    cps None: each line arrives at once (pasted, faster than any prefill)."""
    m, s = pty.openpty()
    code = CHAT.format(paths=[str(p) for p in BOARD_PATHS], image=image, max_tokens=max_tokens,
                       typed=typed)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=s, stdout=s, stderr=s,
                         close_fds=True)
    os.close(s)
    out = bytearray()

    def read(until: bytes, start: int, timeout: float = 60.0) -> int:
        """Read until `until` is in the output after `start`; the index after it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            at = out.find(until, start)
            if at >= 0:
                return at + len(until)
            if select.select([m], [], [], 0.005)[0]:
                out.extend(os.read(m, 65536))
        raise TimeoutError(f"no {until!r} from the chat; it printed {bytes(out[-300:])!r}")

    times = []
    try:
        seen = read(b"> ", 0)
        for line in lines:
            if cps is None:  # the line and Enter at once: no time to prefill ahead
                sent = time.monotonic()
                os.write(m, line.encode() + b"\r")
            else:
                for c in line:
                    os.write(m, c.encode())
                    time.sleep(1.0 / cps)
                sent = time.monotonic()
                os.write(m, b"\r")
            seen = read(b"\r\n", seen)  # the echo of Enter
            while len(out) == seen:  # the reply's first byte
                if select.select([m], [], [], 0.001)[0]:
                    out.extend(os.read(m, 65536))
            times.append((time.monotonic() - sent) * 1e3)
            seen = read(b"\n> ", seen)
        os.write(m, b"\x04")
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(m)
    return times


def ids_at_enter(image: str, typed: bool, max_tokens: int = 20,
                 lines: tuple[str, ...] = LINES) -> list[int]:
    """The ids Enter prefills for each line (every key typed before it)."""
    add_board_paths()
    import llm
    import llm_chat

    llm.unload()  # a cold context: another run's story would be reused
    llm.load(image)
    w = llm_chat.CoWriter(seed=7, max_tokens=max_tokens)
    out = []
    for line in lines:
        if typed:
            for i in range(1, len(line) + 1):
                w.type_ahead(line[:i])
        "".join(w.turn(line))
        out.append(llm.stats()["prefilled"])
    return out


def s3_pass_ms(report: Path) -> dict[int, float]:
    """Modeled ms of one pass over m positions of the release model on the S3:
    the pass_ms_by_m of the mpllm-spec-sampled build in the cost model's report
    (`bench.py --model-s3 --json`). ValueError when the file holds none."""
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        by_m = data["builds"]["mpllm-spec-sampled"]["pass_ms_by_m"]
        return {int(k): float(v) for k, v in by_m.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{report}: not the cost model's report (bench.py --model-s3 "
                         f"--json) with the speculative builds' passes ({e!r})") from None


def prefill_ms(n: int, pass_ms: dict[int, float]) -> float:
    """A prefill of n ids: passes of up to the cost model's largest m."""
    big = max(pass_ms)
    return (n // big) * pass_ms[big] + (pass_ms[n % big] if n % big else 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", help="a converted model image (default: the demo model)")
    ap.add_argument("--cps", default="5,10", help="typing speeds, characters per second")
    ap.add_argument("--json", type=Path, help="write the figures to this JSON file")
    ap.add_argument("--s3-report", type=Path, metavar="REPORT.json",
                    help="the S3 cost model's report (python tools/bench.py --model-s3 --json "
                         "REPORT.json): price Enter's ids on the S3 (the \"S3 modeled\" column)")
    args = ap.parse_args(argv)
    pass_ms: dict[int, float] = {}
    if args.s3_report is not None:
        try:
            pass_ms = s3_pass_ms(args.s3_report)
        except ValueError as e:
            ap.error(f"--s3-report: {e}")
    image = args.image
    if image is None:
        from .hostboard import demo_sources, ensure_image

        image = str(ensure_image(*demo_sources()))
    speeds: list[float | None] = [float(c) for c in args.cps.split(",")] + [None]
    at_enter = {typed: ids_at_enter(image, typed) for typed in (True, False)}
    if not pass_ms:  # the host figures stand alone
        print("(no S3 figures: give --s3-report REPORT.json, the cost model's "
              "`python tools/bench.py --model-s3 --json REPORT.json`)", file=sys.stderr)
    rows = []
    print(f"{'typing':>10} {'type-ahead':>10} {'Enter->1st char':>16} {'ids at Enter':>13} "
          f"{'S3 modeled':>11}")
    runs = [(cps, typed) for cps in speeds for typed in (True, False)]
    # each run types its lines at the speed asked for (~15 s at 5 keys/s): a bar
    # on stderr, the table's rows above it on stdout
    bar = tqdm(runs, desc="typing sessions", unit="session", file=sys.stderr, leave=False)
    for cps, typed in bar:
        ms = enter_latency_ms(image, cps, typed)
        ids = at_enter[typed if cps is not None else False]
        s3 = statistics.mean(prefill_ms(n, pass_ms) for n in ids) if pass_ms else None
        rows.append({"cps": cps, "type_ahead": typed, "enter_ms_median":
                     statistics.median(ms), "enter_ms": ms, "ids_at_enter": ids,
                     "s3_modeled_ms": s3})
        speed = f"{cps:g}/s" if cps is not None else "pasted"
        s3_text = "-" if s3 is None else f"{s3:.1f} ms"
        tqdm.write(f"{speed:>10} {'on' if typed else 'off':>10} "
                   f"{statistics.median(ms):13.1f} ms {statistics.mean(ids):13.1f} "
                   f"{s3_text:>11}", file=sys.stdout)
    bar.close()
    if args.json:
        args.json.write_text(json.dumps({"image": image, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
