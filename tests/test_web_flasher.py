"""The web flasher and chat pages (firmware/web) in headless Chromium: the
site as `mpllm.board.release site` assembles it, served from 127.0.0.1.

  * both pages load with no console error, with the real (vendored)
    esp-web-tools and the generated manifests;
  * raw_repl.js replays the recorded MicroPython session
    (tests/data/raw_repl_transcript.json) byte for byte through a scripted
    fake port (tests/web/fake_port.js), as recorded and one byte per read;
  * the chat page, driven like a user over that fake port, shows the stories.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import chromium, console_errors, save_screenshot
from mpllm.board import release
from test_release import web_tools_tarball

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


@pytest.mark.parametrize("rx_chunk", [0, 1])
def test_raw_repl_js_replays_the_recorded_session(browser, base_url: str,  # type: ignore[no-untyped-def]
                                                  rx_chunk: int) -> None:
    page, errors = _cases(browser, base_url)
    got = page.evaluate("""async ([t, n]) => {
        const cases = await import('/tests/web/raw_repl_cases.js');
        return cases.replaySessions(t, {rxChunk: n});
    }""", [TRANSCRIPT, rx_chunk])
    assert "error" not in got, got
    assert got["mismatch"] is None and got["finished"] is True
    for want, have in zip(TRANSCRIPT["sessions"], got["results"], strict=True):
        assert have["code"] == want["code"]  # the page sends what was recorded
        assert (have["stdout"], have["stderr"]) == (want["stdout"], want["stderr"])
        assert have["streamed"] == want["stdout"]
    if rx_chunk == 1:  # streamed as it came, and UTF-8 split across reads was joined
        assert got["results"][0]["pieces"] > 20
        assert "caf\u00e9" in got["results"][2]["streamed"]
    assert errors == []
    page.close()


def test_raw_repl_js_edge_cases(browser, base_url: str) -> None:  # type: ignore[no-untyped-def]
    page, errors = _cases(browser, base_url)
    got = page.evaluate("""async () => {
        const c = await import('/tests/web/raw_repl_cases.js');
        return {plain: await c.plainRawMode(), silent: await c.silentBoard(),
                bad: c.badOptions()};
    }""")
    assert got["plain"] == {"stdout": "xxx\r\n", "stderr": "", "finished": True,
                            "rawPaste": False}
    assert got["silent"].startswith("true: timed out waiting for the raw REPL banner")
    assert got["bad"] == [
        "RangeError: maxTokens must be an integer >= 1, not 0",
        "RangeError: seed must be an integer >= 0, not -1",
        "RangeError: seed must be an integer >= 0, not 1.5",
        "RangeError: temperature must be a number >= 0, not -1",
        "RangeError: temperature must be a number >= 0, not NaN",
    ]
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


def test_chat_page_writes_the_recorded_stories(browser, base_url: str) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page()
    page.add_init_script(FAKE_SERIAL % json.dumps(TRANSCRIPT))
    errors = console_errors(page)
    page.goto(f"{base_url}/chat.html")
    page.click("#connect")
    page.wait_for_selector("#write:not([disabled])")
    for s in TRANSCRIPT["sessions"]:
        opts = s["options"]
        page.fill("#prompt", s["prompt"])
        page.fill("#max-tokens", str(opts.get("maxTokens", "")))
        page.fill("#seed", str(opts.get("seed", "")))
        page.fill("#temperature", str(opts.get("temperature", "")))
        page.click("#write")
        page.wait_for_function("document.getElementById('status').textContent === 'connected'"
                               " && !document.getElementById('write').disabled")
        assert page.text_content("#output") == s["stdout"]
        want_error = s["stderr"].strip().splitlines()[-1] if s["stderr"] else ""
        assert page.text_content("#error") == want_error
    assert page.evaluate("window.__port.finished() && window.__port.mismatch === null")
    save_screenshot(page, "web-chat.png")
    assert errors == []
    page.close()
