"""The release model on a PC: `tools/chat.py --board host --model release` (and
serve.py) downloads the pinned files once (resuming a .part), converts them
once and writes; with no network it says so in one line, with how to place
the files by hand, and exits 2; with the files placed by hand it works.

No network here: models/release.json is replaced by pins of the tiny test
model's files, served by an http.server on 127.0.0.1 (one that answers range
requests, and one that does not); "no network" is a closed local port.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import engine_ext  # noqa: F401 - puts the in-place _llm first
import pytest
from mpllm.board import chat, flash
from mpllm.models import NAMED_MODELS, NamedModel
from mpllm.web import cli as serve_cli

PROMPT = "Once upon a time"


class Served:
    """An http.server on loopback over `root`; `ranges`: answer Range requests
    (206) as a CDN does. Records the Range headers it was sent."""

    def __init__(self, root: Path, ranges: bool) -> None:
        self.ranges_seen: list[str | None] = []
        seen = self.ranges_seen

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
                super().__init__(*a, directory=str(root), **k)

            def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
                pass

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                seen.append(rng)
                path = Path(self.translate_path(self.path))
                if not (ranges and rng and path.is_file()):
                    super().do_GET()
                    return
                data = path.read_bytes()
                start = int(rng.removeprefix("bytes=").rstrip("-"))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                self.wfile.write(data[start:])

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the with ends: nothing listens there


@pytest.fixture
def files(tiny_model) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return {"model.bin": tiny_model.model_bin.read_bytes(),
            "tokenizer.json": tiny_model.tokenizer_json.read_bytes()}


def pin_release(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, base: str,
                files: dict[str, bytes]) -> Path:
    """models/release.json's stand-in: these files, at base/NAME."""
    pins = tmp_path / "release.json"
    pins.write_text(json.dumps({"files": [
        {"name": n, "url": f"{base}/{n}", "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
        for n, d in files.items()]}))
    monkeypatch.setitem(NAMED_MODELS, "release",
                        NamedModel("release", "the test's release", pins=pins))
    return pins


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    c = tmp_path / "cache"
    monkeypatch.setenv("MPLLM_CACHE", str(c))
    yield c


def test_release_downloads_once_converts_once_and_writes(
        tmp_path: Path, files: dict[str, bytes], cache: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "served"
    root.mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    server = Served(root, ranges=True)
    pin_release(monkeypatch, tmp_path, server.base, files)
    # a download stopped part way: the .part is resumed with a range request
    dest = cache / "models" / "release"
    dest.mkdir(parents=True)
    (dest / "model.bin.part").write_bytes(files["model.bin"][:1000])
    args = ["--board", "host", "--model", "release", "--greedy", "--max-tokens", "5", PROMPT]
    try:
        assert chat.main(args) == 0
    finally:
        server.close()
    out, err = capfd.readouterr()
    assert out.startswith(PROMPT) and len(out) > len(PROMPT)
    assert "resuming after 1000)" in err and "first run only" in err
    assert server.ranges_seen == ["bytes=1000-", None]
    assert sorted(p.name for p in dest.iterdir()) == ["model.bin", "tokenizer.json"]
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
    images = list((cache / "images").glob("*.img"))
    assert len(images) == 1
    # the second run: no network needed, nothing converted again, the same story
    assert chat.main(args) == 0
    again_out, again_err = capfd.readouterr()
    assert again_out == out and "first run only" not in again_err
    assert list((cache / "images").glob("*.img")) == images


def test_a_server_that_ignores_ranges_sends_it_all_again(
        tmp_path: Path, files: dict[str, bytes], cache: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "served"
    root.mkdir()
    (root / "model.bin").write_bytes(files["model.bin"])
    server = Served(root, ranges=False)
    data = files["model.bin"]
    pin = flash.PinnedFile("model.bin", f"{server.base}/model.bin", len(data),
                           hashlib.sha256(data).hexdigest())
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "model.bin.part").write_bytes(data[:1000])
    try:
        got = flash.fetch_pinned(pin, dest, flash.Runner(False))
    finally:
        server.close()
    assert got.read_bytes() == data and not (dest / "model.bin.part").exists()
    assert server.ranges_seen == ["bytes=1000-"]


def test_no_network_is_one_line_then_files_placed_by_hand_work(
        tmp_path: Path, files: dict[str, bytes], cache: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    pins = pin_release(monkeypatch, tmp_path, f"http://127.0.0.1:{closed_port()}", files)
    args = ["--board", "host", "--model", "release", "--greedy", "--max-tokens", "5", PROMPT]
    assert chat.main(args) == 2
    out, err = capfd.readouterr()
    dest = cache / "models" / "release"
    assert out == "" and err.count("\n") == 1 and err.startswith("error: cannot download model.bin")
    assert "No network? Put model.bin" in err and "and tokenizer.json" in err
    assert f" in {dest} by hand and run this again (they are checked against {pins.name})" in err
    assert f"({len(files['model.bin']):,} bytes, " in err
    assert not list(cache.rglob("*.img")) and not list(cache.rglob("*.part"))
    # serve.py --model release: the same line, the same status
    assert serve_cli.main(["--board", "host", "--model", "release"]) == 2
    assert capfd.readouterr().err == err

    # the files placed by hand, as the line says: a story, with no network
    for name, data in files.items():
        (dest / name).write_bytes(data)
    assert chat.main(args) == 0
    out, err = capfd.readouterr()
    assert out.startswith(PROMPT) and len(out) > len(PROMPT)
    assert "model.bin: cached copy verified" in err

    # a wrong file placed by hand is not used (and with no network, said so)
    (dest / "tokenizer.json").write_bytes(b"{}")
    shutil.rmtree(cache / "images")
    assert chat.main(args) == 2
    err = capfd.readouterr().err
    assert "tokenizer.json: the copy in" in err and "does not match its pin" in err
    assert "error: cannot download tokenizer.json" in err and not list(cache.rglob("*.img"))
    # the line names the file to place again (before: "Put  in ...", naming none)
    assert "No network? Put tokenizer.json (" in err and "; the one there does not match) in" in err
    assert "Put model.bin" not in err  # (verified: it stays)
