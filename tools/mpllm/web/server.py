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
message over the size limit (room for the longest line however it is escaped,
Limits.max_message_bytes) closes the connection (WebSocket code 1009); any
other message that is not what the list above says is answered with an error
and the connection goes on. Connections that never finish a request are
closed (listener.py).

A connection is one story; it has one request at a time, and its story is
forgotten when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web

from .engines import Busy, Pool
from .listener import Listener, listen

STATIC = Path(__file__).resolve().parent / "static"


#: the most bytes one character of a line can take in a JSON message: a
#: character beyond the BMP escaped as a UTF-16 surrogate pair, "\\ud83d\\ude00"
#: (raw UTF-8 is at most 4, any other escape at most 6)
JSON_BYTES_PER_CHAR = 12
#: a message's bytes beside its line: the type, the keys, quotes, braces and
#: spacing, escaped as a client likes
MESSAGE_ENVELOPE_BYTES = 256


@dataclass(frozen=True)
class Limits:
    max_line_chars: int = 400  # a line of the story, as typed
    max_connections: int = 2000
    max_queue: int = 2000  # requests waiting for an engine, all connections
    messages_per_s: float = 20.0  # per connection, on average (a turn waited
    burst: int = 40  # for is not counted) ... with this many at once
    reply_tokens: int = 60  # story tokens of one reply (llm_chat.TURN_TOKENS)
    temperature: float = 0.8  # llm.TEMPERATURE
    # connections accepted but not (or no longer) a request being answered:
    # a half-open TCP connection, an HTTP request that never ends, an idle
    # keep-alive one (listener.py)
    max_pending: int = 512  # kept at once: the oldest makes room for a new one
    pending_timeout_s: float = 10.0  # closed after this long

    @property
    def max_message_bytes(self) -> int:
        """A WebSocket message from the page: room for the longest line
        however the client escapes it (all of it as \\u escapes)."""
        return self.max_line_chars * JSON_BYTES_PER_CHAR + MESSAGE_ENVELOPE_BYTES

    def public(self) -> dict:
        """What the hello message tells the page."""
        return {**asdict(self), "max_message_bytes": self.max_message_bytes}


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
        self.listener: Listener | None = None  # set by start()
        self.app = web.Application(middlewares=[self._pending])
        self.app.router.add_get("/", self._index)
        self.app.router.add_get("/ws", self._ws)
        self.app.router.add_static("/static/", STATIC)
        self.app.on_startup.append(self._start_pool)
        self.app.on_cleanup.append(self._stop_pool)

    @web.middleware
    async def _pending(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        """A connection with a request being answered is not pending (listener.py)."""
        if self.listener is None:
            return await handler(request)
        self.listener.busy(request.transport)
        try:
            return await handler(request)
        finally:
            self.listener.idle(request.transport)

    def quiet(self) -> bool:
        """No connection, and the engines have nothing to do."""
        return self.connections == 0 and self.pool.idle()

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
        # aiohttp refuses a message of max_msg_size bytes itself: one more, so
        # that the limit is the longest message read, as the page is told
        ws = web.WebSocketResponse(max_msg_size=lim.max_message_bytes + 1, heartbeat=30)
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


class BadMessage(ValueError):
    """A message from the page the server does not take; the text says why."""


class _NotJson(BadMessage):
    pass


def _not_json(name: str) -> None:
    raise _NotJson(f"malformed message: {name} is not JSON (a number must be finite)")


def parse_message(data: str, limits: Limits) -> dict:
    """The engine request (without its sid) that a message from the page asks
    for; BadMessage says what is wrong with it. Any text gives one or the
    other: nothing a client sends gets past this as another exception."""
    try:
        m = json.loads(data, parse_constant=_not_json)  # NaN, Infinity: not JSON
    except _NotJson:
        raise
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        m = None
    if not isinstance(m, dict):
        raise BadMessage("malformed message: a message is one JSON object")
    kind = m.get("type")
    if kind in ("turn", "typing"):
        text = m.get("text")
        if not isinstance(text, str):
            raise BadMessage(f"{kind}: 'text' must be a string")
        if len(text) > limits.max_line_chars:
            raise BadMessage(f"the line is too long: {len(text)} characters, at most "
                             f"{limits.max_line_chars}")
        if any(c < " " and c not in "\n\t" or "\x7f" <= c <= "\x9f" for c in text):
            raise BadMessage("the line has control characters; type text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadMessage("the line has half a character (a lone UTF-16 surrogate); "
                             "type text") from None
        return {"op": "turn" if kind == "turn" else "speculate", "line": text}
    if kind in ("new", "undo"):
        return {"op": kind}
    if kind == "seed":
        seed = m.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise BadMessage("seed: 'seed' must be a whole number")
        return {"op": "seed", "seed": seed}
    if kind == "temp":
        temperature = m.get("temperature")
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) \
                or isinstance(temperature, float) and not math.isfinite(temperature):
            raise BadMessage("temp: 'temperature' must be a number")
        return {"op": "temp", "temperature": temperature}
    # the type as sent only when it is short text: a client's list or object
    # is not echoed back (nor its repr built, which could nest too deep)
    shown = repr(kind) if isinstance(kind, str) and len(kind) <= 40 else \
        f"({type(kind).__name__})" if kind is not None else "(none)"
    raise BadMessage(f"unknown message type {shown}; the types are turn, typing, new, "
                     f"undo, seed, temp")


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
                         "engines": len(self.pool.engines), "limits": lim.public(),
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

    async def on_message(self, data: str, bucket: _Bucket) -> None:
        req, problem = None, None
        try:
            req = {"sid": self.sid, **parse_message(data, self.limits)}
        except BadMessage as e:
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


class Serving:
    """A ChatServer at its address: cleanup() stops accepting, closes the
    connections and stops the engines."""

    def __init__(self, runner: web.AppRunner, listener: Listener) -> None:
        self.runner, self.listener = runner, listener

    async def cleanup(self) -> None:
        self.listener.close()
        await self.runner.cleanup()


async def start(server: ChatServer, host: str, port: int) -> tuple[Serving, int]:
    """Serve at host:port (0: any free port); returns what serves and the port."""
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    try:
        # a backlog for the load test's thousands of connections at once
        socks = listen(host, port, backlog=4096)
    except BaseException:
        await runner.cleanup()
        raise
    lim = server.limits
    server.listener = Listener(runner.server, socks, lim.max_pending,  # type: ignore[arg-type]
                               lim.pending_timeout_s)
    server.listener.start()
    return Serving(runner, server.listener), server.listener.port
