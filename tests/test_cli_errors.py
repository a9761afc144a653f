"""Bad input to the command-line tools: one line saying what was wrong, no traceback,
nothing half-written (issue 24's abuse findings, items 1 and 3).

The tools run as a user runs them (`python tools/X.py` in a subprocess) where the
output of the whole process matters, and in-process where a stand-in proves that
nothing ran before the error. tests/test_flash.py holds flash.py's; tests/test_atomic.py
the writer's own.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import engine_ext
import pytest
from conftest import ROOT, ModelFiles
from mpllm import atomic

engine_ext.load()  # the tools below run the checkout's _llm

DEMO = ROOT / "models" / "demo"


def run_tool(tool: str, *args: str, cwd: Path | None = None, stdin: bytes = b"",
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "tools"), str(ROOT / "firmware" / "modules")]))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / tool), *args], cwd=cwd, env=env,
                       input=stdin, capture_output=True, timeout=timeout, check=False)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def one_line(err: str) -> str:
    """The whole of stderr, which must be one line; returned without its newline."""
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err[:-1]


@pytest.fixture
def corrupted(tiny_model: ModelFiles, tmp_path: Path) -> Path:
    bad = tmp_path / "corrupted.img"
    data = bytearray(tiny_model.image.read_bytes())
    data[-1] ^= 0xFF  # the last section's payload: its CRC no longer matches
    bad.write_bytes(bytes(data))
    return bad


# ---------------------------------------------------------------------------
# convert.py


def convert_args(m: ModelFiles, out: Path | str) -> list[str]:
    return [str(m.model_bin), str(m.tokenizer_json), "-o", str(out), "-q",
            "--drafter-stories", "0"]


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="no /dev/full here")
def test_convert_to_a_full_device(tiny_model: ModelFiles) -> None:
    assert atomic._kind("/dev/full") == "stream"  # else the run could replace /dev/full
    r = run_tool("convert.py", *convert_args(tiny_model, "/dev/full"))
    assert r.returncode == 2
    assert one_line(r.stderr) == "error: cannot write /dev/full: No space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_convert_to_a_directory_or_a_missing_folder(tiny_model: ModelFiles,
                                                     tmp_path: Path) -> None:
    r = run_tool("convert.py", *convert_args(tiny_model, tmp_path))
    assert r.returncode == 2
    assert one_line(r.stderr) == f"error: cannot write {tmp_path}: it is a directory; name " \
                                 f"a file in it"
    missing = tmp_path / "no" / "x.img"
    r = run_tool("convert.py", *convert_args(tiny_model, missing))
    assert one_line(r.stderr) == (f"error: cannot write {missing}: the folder {missing.parent} "
                                  f"does not exist")
    assert list(tmp_path.iterdir()) == []


def test_convert_deeply_nested_tokenizer(tiny_model: ModelFiles, tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer.json"
    tok.write_text("[" * 100_000 + "]" * 100_000)
    r = run_tool("convert.py", str(tiny_model.model_bin), str(tok), "-o",
                 str(tmp_path / "x.img"), "-q")
    assert r.returncode == 2
    assert one_line(r.stderr) == (f"error: {tok}: JSON nested too deeply (thousands of "
                                  f"levels); not a tokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]


def test_ctrl_c_during_convert(tmp_path: Path) -> None:
    """SIGINT while the image is being made (its staging file exists): one line,
    exit 130, the previous output as it was and no staging file left."""
    out = tmp_path / "out.img"
    out.write_bytes(b"the previous image")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tools"))
    # thousands of drafter stories: far longer than the wait for the staging file
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "convert.py"),
                             str(DEMO / "model.bin"), str(DEMO / "tokenizer.json"), "-o",
                             str(out), "-q", "--drafter-stories", "20000"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".out.img.*.tmp")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no staging file appeared"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert one_line(err.decode()) == f"interrupted; {out} was not written"
    assert out.read_bytes() == b"the previous image"
    assert [p.name for p in tmp_path.iterdir()] == ["out.img"]


# ---------------------------------------------------------------------------
# bench.py


def test_bench_report_to_a_directory_fails_before_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tiny_model: ModelFiles) -> None:
    from mpllm.board import bench_cli

    def must_not_run(*a: object, **k: object) -> None:
        raise AssertionError("the report ran before its output was checked")

    monkeypatch.setattr(bench_cli, "report_info", must_not_run)
    monkeypatch.setattr(bench_cli, "run_host", must_not_run)
    rc = bench_cli.main(["--board", "host", "--image", str(tiny_model.image), "--report",
                         str(tmp_path)])
    assert rc == 2
    assert one_line(capsys.readouterr().err) == (f"bench.py: cannot write {tmp_path}: it is a "
                                                 f"directory; name a file in it")


def test_bench_checks_every_output_before_writing_any(tmp_path: Path) -> None:
    """--model-s3 writes a plot and a JSON: a JSON that cannot be written is found
    before the plot lands in the current directory."""
    r = run_tool("bench.py", "--model-s3", "--json", str(tmp_path / "no" / "x.json"),
                 cwd=tmp_path)
    assert r.returncode == 2
    assert one_line(r.stderr).endswith(f"the folder {tmp_path / 'no'} does not exist")
    assert list(tmp_path.iterdir()) == []


def test_bench_port_that_does_not_exist(tmp_path: Path) -> None:
    r = run_tool("bench.py", "--port", str(tmp_path / "ttyNONE"), "--quiet")
    assert r.returncode == 1
    assert one_line(r.stderr) == f"bench.py: failed to access {tmp_path / 'ttyNONE'}"


@pytest.mark.parametrize("tool", ["bench.py", "chat.py", "serve.py"])
def test_image_that_is_not_a_model_image(tool: str, tmp_path: Path, corrupted: Path) -> None:
    """A directory, a device and a corrupted file each say what they are (not "not
    found"), before any engine starts."""
    board = {"bench.py": ["--board", "host", "--quiet"], "chat.py": ["--board", "host"],
             "serve.py": ["--board", "host", "--http-port", "0"]}[tool]
    tail = ["Once upon a time"] if tool == "chat.py" else []
    prefix = "bench.py: " if tool == "bench.py" else "error: "
    want = {tmp_path: f"--image {tmp_path} is a directory, not a model image file",
            Path(os.devnull): f"--image {os.devnull} is not a regular file (a device or a "
                              f"pipe), so not a model image",
            corrupted: f"--image {corrupted} is not a valid mpllm model image (section"}
    for image, message in want.items():
        r = run_tool(tool, *board, "--image", str(image), *tail)
        assert r.returncode == 2, r.stderr
        assert one_line(r.stderr).startswith(prefix + message)


# ---------------------------------------------------------------------------
# serve.py


@pytest.mark.parametrize("args,message", [
    (["--http-port", "70000"], ("argument --http-port: 70000 is not a TCP port (0..65535; 0: "
                               "any free one)")),
    (["--load-test", "--seconds", "nan"], ("argument --seconds: must be a number of seconds "
                                          "above 0, not nan")),
    (["--load-test", "--seconds", "-1"], ("argument --seconds: must be a number of seconds "
                                         "above 0, not -1")),
    (["--engines", "0"], "argument --engines: must be at least 1, not 0"),
    (["--max-queue", "0"], "argument --max-queue: must be at least 1, not 0"),
])
def test_serve_arguments_refused(args: list[str], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from mpllm.web import cli

    with pytest.raises(SystemExit) as e:
        cli.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == f"serve.py: error: {message}"


def test_serve_outputs_checked_before_the_engines_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from mpllm.web import cli

    monkeypatch.setattr(cli, "_pool", lambda *a: pytest.fail("engines started"))
    rc = cli.main(["--load-test", "--json", str(tmp_path / "no" / "load.json")])
    assert rc == 2
    assert one_line(capsys.readouterr().err) == (
        f"error: cannot write {tmp_path / 'no' / 'load.json'}: the folder {tmp_path / 'no'} "
        f"does not exist")
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["--load-test", "--json", "load.json", "--plot", str(tmp_path)])
    assert rc == 2 and "it is a directory" in capsys.readouterr().err


def test_serve_port_that_does_not_exist(tmp_path: Path) -> None:
    """The engine says why it cannot start, the server that it did not: no traceback."""
    port = tmp_path / "ttyNONE"
    r = run_tool("serve.py", "--port", str(port), "--http-port", "0")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "Event loop is closed" not in r.stderr
    assert r.stderr.splitlines() == [f"engine_process: failed to access {port}",
                                     ("error: engine 0 did not start (exit status 1; its "
                                     "message is above)")]


def test_serve_http_port_in_use(tiny_model: ModelFiles) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_tool("serve.py", "--image", str(tiny_model.image), "--engines", "2",
                     "--http-port", str(port))
    assert r.returncode == 2
    assert one_line(r.stderr) == f"error: cannot listen on 127.0.0.1 port {port}: address already in use"


# ---------------------------------------------------------------------------
# chat.py


def test_chat_input_that_is_not_utf8(tiny_model: ModelFiles) -> None:
    r = run_tool("chat.py", "--image", str(tiny_model.image), "--max-tokens", "3",
                 stdin=b"Once upon a \xff\xfe time\n")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [("error: the input is not UTF-8 text (byte 0xff: invalid "
                                     "start byte)")]


def test_chat_prompt_that_is_not_utf8(tiny_model: ModelFiles) -> None:
    r = run_tool("chat.py", "--image", str(tiny_model.image), os.fsdecode(b"Once \xff"))
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == ("chat.py: error: the prompt is not UTF-8 text (as this "
                                         "system passed it to the command)")


@pytest.mark.parametrize("stdout_is", ["a pipe", "a file"])
def test_convert_to_dev_stdout(stdout_is: str, tiny_model: ModelFiles, tmp_path: Path) -> None:
    """-o /dev/stdout is written in place: the image arrives on stdout whole, and the
    line after it too (renaming over a redirect's file would lose what follows)."""
    log = tmp_path / "stdout"
    with open(log, "wb") as f:
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert.py"),
                            *convert_args(tiny_model, "/dev/stdout")],
                           stdout=subprocess.PIPE if stdout_is == "a pipe" else f,
                           stderr=subprocess.PIPE, timeout=120, check=False,
                           env=dict(os.environ, PYTHONPATH=str(ROOT / "tools")))
    assert r.returncode == 0, r.stderr
    got = r.stdout if stdout_is == "a pipe" else log.read_bytes()
    image = tiny_model.image.read_bytes()
    assert got == image + f"wrote /dev/stdout ({len(image):,} bytes)\n".encode()
