"""The web chat's WebSocket API (tools/serve.py, mpllm.web) against real
host-board engine processes: turns, speculation while typing, limits and bad
input, one request at a time, busy, disconnects, the origin check, the short
load test and the command line. The engines' queue and restarts:
test_web_engines.py; the board backend: test_web_board.py; llm_serve itself:
test_llm_serve.py; the page in a browser: test_web_page.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import llm
import llm_chat
import pytest
from mpllm.web.engines import Pool, host_argvs
from mpllm.web.server import Limits
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
    w = llm_chat.CoWriter(seed=seed, max_tokens=tokens)
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
        assert d["type"] == "done" and s["tokens"] == 12 and s["speculated"] is False
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

def test_bad_input_is_answered_and_the_connection_goes_on(served) -> None:  # type: ignore[no-untyped-def]
    async def session() -> list[str]:
        errors = []
        async with connect(served.url) as (ws, hello):
            limit = hello["limits"]["max_line_chars"]
            for bad in ("not json", "[1, 2]", '{"type": "dance"}', '{"type": "turn"}',
                        json.dumps({"type": "turn", "text": "x" * (limit + 1)}),
                        '{"type": "turn", "text": "   "}',
                        '{"type": "turn", "text": "Once\\u0004 upon"}',
                        '{"type": "seed", "seed": "five"}', '{"type": "temp", "temperature": -1}'):
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
    assert errors[0].startswith("malformed") and errors[1].startswith("malformed")
    assert "unknown message type 'dance'" in errors[2]
    assert "'text' must be a string" in errors[3]
    assert "too long" in errors[4] and "empty line" in errors[5]
    assert "control characters" in errors[6]
    assert "seed" in errors[7] and "temperature" in errors[8]
    assert "JSON text" in errors[9]
    # a malformed seed in the address is refused with the reason
    async def bad_seed() -> dict:
        async with aiohttp.ClientSession() as s, s.ws_connect(f"{served.url}/ws?seed=x") as ws:
            return await ws.receive_json()
    assert "seed" in asyncio.run(bad_seed())["message"]

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
