// Cases for firmware/web/raw_repl.js, run in headless Chromium by
// tests/test_web_flasher.py (which asserts on what they return).
import { RawRepl, ReplError, storyCode } from "/raw_repl.js";
import { ScriptedPort } from "/tests/web/fake_port.js";

/** Each recorded session the way bench.py's transport runs it: enter, exec, follow, exit. */
export async function replaySessions(transcript, { rxChunk = 0 } = {}) {
  const port = new ScriptedPort(transcript.events, { rxChunk });
  const repl = new RawRepl(port, { timeoutMs: 2000 });
  const results = [];
  try {
    for (const s of transcript.sessions) {
      const code = storyCode(s.prompt, s.options);
      const streamed = [];
      await repl.enter();
      const { stdout, stderr } = await repl.exec(code, (t) => streamed.push(t));
      await repl.exit();
      results.push({ code, stdout, stderr, streamed: streamed.join(""), pieces: streamed.length });
    }
  } catch (e) {
    return { results, error: `${e.name}: ${e.message}`, mismatch: port.mismatch };
  }
  return { results, finished: port.finished(), mismatch: port.mismatch };
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

/** storyCode's refusals. */
export function badOptions() {
  const out = [];
  for (const opts of [{ maxTokens: 0 }, { seed: -1 }, { seed: 1.5 }, { temperature: -1 },
                      { temperature: NaN }]) {
    try {
      storyCode("x", opts);
      out.push("accepted");
    } catch (e) {
      out.push(`${e.name}: ${e.message}`);
    }
  }
  return out;
}
