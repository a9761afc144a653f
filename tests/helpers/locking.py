"""A file lock for work that parallel runs must do one at a time (builds
shared by pytest-xdist workers, the fuzz runs' model image). Here, not in
conftest, so that scripts run outside pytest (tests/fuzz/fuzzrun.py) can use
it too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): xdist workers then may build twice, harmlessly
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
