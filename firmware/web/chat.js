// The chat page: each story is one raw-REPL session on the board (enter, run
// llm.story(...), stream its output, leave), the same exchange bench.py's
// transport has with a board, so the board's friendly REPL is free between stories.
import { RawRepl, storyCode } from "./raw_repl.js";

const $ = (id) => document.getElementById(id);
const status = $("status"), output = $("output"), error = $("error");
const writeButton = $("write"), stopButton = $("stop"), connectButton = $("connect");

let port = null;
let repl = null;

if (!("serial" in navigator)) {
  $("no-serial").hidden = false;
  connectButton.disabled = true;
}

/** A number field's value, or undefined when left empty (llm.py's default then). */
function optionalNumber(id, parse) {
  const text = $(id).value.trim();
  return text === "" ? undefined : parse(text);
}

/** The line of a traceback that says what went wrong. */
function lastLine(text) {
  const lines = text.trim().split("\n");
  return lines[lines.length - 1];
}

connectButton.addEventListener("click", async () => {
  error.textContent = "";
  try {
    if (port) {
      repl.release();
      await port.close();
      port = repl = null;
      status.textContent = "not connected";
      connectButton.textContent = "Connect to the board";
      writeButton.disabled = true;
      return;
    }
    port = await navigator.serial.requestPort();
    await port.open({ baudRate: 115200 }); // the REPL's rate on a UART bridge; native USB ignores it
    repl = new RawRepl(port, { timeoutMs: 30000 });
    status.textContent = "connected";
    connectButton.textContent = "Disconnect";
    writeButton.disabled = false;
  } catch (e) {
    port = repl = null;
    error.textContent = `Could not open the port: ${e.message}`;
  }
});

$("story").addEventListener("submit", async (event) => {
  event.preventDefault();
  error.textContent = "";
  let code;
  try {
    code = storyCode($("prompt").value, {
      maxTokens: optionalNumber("max-tokens", Number),
      seed: optionalNumber("seed", Number),
      temperature: optionalNumber("temperature", Number),
    });
  } catch (e) {
    error.textContent = e.message;
    return;
  }
  output.textContent = "";
  writeButton.disabled = true;
  stopButton.disabled = false;
  status.textContent = "writing…";
  try {
    await repl.enter();
    const { stderr } = await repl.exec(code, (text) => { output.textContent += text; });
    await repl.exit();
    if (stderr) error.textContent = lastLine(stderr);
    status.textContent = "connected";
  } catch (e) {
    error.textContent = `The board did not answer as expected: ${e.message}`;
    status.textContent = "connected (press RESET on the board if it stays silent)";
  } finally {
    writeButton.disabled = false;
    stopButton.disabled = true;
  }
});

stopButton.addEventListener("click", () => {
  // Ctrl-C: the story stops between two tokens; llm.story says so and the
  // KeyboardInterrupt comes back as the session's error output.
  if (repl) repl.interrupt();
});
