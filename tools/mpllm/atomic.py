"""Writing files so that a failure never leaves half of one behind.

Every tool that writes a file people keep (model.bin, images, downloads, JSON
reports, plots) goes through here: the data goes to a temporary file beside
the target, is flushed to disk, and only then renamed over the target. On any
error the temporary file is removed and an existing target is left as it was.

Only a regular file (or a new name) is ever renamed over. What else a path
can name:

- a character device or a FIFO (/dev/null, /dev/full, a named pipe), and
  anything under /dev, is written in place: the data is staged in a temporary
  file of the system's temp folder (a device's folder is no place for files)
  and appended to the device once complete. /dev/stdout, /dev/stderr and
  /dev/fd/N are written through the process's own descriptor, so the data
  lands between what the program prints before and after, also when the
  descriptor is a shell's redirect to a regular file. Nothing is written if
  the data cannot be made; a device that fails part way (/dev/full: no
  space) is an error. A FIFO waits for its reader.
- a directory, a block device (a disk: write a file and copy it yourself) or
  a socket is refused, and so is a path whose folder does not exist.

Refusals and write errors are OutputError (an OSError) with one line that
names the path as the user gave it, never the temporary file's name.
check_output() makes the same checks without writing, so a command can check
every output it will write before it does any work.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .interrupt import deferred

# Errors of a write that name no file (the disk is full, ...): said about the target.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO,
                 errno.EPIPE, errno.EBADF}


class OutputError(OSError):
    """An output path that cannot be (or was not) written; str() is one line naming it."""


def _fail(path: str | os.PathLike[str], why: str) -> OutputError:
    return OutputError(f"cannot write {os.fspath(path)}: {why}")


def _is_stream_name(text: str) -> bool:
    # /dev/stdout and /dev/fd/N lead to whatever the descriptor is; renaming
    # over it would replace the shell's redirect target, losing its other output
    return os.path.abspath(text).startswith(("/dev/", "/proc/self/fd/"))


def _own_descriptor(text: str) -> int | None:
    """N for /dev/stdout (1), /dev/stderr (2), /dev/fd/N, /proc/self/fd/N; else None."""
    name = os.path.abspath(text)
    named = {"/dev/stdout": 1, "/dev/stderr": 2}
    if name in named:
        return named[name]
    m = re.fullmatch(r"/(?:dev/fd|proc/self/fd)/(\d+)", name)
    return int(m.group(1)) if m else None


def _copy_in_place(src: Path, path: str | os.PathLike[str]) -> None:
    fd = _own_descriptor(os.fspath(path))
    if fd is not None:  # at the descriptor's own offset, after what was printed before
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    with open(src, "rb") as f, \
            (open(path, "ab") if fd is None else os.fdopen(os.dup(fd), "wb")) as dst:
        shutil.copyfileobj(f, dst, 1 << 20)


def _kind(path: str | os.PathLike[str]) -> str:
    """"file" (rename a temporary file over it) or "stream" (write it in place);
    raises OutputError for anything that cannot take the file."""
    text = os.fspath(path)
    if not text:
        raise OutputError("cannot write to an empty path")
    if text.endswith(("/", os.sep)):
        raise _fail(text, "the name ends with a slash, so it names a folder, not a file")
    try:
        st = os.stat(text)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise _fail(text, "a part of the path before the file name is not a folder") from None
    except OSError as e:
        raise _fail(text, e.strerror or str(e)) from None
    if st is None and _is_stream_name(text):
        raise _fail(text, "no such device (or a closed descriptor)")
    if st is not None:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise _fail(text, "it is a directory; name a file in it")
        if stat.S_ISBLK(mode):
            raise _fail(text, "it is a block device (a disk); write a file and copy it there")
        if stat.S_ISSOCK(mode):
            raise _fail(text, "it is a socket")
        if not stat.S_ISREG(mode) or _is_stream_name(text):  # a character device or a FIFO
            if not os.access(text, os.W_OK):
                raise _fail(text, "permission denied")
            return "stream"
    parent = Path(os.path.realpath(text)).parent
    if not parent.is_dir():
        given = Path(text).parent
        shown = given if not given.is_dir() else parent  # a dangling link's folder
        raise _fail(text, f"the folder {shown} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _fail(text, f"no permission to write in the folder {parent}")
    return "file"


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is written in place (a character device, a FIFO, a
    descriptor's name such as /dev/stdout): nothing can be put beside it. A
    path that cannot take a file at all is not one (check_output says why)."""
    try:
        return _kind(path) == "stream"
    except OutputError:
        return False


def check_output(path: str | os.PathLike[str]) -> None:
    """Raise OutputError if `path` cannot take a file (see the module docstring);
    writes nothing. atomic_path() makes the same check."""
    _kind(path)


def _translated(e: OSError, path: str | os.PathLike[str], tmp: Path) -> OSError:
    """`e` about the target when it is about the temporary file or a full disk;
    else `e` itself (say, an input that could not be read)."""
    if isinstance(e, OutputError):
        return e
    names = {os.fspath(n) for n in (e.filename, e.filename2) if n is not None}
    if str(tmp) in names or (not names and e.errno in _WRITE_ERRNOS):
        return _fail(path, e.strerror or str(e))
    return e


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path; once the block succeeds, its file becomes `path`.

    The block writes the temporary file however it likes (and may read it back to
    verify it). A regular target (or a new one) is replaced by a rename, so it is
    either the old file or the whole new one; the final file gets the usual
    permissions (0666 less the umask), not mkstemp's private 0600. A symbolic
    link is followed: the file it points to is replaced. A character device or
    FIFO is written in place once the block succeeds. Raises OutputError (before
    the block runs) for a target that cannot take a file."""
    kind = _kind(path)
    real = Path(os.path.realpath(path))
    tmp: Path | None = None
    try:
        # Ctrl-C waits until the staging file is in our hands (and, below,
        # until it is gone): in between it would be left behind
        with deferred():
            try:
                if kind == "stream":
                    fd, name = tempfile.mkstemp(prefix="mpllm-", suffix=".tmp")
                else:
                    fd, name = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp",
                                                dir=real.parent)
            except OSError as e:
                raise _fail(path, e.strerror or str(e)) from None
            os.close(fd)
            tmp = Path(name)
        try:
            yield tmp
            if kind == "stream":
                _copy_in_place(tmp, path)
            else:
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o666 & ~_umask())
                os.replace(tmp, real)
        except OSError as e:
            err = _translated(e, path, tmp)
            if err is e:
                raise
            raise err from None
    finally:
        if tmp is not None:
            with deferred():
                tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` all at once or not at all."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
