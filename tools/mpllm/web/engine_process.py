"""One engine behind the web server, as a process of its own.

    python -m mpllm.web.engine_process --image model.img    # the host board
    python -m mpllm.web.engine_process --port /dev/ttyACM0  # a board

It reads requests, one JSON object a line, on stdin and writes their events
(firmware/modules/llm_serve.py says which) one JSON object a line on stdout.
The host board runs llm_serve in this process over the CPython engine; a
board runs its own frozen llm_serve, reached over its raw REPL through
mpremote's transport: each request is one llm_serve.run() call, whose
output streams back as it is printed. Either way the server sees the same
events. A process per engine because the engine and llm.py hold one model
each: several processes are several engines on several cores.
"""

from __future__ import annotations

import argparse
import codecs
import json
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


Emit = Callable[[dict], None]


def host_engine(image: str) -> Callable[[dict, Emit], None]:
    """llm_serve in this process, with `image` loaded."""
    from ..board import hostboard
    from ..checkout import board_module

    hostboard.open_image(image)
    handle = board_module("llm_serve").handle

    def run(req: dict, emit: Emit) -> None:
        for event in handle(req):
            emit(event)

    return run


class EventParser:
    """llm_serve.run()'s output, fed as it arrives, turned into events: text
    is a piece; RS (0x1e), JSON and newline an event. `ended` once the last
    event of the request (a "done" or an "error") came; bytes after it are
    ignored. UTF-8 split across feeds is joined. An event that is not JSON
    raises ValueError. firmware/web/serve_protocol.js is the same parser for
    the Web Serial page; a test holds both to the same events."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.ended = False
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._event = bytearray()
        self._in_event = False

    def feed(self, data: bytes) -> None:
        # mpremote hands over the 0x04 that ends the output too, and a board's
        # stdout writes every newline as CR LF (the unix port's does not);
        # neither a piece (llm.shown) nor JSON holds a raw 0x04 or CR
        data = data.replace(b"\x04", b"").replace(b"\r", b"")
        while data and not self.ended:
            if self._in_event:
                at = data.find(b"\n")
                self._event.extend(data if at < 0 else data[:at])
                if at < 0:
                    return
                parsed = json.loads(self._event.decode())
                self.ended = "piece" not in parsed and "line" not in parsed
                self.emit(parsed)
                self._event.clear()
                self._in_event, data = False, data[at + 1:]
            else:
                at = data.find(b"\x1e")
                text = self._decoder.decode(bytes(data if at < 0 else data[:at]))
                if text:
                    self.emit({"piece": text})
                if at < 0:
                    return
                self._in_event, data = True, data[at + 1:]


def parse_events(chunks: Iterable[bytes]) -> list[dict]:
    """The events in llm_serve.run()'s output, read in these chunks."""
    events: list[dict] = []
    parser = EventParser(events.append)
    for chunk in chunks:
        parser.feed(chunk)
    return events


class BoardLost(RuntimeError):
    """The board stopped answering (unplugged, reset, or silent too long): the
    process ends, and the server starts it again, which reconnects."""


class _Coalesced:
    """Pieces passed on at most every `interval` seconds (mpremote reads a
    board's output a byte at a time: a WebSocket message per byte otherwise);
    any other event passes the pieces before it on at once."""

    def __init__(self, emit: Emit, interval: float = 0.02) -> None:
        self.emit, self.interval = emit, interval
        self.text: list[str] = []
        self.at = time.monotonic()

    def __call__(self, event: dict) -> None:
        if "piece" in event:
            self.text.append(event["piece"])
            if time.monotonic() - self.at < self.interval:
                return
        self.flush()
        if "piece" not in event:
            self.emit(event)

    def flush(self) -> None:
        if self.text:
            self.emit({"piece": "".join(self.text)})
            self.text.clear()
        self.at = time.monotonic()


def request_code(req: dict) -> str:
    """The one line a board runs for a request. A JSON string literal is a
    Python literal too (json.dumps never writes \\/); non-ASCII stays as it is
    (sent as UTF-8), because MicroPython's json does not join the surrogate
    pairs that ensure_ascii would write for a character beyond U+FFFF."""
    return f"llm_serve.run({json.dumps(json.dumps(req, ensure_ascii=False), ensure_ascii=False)})\n"


class BoardEngine:
    """llm_serve on a board, over one raw REPL session held open."""

    def __init__(self, port: str, port_image: str | None = None, timeout: float = 600) -> None:
        from ..board.transport import open_transport

        self.port = port
        self.timeout = timeout
        self.speculating = False  # a speculation's output is being followed
        self.transport = open_transport(port)
        self.transport.enter_raw_repl(soft_reset=False)
        setup = "import llm, llm_serve\n"
        if port_image:  # a runtime with no model partition (the unix port)
            setup += f"llm.load({port_image!r})\n"
        _out, err = self.transport.exec_raw(setup)
        if err:
            raise RuntimeError(f"{port}: the board cannot start llm_serve: "
                               f"{err.decode(errors='replace').strip()}")

    def interrupt_speculation(self) -> None:
        """SIGUSR1 from the server: a request for real waits. Ctrl-C stops the
        board's speculation (llm_serve leaves the story as it was); a request
        for real is never stopped this way."""
        if self.speculating:
            self.speculating = False
            self.transport.serial.write(b"\x03")

    def __call__(self, req: dict, emit: Emit) -> None:
        """One llm_serve.run() on the board, its events emitted as they
        arrive (EventParser reads them)."""
        from mpremote.transport import TransportError

        out = _Coalesced(emit)
        parser = EventParser(out)
        try:
            self.transport.exec_raw_no_follow(request_code(req))
            self.speculating = req.get("op") == "speculate"
            try:
                _out, err = self.transport.follow(self.timeout, parser.feed)
            finally:
                self.speculating = False
        except (TransportError, OSError) as e:  # OSError: pyserial's SerialException
            out.flush()
            raise BoardLost(f"{self.port} stopped answering ({e}); reconnecting") from e
        except ValueError as e:  # an event that is not JSON: the output is garbled
            out.flush()
            raise BoardLost(f"{self.port} sent a garbled answer ({e}); reconnecting") from e
        out.flush()
        if not parser.ended:
            lines = err.decode(errors="replace").strip().splitlines()
            emit({"error": "the board raised " + (lines[-1] if lines else "nothing: its "
                                                   "answer was cut off")})


def serve(run: Callable[[dict, Emit], None]) -> None:
    """Requests from stdin, events to stdout, until stdin closes."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            _emit({"error": "a request is one JSON object a line"})
            continue
        try:
            run(req, _emit)
        except BoardLost as e:
            # the last event, then the end: the server restarts this process
            _emit({"error": str(e), "lost": True})
            raise SystemExit(3) from e
        except Exception as e:  # noqa: BLE001 - any engine failure is reported, not fatal
            _emit({"error": f"the engine raised {type(e).__name__}: {e}"})


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C is the server's to handle: it stops this process by closing its
    # stdin (and starts it in a process group of its own, so the terminal's
    # Ctrl-C never reaches it: mpllm.web.engines)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--image", help="model image for the host board engine")
    where.add_argument("--port", help="serial port of a board running the mpllm firmware")
    ap.add_argument("--port-image", help="with --port: the image a runtime without a model "
                    "partition opens (the MicroPython unix port)")
    args = ap.parse_args(argv)
    try:
        run = host_engine(args.image) if args.image else BoardEngine(args.port,
                                                                     args.port_image)
    except Exception as e:  # noqa: BLE001 - why it cannot start, in one line
        print(f"engine_process: {e}", file=sys.stderr)
        return 1
    # SIGUSR1: the server asks to stop a speculation under way (a board's);
    # a host engine's are short, and nothing else may end the process
    if isinstance(run, BoardEngine):
        signal.signal(signal.SIGUSR1, lambda *_: run.interrupt_speculation())
    else:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _emit({"ready": True})
    serve(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
