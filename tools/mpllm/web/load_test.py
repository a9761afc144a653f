"""Load and typing tests of the web chat, as WebSocket clients on loopback.

load_test(): at each level, that many connections at once (a level starts
when the previous one's requests are all done: settle()); each writes
turns until the level's seconds are up (every connection at least one),
and the table says how many turns completed, how many failed (an error or
busy reply, a dropped connection, no answer in time), how many replies were
empty, the latency from sending a line to the reply's end (p50, p95) and the
engines' speed.

typist(): one scripted typist writes lines the way the page sends them
(a "typing" message after each pause in typing, then Enter): how often the
reply was written while the line was typed, and Enter to the first piece.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import aiohttp

LINES = ("Once upon a time there was a little cat", "One day a boy found a red ball",
         "The sun was warm and the birds sang", "Lily wanted to play in the park",
         "A big dog ran to the tree", "Tom and Sue made a cake",
         "The little fish swam far away", "It was a cold night in the forest")
#: the page's pause in typing before it sends the line so far (static/chat.js)
TYPING_PAUSE_S = 0.3


@dataclass
class Level:
    connections: int
    completed: int = 0
    errors: int = 0
    empty: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    engine_tok_s: float | None = None  # the engines' own speed, mean over turns
    seconds: float = 0.0  # the level's wall time, start to last answer
    error_kinds: dict[str, int] = field(default_factory=dict)

    def row(self) -> dict:
        d = asdict(self)
        d.pop("error_kinds")
        d["error_kinds"] = dict(self.error_kinds)
        return d


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    s = sorted(values)
    at = (len(s) - 1) * q
    lo = int(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


class _Turns:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.speeds: list[float] = []
        self.errors: dict[str, int] = {}
        self.empty = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def _turn(ws: aiohttp.ClientWebSocketResponse, line: str, timeout: float) -> tuple:
    """Send a line; (latency ms, reply text, stats) or raise with what went wrong."""
    t0 = time.perf_counter()
    await ws.send_json({"type": "turn", "text": line})
    text = []

    async def follow() -> dict:
        while True:
            msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError("closed")
            m = msg.json()
            if m["type"] == "piece":
                text.append(m["text"])
            elif m["type"] == "done":
                return m["stats"]
            elif m["type"] in ("error", "busy"):
                raise RuntimeError(m["type"])

    stats = await asyncio.wait_for(follow(), timeout)
    return (time.perf_counter() - t0) * 1000, "".join(text), stats


async def _client(session: aiohttp.ClientSession, url: str, index: int, deadline: float,
                  timeout: float, out: _Turns) -> None:
    try:
        async with session.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
            hello = await asyncio.wait_for(ws.receive_json(), timeout)
            if hello.get("type") != "hello":
                out.error(hello.get("type", "no hello"))
                return
            k = index
            while True:
                try:
                    ms, text, stats = await _turn(ws, LINES[k % len(LINES)], timeout)
                except RuntimeError as e:
                    out.error(str(e))
                    return
                k += 1
                out.latencies.append(ms)
                if not text or not stats.get("tokens"):
                    out.empty += 1
                if stats.get("engine_ms_per_token"):
                    out.speeds.append(1000 / stats["engine_ms_per_token"])
                if time.monotonic() >= deadline:
                    return
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        out.error(type(e).__name__)
    except asyncio.TimeoutError:
        out.error("timeout")


async def run_level(url: str, connections: int, seconds: float, timeout: float) -> Level:
    out = _Turns()
    start = time.monotonic()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(_client(session, url, i, start + seconds, timeout, out)
                               for i in range(connections)))
    lv = Level(connections, completed=len(out.latencies), empty=out.empty,
               errors=sum(out.errors.values()), error_kinds=out.errors,
               seconds=round(time.monotonic() - start, 2))
    if out.latencies:
        lv.p50_ms = round(percentile(out.latencies, 0.5), 1)
        lv.p95_ms = round(percentile(out.latencies, 0.95), 1)
    if out.speeds:
        lv.engine_tok_s = round(statistics.fmean(out.speeds), 1)
    return lv


async def settle(quiet: Callable[[], bool], timeout: float) -> bool:
    """Wait until quiet() (the server has no connection left and its engines
    nothing to do: a level's last turns and the drops of its stories are
    done), so that the next level starts with an empty queue; False if it
    did not come within timeout seconds."""
    end = time.monotonic() + timeout
    while not quiet():
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(0.02)
    return True


def table(levels: Sequence[Level]) -> str:
    head = (f"{'connections':>11} {'completed':>9} {'errors':>6} {'empty':>5} "
            f"{'p50 ms':>9} {'p95 ms':>9} {'engine tok/s':>12} {'wall s':>7}")
    rows = [head]
    for lv in levels:
        def num(v: float | None, w: int) -> str:
            return f"{'-':>{w}}" if v is None else f"{v:>{w}.1f}"
        rows.append(f"{lv.connections:>11} {lv.completed:>9} {lv.errors:>6} {lv.empty:>5} "
                    f"{num(lv.p50_ms, 9)} {num(lv.p95_ms, 9)} {num(lv.engine_tok_s, 12)} "
                    f"{lv.seconds:>7.1f}")
    return "\n".join(rows)


def plot(levels: Sequence[Level], path: str, title: str) -> bool:
    """Latency against connections as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from ..atomic import atomic_path

    xs = [lv.connections for lv in levels]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in (("p50_ms", "p50"), ("p95_ms", "p95")):
        ax.plot(xs, [getattr(lv, key) for lv in levels], marker="o", label=f"{label} latency")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent connections")
    ax.set_ylabel("line sent to reply's end (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    for lv in levels:
        ax.annotate(f"{lv.completed} done, {lv.errors} err", (lv.connections, lv.p95_ms or 1),
                    textcoords="offset points", xytext=(4, 6), fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return True


@dataclass
class TypistResult:
    lines: int
    speculated: int
    hit_rate: float
    enter_to_first_ms_hit: float | None
    enter_to_first_ms_miss: float | None
    keys_per_s: float


async def typist(url: str, n_lines: int, seed: int = 1, keys_per_s: float = 6.0,
                 timeout: float = 60) -> TypistResult:
    """A scripted typist: keys at about keys_per_s, a longer pause after some
    words (thinking), then Enter after a pause of 0.1 to 1.2 s. Like the page,
    it sends the line so far after every pause of TYPING_PAUSE_S."""
    rng = random.Random(seed)
    hits: list[float] = []
    misses: list[float] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        hello = await ws.receive_json()
        if hello.get("type") != "hello":
            raise RuntimeError(f"the server said {hello}")
        for k in range(n_lines):
            line = LINES[k % len(LINES)]
            typed = ""
            for i, ch in enumerate(line):
                typed += ch
                gap = rng.expovariate(keys_per_s)
                if ch == " " and rng.random() < 0.25:
                    gap += rng.uniform(0.3, 0.9)  # a word to think about
                if i == len(line) - 1:
                    gap = rng.uniform(0.1, 1.2)  # before Enter
                if gap >= TYPING_PAUSE_S:
                    await asyncio.sleep(TYPING_PAUSE_S)
                    await ws.send_json({"type": "typing", "text": typed})
                    await asyncio.sleep(gap - TYPING_PAUSE_S)
                else:
                    await asyncio.sleep(gap)
            t0 = time.perf_counter()
            await ws.send_json({"type": "turn", "text": line})
            first = None
            while True:
                m = await asyncio.wait_for(ws.receive_json(), timeout)
                if m["type"] == "piece" and first is None:
                    first = (time.perf_counter() - t0) * 1000
                elif m["type"] == "done":
                    (hits if m["stats"]["speculated"] else misses).append(first or 0.0)
                    break
                elif m["type"] in ("error", "busy"):
                    raise RuntimeError(m["message"])
    med = (lambda v: round(statistics.median(v), 2) if v else None)
    return TypistResult(n_lines, len(hits), len(hits) / n_lines, med(hits), med(misses),
                        keys_per_s)
