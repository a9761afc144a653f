// The chat page: a story written together with the board, over Web Serial,
// in the protocol of the web server's board backend (serve_protocol.js):
// the board's llm_serve keeps the story, this page shows it.
//
// Each request is a raw-REPL session of its own (enter, exec, follow, exit)
// rather than one session held across requests, as BoardEngine holds it:
// every session starts with Ctrl-C and Ctrl-A, so whatever the board was
// left in (RESET pressed, a reply stopped half-way, something typed at its
// REPL from another program) the next request starts clean, and the board's
// friendly REPL is free between requests. It costs about a hundred bytes
// each way per request, nothing next to a reply's sixty tokens.
import { RawRepl, ReplError } from "./raw_repl.js";
import {
  COMMANDS_HELP, PAGE_SID, ServeProtocolError, lineRequest, openRequest, runRequest,
} from "./serve_protocol.js";

const $ = (id) => document.getElementById(id);
const status = $("status"), error = $("error"), story = $("story"), line = $("line");
const connectButton = $("connect"), stopButton = $("stop");
const storyButtons = [$("send"), $("undo"), $("new"), line];

let port = null;
let repl = null;
let busy = false; // one request at a time: the board answers one
let storyOpen = false; // false until "open" is done, and again once the board lost it
let stopAsked = false;
const turns = []; // the story on the page, a turn at a time: [line span, reply span]

// What tests and curious users can read: the last "done" of each op.
window.mpllm = { done: {}, story: () => story.textContent };

if (!("serial" in navigator)) {
  $("no-serial").hidden = false;
  connectButton.disabled = true;
}

function say(text) { status.textContent = text; }
const ENDED_AT_ONCE = "The model ends the story here: Undo takes your line back, New story starts another.";

function setBusy(value) {
  busy = value;
  for (const el of storyButtons) el.disabled = value || port === null;
  stopButton.disabled = !value;
}

/** A number field's value, or undefined when left empty (the default then). */
function optionalNumber(id) {
  const text = $(id).value.trim();
  return text === "" ? undefined : Number(text);
}

// Whether the running request's line joined the story (its spans are shown).
let turnStarted = false;

/** Run one request; each event is shown as it comes. Returns the last event. */
async function request(req) {
  let reply = null;
  turnStarted = false;
  return runRequest(repl, req, (event) => {
    if ("line" in event) {
      turnStarted = true;
      const you = document.createElement("span");
      you.className = "you";
      you.textContent = event.line;
      reply = document.createElement("span");
      reply.className = "model";
      story.append(you, reply);
      turns.push([you, reply]);
    } else if ("piece" in event && reply !== null) {
      reply.textContent += event.piece;
    }
  });
}

async function openStory() {
  const done = await request(openRequest(PAGE_SID, {
    seed: optionalNumber("seed"), temperature: optionalNumber("temperature"),
  }));
  if (done.error) throw new Error(done.error);
  storyOpen = true;
  turns.length = 0;
  story.textContent = "";
  window.mpllm.done.open = done.done;
  $("where").textContent = `A new story: seed ${done.done.seed}, context ${done.done.seq_len} tokens.`;
}

function showDone(op, done) {
  window.mpllm.done[op] = done;
  if (op === "turn") {
    const ms = done.engine_ms_per_token;
    $("engine-speed").textContent = ms === null || ms === undefined ? "–" : ms.toFixed(2);
    $("tokens").textContent = String(done.tokens);
    if (done.rolled) {
      say(`The story outgrew the model's memory: its middle (${done.rolled} tokens) is forgotten.`);
    } else if (done.stop === "eot" && done.tokens === 0) {
      // the model wrote <|endoftext|> first: else the line would get an empty reply
      say(ENDED_AT_ONCE);
    } else {
      say("connected");
    }
  } else if (op === "undo") {
    const last = done.ok ? turns.pop() : null;
    if (last) last.forEach((el) => el.remove());
    say(last ? "Took back the last turn." : "Nothing to take back.");
  } else if (op === "new") {
    turns.length = 0;
    story.textContent = "";
    say("A new story.");
  } else if (op === "seed" || op === "temp") {
    say(`Seed ${done.seed}, temperature ${done.temperature} from now on.`);
  }
}

function showError(op, message) {
  if (op === "turn" && turnStarted) {
    // llm_serve takes a cut turn back whole (its line with it): so does the page
    const cut = turns.pop();
    if (cut) cut.forEach((el) => el.remove());
  }
  if (stopAsked && op === "turn") {
    say("Stopped: the line and its reply are taken back.");
  } else if (message.startsWith("no story")) {
    // the board was reset (or its story dropped): open a new one next time
    storyOpen = false;
    error.textContent = "The board no longer has this story (was it reset?); " +
                        "the next line starts a new one.";
  } else {
    error.textContent = message;
  }
}

async function submit(text) {
  if (busy || port === null) return;
  error.textContent = "";
  let req;
  try {
    req = lineRequest(PAGE_SID, text);
  } catch (e) {
    error.textContent = e.message;
    return;
  }
  setBusy(true);
  stopAsked = false;
  say(req.op === "turn" ? "writing…" : "");
  try {
    if (!storyOpen) await openStory();
    const last = await request(req);
    if (req.op === "turn") line.value = "";
    if (last.error) showError(req.op, last.error);
    else showDone(req.op, last.done);
  } catch (e) {
    if (e instanceof ReplError || e instanceof ServeProtocolError) {
      error.textContent = `The board did not answer as expected: ${e.message}`;
      say("press RESET on the board if it stays silent");
    } else {
      error.textContent = e.message; // the story could not open (a field, or the board said why)
    }
  } finally {
    setBusy(false);
    line.focus();
  }
}

async function connect() {
  const chosen = await navigator.serial.requestPort();
  await chosen.open({ baudRate: 115200 }); // the REPL's rate on a UART bridge; native USB ignores it
  port = chosen;
  // a reply's tokens come every few tens of ms, but the first request opens the model
  repl = new RawRepl(port, { timeoutMs: 30000 });
  connectButton.textContent = "Disconnect";
  say("opening the story…");
  setBusy(true);
  try {
    await openStory();
    say("connected");
  } finally {
    setBusy(false);
  }
}

async function disconnect() {
  repl.release();
  await port.close();
  port = repl = null;
  storyOpen = false;
  say("not connected");
  connectButton.textContent = "Connect to the board";
  setBusy(false);
}

connectButton.addEventListener("click", async () => {
  error.textContent = "";
  if (busy) return;
  try {
    if (port) await disconnect();
    else await connect();
  } catch (e) {
    error.textContent = port === null ? `Could not open the port: ${e.message}`
                                      : `Could not open the story on the board: ${e.message}`;
    if (port !== null) say("connected; the next line tries to open the story again");
  }
});

$("turn").addEventListener("submit", (event) => {
  event.preventDefault();
  submit(line.value);
});
line.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    submit(line.value);
  }
});
$("undo").addEventListener("click", () => submit("/undo"));
$("new").addEventListener("click", () => submit("/new"));
stopButton.addEventListener("click", () => {
  // Ctrl-C: the reply stops between two tokens; what was written stays in
  // the story (llm_chat.CoWriter keeps it), and the KeyboardInterrupt ends the
  // request without a "done"
  stopAsked = true;
  if (repl) repl.interrupt();
});
line.title = COMMANDS_HELP;
