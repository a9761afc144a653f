// The board's co-writing protocol, as the chat page speaks it over the raw
// REPL: the same requests and events as the web server's board backend
// (tools/mpllm/web/engine_process.py, BoardEngine), answered by the board's
// frozen module llm_serve (firmware/modules/llm_serve.py says what each
// request does). No dependencies: the page and the tests import it as is.
//
// A request is one line of Python, llm_serve.run(<the request as JSON>). The
// board prints each piece of a reply as it is written, and every other event
// as RS (0x1e), its JSON, newline; the last event is a "done" or an "error".

const RS = 0x1e;
const CTRL_D = 0x04;
const LF = 0x0a;
const CR = 0x0d;

/**
 * The page's story on the board. One program at a time can hold a serial
 * port, so one page talks to a board at a time; a fixed name means that a
 * page opening its story replaces the last page's (llm_serve's "open" does)
 * instead of leaving it on the board.
 */
export const PAGE_SID = "web-serial";
/** The model's tokens per reply, as llm_chat.TURN_TOKENS (the rest of the project's chats). */
export const TURN_TOKENS = 60;
/** llm.TEMPERATURE: the sampling temperature when the page is not given one. */
export const DEFAULT_TEMPERATURE = 0.8;
/** What the page's commands are, for its help text and its errors. */
export const COMMANDS_HELP = "Commands: /new, /undo, /seed N, /temp T.";

/** The board's output broke the protocol (an event that is not JSON); the message says how. */
export class ServeProtocolError extends Error {
  constructor(message) {
    super(message);
    this.name = "ServeProtocolError";
  }
}

/**
 * The Python that answers `request` on the board. A JSON string is also a
 * Python string literal (JSON.stringify never writes "\/"), so the request's
 * JSON arrives as it was made, any line as typed. The import is there for a
 * board that was reset since the last request (a no-op otherwise).
 */
export function serveCode(request) {
  if (request === null || typeof request !== "object" || typeof request.op !== "string") {
    throw new TypeError("a request is an object with an op");
  }
  return `import llm_serve\nllm_serve.run(${JSON.stringify(JSON.stringify(request))})\n`;
}

/**
 * llm_serve.run()'s output, pushed as it arrives, turned into events:
 * {piece}, {line}, then {done} or {error}; `ended` once that last one came
 * (bytes after it are ignored). UTF-8 split across reads is joined; 0x04
 * (which ends the raw REPL's output) and CR (a board's stdout sends CR LF) are
 * dropped. The same parser as
 * engine_process.py's EventParser, byte for byte (a test holds them to it).
 */
export class ServeEventParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.ended = false;
    this._text = new TextDecoder("utf-8"); // invalid bytes become U+FFFD, as "replace" does
    this._frame = [];
    this._inFrame = false;
  }

  push(bytes) {
    // 0x04 ends the raw REPL's output; a board's stdout writes each newline as
    // CR LF. A piece (llm.shown) or a JSON frame holds neither raw.
    let data = bytes.filter((b) => b !== CTRL_D && b !== CR);
    while (data.length && !this.ended) {
      if (this._inFrame) {
        const at = data.indexOf(LF);
        const part = at < 0 ? data : data.subarray(0, at);
        for (const b of part) this._frame.push(b);
        if (at < 0) return;
        const event = this._parseFrame();
        this.ended = !("piece" in event) && !("line" in event);
        this.onEvent(event);
        this._frame = [];
        this._inFrame = false;
        data = data.subarray(at + 1);
      } else {
        const at = data.indexOf(RS);
        const text = this._text.decode(at < 0 ? data : data.subarray(0, at), { stream: true });
        if (text) this.onEvent({ piece: text });
        if (at < 0) return;
        this._inFrame = true;
        data = data.subarray(at + 1);
      }
    }
  }

  _parseFrame() {
    let json;
    try {
      json = new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(this._frame));
      const event = JSON.parse(json);
      if (event === null || typeof event !== "object") throw new SyntaxError("not an object");
      return event;
    } catch (e) {
      throw new ServeProtocolError(`the board sent an event that is not JSON (${e.message}): ` +
                                   JSON.stringify(json ?? "invalid UTF-8"));
    }
  }
}

/** The events in llm_serve.run()'s output, read in these chunks (Uint8Arrays). */
export function parseEvents(chunks) {
  const events = [];
  const parser = new ServeEventParser((e) => events.push(e));
  for (const chunk of chunks) parser.push(chunk);
  return events;
}

/** The line of a traceback that says what went wrong. */
function lastLine(text) {
  const lines = text.trim().split("\n");
  return lines[lines.length - 1].trim();
}

/**
 * One request, in a raw-REPL session of its own (enter, exec, follow, exit):
 * each event goes to onEvent as it arrives. Returns the last event, a
 * {done} or an {error}; when the board ended without one (an exception,
 * e.g. the KeyboardInterrupt of Ctrl-C), an {error} saying what it raised,
 * as BoardEngine does. A board that stops answering throws ReplError.
 */
export async function runRequest(repl, request, onEvent = () => {}) {
  const code = serveCode(request);
  let last = null;
  const parser = new ServeEventParser((event) => {
    if (!("piece" in event) && !("line" in event)) last = event;
    onEvent(event);
  });
  await repl.enter();
  await repl.execNoFollow(code);
  const stderr = await repl.followBytes((bytes) => parser.push(bytes));
  await repl.exit();
  if (last !== null) return last;
  const raised = stderr.trim() ? lastLine(stderr) : "nothing: its answer was cut off";
  return { error: `the board raised ${raised}` };
}

function checkedInteger(name, value, min) {
  // past 2**53 a JSON number would reach the board rounded
  if (!Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`${name} must be an integer from ${min} to ${Number.MAX_SAFE_INTEGER}, not ${value}`);
  }
  return value;
}

function checkedTemperature(value) {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`temperature must be a number >= 0, not ${value}`);
  }
  return value;
}

/**
 * The request that opens a story: seed undefined lets the board choose a
 * fresh one (its "done" says which).
 */
export function openRequest(sid, { seed, temperature = DEFAULT_TEMPERATURE,
                                   maxTokens = TURN_TOKENS } = {}) {
  return {
    op: "open", sid,
    seed: seed === undefined ? null : checkedInteger("seed", seed, 0),
    temperature: checkedTemperature(temperature),
    max_tokens: checkedInteger("maxTokens", maxTokens, 1),
  };
}

/**
 * What a typed line asks for: a turn, or one of tools/chat.py's commands
 * (/new, /undo, /seed N, /temp T). Throws RangeError for an empty line or a
 * command it does not know; the board checks the values themselves.
 */
export function lineRequest(sid, text) {
  const words = text.trim().split(/\s+/);
  if (!words[0]) throw new RangeError("Type how the story goes on first.");
  if (!words[0].startsWith("/")) return { op: "turn", sid, line: text };
  const [name, arg, extra] = words;
  if ((name === "/new" || name === "/undo") && arg === undefined) return { op: name.slice(1), sid };
  if (name === "/seed" && /^\d+$/.test(arg || "") && extra === undefined) {
    return { op: "seed", sid, seed: checkedInteger("seed", Number(arg), 0) };
  }
  if (name === "/temp" && /^-?\d+(\.\d*)?$|^-?\.\d+$/.test(arg || "") && extra === undefined) {
    return { op: "temp", sid, temperature: Number(arg) };
  }
  throw new RangeError(`Not a command: ${text.trim()}. ${COMMANDS_HELP}`);
}
