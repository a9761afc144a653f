"""Ctrl-C (SIGINT) in the command-line tools: said once, in one line, at any
moment from start-up on; never a traceback, never a half-written file.

`run("module:function")` is how every tool starts (tools/*.py and the console
scripts, through mpllm.entry): it installs its handler first, then imports
the tool (imports are most of a tool's start-up) and runs it, and a
KeyboardInterrupt that reaches it, from the imports on, becomes one line on
stderr and exit status 130. A tool with something better to say (convert.py:
which file was not written) catches it first. After the first Ctrl-C further
ones are ignored, so that the tool's cleanup as it unwinds (a staging file
removed, engine processes stopped) is not cut short and nothing is said twice;
`repeat=True` leaves Ctrl-C to Python's own handler, each one a
KeyboardInterrupt: for a tool whose Ctrl-C means "stop this, then go on" (the
interactive chat), and for one that runs an asyncio event loop (serve.py),
whose asyncio.run takes the first Ctrl-C itself, only with that handler, and
turns it into its main task cancelled in order (an exception raised at any
point inside the loop instead leaves tasks half started, and asyncio prints
their tracebacks). The interpreter's exit after the tool returns is not
interrupted either. A tool started with Ctrl-C ignored (a shell's background
job) goes on ignoring it.

A Ctrl-C is never lost: one that lands while Python runs a finalizer (a
generator's `finally` as the generator is collected, a `__del__`), where no
exception can leave, would only be printed as "Exception ignored" while the
tool went on, deaf to Ctrl-C from then on; `run` delivers it again instead,
to the code that runs next.

`deferred()` holds a Ctrl-C back over a few statements that must happen
together (creating a staging file and taking charge of it, removing it): it
arrives just after.

Processes a tool starts for itself (the web chat's engine processes) do not
take the terminal's Ctrl-C at all: they are stopped by the tool that owns them
(mpllm.web.engines).

As far as Python allows: Python can be interrupted before it runs any of
this, while it starts its own `site` (a few milliseconds), and says so itself.
This module imports only the standard library, so that it is in charge a
millisecond after the tool's first line.
"""

from __future__ import annotations

# Only what Python has loaded already, and signal: the tool's first line is
# not in charge of Ctrl-C until this module is imported
import os
import signal
import sys

TYPE_CHECKING = False  # (typing.TYPE_CHECKING, without importing typing: ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

#: the exit status of a tool stopped by Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_INTERRUPTED = 130


def _first_only(signum: int, frame: object) -> None:
    """The first Ctrl-C interrupts; the ones after it are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _unraisable(what: object) -> None:
    """sys.unraisablehook: a KeyboardInterrupt raised in a finalizer (it
    cannot leave one) comes again: _first_only re-armed if it was the one
    (it ignores the Ctrl-Cs after it), and the signal once more, from a thread a
    moment later (sent from here, it would be raised in this hook, where it
    is lost the same way). Anything else goes to the hook there was."""
    if isinstance(getattr(what, "exc_value", None), KeyboardInterrupt):
        import threading

        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # (_first_only's doing)
            signal.signal(signal.SIGINT, _first_only)
        again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
        again.daemon = True
        again.start()
        return
    _hook_before(what)  # type: ignore[arg-type]


_hook_before = sys.unraisablehook


def run(target: str | Callable[[], int | None], prog: str | None = None, *,
        repeat: bool = False) -> NoReturn:
    """Import and run a tool's main ("package.module:function", or the
    function) under the Ctrl-C rules above, and exit with its status."""
    name = prog or os.path.basename(sys.argv[0]) or "mpllm"
    # (a tool started with Ctrl-C ignored, as a shell starts a background
    # job, keeps ignoring it)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        if not repeat:
            signal.signal(signal.SIGINT, _first_only)
        sys.unraisablehook = _unraisable
    code: int | str | None
    try:
        if isinstance(target, str):
            import importlib

            module, _, function = target.partition(":")
            target = getattr(importlib.import_module(module), function)
        code = target()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        code = EXIT_INTERRUPTED
    except SystemExit as e:  # argparse's refusals, a tool's own exit
        code = e.code  # type: ignore[assignment]
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interpreter's exit included
    sys.exit(code)


class deferred:  # (lower case: used as `with deferred():`, a context manager's name)
    """A block no Ctrl-C interrupts: one that comes meanwhile is held and
    delivered as the block ends (to the handler there was before). Only the
    main thread runs Python's signal handlers: elsewhere the block runs as it
    is. (The handler is swapped, not the signal blocked: a blocked SIGINT
    goes to another thread, tqdm's or asyncio's, and interrupts the main one
    all the same.)"""

    def __enter__(self) -> None:
        import threading

        self.came = False
        self.old: object = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._hold)

    def _hold(self, signum: int, frame: object) -> None:
        self.came = True

    def __exit__(self, *exc: object) -> None:
        if self.old is None:  # (not the main thread, or a handler not set from Python)
            return
        signal.signal(signal.SIGINT, self.old)  # type: ignore[arg-type]
        if self.came and callable(self.old):
            self.old(signal.SIGINT, None)  # delivered now: KeyboardInterrupt, as a rule
        elif self.came and self.old == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)
