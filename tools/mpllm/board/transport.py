"""A board's raw REPL, through mpremote's own transport: run code, stream its
output (bench.py, gate.py and the report use it; so can any tool that talks to
a board or a serial peer)."""

from __future__ import annotations

from collections.abc import Callable


def open_transport(port: str) -> object:
    """mpremote's serial transport to the board at `port`."""
    try:
        from mpremote.transport import TransportError
        from mpremote.transport_serial import SerialTransport
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SystemExit("talking to a board needs mpremote: pip install 'mpllm[board]'") from e
    try:
        return SerialTransport(port, baudrate=115200)
    except TransportError as e:  # "failed to access PORT": no such port, or it is busy
        raise RuntimeError(str(e)) from None


def run_port_snippet(port: str, snippet: str, *, consumer: Callable[[bytes], None],
                     soft_reset: bool = False, timeout: float = 120) -> bytes:
    """Run `snippet` on the board at `port` through mpremote's transport,
    streaming its stdout to `consumer`; returns its stderr (the traceback of
    an exception, empty on success)."""
    from mpremote.transport import TransportError

    tr = open_transport(port)
    try:
        tr.enter_raw_repl(soft_reset=soft_reset)
        tr.exec_raw_no_follow(snippet)
        _out, err = tr.follow(timeout, consumer)
        tr.exit_raw_repl()
    except TransportError as e:
        raise RuntimeError(f"{port}: {e}") from e
    finally:
        tr.close()
    return err
