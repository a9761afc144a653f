// A serial port that replays a recorded raw-REPL session (tests/data/
// raw_repl_transcript.json): what the client writes must be exactly the
// recorded tx bytes, in order (however it splits them), and the board's
// recorded rx bytes are released only once the tx before them was written.

export function latin1Bytes(text) {
  const out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
  return out;
}

export class ScriptedPort {
  /**
   * @param events [{tx: latin-1 text} | {rx: latin-1 text}, ...]
   * @param rxChunk  deliver rx in pieces of this many bytes (0: as recorded)
   */
  constructor(events, { rxChunk = 0 } = {}) {
    this.steps = events.map((e) => ("tx" in e ? { tx: latin1Bytes(e.tx) } : { rx: latin1Bytes(e.rx) }));
    this.rxChunk = rxChunk;
    this.step = 0;
    this.offset = 0; // bytes of steps[step].tx written so far
    this.queue = [];
    this.wake = null;
    this.mismatch = null;
    this._release();
    this.readable = new ReadableStream({ pull: (c) => this._pull(c) }, { highWaterMark: 0 });
    this.writable = new WritableStream({ write: (chunk) => this._write(chunk) });
  }

  _release() {
    while (this.step < this.steps.length && this.steps[this.step].rx) {
      const data = this.steps[this.step].rx;
      const n = this.rxChunk || data.length;
      for (let i = 0; i < data.length; i += n) this.queue.push(data.slice(i, i + n));
      this.step++;
    }
    if (this.wake) this.wake();
  }

  async _pull(controller) {
    while (!this.queue.length) await new Promise((resolve) => { this.wake = resolve; });
    this.wake = null;
    controller.enqueue(this.queue.shift());
  }

  _write(chunk) {
    for (const b of chunk) {
      const s = this.steps[this.step];
      if (!s || !s.tx || s.tx[this.offset] !== b) {
        const want = s && s.tx ? `byte ${s.tx[this.offset]} (step ${this.step}, offset ${this.offset})` : "nothing";
        this.mismatch = `the client wrote byte ${b} where the recording has ${want}`;
        throw new Error(this.mismatch);
      }
      if (++this.offset === s.tx.length) {
        this.step++;
        this.offset = 0;
        this._release();
      }
    }
  }

  /** Every recorded byte was written and read. */
  finished() {
    return this.step === this.steps.length && this.queue.length === 0;
  }

  // the SerialPort methods the chat page calls
  async open() {}
  async close() {}
  getInfo() { return {}; }
}
