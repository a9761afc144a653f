"""The web chat's WebSocket API (tools/serve.py, mpllm.web) against real
host-board engine processes: turns, speculation while typing, limits and bad
input (any text at all), one request at a time, busy, disconnects, the origin
check, connections that never finish a request (timed out, bounded, and the
file descriptors used up), the short load test (its levels each on an empty
queue) and the command line. The engines' queue and restarts:
test_web_engines.py; the board backend: test_web_board.py; llm_serve itself:
test_llm_serve.py; the page in a browser: test_web_page.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import llm
import llm_chat
import pytest
from mpllm.web.engines import Pool, host_argvs
from mpllm.web.server import BadMessage, Limits, parse_message
from web_client import Running, connect, follow, reply_text

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "tools" / "serve.py"


@pytest.fixture(scope="module")
def served(tiny_model) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    """Two host-board engines on the tiny model, replies of 12 tokens."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 2)), limits=Limits(reply_tokens=12))
    yield r
    r.stop()

def _alone(image: Path, lines: list[str], seed: int, tokens: int) -> list[str]:
    """What llm_chat.CoWriter writes for these lines in this process (the oracle)."""
    llm.unload()
    llm.load(str(image))
    w = llm_chat.CoWriter(seed=seed, max_tokens=tokens, finish=llm_chat.FINISH_TOKENS)
    return ["".join(llm.shown(p) for p in w.turn(line)) for line in lines]

LINES = ["Once upon a time", "The cat ran to the tree", "It was happy"]

def test_turns_stream_the_cowriters_story(served, tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Each turn streams the line as it joined, the pieces and the figures;
    the text is llm_chat.CoWriter's for the same seed; /undo and the same line
    give the same reply."""
    async def session() -> tuple[list[str], list[dict], dict]:
        async with connect(served.url) as (ws, hello):
            replies, dones = [], []
            for line in LINES:
                await ws.send_json({"type": "turn", "text": line})
                msgs = await follow(ws)
                assert msgs[0]["type"] in ("line", "queued"), msgs
                assert next(m for m in msgs if m["type"] == "line")["text"].strip() == line
                replies.append(reply_text(msgs))
                dones.append(msgs[-1])
            await ws.send_json({"type": "undo"})
            undo = (await follow(ws))[-1]
            await ws.send_json({"type": "turn", "text": LINES[-1]})
            again = reply_text(await follow(ws))
            assert again == replies[-1]
            return replies, dones, {"hello": hello, "undo": undo}

    replies, dones, other = asyncio.run(session())
    assert replies == _alone(tiny_model.image, LINES, 5, 12)
    assert other["hello"]["seed"] == 5 and other["hello"]["engines"] == 2
    assert other["undo"] == {"type": "done", "op": "undo", "stats": {"ok": True}}
    for d in dones:
        s = d["stats"]
        # 12 tokens, and on to a sentence end (the tiny model's text has few)
        assert d["type"] == "done" and 12 <= s["tokens"] <= 12 + llm_chat.FINISH_TOKENS
        assert s["speculated"] is False
        assert s["engine_ms_per_token"] > 0 and set(s["stage_ms"]) == {
            "embed", "attn", "ffn", "ple", "head", "sample"}
        assert sum(s["stage_ms"].values()) > 0
    # the second turn fed only its line: the story stayed in the context
    assert dones[1]["stats"]["prefilled"] < dones[1]["stats"]["prompt_tokens"]

def test_a_reply_written_while_typing_is_the_same_reply(served) -> None:  # type: ignore[no-untyped-def]
    """typing → the engine writes the reply ahead; Enter on exactly that text
    answers with it (speculated), and its text is what a run after Enter
    writes; a line that differs from what was typed is written afresh."""
    async def session(speculate: bool) -> list[tuple[str, bool]]:
        out = []
        async with connect(served.url, "?seed=11") as (ws, _hello):
            for line in LINES:
                if speculate:
                    await ws.send_json({"type": "typing", "text": line[:-2]})  # stale
                    await ws.send_json({"type": "typing", "text": line})
                    await asyncio.sleep(0.3)  # the engine is idle: it writes ahead
                await ws.send_json({"type": "turn", "text": line})
                msgs = await follow(ws)
                out.append((reply_text(msgs), msgs[-1]["stats"]["speculated"]))
            # typed one thing, sent another: written afresh, not the stale one
            await ws.send_json({"type": "typing", "text": "The dog"})
            await asyncio.sleep(0.3)
            await ws.send_json({"type": "turn", "text": "The bird"})
            msgs = await follow(ws)
            out.append((reply_text(msgs), msgs[-1]["stats"]["speculated"]))
        return out

    ahead = asyncio.run(session(True))
    after = asyncio.run(session(False))
    assert [t for t, _ in ahead] == [t for t, _ in after]
    assert [s for _, s in ahead] == [True, True, True, False]
    assert not any(s for _, s in after)

def test_bad_input_is_answered_and_the_connection_goes_on(served, caplog) -> None:  # type: ignore[no-untyped-def]
    """Each malformed message gets an error and the connection goes on; the
    server logs nothing about them (no traceback)."""
    caplog.set_level(logging.WARNING)

    async def session() -> list[str]:
        errors = []
        async with connect(served.url) as (ws, hello):
            limit = hello["limits"]["max_line_chars"]
            for bad in ("not json", "[1, 2]", '{"type": "dance"}', '{"type": "turn"}',
                        json.dumps({"type": "turn", "text": "x" * (limit + 1)}),
                        '{"type": "turn", "text": "   "}',
                        '{"type": "turn", "text": "Once\\u0004 upon"}',
                        '{"type": "seed", "seed": "five"}', '{"type": "temp", "temperature": -1}',
                        # nested deeper than json.loads goes, well under the size limit
                        "[" * 3000, '{"type": "seed", "seed": ' + "[" * 3000 + "}",
                        '{"type": "turn", "text": "half \\ud83d"}',
                        '{"type": "temp", "temperature": NaN}',
                        '{"type": "temp", "temperature": 1e999}',
                        '{"type": "temp", "temperature": 1' + "0" * 400 + "}"):
                await ws.send_str(bad)
                msgs = await follow(ws)
                assert msgs[-1]["type"] == "error", (bad, msgs)
                errors.append(msgs[-1]["message"])
            await ws.send_bytes(b"\x00\x01")
            errors.append((await follow(ws))[-1]["message"])
            # after all that, the connection writes its story
            await ws.send_json({"type": "turn", "text": "Once upon a time"})
            msgs = await follow(ws)
            assert msgs[-1]["type"] == "done" and reply_text(msgs)
        return errors

    errors = asyncio.run(session())
    assert [r.getMessage() for r in caplog.records] == []
    assert errors[0].startswith("malformed") and errors[1].startswith("malformed")
    assert "unknown message type 'dance'" in errors[2]
    assert "'text' must be a string" in errors[3]
    assert "too long" in errors[4] and "empty line" in errors[5]
    assert "control characters" in errors[6]
    assert "seed" in errors[7] and "temperature" in errors[8]
    assert errors[9].startswith("malformed") and errors[10].startswith("malformed")
    assert "half a character" in errors[11]
    assert "NaN is not JSON" in errors[12]
    assert "temperature" in errors[13] and "temperature" in errors[14]
    assert "JSON text" in errors[15]
    # a malformed seed in the address is refused with the reason
    async def bad_seed() -> dict:
        async with aiohttp.ClientSession() as s, s.ws_connect(f"{served.url}/ws?seed=x") as ws:
            return await ws.receive_json()
    assert "seed" in asyncio.run(bad_seed())["message"]

def test_every_allowed_line_fits_in_a_message(served) -> None:  # type: ignore[no-untyped-def]
    """A line of the most characters, each escaped the longest way (a surrogate
    pair as two \\u escapes, 12 bytes a character), spaced out, is a message
    the server reads (answered, not closed with 1009); the limit the page is
    told is the server's."""
    lim = Limits()
    emoji = "\U0001F600" * lim.max_line_chars
    spaced = json.dumps({"type": "typing", "text": emoji}, indent=8, ensure_ascii=True)
    assert len(spaced) > 4096 and spaced.count("\\ud83d\\ude00") == lim.max_line_chars
    assert len(spaced) <= lim.max_message_bytes

    async def session() -> tuple[dict, list[dict], list[dict]]:
        async with connect(served.url) as (ws, hello):
            await ws.send_str(spaced)  # typing: written ahead, no answer
            await ws.send_str(spaced.replace('"typing"', '"turn"'))
            answered = await follow(ws)
            await ws.send_json({"type": "turn", "text": "Once upon a time"})
            return hello, answered, await follow(ws)

    hello, answered, after = asyncio.run(session())
    assert hello["limits"]["max_message_bytes"] == lim.max_message_bytes
    # the tiny model's context cannot hold it: the engine says so
    assert answered[-1]["type"] == "error" and "too long" in answered[-1]["message"]
    assert after[-1]["type"] == "done" and reply_text(after)

def test_a_message_of_exactly_the_limit_is_read(served) -> None:  # type: ignore[no-untyped-def]
    """A message of max_message_bytes (5,056: the documented maximum) is read
    and answered; one byte more closes the connection with 1009 (before, the
    limit itself was closed: aiohttp refuses a message of max_msg_size)."""
    lim = Limits()
    assert lim.max_message_bytes == 5056
    turn = '{"type": "turn", "text": "Once upon a time"}'

    async def send(size: int) -> tuple[list[dict], int | None]:
        async with connect(served.url) as (ws, _):
            await ws.send_str(turn + " " * (size - len(turn)))  # JSON allows the spaces
            try:
                return await follow(ws), None
            except TypeError:  # receive_json of the close
                return [], ws.close_code

    answered, code = asyncio.run(send(lim.max_message_bytes))
    assert code is None and answered[-1]["type"] == "done" and reply_text(answered)
    assert asyncio.run(send(lim.max_message_bytes + 1)) == ([], 1009)


def _messages(rng: random.Random, n: int) -> Iterator[str]:
    """Messages a client could send: valid ones mutated, deep nesting in every
    place a value goes, odd numbers and strings, random text."""
    valid = ['{"type": "turn", "text": "Once upon a time"}', '{"type": "typing", "text": "The"}',
             '{"type": "new"}', '{"type": "undo"}', '{"type": "seed", "seed": 3}',
             '{"type": "temp", "temperature": 0.5}']
    values = ["NaN", "-Infinity", "1e999", "-0", "1" + "0" * 400, "true", "null", '"\\ud800"',
              '"\\u0000"', '"' + "x" * 500 + '"', "{}", "[]", '"turn"']
    for _ in range(n):
        pick = rng.random()
        depth = rng.choice([10, 900, 1000, 2000, 3000])
        if pick < 0.3:
            opener = rng.choice(["[", '{"a":', '{"type":', '{"type":"seed","seed":',
                                 '{"type":"turn","text":', '[{"x":'])
            closer = {"[": "]", "{": "}"}[opener[0]] if opener != '[{"x":' else "}]"
            yield opener * depth + rng.choice(values) + closer * rng.choice([0, depth])
        elif pick < 0.6:
            m = json.loads(rng.choice(valid))
            key = rng.choice(["type", "text", "seed", "temperature", "extra"])
            yield json.dumps(m)[:-1] + f', "{key}": {rng.choice(values)}}}'
        elif pick < 0.8:
            raw = bytearray(rng.choice(valid).encode())
            for _ in range(rng.randint(1, 6)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            yield raw.decode("utf-8", "replace")
        else:
            yield "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randint(0, 60)))

def test_any_message_is_a_request_or_says_what_is_wrong() -> None:
    """parse_message (every message from the page goes through it) answers any
    text with a request or BadMessage, nothing else: no RecursionError from a
    deeply nested message, no OverflowError from a huge number."""
    lim = Limits()
    kinds: dict[str, int] = {}
    for text in _messages(random.Random(24), 3000):
        try:
            req = parse_message(text, lim)
        except BadMessage as e:
            kinds["bad"] = kinds.get("bad", 0) + 1
            assert str(e) and len(str(e)) < 200, text[:80]
        else:
            kinds[req["op"]] = kinds.get(req["op"], 0) + 1
            assert set(req) <= {"op", "line", "seed", "temperature"}
    assert kinds["bad"] > 1000 and len(kinds) > 3, kinds

class HeldPool:
    """A pool whose turns stay in flight until `go` is set (a turn can then
    be caught mid-reply without a race)."""

    engines = ("held",)

    async def start(self) -> None:
        self.go = asyncio.Event()

    async def stop(self) -> None:
        pass

    def new_sid(self) -> str:
        return "s1"

    async def open(self, sid: str, seed: object, temperature: float, max_tokens: int,
                   on_restart: object = None) -> dict:
        return {"done": {"seed": 1, "seq_len": 64}}

    def close(self, sid: str) -> None:
        pass

    async def ask(self, req: dict):  # type: ignore[no-untyped-def]
        yield {"line": req["line"]}
        await self.go.wait()
        yield {"piece": " and so on."}
        yield {"done": {"tokens": 3}}

def test_one_request_at_a_time() -> None:
    """A second request while a turn is in flight is refused with the reason;
    the first one goes on to its end."""
    pool = HeldPool()
    r = Running(pool)  # type: ignore[arg-type]

    async def session() -> list[dict]:
        async with connect(r.url) as (ws, _hello):
            await ws.send_json({"type": "turn", "text": "Once"})
            got = [await ws.receive_json()]  # the line: the turn is in flight
            await ws.send_json({"type": "turn", "text": "Again"})
            await ws.send_json({"type": "undo"})
            got += [await ws.receive_json(), await ws.receive_json()]
            r.loop.call_soon_threadsafe(pool.go.set)
            got += await follow(ws)
            return got

    try:
        got = asyncio.run(session())
    finally:
        r.stop()
    assert [m["type"] for m in got] == ["line", "error", "error", "piece", "done"]
    assert all("one request at a time" in m["message"] for m in got[1:3])
    assert got[-1] == {"type": "done", "op": "turn", "stats": {"tokens": 3}}

def test_rate_limit_and_disconnect_free_the_slot(served) -> None:  # type: ignore[no-untyped-def]
    """Typing messages past the rate limit are refused; a client that leaves
    mid-story frees its connection, its waiting requests and its story."""
    async def flood() -> list[dict]:
        async with connect(served.url) as (ws, _hello):
            for i in range(80):
                await ws.send_json({"type": "typing", "text": f"x{i}"})
            got = []
            with contextlib.suppress(asyncio.TimeoutError):
                while True:
                    got.append(await asyncio.wait_for(ws.receive_json(), 1.0))
            return got

    got = asyncio.run(flood())
    assert got and all(m["type"] == "error" and "slow down" in m["message"] for m in got)

    async def leave_mid_story() -> None:
        async with connect(served.url) as (ws, _hello):
            await ws.send_json({"type": "turn", "text": "Once upon a time"})
            await ws.receive_json()  # the story has begun; leave

    asyncio.run(leave_mid_story())

    async def settled() -> None:
        for _ in range(100):
            if served.on_loop(lambda: (served.server.connections, len(served.server.pool.home))) \
                    == (0, 0):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the connection's slot was not freed")

    asyncio.run(settled())
    assert sum(served.on_loop(lambda: [e.sessions for e in served.server.pool.engines])) == 0

def test_refused_turns_count_against_the_rate_limit(served) -> None:  # type: ignore[no-untyped-def]
    async def flood() -> list[str]:
        async with connect(served.url) as (ws, _hello):
            for _ in range(100):
                await ws.send_json({"type": "turn"})  # no text: refused
            got = []
            with contextlib.suppress(asyncio.TimeoutError):
                while True:
                    got.append((await asyncio.wait_for(ws.receive_json(), 1.0))["message"])
            return got

    got = asyncio.run(flood())
    assert any("slow down" in m for m in got) and len(got) == 100

def test_a_full_queue_answers_busy(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """With room for two waiting requests, the third connection to ask while
    they wait is told the server is busy; the others complete."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 1), max_queue=2),
                limits=Limits(reply_tokens=40))

    async def many() -> list[str]:
        async with contextlib.AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(connect(r.url)) for _ in range(6)]
            for ws, _ in conns:
                await ws.send_json({"type": "turn", "text": "Once upon a time"})
            return [(await follow(ws))[-1]["type"] for ws, _ in conns]

    try:
        kinds = asyncio.run(many())
    finally:
        r.stop()
    assert "busy" in kinds and "done" in kinds, kinds
    assert set(kinds) <= {"busy", "done"}

def test_a_page_of_another_site_cannot_connect(served) -> None:  # type: ignore[no-untyped-def]
    """A browser sends the page's Origin with a WebSocket: the chat's own page
    connects, another site's page is refused (and a client with no Origin,
    such as the load test, connects)."""
    async def attempt(origin: str | None) -> int | str:
        headers = {"Origin": origin} if origin else {}
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"{served.url}/ws", headers=headers) as ws:
                    return (await ws.receive_json())["type"]
            except aiohttp.WSServerHandshakeError as e:
                return e.status

    assert asyncio.run(attempt(served.url)) == "hello"
    assert asyncio.run(attempt(None)) == "hello"
    assert asyncio.run(attempt("http://evil.example")) == 403

def test_short_load_test(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The command's load test: its table, JSON and plot; no errors, no empty
    replies at any level."""
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, str(SERVE), "--board", "host", "--image",
                        str(tiny_model.image), "--engines", "2", "--tokens", "12",
                        "--load-test", "--levels", "1,10,50", "--seconds", "2", "--json",
                        str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    rows = data["levels"]
    assert [row["connections"] for row in rows] == [1, 10, 50]
    for row in rows:
        assert row["errors"] == 0 and row["empty"] == 0, row
        assert row["completed"] >= row["connections"] and row["p95_ms"] >= row["p50_ms"] > 0
    assert "p95 ms" in r.stdout and "50" in r.stdout.splitlines()[-1]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

def test_load_test_json_to_a_device(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--json /dev/null: written in place (devices are), and no plot beside it,
    said in one line (before: refused, as "/dev/null.png" cannot be written)."""
    r = subprocess.run([sys.executable, str(SERVE), "--board", "host", "--image",
                        str(tiny_model.image), "--engines", "1", "--tokens", "4",
                        "--load-test", "--levels", "1", "--seconds", "0.5", "--json",
                        "/dev/null"], capture_output=True, text=True, timeout=300,
                       check=False, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wrote /dev/null" in r.stderr
    assert "(no plot: --json /dev/null is written in place, a device or a pipe" in r.stderr
    assert list(tmp_path.iterdir()) == []  # and no serve-load.png instead


def test_bad_command_lines(tiny_model) -> None:  # type: ignore[no-untyped-def]
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SERVE), *args], capture_output=True,
                              text=True, timeout=60, check=False)

    r = run("--levels", "1,x")
    assert r.returncode == 2 and "--levels" in r.stderr
    r = run("--board", "n16r8")
    assert r.returncode == 2 and "--port" in r.stderr
    r = run("--image", "/nonexistent.img", "--load-test")
    assert r.returncode == 2 and "not found" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "--load-test" in r.stdout and "--typist" in r.stdout


def test_without_aiohttp_the_command_says_what_to_install(tmp_path) -> None:
    """A plain `pip install -e .` has no aiohttp: one line saying what to install."""
    (tmp_path / "aiohttp.py").write_text("raise ImportError('No module named aiohttp')\n")
    r = subprocess.run([sys.executable, str(SERVE), "--board", "host"], capture_output=True,
                       text=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2 and "pip install 'mpllm[board]'" in r.stderr
    assert "Traceback" not in r.stderr

def _closed_by_server(s: socket.socket, within: float) -> bool:
    """True if the server closes this connection within `within` seconds
    (whatever it sent before: a response to a whole request)."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True

def test_unfinished_connections_are_closed(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """A connection that sends nothing, one whose request never ends and an
    idle keep-alive one are closed after pending_timeout_s; a chat WebSocket,
    idle just as long, is not."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 1)),
                limits=Limits(reply_tokens=12, pending_timeout_s=1.0))
    try:
        silent = socket.create_connection(("127.0.0.1", r.port))
        unfinished = socket.create_connection(("127.0.0.1", r.port))
        unfinished.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        kept = socket.create_connection(("127.0.0.1", r.port))
        kept.sendall(b"GET /static/chat.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        kept.settimeout(10)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")

        async def idle_chat() -> list[dict]:
            async with connect(r.url) as (ws, _hello):
                await asyncio.sleep(2.5)
                await ws.send_json({"type": "turn", "text": "Once upon a time"})
                return await follow(ws)

        chat = asyncio.run(idle_chat())
        closed = [_closed_by_server(s, 5) for s in (silent, unfinished, kept)]
        counts = r.on_loop(lambda: (r.server.listener.timed_out, len(r.server.listener.pending)))
    finally:
        r.stop()
    assert closed == [True, True, True]
    assert chat[-1]["type"] == "done" and reply_text(chat)
    assert counts == (3, 0)

def test_at_most_max_pending_unfinished_connections(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """Past max_pending, the oldest unfinished connection makes room for the
    newest; a chat connecting after a crowd of them is served."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 1)),
                limits=Limits(reply_tokens=12, max_pending=8, pending_timeout_s=60))
    crowd = []
    try:
        for _ in range(20):
            crowd.append(socket.create_connection(("127.0.0.1", r.port)))

        async def chat() -> list[dict]:
            async with connect(r.url) as (ws, _hello):
                await ws.send_json({"type": "turn", "text": "Once upon a time"})
                return await follow(ws)

        served = asyncio.run(chat())
        closed = [_closed_by_server(s, 1.0 if i < 12 else 0.2) for i, s in enumerate(crowd)]
        counts = r.on_loop(lambda: (r.server.listener.evicted, len(r.server.listener.pending)))
    finally:
        for s in crowd:
            s.close()
        r.stop()
    assert served[-1]["type"] == "done" and reply_text(served)
    # the chat's own connection pushed out one more of the crowd
    assert closed == [True] * 13 + [False] * 7, closed
    assert counts == (13, 7)

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def _with_file_limit(n: int, script: Path, *args: str) -> list[str]:
    """The command line that runs `script args` with at most n file descriptors
    (sys.path as `python script` has it: its own folder first)."""
    code = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
            f"({n}, {n})); sys.argv = {[str(script), *args]!r}; "
            f"sys.path[0] = {str(script.parent)!r}; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')")
    return [sys.executable, "-c", code]

def test_out_of_descriptors_a_story_is_still_served(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """serve.py with 64 file descriptors (as 4,096 are to 4,200 connections),
    300 half-open connections against it from loopback: the seeded story is
    still served, the same story; the log has a line about it, no traceback."""
    port = _free_port()
    server = subprocess.Popen(
        _with_file_limit(64, SERVE, "--board", "host", "--image", str(tiny_model.image),
                         "--engines", "1", "--tokens", "12", "--http-port", str(port)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    crowd: list[socket.socket] = []
    try:
        assert "the web chat is at" in server.stderr.readline()
        for _ in range(300):
            crowd.append(socket.create_connection(("127.0.0.1", port)))

        async def story() -> list[dict]:
            async with connect(f"http://127.0.0.1:{port}") as (ws, _hello):
                await ws.send_json({"type": "turn", "text": LINES[0]})
                return await follow(ws)

        told = asyncio.run(asyncio.wait_for(story(), 60))
    finally:
        for s in crowd:
            s.close()
        server.send_signal(signal.SIGINT)
        _, log = server.communicate(timeout=60)
    assert server.returncode == 0, log
    assert reply_text(told) == _alone(tiny_model.image, LINES[:1], 5, 12)[0]
    assert "Traceback" not in log and len(log.splitlines()) <= 2, log[:3000]
    assert "out of file descriptors" in log

# the host engine, but a story takes a while to forget: the drops of a load
# test level's stories are still queued when the next level would start
SLOW_DROP_ENGINE = """
import sys, time
sys.path[:0] = [{tools!r}]
from mpllm.web import engine_process as ep
real = ep.host_engine
def slow_drops(image):
    run = real(image)
    def answer(req, emit):
        if req.get("op") == "drop":
            time.sleep({delay})
        run(req, emit)
    return answer
ep.host_engine = slow_drops
sys.exit(ep.main(["--image", {image!r}]))
"""

def test_each_load_test_level_starts_with_an_empty_queue(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Level 3 right after level 3 with room for 3 waiting requests: the first
    level's 3 drops (0.4 s each here) would take the second level's room and
    it would be told "busy"; the load test waits for them, no errors."""
    from mpllm.web import cli
    from mpllm.web.server import ChatServer

    code = SLOW_DROP_ENGINE.format(tools=str(ROOT / "tools"), delay=0.4,
                                   image=str(tiny_model.image))
    server = ChatServer(Pool([[sys.executable, "-c", code]], max_queue=3), "host",
                        Limits(reply_tokens=4, max_queue=3))
    out = tmp_path / "levels.json"
    args = argparse.Namespace(typist=None, load_test=True, levels=[3, 3], seconds=0.3,
                              json=str(out), plot=str(tmp_path / "levels.png"))
    rc = asyncio.run(cli._load_test(server, args))
    rows = json.loads(out.read_text())["levels"]
    assert [(row["errors"], row["error_kinds"]) for row in rows] == [(0, {}), (0, {})], rows
    assert rc == 0 and all(row["completed"] >= 3 for row in rows)
