"""The bundled demo model writes a story together with a person
(mpllm.board.cowrite_eval): one scripted session, fixed seed, on the real
engine through llm_chat.CoWriter; no reply is empty or ends the story at once.
And the rule that counts such replies, on replies made up here."""

from __future__ import annotations

import json
from pathlib import Path

import engine_ext
import llm
import pytest
from mpllm.board import cowrite_eval as ce

engine_ext.load()


@pytest.mark.parametrize(("line", "reply", "n"), [
    ("Max ran home.", " The end.", 0),  # two words: not a sentence of its own
    ("Max ran home.", " He was happy.", 1),
    ("Max ran to the", " park.", 0),  # only finishes the person's sentence
    ("Max ran to the", " park. He saw a big dog. And", 1),
    ("\"Go!\" said Max.", " \"No!\" said the cat. The cat ran away.", 2),
    ("Max ran.", " He ran and ran", 0),  # unfinished
    ("Max ran.", "", 0),
])
def test_own_sentences(line: str, reply: str, n: int) -> None:
    assert ce.own_sentences(line, reply) == n


def test_judge() -> None:
    assert ce.judge("Max ran.", " The end.", "eot").ended_at_once
    assert not ce.judge("Max ran.", " The end.", "budget").ended_at_once
    assert not ce.judge("Max ran.", " He went home and slept.", "eot").ended_at_once
    t = ce.judge("Max ran.", "  ", "eot")
    assert t.empty and t.ended_at_once
    assert ce.counts([ce.Session(1, [t, ce.judge("a", " b c d.", "budget")])]) == {
        "replies": 2, "empty": 1, "ended_at_once": 1, "ended": 1}


def test_a_scripted_session_on_the_demo(demo_image: Path) -> None:
    """The first scripted session (seed 11): every reply has words and none ends
    the story before a sentence of its own; the story holds each line and reply."""
    llm.load(str(demo_image))
    seed, lines = ce.SESSIONS[0]
    s = ce.run_session(llm, seed, lines)
    assert [t.line for t in s.turns] == list(lines)
    story = ""
    for t in s.turns:
        assert any(c.isalpha() for c in t.reply), t
        assert not t.empty and not t.ended_at_once, t
        story += ("" if not story or story[-1:].isspace() else " ") + t.line + t.reply
    assert ce.counts([s])["ended_at_once"] == 0
    # the same session again gives the same story (fixed seeds)
    again = ce.run_session(llm, seed, lines)
    assert [t.reply for t in again.turns] == [t.reply for t in s.turns]
    assert len(story) > sum(map(len, lines)) + 5 * 40  # the model wrote, not only the person


def test_the_command(demo_image: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m mpllm.board.cowrite_eval`: a bad --json path is refused before the
    sessions run; the ten sessions' JSON holds counts that its own turns add up to."""
    bad = tmp_path / "no" / "such" / "dir.json"
    assert ce.main(["--image", str(demo_image), "--json", str(bad)]) == 2
    out = capsys.readouterr()
    assert "session" not in out.out and out.err.startswith("error: cannot write")
    doc_path = tmp_path / "c.json"
    assert ce.main(["--image", str(demo_image), "--json", str(doc_path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(doc_path.read_text())
    turns = [t for s in doc["sessions"] for t in s["turns"]]
    assert len(doc["sessions"]) == len(ce.SESSIONS) and len(turns) == 50
    assert doc["counts"] == {
        "replies": 50, "empty": sum(not t["reply"].strip() for t in turns),
        "ended_at_once": sum(t["stop"] == "eot" and ce.own_sentences(t["line"], t["reply"]) == 0
                             for t in turns),
        "ended": sum(t["stop"] == "eot" for t in turns)}
    assert out.count("--- session") == 10 and f"{doc['counts']['ended_at_once']} ended" in out
