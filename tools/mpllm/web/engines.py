"""The engines behind the web server and the fair queue in front of them.

An engine is a process (engine_process.py) that answers requests one at a
time; the host board has several (one per core by default), a board one.
A story lives in one engine (its ids are in that engine's context), so a
connection keeps its engine; each engine has a FIFO of waiting requests,
and a connection has at most one turn waiting or running, so the FIFO is
fair: nobody is served twice while another waits. Requests beyond
`max_queue` waiting in all are refused at once (Busy), not kept.

Speculation (a reply computed while its line is typed) is the lowest
priority: an engine runs one only when no request waits for it, and a
newer line from the same connection replaces one not yet started. On a
board (interrupt_speculation) a request for real also stops the one under
way: it takes as long as a reply there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class Busy(Exception):
    """The queue is full; the message says so."""


class EngineFailed(RuntimeError):
    """An engine process could not start or stopped."""


@dataclass
class Job:
    req: dict
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    speculative: bool = False
    dropped: bool = False  # nobody reads its events (its connection left, or a re-open)
    told: int = 0  # the queue position it was last told, and when
    told_at: float = 0.0


_END = object()  # after the last event of a job
#: a waiting job this near the front hears of every step; the others at most
#: once a second (a step tells every waiting job: n of them, n steps a round)
_TELL_EVERY_STEP = 10
#: seconds between tries to start an engine that failed
_RESTART_BACKOFF = (0.5, 30.0)


class Engine:
    """One engine process: requests as JSON lines in, events as JSON lines out."""

    def __init__(self, name: str, argv: Sequence[str], interruptible: bool = False) -> None:
        self.name = name
        self.argv = list(argv)
        # a request for real stops a speculation under way (a board's takes as
        # long as a reply: without this, Enter on another line waits for it)
        self.interruptible = interruptible
        self.proc: asyncio.subprocess.Process | None = None
        self.waiting: deque[Job] = deque()
        self.speculations: dict[str, Job] = {}  # sid -> the newest not started
        self.running: Job | None = None
        self.sessions = 0
        self.up = False
        # sid -> the request that opens its story again as it is (seed and
        # temperature as the engine last confirmed them)
        self.stories: dict[str, dict] = {}
        self.on_restart: Callable[[str], None] | None = None  # told each sid that started over
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        # mpllm importable in the engine also when it runs from a checkout
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parents[2])] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
        # Its own process group: the terminal's Ctrl-C goes to the server
        # alone, which stops its engines itself (stop(): stdin closed); an
        # engine that took it too would print its own traceback (and it
        # ignores SIGINT besides: engine_process.main)
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=None, limit=1 << 20, env=env, process_group=0)
        line = await self.proc.stdout.readline()
        if not line:
            code = await self.proc.wait()
            raise EngineFailed(f"engine {self.name} did not start (exit status {code}; "
                               f"its message is above)")
        self.up = True

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.proc is not None and self.proc.returncode is None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def _ask(self, req: dict) -> AsyncIterator[dict]:
        """The events of one request, up to and with the last."""
        assert self.proc is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        await self.proc.stdin.drain()
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise EngineFailed(f"engine {self.name} stopped")
            event = json.loads(line)
            yield event
            if "piece" not in event and "line" not in event:
                return  # "done" or "error": the request's last event

    def _next(self) -> Job | None:
        if self.waiting:
            return self.waiting.popleft()
        if self.speculations:
            sid = next(iter(self.speculations))
            return self.speculations.pop(sid)
        return None

    def interrupt_speculation(self) -> None:
        """Ask the process to stop the speculation it runs (engine_process's
        SIGUSR1: it stops only a speculation, never a request for real)."""
        if self.interruptible and self.running is not None and self.running.speculative \
                and self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGUSR1)

    def tell(self, job: Job, position: int, now: float) -> None:
        job.told, job.told_at = position, now
        job.events.put_nowait({"queued": position})

    def positions(self) -> None:
        """Tell the waiting jobs where they stand now (1: next), those near
        the front at every step, the others at most once a second."""
        now = time.monotonic()
        for i, job in enumerate(self.waiting):
            position = i + 1
            if job.told != position and not job.dropped and (
                    position <= _TELL_EVERY_STEP or now - job.told_at >= 1.0):
                self.tell(job, position, now)

    def _remember(self, req: dict, last: dict) -> None:
        """Keep what opens the story again after a restart."""
        done, sid = last.get("done"), req.get("sid")
        if done is None or sid is None:
            return
        op = req["op"]
        if op == "open":
            self.stories[sid] = {**req, "seed": done["seed"]}
        elif op in ("seed", "temp") and sid in self.stories:
            self.stories[sid].update(seed=done["seed"], temperature=done["temperature"])
        elif op == "drop":
            self.stories.pop(sid, None)

    async def run(self) -> None:
        """Serve the queue until cancelled."""
        while True:
            job = self._next()
            if job is None:
                self.wake.clear()
                await self.wake.wait()
                continue
            self.running = job
            self.positions()
            last: dict = {}
            try:
                async for event in self._ask(job.req):
                    job.events.put_nowait(event)
                    last = event
                self._remember(job.req, last)
                if last.get("lost"):  # the process ends: start it again now
                    raise EngineFailed(f"engine {self.name} lost its board")
            except (EngineFailed, OSError, ValueError) as e:
                if not last or "piece" in last or "line" in last:  # it had no last event
                    job.events.put_nowait({"error": f"{e}; the engine is restarted and its "
                                                    f"stories start over"})
                job.events.put_nowait(_END)
                self.running = None
                await self._restart()
                continue
            job.events.put_nowait(_END)
            self.running = None

    def _fail_waiting(self, message: str) -> None:
        for job in [*self.waiting, *self.speculations.values()]:
            job.events.put_nowait({"error": message})
            job.events.put_nowait(_END)
        self.waiting.clear()
        self.speculations.clear()

    async def _restart(self) -> None:
        """A new process, tried until it starts; then every story it held is
        opened again, before anything else, and its connection told."""
        self.up = False
        delay, longest = _RESTART_BACKOFF
        while True:
            with contextlib.suppress(ProcessLookupError):
                if self.proc is not None and self.proc.returncode is None:
                    self.proc.kill()
            if self.proc is not None:
                await self.proc.wait()
            try:
                await self.start()
                break
            except (EngineFailed, OSError) as e:
                self._fail_waiting(f"engine {self.name} is down ({e}); trying again")
                await asyncio.sleep(delay)
                delay = min(2 * delay, longest)
        for req in self.stories.values():
            self.waiting.appendleft(Job(dict(req), dropped=True))
        for sid in list(self.stories):
            if self.on_restart is not None:
                self.on_restart(sid)


class Pool:
    """The engines and the queue in front of them."""

    def __init__(self, argvs: Sequence[Sequence[str]], max_queue: int = 2000,
                 interrupt_speculation: bool = False) -> None:
        self.engines = [Engine(str(i), argv, interrupt_speculation)
                        for i, argv in enumerate(argvs)]
        self.max_queue = max_queue
        self.home: dict[str, Engine] = {}  # sid -> the engine its story lives in
        self.listeners: dict[str, Callable[[], None]] = {}  # sid -> told of a restart
        self._ids = itertools.count(1)
        for e in self.engines:
            e.on_restart = self._restarted

    def _restarted(self, sid: str) -> None:
        listener = self.listeners.get(sid)
        if listener is not None:
            listener()

    async def start(self) -> None:
        await asyncio.gather(*(e.start() for e in self.engines))
        for e in self.engines:
            e.task = asyncio.create_task(e.run())

    async def stop(self) -> None:
        await asyncio.gather(*(e.stop() for e in self.engines))

    def waiting(self) -> int:
        return sum(len(e.waiting) for e in self.engines)

    def idle(self) -> bool:
        """Nothing waits and nothing runs (a story's drop included)."""
        return all(not e.waiting and not e.speculations and e.running is None
                   for e in self.engines)

    def new_sid(self) -> str:
        return f"s{next(self._ids)}"

    async def open(self, sid: str, seed: int | None, temperature: float, max_tokens: int,
                   on_restart: Callable[[], None] | None = None) -> dict:
        """A new story in the running engine with the fewest; its last event.
        on_restart() is called when the engine restarted and the story
        started over."""
        running = [e for e in self.engines if e.up]
        if not running:
            return {"error": "no engine is running; try again in a moment"}
        engine = min(running, key=lambda e: (e.sessions, len(e.waiting)))
        engine.sessions += 1
        self.home[sid] = engine
        if on_restart is not None:
            self.listeners[sid] = on_restart
        req = {"op": "open", "sid": sid, "seed": seed, "temperature": temperature,
               "max_tokens": max_tokens}
        last = {}
        async for event in self.ask(req):
            last = event
        return last

    def submit(self, req: dict, *, speculative: bool = False) -> Job:
        """Queue a request of the story req["sid"]; its events come on job.events."""
        sid = req["sid"]
        engine = self.home[sid]
        job = Job(req, speculative=speculative)
        # a newer line (or a request for real) makes an unstarted speculation stale
        old = engine.speculations.pop(sid, None)
        if old is not None:
            old.events.put_nowait(_END)
        if speculative:
            engine.speculations[sid] = job
        else:
            if self.waiting() >= self.max_queue:
                raise Busy(f"the server is busy: {self.max_queue} requests are waiting; "
                           f"try again in a moment")
            engine.waiting.append(job)
            engine.interrupt_speculation()
            if engine.running is not None or len(engine.waiting) > 1:
                engine.tell(job, len(engine.waiting), time.monotonic())
        engine.wake.set()
        return job

    async def ask(self, req: dict, *, speculative: bool = False) -> AsyncIterator[dict]:
        """Submit and follow: the job's events, {"queued": n} among them."""
        job = self.submit(req, speculative=speculative)
        while True:
            event = await job.events.get()
            if event is _END:
                return
            yield event

    def close(self, sid: str) -> None:
        """The connection left: forget its waiting requests and its story."""
        engine = self.home.pop(sid, None)
        self.listeners.pop(sid, None)
        if engine is None:
            return
        engine.sessions -= 1
        engine.stories.pop(sid, None)
        for job in [j for j in engine.waiting if j.req.get("sid") == sid]:
            engine.waiting.remove(job)
            job.events.put_nowait(_END)
        spec = engine.speculations.pop(sid, None)
        if spec is not None:
            spec.events.put_nowait(_END)
        engine.waiting.append(Job({"op": "drop", "sid": sid}, dropped=True))
        engine.positions()
        engine.wake.set()


def host_argvs(image: str, n: int) -> list[list[str]]:
    """The command lines of n host-board engines on `image`."""
    return [[sys.executable, "-m", "mpllm.web.engine_process", "--image", image]] * n


def board_argvs(port: str, port_image: str | None = None) -> list[list[str]]:
    """The command line of the one engine that is the board at `port`."""
    argv = [sys.executable, "-m", "mpllm.web.engine_process", "--port", port]
    return [argv + (["--port-image", port_image] if port_image else [])]
