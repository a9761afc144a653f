// The web chat's page: a story written together with the model, streamed
// over the server's WebSocket (tools/mpllm/web/server.py lists the messages).

const $ = (id) => document.getElementById(id);
const story = $("story");
const line = $("line");
const status = $("status");
// Engine stages in the order the engine runs them, with their colours.
const STAGES = { embed: "#8dd3c7", attn: "#fb8072", ffn: "#80b1d3", ple: "#fdb462",
                 head: "#b3de69", sample: "#bc80bd" };
const TYPING_PAUSE_MS = 300;  // the server writes ahead after this pause in typing

let ws = null;
let waiting = null;  // the request in flight: {op, sentAt, firstAt, turn}
const turns = [];  // the page's story, a turn at a time: [line span, reply span]
let typingTimer = null;
let lastTyped = "";

// What tests and curious users can read: the last reply's figures.
window.mpllm = { stats: null, ttfcMs: null, roundTripTokPerS: null, hello: null,
                 story: () => story.textContent };

function setState(state) { document.body.dataset.state = state; }
function say(text) { status.textContent = text; }
const ENDED_AT_ONCE = "The model ends the story here: Undo takes your line back, New story starts another.";
function send(message) { ws.send(JSON.stringify(message)); }

function connect() {
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  ws = new WebSocket(scheme + location.host + "/ws" + location.search);
  ws.onmessage = (e) => receive(JSON.parse(e.data));
  ws.onclose = () => { setState("closed"); say("The connection closed. Reload the page to start again."); };
}

function receive(m) {
  switch (m.type) {
    case "hello":
      window.mpllm.hello = m;
      $("where").textContent = `${m.backend === "board" ? "an ESP32-S3 board" : "the host board (this PC)"}, ` +
        `${m.engines} engine${m.engines === 1 ? "" : "s"} · seed ${m.seed} · context ${m.seq_len} tokens`;
      line.maxLength = m.limits.max_line_chars;
      setState("idle");
      line.focus();
      break;
    case "queued":
      $("queue").textContent = m.position === 1 ? "next" : `${m.position}`;
      say(`Waiting for the engine: place ${m.position} in the queue.`);
      break;
    case "line": {
      const you = document.createElement("span");
      you.className = "you";
      you.textContent = m.text;
      const reply = document.createElement("span");
      reply.className = "model";
      story.append(you, reply);
      turns.push([you, reply]);
      waiting.turn = reply;
      $("queue").textContent = "writing";
      say("");
      break;
    }
    case "piece":
      if (waiting.firstAt === null) waiting.firstAt = performance.now();
      waiting.turn.textContent += m.text;
      break;
    case "done":
      finish(m);
      break;
    case "busy":
    case "error":
      if (waiting !== null && waiting.turn !== null) {
        // a turn cut by an error is taken back whole, its line with it
        const cut = turns.pop();
        if (cut) cut.forEach((el) => el.remove());
      }
      say(m.message);
      waiting = null;
      setState(ws.readyState === WebSocket.OPEN ? "idle" : "closed");
      break;
    case "restarted":
      turns.length = 0;
      story.textContent = "";
      clearFigures();
      say(m.message);
      break;
  }
}

function finish(m) {
  const w = waiting;
  waiting = null;
  if (m.op === "turn") {
    const s = m.stats;
    const seconds = (performance.now() - w.sentAt) / 1000;
    window.mpllm.stats = s;
    window.mpllm.ttfcMs = w.firstAt === null ? null : w.firstAt - w.sentAt;
    window.mpllm.roundTripTokPerS = seconds > 0 ? s.tokens / seconds : null;
    $("engine-speed").textContent = s.engine_ms_per_token === null ? "–" : s.engine_ms_per_token.toFixed(2);
    $("roundtrip").textContent = window.mpllm.roundTripTokPerS === null ? "–" : window.mpllm.roundTripTokPerS.toFixed(0);
    $("ttfc").textContent = window.mpllm.ttfcMs === null ? "–" : window.mpllm.ttfcMs.toFixed(1);
    $("speculated").textContent = s.speculated ? "yes: shown at once" : "no: written after Enter";
    $("queue").textContent = "–";
    drawStages(s);
    if (s.rolled) say(`The story outgrew the model's memory: its middle (${s.rolled} tokens) is forgotten.`);
    // the model wrote <|endoftext|> first: else the line would get an empty reply
    else if (s.stop === "eot" && s.tokens === 0) say(ENDED_AT_ONCE);
  } else if (m.op === "undo") {
    const last = m.stats.ok ? turns.pop() : null;
    if (last) last.forEach((el) => el.remove());
    say(last ? "Took back the last turn." : "Nothing to take back.");
  } else if (m.op === "new") {
    turns.length = 0;
    story.textContent = "";
    clearFigures();
    say("A new story.");
  } else if (m.op === "seed" || m.op === "temp") {
    say(`Seed ${m.stats.seed}, temperature ${m.stats.temperature} from now on.`);
  }
  setState("idle");
}

// A new story has no last reply: its figures go with the old story.
function clearFigures() {
  Object.assign(window.mpllm, { stats: null, ttfcMs: null, roundTripTokPerS: null });
  for (const id of ["engine-speed", "roundtrip", "ttfc", "speculated", "queue", "stage-total"]) {
    $(id).textContent = "–";
  }
  $("stages").replaceChildren();
  $("stage-legend").replaceChildren();
}

// The bar and its legend are the whole reply's engine time (the line read,
// the reply written), stage by stage: totals in ms and shares, not per token
// (the per-token figure is "the engine, per token written" above).
function drawStages(s) {
  const stageMs = s.stage_ms;
  const total = Object.values(stageMs).reduce((a, b) => a + b, 0);
  const bar = $("stages");
  const legend = $("stage-legend");
  bar.replaceChildren();
  legend.replaceChildren();
  for (const [name, colour] of Object.entries(STAGES)) {
    const ms = stageMs[name] || 0;
    const share = total > 0 ? (100 * ms) / total : 0;
    const part = document.createElement("span");
    part.style.background = colour;
    part.style.width = `${share}%`;
    part.title = `${name}: ${ms.toFixed(2)} ms of this reply (${share.toFixed(0)}%)`;
    bar.append(part);
    const item = document.createElement("li");
    item.innerHTML = `<i style="background:${colour}"></i>`;
    item.append(`${name} ${ms.toFixed(2)} ms (${share.toFixed(0)}%)`);
    legend.append(item);
  }
  $("stage-total").textContent = `${total.toFixed(2)} ms in all for this reply: ` +
    `${s.prefilled} token${s.prefilled === 1 ? "" : "s"} read, ${s.tokens} written`;
}

function command(text) {
  const [name, arg] = text.trim().split(/\s+/, 2);
  if (name === "/new" || name === "/undo") return { type: name.slice(1) };
  if (name === "/seed" && /^\d+$/.test(arg || "")) return { type: "seed", seed: Number(arg) };
  if (name === "/temp" && arg !== undefined && !Number.isNaN(Number(arg))) return { type: "temp", temperature: Number(arg) };
  say("Commands: /new, /undo, /seed N, /temp T.");
  return null;
}

function submit(text) {
  if (waiting !== null || ws.readyState !== WebSocket.OPEN) return;
  const message = text.trim().startsWith("/") ? command(text) : { type: "turn", text };
  if (message === null) return;
  if (message.type === "turn" && !text.trim()) { say("Type how the story goes on first."); return; }
  clearTimeout(typingTimer);
  waiting = { op: message.type, sentAt: performance.now(), firstAt: null, turn: null };
  setState("writing");
  send(message);
  line.value = "";
  lastTyped = "";
}

$("form").addEventListener("submit", (e) => { e.preventDefault(); submit(line.value); });
line.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); submit(line.value); }
});
line.addEventListener("input", () => {
  clearTimeout(typingTimer);
  typingTimer = setTimeout(() => {
    const text = line.value;
    if (waiting === null && text.trim() && !text.trim().startsWith("/") && text !== lastTyped) {
      lastTyped = text;
      send({ type: "typing", text });
    }
  }, TYPING_PAUSE_MS);
});
$("undo").addEventListener("click", () => submit("/undo"));
$("new").addEventListener("click", () => submit("/new"));

connect();
