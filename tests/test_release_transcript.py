"""The recorded raw-REPL transcript (tests/data/raw_repl_transcript.json,
made by tests/record_raw_repl_transcript.py) replayed to the Python side:
mpllm.board.transport.run_port_snippet, i.e. mpremote's SerialTransport, the
transport bench.py uses. tests/test_web_flasher.py replays the same bytes to
the web page's raw_repl.js; both must read the same stories from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_transcript_holds_what_the_page_needs() -> None:
    data = json.loads(TRANSCRIPT.read_text())
    story, refused, accented, long_prompt = data["sessions"]
    assert story["stdout"].startswith(story["prompt"]) and story["stderr"] == ""
    assert refused["stderr"].strip().splitlines()[-1].startswith("ValueError: empty prompt")
    assert "caf\u00e9" in accented["stdout"]
    # longer than MicroPython's raw-paste window: flow control is part of the exchange
    window = next(e["rx"] for e in data["events"] if "rx" in e and e["rx"].startswith("R\x01"))
    assert len(long_prompt["code"].encode()) > ord(window[2]) + 256 * ord(window[3])
    assert str(TRANSCRIPT.parents[2]) not in json.dumps(data)  # no path of the recording checkout
