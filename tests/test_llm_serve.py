"""llm_serve (firmware/modules/llm_serve.py), the web chat's engine side: many
stories on one model. Random interleavings with speculation equal each story
written alone in plain mode; an engine error mid-reply leaves the story as it
was; MicroPython with the real binding prints what CPython prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import engine_ext
import llm
import pytest
from unix_micropython import run_mp

ROOT = Path(__file__).resolve().parent.parent


SERVE_SESSION = """
import llm, llm_serve
llm.load({image!r})
for req in {requests!r}:
    out = []
    for e in llm_serve.handle(req):
        if "piece" in e:
            out.append(e["piece"])
        elif "line" in e:
            out.append("[" + e["line"] + "]")
        elif "error" in e:
            out.append("ERROR " + e["error"])
        else:
            d = e["done"]
            out.append(" |" + " ".join(str(d.get(k)) for k in ("speculated", "tokens", "ok")))
    print("".join(out).replace("\\n", "\\\\n"))  # a row a request (a story may hold newlines)
"""

def test_llm_serve_on_the_real_micropython_binding(micropython, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two stories on one model, a speculation taken and one left stale, an
    undo, a bad line: MicroPython unix with the real binding prints what
    CPython prints (under MICROPY_DIR)."""
    image = str(hostboard_image())
    requests = [{"op": "open", "sid": "a", "seed": 5, "temperature": 0.8, "max_tokens": 40},
                {"op": "open", "sid": "b", "seed": 6, "temperature": 0.8, "max_tokens": 40},
                {"op": "turn", "sid": "a", "line": "Once upon a time"},
                {"op": "speculate", "sid": "b", "line": "A dog ran"},
                {"op": "speculate", "sid": "a", "line": "The cat"},
                {"op": "turn", "sid": "a", "line": "The cat was sad"},
                {"op": "turn", "sid": "b", "line": "A dog ran"},
                {"op": "undo", "sid": "a"},
                {"op": "turn", "sid": "a", "line": "The cat was sad"},
                {"op": "turn", "sid": "a", "line": "  "}]
    code = SERVE_SESSION.format(image=image, requests=requests)
    out = run_mp(micropython, code, tmp_path)
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": engine_ext.PYTHONPATH}, timeout=300,
                          check=False)
    assert host.returncode == 0, host.stderr
    assert out == host.stdout
    rows = out.splitlines()
    assert rows[6].endswith("True 40 None") or " |True " in rows[6]  # b's speculation taken
    assert " |False " in rows[5]  # a's was for another line: written afresh
    assert rows[5] == rows[8] and rows[-1].startswith("ERROR")

def hostboard_image() -> Path:
    from mpllm.board import hostboard

    return hostboard.ensure_image(*hostboard.demo_sources())

STORY_LINES = ["Once upon a time", "The cat ran to the tree", "It was happy", "A dog sat",
               "They played all day in the big green park", "The end", "Mia smiled",
               "One day the sun came out and the birds sang a song"]

def _random_session(rng, n_ops: int) -> list[dict]:
    """Requests of three stories on one model, in a random interleaving: turns,
    speculations (for the next line, for another, for a prefix), undo, new,
    a new seed."""
    import llm_serve  # noqa: F401 - the module the requests are for

    reqs = [{"op": "open", "sid": s, "seed": 10 + i, "temperature": 0.8, "max_tokens": 12}
            for i, s in enumerate("abc")]
    for _ in range(n_ops):
        sid = rng.choice("abc")
        line = rng.choice(STORY_LINES)
        kind = rng.random()
        if kind < 0.45:
            if rng.random() < 0.5:  # typed ahead: the line, a prefix of it, or another
                typed = rng.choice([line, line[:max(1, len(line) // 2)], rng.choice(STORY_LINES)])
                reqs.append({"op": "speculate", "sid": sid, "line": typed})
                if rng.random() < 0.4:  # someone else writes in between
                    other = rng.choice([s for s in "abc" if s != sid])
                    reqs.append({"op": "turn", "sid": other, "line": rng.choice(STORY_LINES)})
            reqs.append({"op": "turn", "sid": sid, "line": line})
        elif kind < 0.65:
            reqs.append({"op": "speculate", "sid": sid, "line": line})
        elif kind < 0.8:
            reqs.append({"op": "undo", "sid": sid})
        elif kind < 0.9:
            reqs.append({"op": "new", "sid": sid})
        else:
            reqs.append({"op": "seed", "sid": sid, "seed": rng.randrange(1, 1000)})
    return reqs

def _replies(reqs: list[dict]) -> dict[str, list[str]]:
    """Each story's turns, as (line, reply) text, from llm_serve on the open model."""
    import llm_serve

    out: dict[str, list[str]] = {}
    for req in reqs:
        events = list(llm_serve.handle(req))
        assert "error" not in events[-1], (req, events[-1])
        if req["op"] == "turn":
            text = "".join(e.get("line", "") + e.get("piece", "") for e in events)
            out.setdefault(req["sid"], []).append(text)
    for sid in {r["sid"] for r in reqs}:
        list(llm_serve.handle({"op": "drop", "sid": sid}))
    return out

@pytest.mark.parametrize("model_name", ["tiny", "small"])
def test_shared_model_and_speculation_never_change_a_story(model_name, test_model) -> None:  # type: ignore[no-untyped-def]
    """Many random interleavings of three stories on one model, with
    speculations taken, stale and overtaken, undo, new and rollover: each
    story's text equals that story written alone, without speculation, in
    plain mode (every engine speed-up off) on a model opened afresh."""
    import random

    image = str(test_model(model_name).image)
    n_sessions = 12 if model_name == "tiny" else 4
    compared = taken = 0
    for seed in range(n_sessions):
        reqs = _random_session(random.Random(seed), 40)
        llm.unload()
        llm.load(image)
        shared = _replies(reqs)
        for sid in "abc":
            alone = [r for r in reqs if r["sid"] == sid and r["op"] != "speculate"]
            llm.unload()
            llm.load(image, plain=True)
            assert _replies(alone).get(sid, []) == shared.get(sid, []), (seed, sid)
            compared += len(shared.get(sid, []))
        taken += sum(1 for r in reqs if r["op"] == "speculate")
    llm.unload()
    assert compared > 50 * n_sessions // 4 and taken > 0

class _FailingStep:
    """The real model, but the n-th step() (or verify) raises as an engine
    error would (a MemoryError on the board, say)."""

    def __init__(self, real: object, after: int) -> None:
        self._real, self._left = real, after

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def _count(self) -> None:
        self._left -= 1
        if self._left == 0:
            raise RuntimeError("engine failure")

    def step(self, token: int) -> int:
        self._count()
        return self._real.step(token)  # type: ignore[attr-defined]

    def verify(self, tokens: list[int]) -> list[int]:
        self._count()
        return self._real.verify(tokens)  # type: ignore[attr-defined]

@pytest.mark.parametrize("op", ["speculate", "turn"])
def test_an_engine_error_mid_reply_leaves_the_story_as_it_was(op, tiny_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A speculation or a turn cut by an engine error takes its line back:
    the story and its next turns are as if it never was."""
    import llm_serve

    image = str(tiny_model.image)

    def session(fail: bool) -> tuple[str, str]:
        llm.unload()
        llm.load(image)
        if fail:
            monkeypatch.setattr(llm.default_session, "model", _FailingStep(llm.load(), 3))
        list(llm_serve.handle({"op": "open", "sid": "x", "seed": 4, "temperature": 0.8,
                               "max_tokens": 10}))
        if fail:
            with pytest.raises(RuntimeError, match="engine failure"):
                list(llm_serve.handle({"op": op, "sid": "x", "line": "The dog ran"}))
            monkeypatch.setattr(llm.default_session, "model", llm.default_session.model._real)
        events = list(llm_serve.handle({"op": "turn", "sid": "x", "line": "Once upon a time"}))
        story = llm_serve._stories["x"].writer.text
        list(llm_serve.handle({"op": "drop", "sid": "x"}))
        return "".join(e.get("piece", "") for e in events), story

    assert session(True) == session(False)
    llm.unload()
