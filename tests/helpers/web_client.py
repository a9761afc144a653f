"""A web chat server in a test (on loopback, in a thread of its own) and a
WebSocket client for it: what the web chat's tests share."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import aiohttp
from mpllm.web.engines import Pool
from mpllm.web.server import ChatServer, Limits, start


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


async def follow(ws: aiohttp.ClientWebSocketResponse) -> list[dict]:
    """Messages up to and with the request's last (done, error or busy)."""
    out = []
    while True:
        m = await asyncio.wait_for(ws.receive_json(), 60)
        out.append(m)
        if m["type"] in ("done", "error", "busy"):
            return out


def reply_text(msgs: list[dict]) -> str:
    """The reply's text in these messages."""
    return "".join(m["text"] for m in msgs if m["type"] == "piece")


@contextlib.asynccontextmanager
async def connect(url: str, query: str = "?seed=5"):  # type: ignore[no-untyped-def]
    """A WebSocket to the chat, past its hello: (ws, hello)."""
    async with aiohttp.ClientSession() as session, \
            session.ws_connect(f"{url}/ws{query}") as ws:
        hello = await asyncio.wait_for(ws.receive_json(), 60)
        assert hello["type"] == "hello", hello
        yield ws, hello
