"""Coverage-guided fuzzer (atheris) for the web chat's handling of a page's
message: mpllm.web.server's connection, its on_message, on any text a
WebSocket can carry under the message limit.

For every message: on_message returns (nothing raises out of it: an escaping
exception drops the page's connection), and the message has exactly one
outcome: one "error" with a one-line message (the connection goes on), or a
valid request handed to the engines (a turn's line a string within the
limit, without control characters; only the ops the page may ask for). The
engines are stand-ins that record what they are asked; the server code is
the real one.

Runs, the corpus and the long run: tests/fuzz/fuzzrun.py (target "web").
A failure prints the message and leaves crash-<sha1>; replay with
    python tests/fuzz/fuzz_web.py crash-<sha1>
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: F401  (imported uninstrumented: only the server is traced)
import fuzzrun  # also puts tools/ and firmware/modules/ on sys.path

with atheris.instrument_imports(include=["mpllm.web.server"]):
    from mpllm.web import server

LIMITS = server.Limits(messages_per_s=1e9, burst=10**9)  # rate limits are not under test
OPS = {"turn", "speculate", "new", "undo", "seed", "temp"}


class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send_json(self, message: dict) -> None:
        self.sent.append(message)


class _Engines:
    def __init__(self) -> None:
        self.engines = [None]
        self.asked: list[dict] = []

    def submit(self, req: dict, *, speculative: bool = False) -> None:
        self.asked.append(req)

    async def ask(self, req: dict) -> AsyncIterator[dict]:
        self.asked.append(req)
        yield {"done": {}}


class _Server:
    def __init__(self) -> None:
        self.pool = _Engines()
        self.limits = LIMITS


_LOOP = asyncio.new_event_loop()


def _check_request(req: dict, text: str) -> None:
    if req.get("op") not in OPS:
        raise AssertionError(f"{text!r} became a request with op {req.get('op')!r}")
    if req["op"] in ("turn", "speculate"):
        line = req.get("line")
        if not isinstance(line, str) or len(line) > LIMITS.max_line_chars:
            raise AssertionError(f"{text!r} became a line {line!r}")
        if any(c < " " and c not in "\n\t" or "\x7f" <= c <= "\x9f" for c in line):
            raise AssertionError(f"{text!r} became a line with control characters")


def handle(text: str) -> None:
    srv = _Server()
    ws = _Socket()
    conn = server._Connection(srv, ws, "fuzz")  # type: ignore[arg-type]
    bucket = server._Bucket(LIMITS.messages_per_s, LIMITS.burst)
    _LOOP.run_until_complete(conn.on_message(text, bucket))
    if conn.task is not None:
        _LOOP.run_until_complete(conn.task)
    errors = [m for m in ws.sent if m.get("type") == "error"]
    asked = srv.pool.asked
    if errors:
        message = errors[0].get("message")
        if len(errors) > 1 or asked or not isinstance(message, str) or not message \
                or "\n" in message:
            raise AssertionError(f"{text!r}: errors {errors}, requests {asked}")
        return
    # a blank line typed so far asks for nothing
    for req in asked:
        _check_request(req, text)


def test_one_input(data: bytes) -> None:
    try:
        text = data.decode("utf-8")  # a WebSocket text frame is valid UTF-8
    except UnicodeDecodeError:
        return
    handle(text)


if __name__ == "__main__":
    fuzzrun.atheris_fuzz(test_one_input)
