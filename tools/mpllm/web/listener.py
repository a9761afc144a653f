"""The web chat's TCP listener: what loop.create_server does, with the guards
a public server needs against connections that never finish.

A connection is *pending* from the moment it is accepted until a request
on it is being answered, and again once the answer is sent (an idle
keep-alive connection): a chat WebSocket, a request for real, is pending
only for the moment its handshake takes. Pending connections cost a file
descriptor each and give nothing, so:

- one that stays pending `timeout` seconds is closed (a half-open TCP
  connection, an HTTP request that never ends, an idle keep-alive one);
- at most `limit` are kept: the oldest is closed to make room for a new
  one (a real client sends its request the moment it connects, so it is
  the newest, not the oldest);
- out of file descriptors (EMFILE), the oldest pending connections are
  closed to make room and accepting goes on at the next turn of the loop;
  with none to close it waits a second. One line says so, at most once a
  minute, instead of asyncio's traceback for every failed accept.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
import time
from collections.abc import Callable

#: accepts per turn of the event loop, so that a flood of connections does
#: not starve the connections already served
ACCEPT_BATCH = 64
#: errno of an accept() that failed for want of descriptors or memory
OUT_OF_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
#: with nothing pending to close, how long to wait before accepting again
FULL_PAUSE_S = 1.0
#: at most one line a minute about running out of descriptors
LOG_EVERY_S = 60.0
#: on EMFILE, close this fraction of the pending connections (the oldest),
#: so that the backlog moves on at the pace of the loop, not one a turn
EVICT_FRACTION = 8


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Non-blocking listening sockets on every address of `host` (port 0:
    one free port, the same on all of them)."""
    socks: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        for family, kind, proto, _name, addr in dict.fromkeys(infos):
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: v4 has its own socket
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            try:
                s.bind(addr)
            except OSError as e:  # say where: "Address already in use" alone names no port
                raise OSError(e.errno, f"cannot listen on {addr[0]} port {addr[1]}: "
                                       f"{(e.strerror or str(e)).lower()}") from None
            s.listen(backlog)
            s.setblocking(False)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class _Tracked(asyncio.Protocol):
    """The server's protocol for one connection, with its comings and goings
    told to the listener (the protocol itself is left as it is)."""

    def __init__(self, inner: asyncio.Protocol, listener: Listener) -> None:
        self.inner, self.listener = inner, listener
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.listener._made(transport)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener._lost(self.transport)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class Listener:
    """Accepts connections on `socks` for `factory` (an aiohttp web.Server),
    keeping at most `limit` pending, none longer than `timeout` seconds."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], socks: list[socket.socket],
                 limit: int, timeout: float, log: Callable[[str], None] = _stderr) -> None:
        self.factory, self.socks = factory, socks
        self.limit, self.timeout, self.log = limit, timeout, log
        self.loop = asyncio.get_running_loop()
        # transport -> when it is closed if still pending; in that order,
        # since every deadline is "now + timeout" when it is set
        self.pending: dict[asyncio.BaseTransport, float] = {}
        self.starting = 0  # accepted, its transport not made yet
        self.connections = 0  # open, pending or not
        self.evicted = 0  # pending connections closed to make room, in all
        self.timed_out = 0  # pending connections closed for their time, in all
        self._tasks: set[asyncio.Task] = set()
        self._logged_at: float | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def port(self) -> int:
        return self.socks[0].getsockname()[1]

    def start(self) -> None:
        for s in self.socks:
            self.loop.add_reader(s.fileno(), self._accept, s)
        self._sweep()

    def close(self) -> None:
        """Stop accepting (the connections already open are the server's)."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for s in self.socks:
            self.loop.remove_reader(s.fileno())
            s.close()

    # -- what the server tells it

    def busy(self, transport: asyncio.BaseTransport | None) -> None:
        """A request on this connection is being answered: it is not pending."""
        self.pending.pop(transport, None)  # type: ignore[arg-type]

    def idle(self, transport: asyncio.BaseTransport | None) -> None:
        """Its answer is sent: pending again, with a new deadline."""
        if transport is not None and not transport.is_closing():
            self.pending.pop(transport, None)
            self.pending[transport] = time.monotonic() + self.timeout

    # -- the connections' comings and goings

    def _made(self, transport: asyncio.BaseTransport) -> None:
        self.starting -= 1
        self.connections += 1
        if len(self.pending) >= self.limit:
            self._evict(len(self.pending) - self.limit + 1)
        self.pending[transport] = time.monotonic() + self.timeout

    def _lost(self, transport: asyncio.BaseTransport | None) -> None:
        self.connections -= 1
        self.pending.pop(transport, None)  # type: ignore[arg-type]

    def _protocol(self) -> asyncio.Protocol:
        return _Tracked(self.factory(), self)

    async def _start(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self._protocol, conn)
        except OSError:
            self.starting -= 1
            conn.close()

    # -- accepting

    def _evict(self, n: int) -> int:
        """Close the n oldest pending connections; how many were closed."""
        closed = 0
        while closed < n and self.pending:
            transport = next(iter(self.pending))
            del self.pending[transport]
            if not transport.is_closing():
                transport.abort()  # type: ignore[attr-defined]
                closed += 1
        self.evicted += closed
        return closed

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno in OUT_OF_RESOURCES:
                    self._out_of_descriptors(sock, e)
                else:
                    self._say(f"the web chat could not accept a connection: {e}")
                return
            conn.setblocking(False)
            self.starting += 1
            task = self.loop.create_task(self._start(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _out_of_descriptors(self, sock: socket.socket, e: OSError) -> None:
        """Make room by closing the oldest pending connections; try again at
        the next turn of the loop (their descriptors are freed then), or in a
        second when nothing could be closed."""
        closed = self._evict(max(1, len(self.pending) // EVICT_FRACTION))
        self._say(f"the web chat is out of file descriptors ({e.strerror}; "
                  f"{self.connections} connections open): it closes the oldest unfinished "
                  f"ones to make room and accepts again shortly")
        self.loop.remove_reader(sock.fileno())
        delay = 0.0 if closed or self.starting else FULL_PAUSE_S
        self.loop.call_later(delay, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        if not self._closed:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _say(self, line: str) -> None:
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            self.log(line)

    def _sweep(self) -> None:
        """Close the pending connections whose time is up; again in a while."""
        now = time.monotonic()
        while self.pending:
            transport, deadline = next(iter(self.pending.items()))
            if deadline > now:
                break
            del self.pending[transport]
            if not transport.is_closing():
                transport.abort()  # type: ignore[attr-defined]
                self.timed_out += 1
        if not self._closed:
            self._sweeper = self.loop.call_later(min(1.0, self.timeout / 4), self._sweep)

