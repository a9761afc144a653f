"""The engines behind the web chat (mpllm.web.engines): queue positions,
stale speculations withdrawn, an engine process that dies (its stories
opened again first, with their seeds) or cannot start again (retried; what
waits is answered)."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from mpllm.web.engines import Pool, host_argvs
from mpllm.web.server import Limits
from web_client import Running, connect, follow, reply_text


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
        async with connect(r.url, "?seed=5") as (a, _), connect(r.url, "?seed=6") as (b, _):
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            first_a = reply_text(await follow(a))
            r.on_loop(lambda: engine.proc.kill())
            await asyncio.sleep(0.2)
            await a.send_json({"type": "turn", "text": "The cat"})
            await b.send_json({"type": "turn", "text": "A dog"})
            got_a, got_b = await _turn_and_notice(a), await _turn_and_notice(b)
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            again_a = reply_text(await follow(a))
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
        async with connect(r.url, "?seed=5") as (a, _):
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            first = reply_text(await follow(a))

            def break_it() -> None:
                engine.argv = [sys.executable, "-c", "raise SystemExit(1)"]
                engine.proc.kill()
            r.on_loop(break_it)
            await asyncio.sleep(0.2)
            await a.send_json({"type": "turn", "text": "The cat"})
            crashed = await follow(a)
            await a.send_json({"type": "turn", "text": "The cat"})
            while_down = await follow(a)
            r.on_loop(lambda: setattr(engine, "argv", good))
            notice = await asyncio.wait_for(a.receive_json(), 60)
            await a.send_json({"type": "turn", "text": "Once upon a time"})
            again = reply_text(await follow(a))
            return first, crashed, while_down, notice, again

    try:
        first, crashed, while_down, notice, again = asyncio.run(session())
    finally:
        r.stop()
    assert crashed[-1]["type"] == "error" and "restarted" in crashed[-1]["message"]
    assert while_down[-1]["type"] == "error" and "down" in while_down[-1]["message"]
    assert notice["type"] == "restarted" and again == first
