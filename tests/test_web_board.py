"""The web chat's board backend (engine_process.BoardEngine): llm_serve on a
board over its raw REPL through mpremote's transport, run for real over a
serial peer (MicroPython unix with the replay double of `_llm`); the request
code, a board's CR LF, a lost board, and stopping a speculation under way."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import engine_ext
import pytest
from mpllm.web.engines import Pool, board_argvs
from mpllm.web.server import Limits
from web_client import Running, connect, follow, reply_text

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "firmware" / "modules"
REPLAY = ROOT / "tests" / "helpers" / "replay"


@pytest.fixture(scope="module", autouse=True)
def _engine_built() -> None:
    """The recordings (replay.record) run this checkout's in-place `_llm`:
    built first, also when this file runs alone."""
    engine_ext.load()


def test_the_board_backend_over_a_serial_peer(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """serve.py --port: the board's own llm_serve over its raw REPL, through
    mpremote's transport, on a real pty (MicroPython unix running llm.py with
    the replay double of `_llm`, replaying what the real engine answered to
    the same requests on CPython). The page's messages carry the text the
    CPython engine wrote, speculation included."""
    from serial_peer import SerialPeer

    lines = ["Once upon a time", "The cat ran"]
    requests = [{"op": "open", "sid": "s1", "seed": 5, "temperature": 0.8, "max_tokens": 12},
                {"op": "turn", "sid": "s1", "line": lines[0]},
                {"op": "speculate", "sid": "s1", "line": lines[1]},
                {"op": "turn", "sid": "s1", "line": lines[1]}]
    from replay.record import record_serve_session

    rec = tmp_path / "recording"
    answers = record_serve_session(tiny_model.image, requests, rec)
    cpython = ["".join(e.get("piece", "") for e in answers[i]) for i in (1, 3)]

    async def session(url: str) -> list[tuple[str, bool]]:
        out = []
        async with connect(url) as (ws, hello):
            assert hello["backend"] == "board" and hello["engines"] == 1
            await ws.send_json({"type": "turn", "text": lines[0]})
            msgs = await follow(ws)
            out.append((reply_text(msgs), msgs[-1]["stats"]["speculated"]))
            await ws.send_json({"type": "typing", "text": lines[1]})
            await asyncio.sleep(1.0)
            await ws.send_json({"type": "turn", "text": lines[1]})
            msgs = await follow(ws)
            out.append((reply_text(msgs), msgs[-1]["stats"]["speculated"]))
        return out

    with SerialPeer([REPLAY, MODULES], env={"MPLLM_REPLAY": str(rec)}) as peer:
        r = Running(Pool(board_argvs(peer.port)), backend="board",
                    limits=Limits(reply_tokens=12))
        try:
            got = asyncio.run(session(r.url))
        finally:
            r.stop()
    assert [t for t, _ in got] == cpython and all(cpython)
    assert [s for _, s in got] == [False, True]

def test_board_request_code_carries_any_line_to_micropython(tmp_path) -> None:
    """The line a board runs for a request parses, on MicroPython, to the very
    request: quotes, backslashes, newlines and characters beyond U+FFFF (which
    ensure_ascii would write as surrogate pairs MicroPython's json does not join)."""
    from mpllm.web.engine_process import request_code
    from serial_peer import find_micropython

    (tmp_path / "llm_serve.py").write_text(
        "import json\ndef run(text):\n    print(json.dumps(json.loads(text)))\n")
    req = {"op": "turn", "sid": "s1", "line": 'The cat \U0001F600 said "hi" \\ \'ok\'\n\tcaf\u00e9 \u2028'}
    script = tmp_path / "main.py"
    script.write_text("import llm_serve\n" + request_code(req), encoding="utf-8")
    r = subprocess.run([find_micropython(), str(script)], capture_output=True, timeout=60,
                       check=False, cwd=tmp_path, env={**os.environ, "MICROPYPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == req

def test_a_board_prints_cr_lf_and_the_reply_is_the_hosts() -> None:
    """A board's stdout writes each newline as CR LF: the events carry the
    host's text (the unix port, which the serial-peer test uses, does not)."""
    from mpllm.web.engine_process import parse_events

    board = b'\x1e{"line": "The end"}\r\n. The end.\r\n\r\nOnce\x1e{"done": {"ok": true}}\r\n\x04'
    events = parse_events(bytes([b]) for b in board)
    assert "".join(e.get("piece", "") for e in events) == ". The end.\n\nOnce"
    assert events[0] == {"line": "The end"} and events[-1] == {"done": {"ok": True}}

class _LostTransport:
    """A board that vanishes mid-reply (pyserial raises an OSError)."""

    def exec_raw_no_follow(self, code: str) -> None:
        pass

    def follow(self, timeout: float, consumer):  # type: ignore[no-untyped-def]
        consumer(b'\x1e{"line": "x"}\n Once')
        raise OSError("device disconnected")

def test_a_lost_board_ends_the_engine_process_to_be_restarted(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The last event says the board is lost, and the process ends (the server
    starts it again, which reconnects), instead of answering errors forever."""
    from mpllm.web import engine_process as ep

    engine = ep.BoardEngine.__new__(ep.BoardEngine)
    engine.port, engine.timeout, engine.transport = "/dev/gone", 5, _LostTransport()
    monkeypatch.setattr(sys, "stdin", iter(['{"op": "turn", "sid": "s", "line": "x"}\n',
                                            '{"op": "turn", "sid": "s", "line": "y"}\n']))
    with pytest.raises(SystemExit) as stop:
        ep.serve(engine)
    assert stop.value.code == 3
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events[:2] == [{"line": "x"}, {"piece": " Once"}]
    assert events[-1]["lost"] is True and "stopped answering" in events[-1]["error"]
    assert len(events) == 3  # the second request was never read

def test_a_request_for_real_stops_the_boards_speculation(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On a board a speculation takes as long as a reply: Enter on another
    line stops it (Ctrl-C over the raw REPL) instead of waiting for it, and
    the turn is still the recorded engine's. The serial peer's double takes
    0.25 s a token here, as a slow engine would."""
    from replay.record import record_serve_session
    from serial_peer import SerialPeer

    lines = ["Once upon a time", "The dog ran"]
    requests = [{"op": "open", "sid": "s1", "seed": 5, "temperature": 0.8, "max_tokens": 12},
                {"op": "turn", "sid": "s1", "line": lines[0]},
                {"op": "speculate", "sid": "s1", "line": "The do"},
                {"op": "turn", "sid": "s1", "line": lines[1]}]
    rec = tmp_path / "recording"
    answers = record_serve_session(tiny_model.image, requests, rec)
    cpython = "".join(e.get("piece", "") for e in answers[3])

    async def session(r: Running) -> tuple:
        engine = r.server.pool.engines[0]
        async with connect(r.url) as (ws, _hello):
            await ws.send_json({"type": "turn", "text": lines[0]})
            await follow(ws)
            await ws.send_json({"type": "typing", "text": "The do"})
            for _ in range(100):  # until the board runs it
                spec = r.on_loop(lambda: engine.running)
                if spec is not None:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            await ws.send_json({"type": "turn", "text": lines[1]})
            msgs = await follow(ws)
        spec_events = []
        while not spec.events.empty():
            e = spec.events.get_nowait()
            if isinstance(e, dict):  # (not the end marker)
                spec_events.append(e)
        return spec, spec_events, msgs

    with SerialPeer([REPLAY, MODULES], env={"MPLLM_REPLAY": str(rec),
                                             "MPLLM_REPLAY_STEP_S": "0.25"}) as peer:
        r = Running(Pool(board_argvs(peer.port), interrupt_speculation=True), backend="board",
                    limits=Limits(reply_tokens=12))
        try:
            spec, spec_events, msgs = asyncio.run(session(r))
        finally:
            r.stop()
    assert spec.speculative and spec.req["line"] == "The do"
    assert not any("done" in e for e in spec_events), spec_events
    assert any("KeyboardInterrupt" in e.get("error", "") for e in spec_events), spec_events
    assert reply_text(msgs) == cpython and msgs[-1]["stats"]["speculated"] is False
