"""The board's llm.py with llama2.c's sentencepiece tokenizer: where a story
stops (BOS or EOS), streaming byte-fallback tokens, co-writing lines.

A scripted model (the test double below: it writes a given list of ids
whatever it is fed) carries the llama2.c demo's tokenizer, so the loop's
text handling is checked without depending on what a trained model writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import engine_ext
import llm
import llm_chat
import pytest
from mpllm.formats import llama2c
from mpllm.formats.tokenizer import tokenizer_section

ROOT = Path(__file__).resolve().parent.parent
SECTION = tokenizer_section(llama2c.load_tokenizer_bin(ROOT / "models" / "llama2c-demo" /
                                                       "tokenizer.bin"))
BOS, EOS = llama2c.BOS_ID, llama2c.EOS_ID


class Scripted:
    """An engine double: prefill and step return the next id of `script`."""

    def __init__(self, script: list[int], seq_len: int = 256) -> None:
        self.script, self.seq_len = script, seq_len
        self.fed: list[int] = []
        self.at = 0

    def config(self) -> dict[str, object]:
        return {"seq_len": self.seq_len, "vocab_out": 512, "eot_id": EOS, "max_draft": 0}

    def tokenizer(self) -> bytes:
        return SECTION

    def reset(self) -> None:
        self.fed, self.at = [], 0

    def sampler(self, *args: object) -> None:
        pass

    def _next(self) -> int:
        self.at += 1
        return self.script[self.at - 1]

    def prefill(self, ids: list[int]) -> int:
        self.fed += ids
        return self._next()

    def step(self, token: int) -> int:
        self.fed.append(token)
        return self._next()

    def rewind(self, n: int) -> None:
        del self.fed[n:]

    def pos(self) -> int:
        return len(self.fed)

    def stats(self) -> dict[str, float]:
        return {"tokens": len(self.fed), "ttft_ms": 0.0, "total_ms": 0.0}

    def plain(self) -> bool:
        return False

    def fast(self) -> bool:
        return False

    def set_plain(self, on: bool) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def session() -> llm.Session:
    s = llm.Session()
    s.model = Scripted([])
    s.source = "scripted"
    tok = llm.Tokenizer(SECTION)
    s.tokenizer, s.seq_len, s.eot_id, s.vocab_out = tok, 256, EOS, 512
    s.stop_ids = tok.stop_ids
    return s


def _write(session: llm.Session, script: list[int], prompt: str = "Once upon a time",
           max_tokens: int = 50) -> list[str]:
    session.model.script = script  # type: ignore[attr-defined]
    # the script is the story after the prompt's own ids: no healing of its last word
    return list(session.generate(prompt, max_tokens=max_tokens, temperature=0, draft="none",
                                 heal=False))


def test_a_character_split_over_byte_tokens_is_printed_whole(session) -> None:  # type: ignore[no-untyped-def]
    """"日" is three byte-fallback tokens (<0xE6> <0x97> <0xA5>) in the demo's
    vocabulary: no piece holds a part of it, and the story is the text."""
    tok = session.tokenizer
    ids = tok.encode(" saw 日 and é.", bos=False)
    fallback = [i for i in ids if tok.token_bytes(i)[0] >= 0x80]
    assert len(fallback) >= 4  # 日 as three bytes, é as two (the vocabulary lacks both)
    pieces = _write(session, [*ids, BOS])
    assert "".join(pieces) == " saw 日 and é."
    for p in pieces:
        assert "\ufffd" not in p
        p.encode("utf-8")  # whole characters only (a lone surrogate would raise)
    assert session.stats()["stop"] == "eot"


@pytest.mark.parametrize("stop", [BOS, EOS])
def test_a_story_stops_at_bos_and_at_eos(session, stop) -> None:  # type: ignore[no-untyped-def]
    """llama2.c's run.c stops where the model starts the next text (BOS);
    EOS ends a text too. Neither is shown or counted."""
    tok = session.tokenizer
    ids = tok.encode(" the end", bos=False)
    after = tok.encode(" more", bos=False)
    pieces = _write(session, [*ids, stop, *after, EOS])
    assert "".join(pieces) == " the end"
    st = session.stats()
    assert st["stop"] == "eot" and st["tokens"] == len(ids)


def test_co_writing_lines_start_the_text_once(session, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The first line starts the story with BOS; a later line goes on the same
    text (no BOS in the middle of the story, no doubled space)."""
    tok = session.tokenizer
    reply = tok.encode(" They played.", bos=False)
    w = llm_chat.CoWriter(session, seed=1, max_tokens=10, draft="none")
    session.model.script = [*reply, BOS]  # type: ignore[attr-defined]
    assert "".join(w.turn("Once upon a time.")) == " They played."
    session.model.script = [*reply, BOS]  # type: ignore[attr-defined]
    session.model.at = 0  # type: ignore[attr-defined]
    assert "".join(w.turn("Then the sun came out.")) == " They played."
    assert w.tokens.count(BOS) == 1 and w.tokens[0] == BOS
    assert tok.decode(w.tokens) == w.text
    assert w.text == "Once upon a time. They played. Then the sun came out. They played."
    assert w.tokens == (tok.encode("Once upon a time.") + reply
                        + tok.encode(" Then the sun came out.", bos=False) + reply)


def test_the_last_word_is_its_ids_back_to_its_space(session) -> None:  # type: ignore[no-untyped-def]
    """Token healing's last word with sentencepiece (one piece per line, its
    merges cross words): the ids from the one that starts with the word's
    space; none when the line ends outside a word."""
    tok = session.tokenizer
    for line, word in [("Once upon a time there was a zorbulax", b" zorbulax"),
                       ("Tim", b" Tim"), ("She said hello.", None)]:
        ends: list[int] = []
        ids = tok.encode(line, ends)
        n, extra = session.last_word(ids, ends)
        if word is None:
            assert n is None
            continue
        assert b"".join(tok.token_bytes(i) for i in ids[len(ids) - n:]) == word
        assert extra == len(word) - n


def _chat(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "chat.py"), *args],
                          input=stdin, capture_output=True, text=True, timeout=600,
                          check=False, env=dict(os.environ, PYTHONPATH=engine_ext.PYTHONPATH))


def test_chat_py_model_names(tmp_path: Path) -> None:
    # (the pinned names, release and stories260k, download: tests/test_release_on_host.py)
    r = _chat("--board", "host", "--model", "nope", "Once")
    assert r.returncode == 2 and r.stderr.startswith("error: --model nope: no such model (demo, ")
    r = _chat("--board", "host", "--model", "demo", "--image", str(tmp_path / "x.img"), "Once")
    assert r.returncode == 2 and "--model and --image exclude each other" in r.stderr


# ---- the llama2.c demo writes stories (the real engine) ----------------------------

STORY = """
import llm
llm.load({image!r})
llm.story("Once upon a time", seed=9, max_tokens=250)
print("STOP", llm.stats()["stop"], llm.stats()["tokens"])
llm.story("Once upon a time", seed=7, max_tokens=60)
print("STOP", llm.stats()["stop"])
w = __import__("llm_chat").CoWriter(seed=3, max_tokens=30)
print("TURN", "".join(w.turn("Once upon a time, there was a little girl named Molly.")))
print("TURN", "".join(w.turn("One day, her dad was making a cake")))
print("IDS", w.tokens.count(1), w.tokens[0])
"""


@pytest.fixture(scope="module")
def llama2c_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mpllm.convert import convert

    demo = ROOT / "models" / "llama2c-demo"
    out = tmp_path_factory.mktemp("l2c") / "l2c.img"
    convert(demo / "model.bin", demo / "tokenizer.bin", out, progress=False,
            drafter_stories=20, drafter_always=True)
    return out


def _words(text: str) -> list[str]:
    return [w.strip(".,!?\"'") for w in text.split()]


def test_the_llama2c_demo_writes_a_story(llama2c_image: Path) -> None:
    """llm.story() and CoWriter on CPython: readable English that ends where
    the model starts its next story (BOS); the story has one BOS, at its start.
    A sampled story (seed 9): the int4 demo's greedy one runs past 250 tokens."""
    r = subprocess.run([sys.executable, "-c", STORY.format(image=str(llama2c_image))],
                       capture_output=True, text=True, timeout=600, check=False,
                       env=dict(os.environ, PYTHONPATH=engine_ext.PYTHONPATH))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    print(out)
    story = out.split("STOP")[0]
    assert story.startswith("Once upon a time")
    stop, n = out.split("STOP ")[1].split()[:2]
    assert stop == "eot" and 20 < int(n) < 250  # it ended itself, as llama2.c's run.c does
    words = _words(story)
    common = {"the", "a", "was", "and", "to", "he", "she", "it", "they", "her", "his", "said"}
    assert len(words) > 20 and sum(w.lower() in common for w in words) > len(words) // 6
    assert all(w.isascii() for w in words)
    assert "IDS 1 1" in out  # co-writing: BOS once, first


def test_chat_py_model_llama2c_demo(llama2c_image: Path) -> None:
    # seed 9 ends its story itself (the greedy one runs past the budget)
    r = _chat("--board", "host", "--model", "llama2c-demo", "--seed", "9", "--max-tokens", "250",
              "--stats", "Once upon a time")
    assert r.returncode == 0, r.stderr
    with_image = _chat("--board", "host", "--image", str(llama2c_image), "--seed", "9",
                       "--max-tokens", "250", "Once upon a time")
    assert r.stdout == with_image.stdout and r.stdout.startswith("Once upon a time")
    assert "stop: eot" in r.stderr


def test_llm_chat_with_the_llama2c_demo(llama2c_image: Path, tmp_path: Path) -> None:
    """llm.chat() (chat.py without a prompt, lines piped in): each reply goes
    on the story; a seed gives the same chat every time (saved to the folder
    --stories names)."""
    lines = ("Once upon a time, there was a little girl named Molly.\n"
             "One day, her dad was making a cake\n/undo\nOne day, her dad was making a cake\n")
    first = _chat("--board", "host", "--image", str(llama2c_image), "--seed", "4",
                  "--max-tokens", "30", "--stories", str(tmp_path / "a"), stdin=lines)
    assert first.returncode == 0, first.stderr
    again = _chat("--board", "host", "--image", str(llama2c_image), "--seed", "4",
                  "--max-tokens", "30", "--stories", str(tmp_path / "b"), stdin=lines)
    assert again.stdout.replace(str(tmp_path / "b"), str(tmp_path / "a")) == first.stdout
    assert first.stdout.endswith(f"[story saved to {tmp_path / 'a' / 'story-1.txt'}]\n")
    out = first.stdout
    assert "<s>" not in out and "\ufffd" not in out
    assert sum(w.lower() in {"the", "a", "she", "her", "and", "was"} for w in _words(out)) > 8


def test_the_llama2c_demo_on_the_micropython_unix_port(llama2c_image: Path,
                                                       tmp_path: Path) -> None:
    """The same script on MicroPython's unix port prints the same bytes."""
    from unix_micropython import run_mp, unix_port

    exe = unix_port()
    code = STORY.format(image=str(llama2c_image))
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=False,
                          env=dict(os.environ, PYTHONPATH=engine_ext.PYTHONPATH))
    assert host.returncode == 0, host.stderr
    assert run_mp(exe, code, tmp_path) == host.stdout
