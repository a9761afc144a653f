"""Many co-written stories over the one open model: the engine side of the
web chat (tools/serve.py).

The same file on the board (frozen next to llm.py), where tools/serve.py
reaches it over the raw REPL, and on the PC, where each of serve.py's engine
processes imports it. A request is a dict; handle() answers with events:

  {"line": text}    a turn's line as it joined the story (a space may lead)
  {"piece": text}   a piece of the reply, as it is written (turn only)
  {"done": {...}}   the last event of a request that worked
  {"error": text}   the last event of a request that did not: the story is
                    as it was (a turn cut by an engine error or Ctrl-C is
                    taken back whole, its line with it)

The requests ("sid" names the story; one connection of the web page):
  {"op": "open", "sid", "seed", "temperature", "max_tokens"}   a new story
  {"op": "turn", "sid", "line"}      add the line, write the reply; when a
                                     speculation is for exactly this line and
                                     this story, its reply is the answer
  {"op": "speculate", "sid", "line"} write the reply to a line still being
                                     typed, keep it, take the turn back
  {"op": "new" | "undo" | "drop", "sid"}    start over, take back, forget
  {"op": "seed", "sid", "seed"}, {"op": "temp", "sid", "temperature"}

handle() and run() serve the stories of one llm.Session (default:
llm.default_session), the one that holds the model.

A speculative reply is the authoritative one, not a guess: turn k samples
with seed + k and the context is the story's ids (llm_chat.CoWriter), so
"speculate, then turn" and "turn" write the same text; the tests hold it.

Over the raw REPL, run(json_text) prints the pieces as they come and every
other event as RS (0x1e), its JSON, newline. The pieces pass
through llm.shown(), which leaves no control character but newline and tab,
so RS cannot occur in them.
"""

import json

import llm
import llm_chat

RS = "\x1e"
#: stories kept at most (each is its ids and text); the server bounds its
#: connections (serve.py --max-connections) below this, so this is a guard
#: against a runaway client, not the policy
MAX_STORIES = 2048

_stories = {}  # sid -> _Story


class _Story:
    def __init__(self, writer):
        self.writer = writer
        # (line, the story before, the story after, the line as it joined,
        # the reply, done) of the last speculation, or None
        self.speculation = None


class RequestError(ValueError):
    """A request that cannot be done; the message says why."""


def _field(req, name, kinds):
    value = req.get(name)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise RequestError(f"{req.get('op')}: {name!r} is missing or of the wrong type")
    return value


def _story(req):
    sid = _field(req, "sid", str)
    story = _stories.get(sid)
    if story is None:
        raise RequestError(f"no story {sid!r}: open it first")
    return story


def _stage_ms(model):
    return dict(model.stats()["stage_ms"])


def _turn_events(story, line):
    """The events of one turn of the story: its pieces as they are written,
    then "done" with the turn's figures."""
    writer = story.writer
    model = writer.session.load()
    before = _stage_ms(model)
    text = writer.text
    try:
        pieces = writer.turn(line)  # a line that cannot join the story: at once
    except ValueError as e:
        raise RequestError(str(e))
    yield {"line": writer.text[len(text):]}  # the line as it joined the story
    for piece in pieces:
        yield {"piece": llm.shown(piece)}
    s = writer.session.stats()
    after = _stage_ms(model)
    yield {"done": {
        "stop": s["stop"], "tokens": s["tokens"], "prompt_tokens": s["prompt_tokens"],
        "prefilled": s["prefilled"], "seed": s["seed"], "rolled": writer.rolled,
        "ttft_ms": s["ttft_ms"], "engine_ttft_ms": s["engine_ttft_ms"],
        "engine_ms_per_token": s["engine_ms_per_token"], "wall_ms": s["wall_ms"],
        "tokens_per_pass": s["tokens_per_pass"],
        "stage_ms": {k: after[k] - before.get(k, 0.0) for k in after},
    }}


def _turn(story, line):
    writer = story.writer
    spec = story.speculation
    story.speculation = None
    if spec is not None and spec[0] == line and spec[1] == writer.snapshot():
        writer.restore(spec[2])
        joined, text, done = spec[3], spec[4], dict(spec[5])
        done["speculated"] = True
        yield {"line": joined}
        if text:
            yield {"piece": text}
        yield {"done": done}
        return
    before = writer.snapshot()
    finished = False
    try:
        for event in _turn_events(story, line):
            if "done" in event:
                event["done"]["speculated"] = False
                finished = True
            yield event
    finally:
        if not finished:  # an error or Ctrl-C cut the reply: the story is as it was
            writer.restore(before)


def _speculate(story, line):
    writer = story.writer
    before = writer.snapshot()
    joined = ""
    pieces = []
    done = None
    try:
        for event in _turn_events(story, line):
            if "line" in event:
                joined = event["line"]
            elif "piece" in event:
                pieces.append(event["piece"])
            else:
                done = event["done"]
        story.speculation = (line, before, writer.snapshot(), joined, "".join(pieces), done)
    finally:
        writer.restore(before)  # written ahead, not told: the story is as it was
    return {"line": line, "tokens": done["tokens"]}


def handle(req, session=None):
    """The events answering one request (a generator; see the module's text);
    session: the llm.Session the stories are written with (default
    llm.default_session)."""
    try:
        if not isinstance(req, dict):
            raise RequestError("a request is a JSON object")
        op = req.get("op")
        if op == "open":
            sid = _field(req, "sid", str)
            if sid not in _stories and len(_stories) >= MAX_STORIES:
                raise RequestError(f"{MAX_STORIES} stories are open; drop one first")
            seed = req.get("seed")
            # replies end at a sentence end, as the terminal chat's do
            options = {"max_tokens": _field(req, "max_tokens", int),
                       "temperature": _field(req, "temperature", (int, float)),
                       "finish": llm_chat.FINISH_TOKENS}
            if seed is not None:
                options["seed"] = _field(req, "seed", int)
            try:
                writer = llm_chat.CoWriter(session, **options)
            except (TypeError, ValueError) as e:
                raise RequestError(str(e))
            _stories[sid] = _Story(writer)
            yield {"done": {"seed": writer.seed, "seq_len": writer.session.seq_len}}
        elif op == "turn":
            story = _story(req)
            yield from _turn(story, _field(req, "line", str))
        elif op == "speculate":
            yield {"done": _speculate(_story(req), _field(req, "line", str))}
        elif op in ("new", "undo"):
            story = _story(req)
            story.speculation = None
            if op == "new":
                story.writer.new()
                yield {"done": {"ok": True}}
            else:
                yield {"done": {"ok": story.writer.undo()}}
        elif op == "seed" or op == "temp":
            story = _story(req)
            story.speculation = None
            try:
                if op == "seed":
                    story.writer.set_seed(_field(req, "seed", int))
                else:
                    story.writer.set_temperature(_field(req, "temperature", (int, float)))
            except (TypeError, ValueError) as e:
                raise RequestError(str(e))
            yield {"done": {"seed": story.writer.seed, "temperature": story.writer.temperature}}
        elif op == "drop":
            _stories.pop(_field(req, "sid", str), None)
            yield {"done": {"ok": True}}
        else:
            raise RequestError(f"unknown op {op!r}")
    except RequestError as e:
        yield {"error": str(e)}


def run(request_json, session=None):
    """handle() for the raw REPL: pieces as they come, then RS and the last
    event as one line of JSON."""
    import sys

    last = {"error": "no answer"}
    try:
        req = json.loads(request_json)
    except ValueError:
        req = None
    for event in handle(req, session):
        if "piece" in event:
            sys.stdout.write(event["piece"])
        elif "line" in event:  # before any piece: RS ends it
            sys.stdout.write(RS + json.dumps(event) + "\n")
        else:
            last = event
    sys.stdout.write(RS + json.dumps(last) + "\n")
