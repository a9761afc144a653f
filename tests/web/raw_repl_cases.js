// Cases for firmware/web/raw_repl.js and serve_protocol.js, run in headless
// Chromium by tests/test_web_flasher.py (which asserts on what they return).
import { RawRepl, ReplError } from "/raw_repl.js";
import {
  PAGE_SID, ServeProtocolError, lineRequest, openRequest, parseEvents, runRequest, serveCode,
} from "/serve_protocol.js";
import { ScriptedPort, latin1Bytes } from "/tests/web/fake_port.js";

/** Each recorded request the way the page runs it: runRequest (enter, exec, follow, exit). */
export async function replaySessions(transcript, { rxChunk = 0 } = {}) {
  const port = new ScriptedPort(transcript.events, { rxChunk });
  const repl = new RawRepl(port, { timeoutMs: 2000 });
  const results = [];
  try {
    for (const s of transcript.sessions) {
      const events = [];
      const last = await runRequest(repl, s.request, (e) => events.push(e));
      results.push({ code: serveCode(s.request), events, last });
    }
  } catch (e) {
    return { results, error: `${e.name}: ${e.message}`, mismatch: port.mismatch };
  }
  return { results, finished: port.finished(), mismatch: port.mismatch };
}

/** The events parseEvents reads from `output` (latin-1 text) cut in pieces of each size (0: whole). */
export function parseInPieces(output, sizes) {
  const bytes = latin1Bytes(output);
  return sizes.map((n) => {
    const chunks = [];
    const step = n || bytes.length || 1;
    for (let i = 0; i < bytes.length; i += step) chunks.push(bytes.slice(i, i + step));
    return parseEvents(chunks);
  });
}

/** The page's steps (as the recording script names them) made into requests, as the page does. */
export function pageRequests(steps) {
  return steps.map((s) => ("open" in s ? openRequest(PAGE_SID, s.open) : lineRequest(PAGE_SID, s.line)));
}

/** A board that refuses raw-paste ("R\x00"): the code goes in plain raw mode. */
export async function plainRawMode() {
  const code = "print('x' * 3)\n" + "#".repeat(300) + "\n"; // more than one 256-byte piece
  const events = [
    { tx: "\r\x03\r\x01" }, { rx: "\r\n>>> \r\nraw REPL; CTRL-B to exit\r\n>" },
    { tx: "\x05A\x01" }, { rx: "R\x00" },
    { tx: code + "\x04" }, { rx: "OK" }, { rx: "xxx\r\n\x04\x04>" },
    { tx: "\r\x02" },
  ];
  const port = new ScriptedPort(events);
  const repl = new RawRepl(port, { timeoutMs: 2000 });
  await repl.enter();
  const out = await repl.exec(code);
  await repl.exit();
  return { ...out, finished: port.finished(), rawPaste: repl.useRawPaste };
}

/** A port that never answers: enter() gives up with a ReplError naming what it waited for. */
export async function silentBoard() {
  const repl = new RawRepl(new ScriptedPort([{ tx: "\r\x03\r\x01" }]), { timeoutMs: 200 });
  try {
    await repl.enter();
    return "no error";
  } catch (e) {
    return `${e instanceof ReplError}: ${e.message}`;
  }
}

/** The opening of a raw-REPL session that runs `code` (raw-paste, one window). */
function sessionStart(code) {
  return [
    { tx: "\r\x03\r\x01" }, { rx: "\r\n>>> \r\nraw REPL; CTRL-B to exit\r\n>" },
    { tx: "\x05A\x01" }, { rx: "R\x01\x00\x01\x01" }, // a 256-byte window
    { tx: code + "\x04" }, { rx: "\x04" },
  ];
}

/**
 * Stop during a reply: the page writes Ctrl-C after the first piece, the
 * board's KeyboardInterrupt ends the request without a "done", and
 * runRequest says what the board raised.
 */
export async function stoppedReply() {
  const request = { op: "turn", sid: PAGE_SID, line: "Once" };
  const code = serveCode(request);
  const port = new ScriptedPort([
    ...sessionStart(code),
    { rx: '\x1e{"line": "Once"}\n upon' },
    { tx: "\x03" },
    { rx: "\x04Traceback (most recent call last):\r\n  File \"<stdin>\", line 2, in <module>\r\n" +
          "KeyboardInterrupt: \r\n\x04>" },
    { tx: "\r\x02" },
  ]);
  const repl = new RawRepl(port, { timeoutMs: 2000 });
  const events = [];
  const last = await runRequest(repl, request, (e) => {
    events.push(e);
    if (e.piece) repl.interrupt();
  });
  return { events, last, finished: port.finished(), mismatch: port.mismatch };
}

/** A board whose answer is not the protocol: ServeProtocolError, saying what came. */
export function brokenFrame() {
  try {
    parseEvents([latin1Bytes("text\x1e{not json\n")]);
    return "no error";
  } catch (e) {
    return `${e instanceof ServeProtocolError}: ${e.message}`;
  }
}

/** What the request builders refuse, and the commands they know. */
export function requestBuilders() {
  const refusals = [];
  const attempt = (fn) => {
    try {
      fn();
      refusals.push("accepted");
    } catch (e) {
      refusals.push(`${e.name}: ${e.message}`);
    }
  };
  for (const opts of [{ maxTokens: 0 }, { seed: -1 }, { seed: 1.5 }, { seed: 2 ** 60 },
                      { temperature: -1 }, { temperature: NaN }]) {
    attempt(() => openRequest(PAGE_SID, opts));
  }
  for (const text of ["   ", "/seed", "/seed x", "/temp", "/undo now", "/help"]) {
    attempt(() => lineRequest(PAGE_SID, text));
  }
  attempt(() => serveCode({ sid: PAGE_SID }));
  const known = ["a line", "/new", "/undo", "/seed 5", "/temp 0.5", "/temp -1"].map(
    (text) => lineRequest(PAGE_SID, text));
  return { refusals, known, open: openRequest(PAGE_SID), code: serveCode(lineRequest(PAGE_SID, 'say "hi"\\')) };
}
