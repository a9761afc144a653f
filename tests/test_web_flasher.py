"""The web flasher and chat pages (firmware/web) in headless Chromium: the
site as `mpllm.board.release site` assembles it, served from 127.0.0.1.

  * both pages load with no console error, with the real (vendored)
    esp-web-tools and the generated manifests;
  * raw_repl.js and serve_protocol.js replay the recorded MicroPython
    session of the chat's requests (tests/data/raw_repl_transcript.json)
    byte for byte through a scripted fake port (tests/web/fake_port.js), as
    recorded and one byte per read, and read the events engine_process.py's
    parser reads from the same bytes;
  * the chat page, driven like a user over that fake port, co-writes the
    recorded story.
"""

from __future__ import annotations

import ast
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import llm
import llm_chat
import pytest
from browser import chromium, console_errors, save_screenshot
from conftest import web_tools_tarball
from mpllm.board import release
from mpllm.web.engine_process import parse_events

ROOT = Path(__file__).resolve().parent.parent
TEST_WEB = ROOT / "tests" / "web"
TRANSCRIPT = json.loads((ROOT / "tests" / "data" / "raw_repl_transcript.json").read_text())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> Path:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("web")
    fw = tmp / "firmware.bin"
    fw.write_bytes(b"\xe9" + bytes(4095))
    release.build_assets(fw, tiny_model.image, tmp / "dist", "v0.0.0-test")
    release.assemble_site(tmp / "dist", tmp / "site", web_tools_tarball())
    return tmp / "site"


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, directory=str(site), **k)

        def translate_path(self, path: str) -> str:
            # the tests' own scripts beside the site, under /tests/web/
            if path.startswith("/tests/web/"):
                return str(TEST_WEB / Path(path.split("?")[0]).name)
            return super().translate_path(path)

        def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
            pass

    Handler.extensions_map = {**Handler.extensions_map, ".js": "text/javascript"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b


def test_flash_page_loads_esp_web_tools_and_the_manifests(browser, base_url: str) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page()
    errors = console_errors(page)
    page.goto(f"{base_url}/index.html")
    page.wait_for_function("customElements.get('esp-web-install-button') !== undefined")
    page.wait_for_selector("#parts tbody tr:nth-child(2)")
    rows = page.eval_on_selector_all(
        "#parts tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert [r[:2] for r in rows] == [[release.FIRMWARE_ASSET, "0x0"],
                                     [release.MODEL_ASSET, "0x200000"]]
    assert "v0.0.0-test" in page.text_content("#release")
    # esp-web-tools reads the manifest beside the page
    assert page.get_attribute("esp-web-install-button", "manifest") == release.WEB_MANIFEST
    save_screenshot(page, "web-flasher.png")
    assert errors == []
    page.close()


def _cases(browser, base_url: str):  # type: ignore[no-untyped-def]
    page = browser.new_page()
    errors = console_errors(page)
    page.goto(f"{base_url}/chat.html")
    return page, errors


def _merged(events: list[dict]) -> list[dict]:
    """Events with the pieces between two other events joined (how a
    reply's text is cut into pieces depends on the reads)."""
    out: list[dict] = []
    for e in events:
        if "piece" in e and out and "piece" in out[-1]:
            out[-1] = {"piece": out[-1]["piece"] + e["piece"]}
        else:
            out.append(dict(e))
    return out


def _board_output(session: dict) -> str:
    """A request's output as mpremote's consumer got it (latin-1 text of
    its bytes, the closing 0x04 included)."""
    return (session["stdout"].encode() + b"\x04").decode("latin-1")


@pytest.mark.parametrize("rx_chunk", [0, 1])
def test_the_page_protocol_replays_the_recorded_session(browser, base_url: str,  # type: ignore[no-untyped-def]
                                                        rx_chunk: int) -> None:
    """serve_protocol.js's runRequest, one raw-REPL session per request,
    against the recorded bytes: it sends exactly the recorded code and reads
    the events engine_process.py's parser reads from the same output."""
    page, errors = _cases(browser, base_url)
    got = page.evaluate("""async ([t, n]) => {
        const cases = await import('/tests/web/raw_repl_cases.js');
        return cases.replaySessions(t, {rxChunk: n});
    }""", [TRANSCRIPT, rx_chunk])
    assert "error" not in got, got
    assert got["mismatch"] is None and got["finished"] is True
    for want, have in zip(TRANSCRIPT["sessions"], got["results"], strict=True):
        assert have["code"] == want["code"]  # the page sends what was recorded
        python = parse_events([_board_output(want).encode("latin-1")])
        assert _merged(have["events"]) == _merged(python)
        assert have["last"] == python[-1] and ("done" in python[-1] or "error" in python[-1])
    if rx_chunk == 1:  # streamed as it came, and UTF-8 split across reads was joined
        turn = got["results"][1]["events"]
        assert sum("piece" in e for e in turn) > 100
        assert _merged(got["results"][2]["events"])[0] == {"line": " Tom said: caf\u00e9"}
    assert errors == []
    page.close()


def test_js_and_python_parsers_read_the_same_events(browser, base_url: str) -> None:  # type: ignore[no-untyped-def]
    """parseEvents (serve_protocol.js) and parse_events (engine_process.py)
    on each recorded request's output, cut into reads of 1, 2, 3, 7 bytes and
    whole: the same events, piece for piece."""
    sizes = [0, 1, 2, 3, 7]
    # and a reply with non-ASCII text in its pieces (the demo model's replies
    # have none): one-byte reads split its UTF-8
    written = '\x1e{"line": "Tom said:"}\n caf\u00e9 \u2014 ok\x1e{"done": {"ok": true}}\n\x04'
    # and what a board prints (its stdout writes each newline as CR LF; the
    # unix port's, which made the recording, does not)
    board = written.replace("\n", "\r\n").replace(" ok", " ok\n\nThe end")
    outputs = [_board_output(s) for s in TRANSCRIPT["sessions"]] + \
        [board.encode().decode("latin-1"), written.encode().decode("latin-1")]
    page, errors = _cases(browser, base_url)
    got = page.evaluate("""async ([outputs, sizes]) => {
        const cases = await import('/tests/web/raw_repl_cases.js');
        return outputs.map((o) => cases.parseInPieces(o, sizes));
    }""", [outputs, sizes])
    for output, js in zip(outputs, got, strict=True):
        data = output.encode("latin-1")
        for n, js_events in zip(sizes, js, strict=True):
            step = n or len(data)
            python = parse_events([data[i:i + step] for i in range(0, len(data), step)])
            assert js_events == python, (n, output[:80])
    cooked = got[-2][0]
    assert cooked[0] == {"line": "Tom said:"} and cooked[-1] == {"done": {"ok": True}}
    assert "".join(e.get("piece", "") for e in cooked) == " caf\u00e9 \u2014 ok\n\nThe end"
    one_byte_reads = got[-1][1]
    assert len(one_byte_reads) > 10  # a piece per character
    assert "".join(e.get("piece", "") for e in one_byte_reads) == " caf\u00e9 \u2014 ok"
    assert got[2][1][0] == {"line": " Tom said: caf\u00e9"}  # split inside an RS frame
    assert errors == []
    page.close()


def test_raw_repl_js_edge_cases(browser, base_url: str) -> None:  # type: ignore[no-untyped-def]
    page, errors = _cases(browser, base_url)
    got = page.evaluate("""async (steps) => {
        const c = await import('/tests/web/raw_repl_cases.js');
        return {plain: await c.plainRawMode(), silent: await c.silentBoard(),
                stopped: await c.stoppedReply(), broken: c.brokenFrame(),
                builders: c.requestBuilders(), steps: c.pageRequests(steps)};
    }""", [s["step"] for s in TRANSCRIPT["sessions"]])
    assert got["plain"] == {"stdout": "xxx\r\n", "stderr": "", "finished": True,
                            "rawPaste": False}
    assert got["silent"].startswith("true: timed out waiting for the raw REPL banner")
    # Stop: Ctrl-C went out after the first piece, and the request ended with
    # what the board raised, after the line and the piece it had written
    stopped = got["stopped"]
    assert stopped["mismatch"] is None and stopped["finished"] is True
    assert stopped["events"] == [{"line": "Once"}, {"piece": " upon"}]
    assert stopped["last"] == {"error": "the board raised KeyboardInterrupt:"}
    assert got["broken"].startswith("true: the board sent an event that is not JSON")
    assert '"{not json"' in got["broken"]
    builders = got["builders"]
    assert builders["refusals"] == [
        "RangeError: maxTokens must be an integer from 1 to 9007199254740991, not 0",
        "RangeError: seed must be an integer from 0 to 9007199254740991, not -1",
        "RangeError: seed must be an integer from 0 to 9007199254740991, not 1.5",
        # JavaScript writes 2 ** 60 with 17 significant digits
        "RangeError: seed must be an integer from 0 to 9007199254740991, not 1152921504606847000",
        "RangeError: temperature must be a number >= 0, not -1",
        "RangeError: temperature must be a number >= 0, not NaN",
        "RangeError: Type how the story goes on first.",
        *[f"RangeError: Not a command: {c}. Commands: /new, /undo, /seed N, /temp T."
          for c in ("/seed", "/seed x", "/temp", "/undo now", "/help")],
        "TypeError: a request is an object with an op",
    ]
    sid = "web-serial"
    assert builders["known"] == [
        {"op": "turn", "sid": sid, "line": "a line"}, {"op": "new", "sid": sid},
        {"op": "undo", "sid": sid}, {"op": "seed", "sid": sid, "seed": 5},
        {"op": "temp", "sid": sid, "temperature": 0.5},
        {"op": "temp", "sid": sid, "temperature": -1}]
    # what the page opens: llm_chat.TURN_TOKENS a reply, llm.TEMPERATURE, a fresh seed
    assert builders["open"] == {"op": "open", "sid": sid, "seed": None,
                                "temperature": llm.TEMPERATURE, "max_tokens": llm_chat.TURN_TOKENS}
    # the code is one call whose argument, read as Python, is the request's JSON
    head, call = builders["code"].rstrip("\n").split("\n")
    assert head == "import llm_serve" and call.startswith("llm_serve.run(")
    assert json.loads(ast.literal_eval(call[len("llm_serve.run("):-1])) == {
        "op": "turn", "sid": sid, "line": 'say "hi"\\'}
    # the recorded requests are what the page makes of the recorded steps today
    assert got["steps"] == [s["request"] for s in TRANSCRIPT["sessions"]]
    assert errors == []
    page.close()


FAKE_SERIAL = """
window.__transcript = %s;
Object.defineProperty(navigator, "serial", {configurable: true, value: {
  requestPort: async () => {
    const {ScriptedPort} = await import("/tests/web/fake_port.js");
    window.__port = new ScriptedPort(window.__transcript.events, {rxChunk: 3});
    return window.__port;
  },
}});
"""

IDLE = "!document.getElementById('send').disabled"


def test_chat_page_cowrites_the_recorded_story(browser, base_url: str) -> None:  # type: ignore[no-untyped-def]
    """The page driven like a user over the recorded session: Connect opens
    the story, each line is a turn shown with its reply and the board's
    ms/token, Undo takes the last turn back, a refused command shows the
    board's error, New story clears it."""
    sessions = TRANSCRIPT["sessions"]
    page = browser.new_page()
    page.add_init_script(FAKE_SERIAL % json.dumps(TRANSCRIPT))
    errors = console_errors(page)
    page.goto(f"{base_url}/chat.html")
    page.fill("#seed", str(sessions[0]["step"]["open"]["seed"]))
    page.click("#connect")
    page.wait_for_function(IDLE)
    assert page.text_content("#status") == "connected"
    assert page.text_content("#where") == "A new story: seed 7, context 256 tokens."

    def events(i: int) -> list[dict]:
        return _merged(parse_events([_board_output(sessions[i]).encode("latin-1")]))

    def turn(i: int) -> tuple[str, str]:
        line, reply, _done = events(i)
        return line["line"], reply["piece"]

    def story() -> list[str]:
        return page.eval_on_selector_all("#story span", "spans => spans.map(s => s.textContent)")

    def send(i: int, how: str = "enter") -> None:
        if how == "enter":
            page.fill("#line", sessions[i]["step"]["line"])
            page.press("#line", "Enter")
        else:
            page.click(how)
        page.wait_for_function(IDLE)

    send(1)
    assert story() == list(turn(1))
    assert page.text_content("#engine-speed") == \
        f"{events(1)[-1]['done']['engine_ms_per_token']:.2f}"
    assert page.text_content("#tokens") == str(events(1)[-1]["done"]["tokens"])
    assert page.input_value("#line") == ""
    send(2)
    assert story() == [*turn(1), *turn(2)]
    send(3, "#undo")
    assert story() == list(turn(1)) and page.text_content("#status") == "Took back the last turn."
    send(4)
    assert story() == [*turn(1), *turn(4)]
    assert "".join(story()).startswith("Once upon a time") and page.text_content("#error") == ""
    save_screenshot(page, "web-chat.png")
    send(5)
    assert page.text_content("#error") == events(5)[-1]["error"]
    assert story() == [*turn(1), *turn(4)]  # a refused command leaves the story as it was
    send(6, "#new")
    assert story() == [] and page.text_content("#status") == "A new story."
    assert page.evaluate("window.__port.finished() && window.__port.mismatch === null")
    assert errors == []
    page.close()
