"""mpllm.atomic: what the writer does with every kind of target.

It must never rename over anything but a regular file: a device or FIFO is
written in place, a directory or a missing folder is refused, and every
message is one line naming the path as the user gave it (never the temporary
file's name). The tests that write to a real device first check that the
writer takes it for one, so a broken writer fails them before it could
replace /dev/null.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest
from mpllm import atomic
from mpllm.atomic import OutputError, atomic_path, atomic_write_bytes, check_output


def entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_regular_file_replaced_whole_with_a_temp_file_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    out.write_bytes(b"old")
    with atomic_path(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        tmp.write_bytes(b"new")
        assert out.read_bytes() == b"old"  # nothing changes before the block ends
    assert out.read_bytes() == b"new" and entries(tmp_path) == ["out.json"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failure_keeps_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "out.img"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half way"), atomic_path(out) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("half way")
    assert out.read_bytes() == b"old" and entries(tmp_path) == ["out.img"]


def test_directory_refused_naming_it(tmp_path: Path) -> None:
    target = tmp_path / "dir"
    target.mkdir()
    (target / "keep").write_bytes(b"x")
    with pytest.raises(OutputError) as e:
        atomic_write_bytes(target, b"data")
    assert str(e.value) == f"cannot write {target}: it is a directory; name a file in it"
    assert entries(tmp_path) == ["dir"] and entries(target) == ["keep"]  # no temp file
    with pytest.raises(OutputError, match="names a folder"):
        atomic_write_bytes(f"{tmp_path}/new/", b"data")


def test_missing_folder_refused_naming_the_given_path(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.json"
    with pytest.raises(OutputError) as e:
        atomic_write_bytes(target, b"data")
    assert str(e.value) == f"cannot write {target}: the folder {target.parent} does not exist"
    assert entries(tmp_path) == []
    afile = tmp_path / "file"
    afile.write_bytes(b"")
    with pytest.raises(OutputError, match="is not a folder"):
        check_output(afile / "x.json")


def test_fifo_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write_bytes(fifo, b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(fifo.stat().st_mode) and entries(tmp_path) == ["pipe"]


def test_character_device_written_in_place() -> None:
    assert atomic._kind(os.devnull) == "stream"  # else the next line could replace it
    atomic_write_bytes(os.devnull, b"gone")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="no /dev/full here")
def test_full_device_is_one_line_no_space() -> None:
    assert atomic._kind("/dev/full") == "stream"
    with pytest.raises(OutputError) as e:
        atomic_write_bytes("/dev/full", b"x" * 100_000)
    assert str(e.value) == "cannot write /dev/full: No space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_write_errors_name_the_target_not_the_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    with pytest.raises(OutputError) as e, atomic_path(out):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a full disk names no file
    assert str(e.value) == f"cannot write {out}: No space left on device"
    with pytest.raises(OutputError) as e, atomic_path(out) as tmp:
        tmp.unlink()
        open(tmp, "rb").close()  # an error about the temp file itself
    assert str(e.value) == f"cannot write {out}: No such file or directory"
    # an error about anything else (an input, a download) goes up as it was
    with pytest.raises(FileNotFoundError) as e2, atomic_path(out):
        open(tmp_path / "input.bin", "rb").close()
    assert e2.value.filename == str(tmp_path / "input.bin")
    assert entries(tmp_path) == []


def test_symlink_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_bytes(b"old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic_write_bytes(link, b"new")
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert entries(tmp_path) == ["link.json", "real.json"]
