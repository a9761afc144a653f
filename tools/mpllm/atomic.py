"""Writing files so that a failure never leaves half of one behind.

Every tool that writes a file people keep (model.bin, images, downloads, JSON
reports, plots) goes through here: the data goes to a temporary file beside
the target, is flushed to disk, and only then renamed over the target. On any
error the temporary file is removed and an existing target is left as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` if the block succeeds.

    The block writes the temporary file however it likes (and may read it back to
    verify it). The final file gets the usual permissions (0666 less the umask),
    not mkstemp's private 0600."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` all at once or not at all."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
