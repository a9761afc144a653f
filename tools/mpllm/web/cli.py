"""`tools/serve.py`, `mpllm-serve`: the web chat, and its load test.

    python tools/serve.py --board host              # http://127.0.0.1:8000/
    python tools/serve.py --port /dev/ttyACM0       # a board over USB serial
    python tools/serve.py --board host --load-test --levels 1,10,100 --seconds 5
    python tools/serve.py --board host --typist 10  # speculation's hit rate
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

DEFAULT_LEVELS = "1,10,100,500,1000"
#: stories a board keeps at once by default (each is ids and text in its RAM)
BOARD_CONNECTIONS = 64


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--levels wants counts like 1,10,100, not {text!r}")
    if not levels or min(levels) < 1 or max(levels) > 2000:
        raise argparse.ArgumentTypeError("--levels: each level is 1..2000 connections")
    return levels


def _parsed(text: str, parse: Callable[[str], T], what: str) -> T:
    """parse(text), or argparse's one-line refusal naming `what` was expected."""
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None


def _count(text: str) -> int:
    """A count of at least 1 (0 or less would mean nothing, or something unsaid)."""
    n = _parsed(text, int, "a whole number")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _tcp_port(text: str) -> int:
    n = _parsed(text, int, "a port number")
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port (0..65535; 0: any free one)")
    return n


def _seconds(text: str) -> float:
    x = _parsed(text, float, "seconds")
    if not (math.isfinite(x) and x > 0):  # nan would never end a level; 0 or less, at once
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return x


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="serve.py", description="The web chat: write a story together with the model "
        "in a browser, on this PC (the host board) or on a board over USB serial.",
        epilog=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", choices=["host", "n16r8"], default=None,
                    help="host: engines on this PC (the default); n16r8: a board (give --port)")
    ap.add_argument("--port", help="the board's serial port (implies --board n16r8)")
    ap.add_argument("--port-image", help="with --port: the image a runtime without a model "
                    "partition opens (the MicroPython unix port)")
    ap.add_argument("--image", help="host board: a converted model image (default: the "
                    "bundled demo model)")
    ap.add_argument("--model", metavar="NAME",
                    help="host board: a model by name instead of --image (as tools/chat.py "
                         "--model takes it: demo, llama2c-demo, release, stories260k, "
                         "stories15m; the last three are downloaded once and verified)")
    ap.add_argument("--engines", type=_count, default=None,
                    help="host board: engine processes, at least 1 (default: one per core)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1, this PC only; 0.0.0.0 "
                         "shares the chat on your network)")
    ap.add_argument("--http-port", type=_tcp_port, default=8000,
                    help="TCP port (default 8000; 0: any free one)")
    ap.add_argument("--tokens", type=_count, default=None,
                    help="story tokens of one reply (default: llm_chat.TURN_TOKENS)")
    ap.add_argument("--max-connections", type=_count, default=None,
                    help="connections at once, each one story (default 2000 on the host "
                         f"board, {BOARD_CONNECTIONS} on a board, whose memory holds the "
                         "stories); more get a 'busy' reply")
    ap.add_argument("--max-queue", type=_count, default=None,
                    help="requests that may wait for an engine (default 2000); more get "
                         "a 'busy' reply")
    test = ap.add_argument_group("load test (loopback only: it starts and stops its own server)")
    test.add_argument("--load-test", action="store_true",
                      help="concurrent WebSocket clients at each level; prints a table")
    test.add_argument("--levels", type=_levels, default=_levels(DEFAULT_LEVELS),
                      help=f"connections at each level (default {DEFAULT_LEVELS}; at most 2000)")
    test.add_argument("--seconds", type=_seconds, default=10.0,
                      help="each level writes turns this long (default 10; every connection "
                           "writes at least one)")
    test.add_argument("--json", help="write the load test's figures to this file")
    test.add_argument("--plot", help="the load test's latency plot (PNG; default: next to "
                      "--json, else serve-load.png)")
    test.add_argument("--typist", type=_count, metavar="LINES",
                      help="a scripted typist writes LINES lines: how often the reply was "
                           "ready at Enter")
    return ap


def _raise_file_limit(want: int) -> None:
    """Each connection is a socket on both ends: lift the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def _pool(args: argparse.Namespace, ap: argparse.ArgumentParser):  # type: ignore[no-untyped-def]
    from ..board import hostboard
    from ..image_cache import check_image_file
    from .engines import Pool, board_argvs, host_argvs
    from .server import Limits

    max_queue = args.max_queue or Limits.max_queue
    if args.port:
        if args.image or args.engines or args.model:
            ap.error("--image, --model and --engines are for the host board; a board runs "
                     "its flashed model, one request at a time")
        return Pool(board_argvs(args.port, args.port_image), max_queue,
                    interrupt_speculation=True), "board"
    if args.board == "n16r8":
        ap.error("--board n16r8 needs --port (the board's serial port)")
    if args.image and args.model:
        ap.error("--model and --image exclude each other (an image is a converted model)")
    if args.image:  # refused here in one line, not by every engine process as it starts
        image = str(check_image_file(args.image))
    elif args.model:
        image = str(hostboard.ensure_image(*hostboard.named_sources(args.model)))
    else:
        image = str(hostboard.ensure_image(*hostboard.demo_sources()))
    n = args.engines or os.cpu_count() or 1
    return Pool(host_argvs(image, n), max_queue), "host"


async def _started(server, host: str, port: int):  # type: ignore[no-untyped-def]
    """server.start(), and when it fails (an engine that cannot start, a port in
    use) the engines that did start are stopped before the error goes up, so
    none outlives the event loop."""
    from .server import start

    try:
        return await start(server, host, port)
    except BaseException:
        await server.pool.stop()
        raise


async def _serve(server, host: str, port: int) -> None:  # type: ignore[no-untyped-def]
    runner, bound = await _started(server, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the line that says Ctrl-C stops it
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    print(f"the web chat is at http://{shown}:{bound}/ ({server.backend}, "
          f"{len(server.pool.engines)} engine(s)); Ctrl-C stops it", file=sys.stderr, flush=True)
    await stop.wait()
    await runner.cleanup()
    print("the web chat stopped", file=sys.stderr, flush=True)


async def _load_test(server, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from ..atomic import atomic_write_bytes
    from . import load_test

    runner, port = await _started(server, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}/ws?seed=1"
    levels = []
    unsettled = False
    try:
        if args.typist:
            r = await load_test.typist(url, args.typist)
            print(f"typist: {r.lines} lines at ~{r.keys_per_s:g} keys/s; the reply was "
                  f"written while typing for {r.speculated} ({r.hit_rate:.0%}); Enter to "
                  f"the first piece: {r.enter_to_first_ms_hit} ms (hit), "
                  f"{r.enter_to_first_ms_miss} ms (miss)")
            if args.json and not args.load_test:
                atomic_write_bytes(args.json, json.dumps({"typist": vars(r)}, indent=1).encode())
        if args.load_test:
            timeout = max(120.0, 10 * args.seconds)
            for n in args.levels:
                # the previous level's last turns and the drops of its stories
                # would otherwise count against --max-queue and this level's latency
                if not await load_test.settle(server.quiet, timeout):
                    print(f"error: the server was still busy {timeout:g} s after the last "
                          f"level; level {n} not run", file=sys.stderr)
                    unsettled = True
                    break
                print(f"level {n}: {n} connections for {args.seconds:g} s ...",
                      file=sys.stderr, flush=True)
                levels.append(await load_test.run_level(url, n, args.seconds, timeout))
            print(load_test.table(levels))
    finally:
        await runner.cleanup()
    if args.load_test:
        doc = {"backend": server.backend, "engines": len(server.pool.engines),
               "seconds": args.seconds, "reply_tokens": server.limits.reply_tokens,
               "levels": [lv.row() for lv in levels]}
        if args.json:
            atomic_write_bytes(args.json, json.dumps(doc, indent=1).encode())
            print(f"wrote {args.json}", file=sys.stderr)
        png = _plot_path(args)
        title = f"web chat load test: {doc['engines']} {server.backend} engine(s)"
        if png is None:
            print(f"(no plot: --json {args.json} is written in place, a device or a pipe, so "
                  "no plot goes beside it; --plot FILE names one)", file=sys.stderr)
        elif load_test.plot(levels, png, title):
            print(f"wrote {png}", file=sys.stderr)
        else:
            print("(no plot: matplotlib is not installed; pip install matplotlib)",
                  file=sys.stderr)
        if unsettled or any(lv.errors or lv.empty for lv in levels):
            return 1
    return 0


def _plot_path(args: argparse.Namespace) -> str | None:
    """Where the load test's plot goes: --plot, else beside --json, else
    serve-load.png; None when --json is written in place (a device such as
    /dev/null, or a pipe): nothing can go beside it."""
    from ..atomic import is_stream

    if args.plot or not args.json:
        return args.plot or "serve-load.png"
    return None if is_stream(args.json) else str(Path(args.json).with_suffix(".png"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    from ..atomic import check_output
    from ..board import hostboard
    from ..image_cache import ImageFileError

    # every output is checked before the engines start: a bad --json fails at once
    outputs = [args.json] if args.json else []
    if args.load_test and _plot_path(args) is not None:
        outputs.append(_plot_path(args))
    try:
        for path in outputs:
            check_output(path)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    try:
        from .engines import EngineFailed
        from .server import ChatServer, Limits
    except ImportError as e:  # aiohttp comes with the board extra
        print(f"error: the web chat needs aiohttp ({e}): pip install 'mpllm[board]'",
              file=sys.stderr)
        return 2

    try:
        pool, backend = _pool(args, ap)
    except (hostboard.HostBoardError, ImageFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    given = {"reply_tokens": args.tokens, "max_queue": args.max_queue,
             "max_connections": args.max_connections}
    if backend == "board" and args.max_connections is None:
        given["max_connections"] = BOARD_CONNECTIONS
    limits = Limits(**{k: v for k, v in given.items() if v is not None})
    testing = args.load_test or args.typist
    _raise_file_limit(2 * max(args.levels) + 256 if args.load_test else 4096)
    server = ChatServer(pool, backend, limits)
    try:
        if testing:
            return asyncio.run(_load_test(server, args))
        asyncio.run(_serve(server, args.host, args.http_port))
    except (OSError, EngineFailed) as e:  # a port in use; an engine that cannot start
        print(f"error: {e.strerror if isinstance(e, OSError) and e.strerror else e}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
