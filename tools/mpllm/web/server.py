"""The web chat's server: one static page and a WebSocket API, on aiohttp.

The page (static/index.html) talks to /ws, one JSON object a message.

From the page:
  {"type": "turn", "text": line}      add a line, stream the reply
  {"type": "typing", "text": line}    the line so far (the page sends it after
                                      a pause): the reply is written ahead
  {"type": "new"} | {"type": "undo"}  start over, take back the last turn
  {"type": "seed", "seed": n} | {"type": "temp", "temperature": t}
From the server:
  {"type": "hello", "seed", "seq_len", "backend", "engines", "limits"}
  {"type": "queued", "position": n}   the request waits; 1 is next
  {"type": "line", "text"}            the line as it joined the story
  {"type": "piece", "text"}           a piece of the reply, as it is written
  {"type": "done", "op", "stats"}     the request is done (a turn's figures:
                                      llm_serve's "done", `speculated` among them)
  {"type": "busy", "message"}         refused: the queue or the server is full
  {"type": "error", "message"}        refused or failed; the story is as it was
                                      (a turn cut short is taken back, its line too)
  {"type": "restarted", "message"}    the engine holding the story restarted: the
                                      story starts over, with the same seed

A browser connects only from the chat's own page (the Origin is checked); a
message over the size limit closes the connection (WebSocket code 1009).

A connection is one story; it has one request at a time, and its story is
forgotten when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web

from .engines import Busy, Pool

STATIC = Path(__file__).resolve().parent / "static"


@dataclass(frozen=True)
class Limits:
    max_line_chars: int = 400  # a line of the story, as typed
    max_message_bytes: int = 4096  # a WebSocket message from the page
    max_connections: int = 2000
    max_queue: int = 2000  # requests waiting for an engine, all connections
    messages_per_s: float = 20.0  # per connection, on average (a turn waited
    burst: int = 40  # for is not counted) ... with this many at once
    reply_tokens: int = 60  # story tokens of one reply (llm_chat.TURN_TOKENS)
    temperature: float = 0.8  # llm.TEMPERATURE


class _Bucket:
    """A token bucket: `rate` messages a second, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.level = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level < 1:
            return False
        self.level -= 1
        return True


class ChatServer:
    """The page, the API and the engines' pool."""

    def __init__(self, pool: Pool, backend: str, limits: Limits | None = None) -> None:
        self.pool = pool
        self.backend = backend
        self.limits = limits or Limits()
        self.connections = 0
        self.app = web.Application()
        self.app.router.add_get("/", self._index)
        self.app.router.add_get("/ws", self._ws)
        self.app.router.add_static("/static/", STATIC)
        self.app.on_startup.append(self._start_pool)
        self.app.on_cleanup.append(self._stop_pool)

    async def _start_pool(self, _app: web.Application) -> None:
        await self.pool.start()

    async def _stop_pool(self, _app: web.Application) -> None:
        await self.pool.stop()

    async def _index(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        lim = self.limits
        origin = request.headers.get("Origin")
        if origin and urlsplit(origin).netloc != request.host:
            # a page of another site in a visitor's browser (served with --host
            # 0.0.0.0, any page a LAN user opens could otherwise take the slots)
            return web.Response(status=403, text="this chat takes connections from its own "
                                "page only")
        ws = web.WebSocketResponse(max_msg_size=lim.max_message_bytes, heartbeat=30)
        await ws.prepare(request)
        if self.connections >= lim.max_connections:
            await ws.send_json({"type": "busy", "message": f"the server is full "
                                f"({lim.max_connections} connections); try again later"})
            await ws.close()
            return ws
        self.connections += 1
        sid = self.pool.new_sid()
        try:
            await _Connection(self, ws, sid).serve(request.query)
        finally:
            self.pool.close(sid)
            self.connections -= 1
        return ws


def _number(query: object, name: str, kind: type, default: object) -> object:
    raw = query.get(name)  # type: ignore[attr-defined]
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"?{name}= must be a number, not {raw!r}") from None


class _Connection:
    def __init__(self, server: ChatServer, ws: web.WebSocketResponse, sid: str) -> None:
        self.server, self.ws, self.sid = server, ws, sid
        self.pool = server.pool
        self.limits = server.limits
        self.task: asyncio.Task | None = None  # the request being answered
        self.pending_sends: set[asyncio.Future] = set()  # kept until sent

    async def send(self, message: dict) -> None:
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await self.ws.send_json(message)  # the page may have gone

    async def error(self, text: str) -> None:
        await self.send({"type": "error", "message": text})

    def restarted(self) -> None:
        """The engine holding this story restarted: it starts over (same seed)."""
        self.pending_sends.add(asyncio.ensure_future(self.send(
            {"type": "restarted", "message": "The engine stopped and was restarted: the "
             "story starts over (with the same seed)."})))
        for task in [t for t in self.pending_sends if t.done()]:
            self.pending_sends.discard(task)

    async def serve(self, query: object) -> None:
        lim = self.limits
        try:
            seed = _number(query, "seed", int, None)
            temperature = _number(query, "temperature", float, lim.temperature)
        except ValueError as e:
            await self.error(str(e))
            return
        try:
            opened = await self.pool.open(self.sid, seed, temperature, lim.reply_tokens,
                                          on_restart=self.restarted)
        except Busy as e:
            await self.send({"type": "busy", "message": str(e)})
            return
        if "done" not in opened:
            await self.error(opened.get("error", "the engine did not open the story"))
            return
        await self.send({"type": "hello", "backend": self.server.backend,
                         "engines": len(self.pool.engines), "limits": asdict(lim),
                         **opened["done"]})
        bucket = _Bucket(lim.messages_per_s, lim.burst)
        try:
            async for msg in self.ws:
                if msg.type != WSMsgType.TEXT:
                    if msg.type == WSMsgType.BINARY:
                        await self.error("messages are JSON text")
                    continue
                await self.on_message(msg.data, bucket)
        finally:
            if self.task is not None:
                self.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.task

    def _request(self, m: dict) -> dict:
        """The engine request for a page's message; ValueError says what is wrong."""
        kind = m.get("type")
        req: dict = {"sid": self.sid}
        if kind in ("turn", "typing"):
            text = m.get("text")
            if not isinstance(text, str):
                raise ValueError(f"{kind}: 'text' must be a string")
            if len(text) > self.limits.max_line_chars:
                raise ValueError(f"the line is too long: {len(text)} characters, at most "
                                 f"{self.limits.max_line_chars}")
            if any(c < " " and c not in "\n\t" or "\x7f" <= c <= "\x9f" for c in text):
                raise ValueError("the line has control characters; type text")
            req.update(op="turn" if kind == "turn" else "speculate", line=text)
        elif kind in ("new", "undo"):
            req["op"] = kind
        elif kind == "seed":
            req.update(op="seed", seed=m.get("seed"))
        elif kind == "temp":
            req.update(op="temp", temperature=m.get("temperature"))
        else:
            raise ValueError(f"unknown message type {kind!r}; the types are turn, typing, "
                             f"new, undo, seed, temp")
        return req

    async def on_message(self, data: str, bucket: _Bucket) -> None:
        try:
            m = json.loads(data)
        except ValueError:
            m = None
        req, problem = None, None
        if not isinstance(m, dict):
            problem = "malformed message: a message is one JSON object"
        else:
            try:
                req = self._request(m)
            except ValueError as e:
                problem = str(e)
        idle = self.task is None or self.task.done()
        # A valid turn while none is in flight is not counted: turns come one
        # at a time and the queue paces them. Everything else is (typing above
        # all, and every message that is refused).
        if not (idle and req is not None and req["op"] == "turn") and not bucket.take():
            await self.error("too many messages: slow down")
            return
        if req is None:
            await self.error(problem or "malformed message")
            return
        if req["op"] == "speculate":
            if req["line"].strip():
                self.pool.submit(req, speculative=True)  # nobody waits for its events
            return
        if self.task is not None and not self.task.done():
            await self.error("one request at a time: wait for the reply")
            return
        self.task = asyncio.create_task(self.answer(req))

    async def answer(self, req: dict) -> None:
        try:
            async for event in self.pool.ask(req):
                if "queued" in event:
                    await self.send({"type": "queued", "position": event["queued"]})
                elif "line" in event:
                    await self.send({"type": "line", "text": event["line"]})
                elif "piece" in event:
                    await self.send({"type": "piece", "text": event["piece"]})
                elif "done" in event:
                    await self.send({"type": "done", "op": req["op"], "stats": event["done"]})
                else:
                    await self.error(event.get("error", "the engine gave no answer"))
        except Busy as e:
            await self.send({"type": "busy", "message": str(e)})


async def start(server: ChatServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve at host:port (0: any free port); returns the runner and the port."""
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    # a backlog for the load test's thousands of connections at once
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    return runner, runner.addresses[0][1]
