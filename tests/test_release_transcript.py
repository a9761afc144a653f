"""The recorded raw-REPL transcript (tests/data/raw_repl_transcript.json,
made by tests/helpers/record_raw_repl_transcript.py: the Web Serial chat page's
co-writing requests to the board's llm_serve) replayed to the Python side:
mpllm.board.transport.run_port_snippet, i.e. mpremote's SerialTransport, the
transport bench.py uses, and the event parser of the web server's board
backend (mpllm.web.engine_process). tests/test_web_flasher.py replays the
same bytes to the page's raw_repl.js and serve_protocol.js; both must read
the same events from them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import llm_chat
import pytest
from mpllm.web.engine_process import BoardEngine, parse_events

TRANSCRIPT = Path(__file__).resolve().parent / "data" / "raw_repl_transcript.json"


class ReplaySerial:
    """A pyserial port that answers with the recorded board bytes, and checks
    that what is written is exactly the recorded tx."""

    def __init__(self, events: list[dict[str, str]]) -> None:
        self.steps = [(k, v.encode("latin-1")) for e in events for k, v in e.items()]
        self.step = 0
        self.offset = 0
        self.rx = bytearray()
        self.rts = self.dtr = True
        self._release()

    def _release(self) -> None:
        while self.step < len(self.steps) and self.steps[self.step][0] == "rx":
            self.rx += self.steps[self.step][1]
            self.step += 1

    def isOpen(self) -> bool:  # pyserial's name
        return True

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def inWaiting(self) -> int:  # pyserial's name
        return len(self.rx)

    def read(self, n: int = 1) -> bytes:
        if not self.rx:
            raise AssertionError(f"mpremote reads at step {self.step}, but the recording has "
                                 f"nothing for it before its next write")
        out = bytes(self.rx[:n])
        del self.rx[:n]
        return out

    def write(self, data: bytes) -> int:
        for b in data:
            kind, want = self.steps[self.step] if self.step < len(self.steps) else ("end", b"")
            assert kind == "tx" and want[self.offset] == b, \
                f"mpremote wrote {bytes([b])!r} at step {self.step}; the recording has {kind}"
            self.offset += 1
            if self.offset == len(want):
                self.step, self.offset = self.step + 1, 0
                self._release()
        return len(data)

    def finished(self) -> bool:
        return self.step == len(self.steps) and not self.rx


def test_transcript_replays_through_benchs_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    import mpremote.transport_serial as ts
    from mpllm.board import transport

    data = json.loads(TRANSCRIPT.read_text())
    port = ReplaySerial(data["events"])
    monkeypatch.setattr(ts.serial, "serial_for_url", lambda *a, **k: port)
    for session in data["sessions"]:
        chunks: list[bytes] = []
        err = transport.run_port_snippet("/dev/replayed", session["code"],
                                         consumer=chunks.append)
        # mpremote passes the closing \x04 to its consumer too
        assert b"".join(chunks) == session["stdout"].encode() + b"\x04"
        assert err.decode() == session["stderr"]
    assert port.finished()


def _sessions() -> list[dict]:
    return json.loads(TRANSCRIPT.read_text())["sessions"]


def _output(session: dict) -> bytes:
    """A request's output as mpremote's consumer got it (the closing 0x04 too)."""
    return session["stdout"].encode() + b"\x04"


# the figures of a "done" that are times: the recording's engine ran on
# CPython, the board's answers come from MicroPython replaying it
TIMES = {"ttft_ms", "engine_ttft_ms", "engine_ms_per_token", "wall_ms", "stage_ms"}


def _comparable(events: list[dict]) -> list[dict]:
    """Events with the reply's pieces joined and the times left out."""
    out: list[dict] = []
    for e in events:
        if "piece" in e and out and "piece" in out[-1]:
            out[-1] = {"piece": out[-1]["piece"] + e["piece"]}
        elif "done" in e:
            out.append({"done": {k: v for k, v in e["done"].items() if k not in TIMES}})
        else:
            out.append(dict(e))
    return out


def test_transcript_holds_what_the_page_needs() -> None:
    data = json.loads(TRANSCRIPT.read_text())
    sessions = data["sessions"]
    ops = [s["request"]["op"] for s in sessions]
    assert ops == ["open", "turn", "turn", "undo", "turn", "temp", "new"]
    opened = sessions[0]["request"]
    assert opened["max_tokens"] == llm_chat.TURN_TOKENS and opened["seed"] == 7
    assert len({s["request"]["sid"] for s in sessions}) == 1  # one story
    assert all(s["stderr"] == "" for s in sessions)
    assert "caf\u00e9" in sessions[2]["stdout"]
    # longer than MicroPython's raw-paste window: flow control is part of the exchange
    window = next(e["rx"] for e in data["events"] if "rx" in e and e["rx"].startswith("R\x01"))
    assert len(sessions[4]["code"].encode()) > ord(window[2]) + 256 * ord(window[3])
    assert str(TRANSCRIPT.parents[2]) not in json.dumps(data)  # no path of the recording checkout


def test_the_board_answered_what_the_engine_wrote_on_cpython() -> None:
    """engine_process.py's parser reads, from the board's recorded output
    (MicroPython replaying the real engine), the events llm_serve.handle gave
    on CPython for the same requests: the same lines, replies, stops and
    errors; and the same events however the output is cut into reads."""
    for s in _sessions():
        data = _output(s)
        events = parse_events([data])
        assert _comparable(events) == _comparable(s["engine_events"]), s["request"]
        for n in (1, 2, 5):
            cut = parse_events(data[i:i + n] for i in range(0, len(data), n))
            assert _comparable(cut) == _comparable(events), (n, s["request"])
    turns = [_comparable(parse_events([_output(s)])) for s in _sessions()
             if s["request"]["op"] == "turn"]
    assert all(len(t) == 3 and t[1]["piece"] and t[2]["done"]["tokens"] > 0 for t in turns)
    refused = parse_events([_output(_sessions()[5])])
    assert refused == [{"error": "temperature must be >= 0 (0 means greedy), got -1"}]


class RecordedTransport:
    """What BoardEngine uses of mpremote's transport, answering with a
    recorded request's output one byte per read, as mpremote reads it."""

    def __init__(self, output: bytes, stderr: bytes) -> None:
        self.output, self.stderr = output, stderr
        self.code = ""

    def exec_raw_no_follow(self, code: str) -> None:
        self.code = code

    def follow(self, timeout: float, consumer) -> tuple[bytes, bytes]:  # type: ignore[no-untyped-def]
        for b in self.output:
            consumer(bytes([b]))
        return b"", self.stderr


def test_board_engine_reads_the_recorded_output() -> None:
    """BoardEngine (the server's board backend) on the recorded output: it
    emits parse_events' events, and the code it sends carries the same
    request as the page's."""
    for s in _sessions():
        engine = BoardEngine.__new__(BoardEngine)  # no port: the transport is the recording
        engine.port, engine.timeout = "/dev/recorded", 10
        engine.transport = RecordedTransport(_output(s), s["stderr"].encode())
        emitted: list[dict] = []
        engine(s["request"], emitted.append)
        # (its pieces come together at most every 20 ms: compare them joined)
        assert _comparable(emitted) == _comparable(parse_events(bytes([b]) for b in _output(s)))
        for code in (engine.transport.code, s["code"]):
            call = code.rstrip("\n").split("\n")[-1]
            assert call.startswith("llm_serve.run(") and call.endswith(")")
            assert json.loads(ast.literal_eval(call[len("llm_serve.run("):-1])) == s["request"]
    # an answer cut off before its last event: BoardEngine says what the board raised
    engine.transport = RecordedTransport(b"\x1e{\"line\": \"x\"}\n upon\x04",
                                         b"Traceback:\r\nKeyboardInterrupt: \r\n")
    emitted = []
    engine({"op": "turn", "sid": "s", "line": "x"}, emitted.append)
    assert _comparable(emitted) == [{"line": "x"}, {"piece": " upon"},
                                    {"error": "the board raised KeyboardInterrupt:"}]
