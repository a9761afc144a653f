// MicroPython's raw REPL over a Web Serial port, driven the way mpremote drives
// it (enter, raw-paste with flow control, follow the output, leave), so that the
// page talks to the board exactly like tools/bench.py does over
// mpllm.board.transport. No dependencies: the page and the tests import it as is.
//
// The port is anything with `readable` (a ReadableStream of Uint8Array) and
// `writable` (a WritableStream): an opened Web Serial SerialPort, or the tests'
// scripted fake that replays a recorded MicroPython session.

const encoder = new TextEncoder();

/** What the board prints when it enters the raw REPL (Ctrl-A). */
export const RAW_BANNER = "raw REPL; CTRL-B to exit\r\n";
/** What it prints after a soft reset (Ctrl-D at an empty raw-REPL prompt). */
export const SOFT_REBOOT = "soft reboot\r\n";

const CTRL_A = 0x01, CTRL_B = 0x02, CTRL_C = 0x03, CTRL_D = 0x04, CTRL_E = 0x05;
// Raw-paste: the board answers "R\x01" when it takes it (then the window size,
// then one \x01 per window consumed), "R\x00" when it understands but refuses.
const RAW_PASTE_REQUEST = [CTRL_E, 0x41, CTRL_A];
// Without raw-paste the board has no flow control: send in 256-byte pieces
// with a pause between them, as mpremote does, so a slow UART keeps up.
const PLAIN_CHUNK = 256;
const PLAIN_PAUSE_MS = 10;

/** The board did not answer as the raw-REPL protocol says; the message says what was seen. */
export class ReplError extends Error {
  constructor(message) {
    super(message);
    this.name = "ReplError";
  }
}

function bytesOf(text) {
  return typeof text === "string" ? encoder.encode(text) : text;
}

function latin1(bytes) {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return s;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Buffered reading from a byte stream, with timeouts between bytes. */
export class ByteReader {
  constructor(readable) {
    this._reader = readable.getReader();
    this._buf = new Uint8Array(0);
    this._pending = null; // the read() in flight, kept across timeouts
  }

  /** Bytes already received and not yet consumed. */
  available() {
    return this._buf.length;
  }

  async _fill(timeoutMs) {
    if (this._pending === null) this._pending = this._reader.read();
    let timer;
    const expired = new Promise((resolve) => {
      timer = setTimeout(() => resolve(null), timeoutMs);
    });
    const got = await Promise.race([this._pending, expired]);
    clearTimeout(timer);
    if (got === null) return false; // timed out; the read stays in flight
    this._pending = null;
    if (got.done) throw new ReplError("the serial port closed");
    const joined = new Uint8Array(this._buf.length + got.value.length);
    joined.set(this._buf);
    joined.set(got.value, this._buf.length);
    this._buf = joined;
    return true;
  }

  _take(n) {
    const out = this._buf.slice(0, n);
    this._buf = this._buf.slice(n);
    return out;
  }

  /** Exactly n bytes; ReplError when none arrives for timeoutMs. */
  async readExactly(n, timeoutMs) {
    while (this._buf.length < n) {
      if (!(await this._fill(timeoutMs))) {
        throw new ReplError(`timed out waiting for ${n} bytes (have ${JSON.stringify(latin1(this._buf))})`);
      }
    }
    return this._take(n);
  }

  /** Everything up to and including `marker` (bytes or a string). */
  async readUntil(marker, timeoutMs, what) {
    const m = bytesOf(marker);
    for (;;) {
      const at = indexOf(this._buf, m);
      if (at >= 0) return this._take(at + m.length);
      if (!(await this._fill(timeoutMs))) {
        const tail = latin1(this._buf.slice(-80));
        throw new ReplError(`timed out waiting for ${what || JSON.stringify(latin1(m))}; ` +
                            `the board sent ${JSON.stringify(tail)}`);
      }
    }
  }

  /** Hand each received piece before the first `byte` to onData; consume the byte. */
  async streamUntil(byte, onData, timeoutMs, what) {
    for (;;) {
      const at = this._buf.indexOf(byte);
      if (at >= 0) {
        if (at > 0) onData(this._take(at));
        this._take(1);
        return;
      }
      if (this._buf.length) onData(this._take(this._buf.length));
      if (!(await this._fill(timeoutMs))) {
        throw new ReplError(`timed out waiting for ${what}: nothing came for ${timeoutMs} ms`);
      }
    }
  }

  release() {
    this._reader.releaseLock();
  }
}

function indexOf(haystack, needle) {
  outer: for (let i = 0; i + needle.length <= haystack.length; i++) {
    for (let j = 0; j < needle.length; j++) {
      if (haystack[i + j] !== needle[j]) continue outer;
    }
    return i;
  }
  return -1;
}

/** A session with the board's raw REPL. */
export class RawRepl {
  /**
   * @param port an opened port ({readable, writable})
   * @param options.timeoutMs  how long the board may stay silent (default 10 s;
   *   a reply's tokens come every few tens of milliseconds)
   */
  constructor(port, { timeoutMs = 10000 } = {}) {
    this.reader = new ByteReader(port.readable);
    this.writer = port.writable.getWriter();
    this.timeoutMs = timeoutMs;
    this.useRawPaste = true; // until the board refuses it once
  }

  async write(data) {
    await this.writer.write(bytesOf(data));
  }

  /** Interrupt whatever runs (Ctrl-C) and enter the raw REPL (Ctrl-A). */
  async enter({ softReset = false } = {}) {
    await this.write(new Uint8Array([0x0d, CTRL_C]));
    // mpremote drops what is waiting here; reading up to the banner below
    // drops it too, whenever it arrives.
    await this.write(new Uint8Array([0x0d, CTRL_A]));
    if (softReset) {
      await this.reader.readUntil(RAW_BANNER + ">", this.timeoutMs, "the raw REPL prompt");
      await this.write(new Uint8Array([CTRL_D]));
      await this.reader.readUntil(SOFT_REBOOT, this.timeoutMs, "the soft reboot");
    }
    await this.reader.readUntil(RAW_BANNER, this.timeoutMs, "the raw REPL banner");
  }

  /** Send `code` to run; returns once the board has taken all of it. */
  async execNoFollow(code) {
    const data = bytesOf(code);
    await this.reader.readUntil(">", this.timeoutMs, "the raw REPL prompt");
    if (this.useRawPaste) {
      await this.write(new Uint8Array(RAW_PASTE_REQUEST));
      const answer = latin1(await this.reader.readExactly(2, this.timeoutMs));
      if (answer === "R\x01") {
        await this._rawPaste(data);
        return;
      }
      if (answer !== "R\x00") {
        // a board too old to know raw-paste echoes the request; its prompt follows
        await this.reader.readUntil("w REPL; CTRL-B to exit\r\n>", this.timeoutMs,
                                    "the raw REPL prompt after a refused raw-paste");
      }
      this.useRawPaste = false;
    }
    for (let i = 0; i < data.length; i += PLAIN_CHUNK) {
      await this.write(data.slice(i, i + PLAIN_CHUNK));
      await sleep(PLAIN_PAUSE_MS);
    }
    await this.write(new Uint8Array([CTRL_D]));
    const ok = latin1(await this.reader.readExactly(2, this.timeoutMs));
    if (ok !== "OK") throw new ReplError(`the board did not take the code (it said ${JSON.stringify(ok)})`);
  }

  async _rawPaste(data) {
    const header = await this.reader.readExactly(2, this.timeoutMs);
    const windowSize = header[0] | (header[1] << 8);
    let room = windowSize;
    let i = 0;
    while (i < data.length) {
      // the board grants another window with \x01; \x04 means it stopped reading
      while (room === 0 || this.reader.available() > 0) {
        const [b] = await this.reader.readExactly(1, this.timeoutMs);
        if (b === CTRL_A) room += windowSize;
        else if (b === CTRL_D) {
          await this.write(new Uint8Array([CTRL_D]));
          return;
        } else throw new ReplError(`unexpected byte ${b} from the board during raw-paste`);
      }
      const piece = data.slice(i, i + room);
      await this.write(piece);
      room -= piece.length;
      i += piece.length;
    }
    await this.write(new Uint8Array([CTRL_D]));
    await this.reader.readUntil(new Uint8Array([CTRL_D]), this.timeoutMs, "the end of raw-paste");
  }

  /**
   * Stream the running code's output as bytes, as they arrive (onData gets
   * each piece, the closing 0x04 not included). Returns the error output:
   * the traceback of an exception, "" on success.
   */
  async followBytes(onData = () => {}) {
    await this.reader.streamUntil(CTRL_D, onData, this.timeoutMs, "the end of the output");
    const errBytes = [];
    await this.reader.streamUntil(CTRL_D, (bytes) => errBytes.push(...bytes), this.timeoutMs,
                                  "the end of the error output");
    return new TextDecoder("utf-8").decode(new Uint8Array(errBytes));
  }

  /**
   * Stream the running code's output as text: onStdout gets text as it
   * arrives (UTF-8 split across reads is joined). Returns {stdout, stderr};
   * stderr holds the traceback of an exception, "" on success.
   */
  async follow(onStdout = () => {}) {
    const out = new TextDecoder("utf-8");
    let stdout = "";
    const take = (text) => {
      if (text) {
        stdout += text;
        onStdout(text);
      }
    };
    const stderr = await this.followBytes((bytes) => take(out.decode(bytes, { stream: true })));
    take(out.decode());
    return { stdout, stderr };
  }

  /** Run `code` and stream its output (execNoFollow + follow). */
  async exec(code, onStdout) {
    await this.execNoFollow(code);
    return this.follow(onStdout);
  }

  /** Ctrl-C: a running reply stops between two tokens (KeyboardInterrupt). */
  async interrupt() {
    await this.write(new Uint8Array([CTRL_C]));
  }

  /** Back to the friendly REPL (Ctrl-B). */
  async exit() {
    await this.write(new Uint8Array([0x0d, CTRL_B]));
  }

  /** Give the port's streams back (the port can then be closed). */
  release() {
    this.reader.release();
    this.writer.releaseLock();
  }
}
