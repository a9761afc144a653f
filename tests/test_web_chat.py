"""The web chat (tools/serve.py, mpllm.web): the WebSocket API against real
host-board engines, its limits and bad input, speculation while typing, the
short load test, and the board backend over a serial peer (MicroPython unix
with the replay double). The page itself in a real browser:
tests/test_web_page.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import llm
import llm_chat
import pytest
import test_micropython_binding
from mpllm.web.engines import Pool, board_argvs, host_argvs
from mpllm.web.server import ChatServer, Limits, start

ROOT = Path(__file__).resolve().parent.parent
# the fixture: the unix port built with the real binding (under MICROPY_DIR)
micropython = test_micropython_binding.micropython
MODULES = ROOT / "firmware" / "modules"
REPLAY = ROOT / "tests" / "replay"
SERVE = ROOT / "tools" / "serve.py"


class Running:
    """A ChatServer on loopback, in a thread with its own event loop."""

    def __init__(self, pool: Pool, backend: str = "host", limits: Limits | None = None) -> None:
        self.server = ChatServer(pool, backend, limits)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.runner, self.port = self.loop.run_until_complete(
                start(self.server, "127.0.0.1", 0))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(120), "the server did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    def on_loop(self, fn):  # type: ignore[no-untyped-def]
        """fn() run on the server's loop (to read its state safely)."""
        async def call():  # type: ignore[no-untyped-def]
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(30)


@pytest.fixture(scope="module")
def served(tiny_model) -> Iterator[Running]:  # type: ignore[no-untyped-def]
    """Two host-board engines on the tiny model, replies of 12 tokens."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 2)), limits=Limits(reply_tokens=12))
    yield r
    r.stop()


async def _follow(ws: aiohttp.ClientWebSocketResponse) -> list[dict]:
    """Messages up to and with the request's last (done, error or busy)."""
    out = []
    while True:
        m = await asyncio.wait_for(ws.receive_json(), 60)
        out.append(m)
        if m["type"] in ("done", "error", "busy"):
            return out


def _reply(msgs: list[dict]) -> str:
    return "".join(m["text"] for m in msgs if m["type"] == "piece")


@contextlib.asynccontextmanager
async def _connect(url: str, query: str = "?seed=5"):  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as session, \
            session.ws_connect(f"{url}/ws{query}") as ws:
        hello = await asyncio.wait_for(ws.receive_json(), 60)
        assert hello["type"] == "hello", hello
        yield ws, hello


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
        async with _connect(served.url) as (ws, hello):
            replies, dones = [], []
            for line in LINES:
                await ws.send_json({"type": "turn", "text": line})
                msgs = await _follow(ws)
                assert msgs[0]["type"] in ("line", "queued"), msgs
                assert next(m for m in msgs if m["type"] == "line")["text"].strip() == line
                replies.append(_reply(msgs))
                dones.append(msgs[-1])
            await ws.send_json({"type": "undo"})
            undo = (await _follow(ws))[-1]
            await ws.send_json({"type": "turn", "text": LINES[-1]})
            again = _reply(await _follow(ws))
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
        async with _connect(served.url, "?seed=11") as (ws, _hello):
            for line in LINES:
                if speculate:
                    await ws.send_json({"type": "typing", "text": line[:-2]})  # stale
                    await ws.send_json({"type": "typing", "text": line})
                    await asyncio.sleep(0.3)  # the engine is idle: it writes ahead
                await ws.send_json({"type": "turn", "text": line})
                msgs = await _follow(ws)
                out.append((_reply(msgs), msgs[-1]["stats"]["speculated"]))
            # typed one thing, sent another: written afresh, not the stale one
            await ws.send_json({"type": "typing", "text": "The dog"})
            await asyncio.sleep(0.3)
            await ws.send_json({"type": "turn", "text": "The bird"})
            msgs = await _follow(ws)
            out.append((_reply(msgs), msgs[-1]["stats"]["speculated"]))
        return out

    ahead = asyncio.run(session(True))
    after = asyncio.run(session(False))
    assert [t for t, _ in ahead] == [t for t, _ in after]
    assert [s for _, s in ahead] == [True, True, True, False]
    assert not any(s for _, s in after)


def test_bad_input_is_answered_and_the_connection_goes_on(served) -> None:  # type: ignore[no-untyped-def]
    async def session() -> list[str]:
        errors = []
        async with _connect(served.url) as (ws, hello):
            limit = hello["limits"]["max_line_chars"]
            for bad in ("not json", "[1, 2]", '{"type": "dance"}', '{"type": "turn"}',
                        json.dumps({"type": "turn", "text": "x" * (limit + 1)}),
                        '{"type": "turn", "text": "   "}',
                        '{"type": "turn", "text": "Once\\u0004 upon"}',
                        '{"type": "seed", "seed": "five"}', '{"type": "temp", "temperature": -1}'):
                await ws.send_str(bad)
                msgs = await _follow(ws)
                assert msgs[-1]["type"] == "error", (bad, msgs)
                errors.append(msgs[-1]["message"])
            await ws.send_bytes(b"\x00\x01")
            errors.append((await _follow(ws))[-1]["message"])
            # after all that, the connection writes its story
            await ws.send_json({"type": "turn", "text": "Once upon a time"})
            msgs = await _follow(ws)
            assert msgs[-1]["type"] == "done" and _reply(msgs)
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
        async with _connect(r.url) as (ws, _hello):
            await ws.send_json({"type": "turn", "text": "Once"})
            got = [await ws.receive_json()]  # the line: the turn is in flight
            await ws.send_json({"type": "turn", "text": "Again"})
            await ws.send_json({"type": "undo"})
            got += [await ws.receive_json(), await ws.receive_json()]
            r.loop.call_soon_threadsafe(pool.go.set)
            got += await _follow(ws)
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
        async with _connect(served.url) as (ws, _hello):
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
        async with _connect(served.url) as (ws, _hello):
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


def test_a_full_queue_answers_busy(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """With room for two waiting requests, the third connection to ask while
    they wait is told the server is busy; the others complete."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 1), max_queue=2),
                limits=Limits(reply_tokens=40))

    async def many() -> list[str]:
        async with contextlib.AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(_connect(r.url)) for _ in range(6)]
            for ws, _ in conns:
                await ws.send_json({"type": "turn", "text": "Once upon a time"})
            return [(await _follow(ws))[-1]["type"] for ws, _ in conns]

    try:
        kinds = asyncio.run(many())
    finally:
        r.stop()
    assert "busy" in kinds and "done" in kinds, kinds
    assert set(kinds) <= {"busy", "done"}


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
        async with _connect(url) as (ws, hello):
            assert hello["backend"] == "board" and hello["engines"] == 1
            await ws.send_json({"type": "turn", "text": lines[0]})
            msgs = await _follow(ws)
            out.append((_reply(msgs), msgs[-1]["stats"]["speculated"]))
            await ws.send_json({"type": "typing", "text": lines[1]})
            await asyncio.sleep(1.0)
            await ws.send_json({"type": "turn", "text": lines[1]})
            msgs = await _follow(ws)
            out.append((_reply(msgs), msgs[-1]["stats"]["speculated"]))
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


SERVE_SESSION = """
import llm, llm_serve
llm.load({image!r})
for req in {requests!r}:
    out = []
    for e in llm_serve.handle(req):
        if "piece" in e:
            out.append(e["piece"])
        elif "line" in e:
            out.append("[" + e["line"] + "]")
        elif "error" in e:
            out.append("ERROR " + e["error"])
        else:
            d = e["done"]
            out.append(" |" + " ".join(str(d.get(k)) for k in ("speculated", "tokens", "ok")))
    print("".join(out))
"""


def test_llm_serve_on_the_real_micropython_binding(micropython, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two stories on one model, a speculation taken and one left stale, an
    undo, a bad line: MicroPython unix with the real binding prints what
    CPython prints (under MICROPY_DIR)."""
    image = str(hostboard_image())
    requests = [{"op": "open", "sid": "a", "seed": 5, "temperature": 0.8, "max_tokens": 40},
                {"op": "open", "sid": "b", "seed": 6, "temperature": 0.8, "max_tokens": 40},
                {"op": "turn", "sid": "a", "line": "Once upon a time"},
                {"op": "speculate", "sid": "b", "line": "A dog ran"},
                {"op": "speculate", "sid": "a", "line": "The cat"},
                {"op": "turn", "sid": "a", "line": "The cat was sad"},
                {"op": "turn", "sid": "b", "line": "A dog ran"},
                {"op": "undo", "sid": "a"},
                {"op": "turn", "sid": "a", "line": "The cat was sad"},
                {"op": "turn", "sid": "a", "line": "  "}]
    code = SERVE_SESSION.format(image=image, requests=requests)
    out = test_micropython_binding._run_mp(micropython, code, tmp_path)
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(MODULES)}, timeout=300,
                          check=False)
    assert host.returncode == 0, host.stderr
    assert out == host.stdout
    rows = out.splitlines()
    assert rows[6].endswith("True 40 None") or " |True " in rows[6]  # b's speculation taken
    assert " |False " in rows[5]  # a's was for another line: written afresh
    assert rows[5] == rows[8] and rows[-1].startswith("ERROR")


def hostboard_image() -> Path:
    from mpllm.board import hostboard

    return hostboard.ensure_image(*hostboard.demo_sources())


STORY_LINES = ["Once upon a time", "The cat ran to the tree", "It was happy", "A dog sat",
               "They played all day in the big green park", "The end", "Mia smiled",
               "One day the sun came out and the birds sang a song"]


def _random_session(rng, n_ops: int) -> list[dict]:
    """Requests of three stories on one model, in a random interleaving: turns,
    speculations (for the next line, for another, for a prefix), undo, new,
    a new seed."""
    import llm_serve  # noqa: F401 - the module the requests are for

    reqs = [{"op": "open", "sid": s, "seed": 10 + i, "temperature": 0.8, "max_tokens": 12}
            for i, s in enumerate("abc")]
    for _ in range(n_ops):
        sid = rng.choice("abc")
        line = rng.choice(STORY_LINES)
        kind = rng.random()
        if kind < 0.45:
            if rng.random() < 0.5:  # typed ahead: the line, a prefix of it, or another
                typed = rng.choice([line, line[:max(1, len(line) // 2)], rng.choice(STORY_LINES)])
                reqs.append({"op": "speculate", "sid": sid, "line": typed})
                if rng.random() < 0.4:  # someone else writes in between
                    other = rng.choice([s for s in "abc" if s != sid])
                    reqs.append({"op": "turn", "sid": other, "line": rng.choice(STORY_LINES)})
            reqs.append({"op": "turn", "sid": sid, "line": line})
        elif kind < 0.65:
            reqs.append({"op": "speculate", "sid": sid, "line": line})
        elif kind < 0.8:
            reqs.append({"op": "undo", "sid": sid})
        elif kind < 0.9:
            reqs.append({"op": "new", "sid": sid})
        else:
            reqs.append({"op": "seed", "sid": sid, "seed": rng.randrange(1, 1000)})
    return reqs


def _replies(reqs: list[dict]) -> dict[str, list[str]]:
    """Each story's turns, as (line, reply) text, from llm_serve on the open model."""
    import llm_serve

    out: dict[str, list[str]] = {}
    for req in reqs:
        events = list(llm_serve.handle(req))
        assert "error" not in events[-1], (req, events[-1])
        if req["op"] == "turn":
            text = "".join(e.get("line", "") + e.get("piece", "") for e in events)
            out.setdefault(req["sid"], []).append(text)
    for sid in {r["sid"] for r in reqs}:
        list(llm_serve.handle({"op": "drop", "sid": sid}))
    return out


@pytest.mark.parametrize("model_name", ["tiny", "small"])
def test_shared_model_and_speculation_never_change_a_story(model_name, test_model) -> None:  # type: ignore[no-untyped-def]
    """Many random interleavings of three stories on one model, with
    speculations taken, stale and overtaken, undo, new and rollover: each
    story's text equals that story written alone, without speculation, in
    plain mode (every engine speed-up off) on a model opened afresh."""
    import random

    image = str(test_model(model_name).image)
    n_sessions = 12 if model_name == "tiny" else 4
    compared = taken = 0
    for seed in range(n_sessions):
        reqs = _random_session(random.Random(seed), 40)
        llm.unload()
        llm.load(image)
        shared = _replies(reqs)
        for sid in "abc":
            alone = [r for r in reqs if r["sid"] == sid and r["op"] != "speculate"]
            llm.unload()
            llm.load(image, plain=True)
            assert _replies(alone).get(sid, []) == shared.get(sid, []), (seed, sid)
            compared += len(shared.get(sid, []))
        taken += sum(1 for r in reqs if r["op"] == "speculate")
    llm.unload()
    assert compared > 50 * n_sessions // 4 and taken > 0


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


# ---- what a cold review found: each one held here ------------------------------------


class _FailingStep:
    """The real model, but the n-th step() (or verify) raises as an engine
    error would (a MemoryError on the board, say)."""

    def __init__(self, real: object, after: int) -> None:
        self._real, self._left = real, after

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def _count(self) -> None:
        self._left -= 1
        if self._left == 0:
            raise RuntimeError("engine failure")

    def step(self, token: int) -> int:
        self._count()
        return self._real.step(token)  # type: ignore[attr-defined]

    def verify(self, tokens: list[int]) -> list[int]:
        self._count()
        return self._real.verify(tokens)  # type: ignore[attr-defined]


@pytest.mark.parametrize("op", ["speculate", "turn"])
def test_an_engine_error_mid_reply_leaves_the_story_as_it_was(op, tiny_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A speculation or a turn cut by an engine error takes its line back:
    the story and its next turns are as if it never was."""
    import llm_serve

    image = str(tiny_model.image)

    def session(fail: bool) -> tuple[str, str]:
        llm.unload()
        llm.load(image)
        if fail:
            monkeypatch.setattr(llm, "_model", _FailingStep(llm.load(), 3))
        list(llm_serve.handle({"op": "open", "sid": "x", "seed": 4, "temperature": 0.8,
                               "max_tokens": 10}))
        if fail:
            with pytest.raises(RuntimeError, match="engine failure"):
                list(llm_serve.handle({"op": op, "sid": "x", "line": "The dog ran"}))
            monkeypatch.setattr(llm, "_model", llm._model._real)
        events = list(llm_serve.handle({"op": "turn", "sid": "x", "line": "Once upon a time"}))
        story = llm_serve._stories["x"].writer.text
        list(llm_serve.handle({"op": "drop", "sid": "x"}))
        return "".join(e.get("piece", "") for e in events), story

    assert session(True) == session(False)
    llm.unload()


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


def test_positions_stale_speculations_and_what_they_cost() -> None:
    """1 is next (the running request is not counted); a request sent to an idle
    engine hears of no queue; a turn withdraws its connection's unstarted
    speculation; a long queue costs about ten messages a step, not n."""
    async def scenario() -> tuple:
        pool = Pool([["unused"]])
        engine = pool.engines[0]
        for sid in ("a", "b", "c"):
            pool.home[sid] = engine
        first = pool.submit({"op": "turn", "sid": "a", "line": "x"})
        told_first = first.events.qsize()
        engine.running = engine.waiting.popleft()  # the engine takes it
        spec = pool.submit({"op": "speculate", "sid": "b", "line": "The do"}, speculative=True)
        b = pool.submit({"op": "turn", "sid": "b", "line": "The dog"})
        c = pool.submit({"op": "turn", "sid": "c", "line": "y"})
        positions = [b.events.get_nowait(), c.events.get_nowait()]
        withdrawn = engine.speculations == {} and spec.events.qsize() == 1
        # 500 waiting, the engine works through them
        for i in range(500):
            pool.home[f"q{i}"] = engine
        many = [pool.submit({"op": "turn", "sid": f"q{i}", "line": "z"}) for i in range(500)]
        before = sum(j.events.qsize() for j in many)
        while engine.waiting:
            engine.running = engine.waiting.popleft()
            engine.positions()
        after = sum(j.events.qsize() for j in many) - before
        return told_first, positions, withdrawn, after, many[-1].events

    told_first, positions, withdrawn, after, last = asyncio.run(scenario())
    assert told_first == 0
    assert positions == [{"queued": 1}, {"queued": 2}]
    assert withdrawn
    assert after < 500 * 12  # not 500 * 500 / 2
    seen = []
    while not last.empty():
        seen.append(last.get_nowait()["queued"])
    assert seen[0] == 502 and seen[-1] == 1 and seen == sorted(seen, reverse=True)


def test_refused_turns_count_against_the_rate_limit(served) -> None:  # type: ignore[no-untyped-def]
    async def flood() -> list[str]:
        async with _connect(served.url) as (ws, _hello):
            for _ in range(100):
                await ws.send_json({"type": "turn"})  # no text: refused
            got = []
            with contextlib.suppress(asyncio.TimeoutError):
                while True:
                    got.append((await asyncio.wait_for(ws.receive_json(), 1.0))["message"])
            return got

    got = asyncio.run(flood())
    assert any("slow down" in m for m in got) and len(got) == 100


async def _turn_and_notice(ws: aiohttp.ClientWebSocketResponse) -> list[dict]:
    """Messages until both the turn's last one and the restart notice came."""
    got: list[dict] = []
    while not (any(m["type"] == "restarted" for m in got)
               and any(m["type"] in ("done", "error") for m in got)):
        got.append(await asyncio.wait_for(ws.receive_json(), 30))
    return got


def test_a_restarted_engine_reopens_its_stories_first(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """The engine process dies: the request that met it fails, every story on
    it is opened again with its seed before anything else (a request already
    waiting does not meet "no story"), each connection is told, and the next
    turn is the story's first turn again."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 1)), limits=Limits(reply_tokens=12))
    engine = r.server.pool.engines[0]

    async def session() -> tuple:
        async with _connect(r.url, "?seed=5") as (a, _), _connect(r.url, "?seed=6") as (b, _):
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            first_a = _reply(await _follow(a))
            r.on_loop(lambda: engine.proc.kill())
            await asyncio.sleep(0.2)
            await a.send_json({"type": "turn", "text": "The cat"})
            await b.send_json({"type": "turn", "text": "A dog"})
            got_a, got_b = await _turn_and_notice(a), await _turn_and_notice(b)
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            again_a = _reply(await _follow(a))
            return first_a, got_a, got_b, again_a

    try:
        first_a, got_a, got_b, again_a = asyncio.run(session())
    finally:
        r.stop()
    ends = [[m["type"] for m in got if m["type"] in ("done", "error")] for got in (got_a, got_b)]
    assert sorted(ends) == [["done"], ["error"]], (got_a, got_b)  # the one that met the crash
    assert all("no story" not in m.get("message", "") for m in got_a + got_b)
    assert again_a == first_a  # seed 5 kept; the story started over


def test_an_engine_that_cannot_restart_is_retried_and_comes_back(tiny_model) -> None:  # type: ignore[no-untyped-def]
    """While the engine cannot start, what waits for it is answered with an
    error (not left hanging); once it starts again, its stories are back."""
    r = Running(Pool(host_argvs(str(tiny_model.image), 1)), limits=Limits(reply_tokens=12))
    engine = r.server.pool.engines[0]
    good = engine.argv

    async def session() -> tuple:
        async with _connect(r.url, "?seed=5") as (a, _):
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            first = _reply(await _follow(a))

            def break_it() -> None:
                engine.argv = [sys.executable, "-c", "raise SystemExit(1)"]
                engine.proc.kill()
            r.on_loop(break_it)
            await asyncio.sleep(0.2)
            await a.send_json({"type": "turn", "text": "The cat"})
            crashed = await _follow(a)
            await a.send_json({"type": "turn", "text": "The cat"})
            while_down = await _follow(a)
            r.on_loop(lambda: setattr(engine, "argv", good))
            notice = await asyncio.wait_for(a.receive_json(), 60)
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            again = _reply(await _follow(a))
            return first, crashed, while_down, notice, again

    try:
        first, crashed, while_down, notice, again = asyncio.run(session())
    finally:
        r.stop()
    assert crashed[-1]["type"] == "error" and "restarted" in crashed[-1]["message"]
    assert while_down[-1]["type"] == "error" and "down" in while_down[-1]["message"]
    assert notice["type"] == "restarted" and again == first


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
        async with _connect(r.url) as (ws, _hello):
            await ws.send_json({"type": "turn", "text": lines[0]})
            await _follow(ws)
            await ws.send_json({"type": "typing", "text": "The do"})
            for _ in range(100):  # until the board runs it
                spec = r.on_loop(lambda: engine.running)
                if spec is not None:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            await ws.send_json({"type": "turn", "text": lines[1]})
            msgs = await _follow(ws)
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
    assert _reply(msgs) == cpython and msgs[-1]["stats"]["speculated"] is False
