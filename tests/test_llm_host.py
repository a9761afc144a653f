"""llm.py section 2 (generate/story/chat/stats) on CPython over the real `_llm` engine.

The expected tokens always come from driving the engine directly (not through
llm.py), so these tests check the loop against the engine, not against itself:
on the prompt's own ids (heal=False; healing a prompt's last word is
test_cowriting's, against its own oracle).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import engine_ext
import llm
import llm_session
import pytest

_llm = engine_ext.load()
ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Once upon a time"


@pytest.fixture
def tiny(tiny_model) -> Iterator:
    """llm with the tiny generated model (seq_len 64) loaded."""
    llm.load(str(tiny_model.image))
    yield tiny_model
    llm.unload()  # a test may have swapped it, closed it or left it at another context
    llm.load(str(tiny_model.image))


def engine_tokens(image: Path, ids: list[int], n: int, temperature: float = 0.0, top_k: int = 0,
                  seed: int = 0) -> list[int]:
    """Up to n tokens straight from the engine, stopping after <|endoftext|>."""
    with _llm.Model(str(image)) as m:
        m.sampler(temperature, top_k, seed)
        out = [m.prefill(ids)]
        while len(out) < n and out[-1] != m.config()["eot_id"]:
            out.append(m.step(out[-1]))
    return out


def raw_text(ids: list[int]) -> str:
    tok = llm.tokenizer()
    return b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "replace")


def text_of(ids: list[int]) -> str:
    """What story() shows: control characters but newline and tab as U+FFFD."""
    return re.sub("[\x00-\x08\x0b-\x1f\x7f-\x9f]", "\ufffd", raw_text(ids))


def eot_seed(image: Path, ids: list[int], room: int) -> tuple[int, int]:
    """A seed whose T=3, top_k=0 story ends in <|endoftext|> within `room` tokens, and
    the story's length in tokens (EOT excluded)."""
    for seed in range(1, 2000):
        toks = engine_tokens(image, ids, room, 3.0, 0, seed)
        if toks[-1] == 0:
            return seed, len(toks) - 1
    raise AssertionError("no seed in 1..1999 ends a story in <|endoftext|> on this model")


def test_budget_stop(tiny, capsys):
    ids = llm.tokenizer().encode(PROMPT)
    want = engine_tokens(tiny.image, ids, 7, 0.8, 40, 11)
    assert 0 not in want, "precondition: this seed's first 7 tokens hold no <|endoftext|>"
    llm.story(PROMPT, heal=False, seed=11, max_tokens=7)
    out = capsys.readouterr().out
    assert out == PROMPT + text_of(want) + "\n[stopped: token budget 7 reached]\n"
    s = llm.stats()
    assert (s["stop"], s["tokens"], s["prompt_tokens"], s["seed"]) == ("budget", 7, len(ids), 11)


def test_context_stop(tiny, capsys):
    ids = llm.tokenizer().encode(PROMPT)
    room = tiny.config.seq_len - len(ids)
    want = engine_tokens(tiny.image, ids, room)
    assert len(want) == room and 0 not in want, "precondition: greedy never writes EOT here"
    llm.story(PROMPT, heal=False, temperature=0, max_tokens=500)
    out = capsys.readouterr().out
    assert out == PROMPT + text_of(want) + f"\n[stopped: context full ({tiny.config.seq_len} tokens)]\n"
    s = llm.stats()
    assert (s["stop"], s["tokens"]) == ("context", room)
    assert s["prompt_tokens"] + s["tokens"] == tiny.config.seq_len


def test_context_cap_stops_the_story_where_the_engine_holds_no_more(tiny, capsys):
    """llm.load(context=N): the story gets the room N leaves, with the same tokens as
    the uncapped engine; config and stats say N; load() without context keeps it,
    another context or None after it opens the image again."""
    ids = llm.tokenizer().encode(PROMPT)
    cap = 30
    want = engine_tokens(tiny.image, ids, cap - len(ids))
    m = llm.load(str(tiny.image), context=cap)
    assert m.config()["seq_len"] == cap and llm.load() is m
    assert llm.load(context=cap) is m and llm.load(str(tiny.image), context=cap) is m
    llm.story(PROMPT, heal=False, temperature=0, max_tokens=500)
    out = capsys.readouterr().out
    assert out == PROMPT + text_of(want) + f"\n[stopped: context full ({cap} tokens)]\n"
    s = llm.stats()
    assert (s["stop"], s["tokens"], s["seq_len"]) == ("context", cap - len(ids), cap)
    m2 = llm.load(context=40)
    assert m2 is not m and m2.config()["seq_len"] == 40
    with pytest.raises(_llm.Error, match="bad argument: context 65 exceeds"):
        llm.load(str(tiny.image), context=65)


def test_a_load_that_fails_leaves_the_open_model_open(tiny):
    """llm.load() with a context past the image's, a bad context or a missing
    file raises, and the model that was open stays open at its context, in its
    mode, so that llm.load() and a story go on (before, the failed load had
    closed it: "no model image: ... call llm.load(path_to_image) first")."""
    llm.load(str(tiny.image), context=40, plain=True)
    for kw in ({"context": tiny.config.seq_len + 1}, {"context": 0}, {"context": "x"},
               {"image": str(tiny.image) + ".missing"}):
        with pytest.raises((_llm.Error, ValueError, TypeError, OSError)):
            llm.load(**{"image": str(tiny.image), **kw})
        m = llm.load()
        assert m.config()["seq_len"] == 40 and llm.mode() == "plain", kw
        assert "".join(llm.generate(PROMPT, heal=False, temperature=0, max_tokens=3))
    # a model its holder closed (`with llm.load(...) as m:`) is nothing to keep
    # open: the next load opens the image asked for (before: "the model is closed")
    with llm.load() as m:
        pass
    assert llm.load(str(tiny.image), context=32).config()["seq_len"] == 32


def test_budget_wins_when_it_equals_the_room(tiny):
    ids = llm.tokenizer().encode(PROMPT)
    room = tiny.config.seq_len - len(ids)
    "".join(llm.generate(PROMPT, heal=False, temperature=0, max_tokens=room))
    assert (llm.stats()["stop"], llm.stats()["tokens"]) == ("budget", room)


def test_eot_stop(tiny, capsys):
    ids = llm.tokenizer().encode(PROMPT)
    room = tiny.config.seq_len - len(ids)
    seed, n = eot_seed(tiny.image, ids, room)
    want = engine_tokens(tiny.image, ids, room, 3.0, 0, seed)
    llm.story(PROMPT, heal=False, seed=seed, temperature=3.0, top_k=0)
    out = capsys.readouterr().out
    assert out == PROMPT + text_of(want[:-1]) + "\n"  # no note, and no <|endoftext|> text
    assert "endoftext" not in out
    s = llm.stats()
    assert (s["stop"], s["tokens"]) == ("eot", n)
    assert llm.stop_message() == ""


def test_pieces_concatenate_to_the_decoded_tokens(small_model):
    llm.load(str(small_model.image))
    try:
        tok = llm.tokenizer()
        for prompt, seed in (("Once upon a time", 1), ("caf\u00e9 \u00fcber na\u00efve", 2),
                             ("x", 3)):
            ids = tok.encode(prompt)
            want = engine_tokens(small_model.image, ids, 40, 1.5, 0, seed)
            want = want[:-1] if want[-1] == 0 else want
            pieces = list(llm.generate(prompt, seed=seed, temperature=1.5, top_k=0, heal=False,
                                       max_tokens=40))
            assert all(pieces), "no empty pieces"
            assert "".join(pieces) == tok.decode(want) == raw_text(want)
            assert llm.stats()["tokens"] == len(want)
    finally:
        llm.unload()


def test_same_seed_same_story_and_fresh_seeds(tiny):
    a = "".join(llm.generate(PROMPT, heal=False, seed=42, max_tokens=20))
    b = "".join(llm.generate(PROMPT, heal=False, seed=42, max_tokens=20))
    assert a == b
    "".join(llm.generate(PROMPT, heal=False, max_tokens=20))
    s1 = llm.stats()["seed"]
    first = "".join(llm.generate(PROMPT, heal=False, max_tokens=20))
    s2 = llm.stats()["seed"]
    assert isinstance(s1, int) and isinstance(s2, int) and s1 > 0 and s2 > 0
    assert s1 != s2
    # the reported seed reproduces the story
    assert "".join(llm.generate(PROMPT, heal=False, seed=s2, max_tokens=20)) == first


def test_greedy_equals_engine_greedy(tiny):
    ids = llm.tokenizer().encode(PROMPT)
    want = engine_tokens(tiny.image, ids, 30)
    assert "".join(llm.generate(PROMPT, heal=False, temperature=0, max_tokens=30)) == raw_text(want)
    assert llm.stats()["seed"] is None
    # seed 0 is greedy too (the engine's rule), whatever the temperature
    assert "".join(llm.generate(PROMPT, heal=False, seed=0, max_tokens=30)) == raw_text(want)


def test_story_hides_control_characters_generate_keeps_them(tiny, capsys):
    ids = llm.tokenizer().encode(PROMPT)
    want = engine_tokens(tiny.image, ids, 50)
    raw = raw_text(want)
    assert re.search("[\x00-\x08\x0b-\x1f]", raw), "precondition: the tiny model emits some"
    assert "".join(llm.generate(PROMPT, heal=False, temperature=0, max_tokens=50)) == raw
    llm.story(PROMPT, heal=False, temperature=0, max_tokens=50)
    out = capsys.readouterr().out
    assert out == PROMPT + text_of(want) + "\n[stopped: token budget 50 reached]\n"
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out)


def test_stats_fields(tiny):
    "".join(llm.generate(PROMPT, heal=False, seed=3, max_tokens=10))
    s = llm.stats()
    assert s["stop"] == "budget" and s["max_tokens"] == 10 and s["seq_len"] == 64
    assert (s["temperature"], s["top_k"]) == (0.8, 40)
    for key in ("ttft_ms", "engine_ttft_ms", "engine_ms_per_token", "wall_ms", "tok_per_s"):
        assert isinstance(s[key], float) and s[key] > 0, key
    assert s["ttft_ms"] <= s["wall_ms"]
    assert abs(s["tok_per_s"] - 10 * 1000 / s["wall_ms"]) < 1e-6
    s["stop"] = "changed"
    assert llm.stats()["stop"] == "budget"  # stats() is a copy


def test_abandoned_generator_reports_interrupted(tiny):
    g = llm.generate(PROMPT, heal=False, seed=3, max_tokens=30)
    next(g)
    assert llm.stats()["stop"] is None  # running
    g.close()
    assert llm.stats()["stop"] == "interrupted"


class _InterruptingModel:
    """The real model, but the n-th step() raises `exc` (default: a Ctrl-C)."""

    def __init__(self, real: object, after: int, exc: BaseException | None = None) -> None:
        self._real, self._left = real, after
        self._exc = KeyboardInterrupt() if exc is None else exc

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def step(self, token: int) -> int:
        self._left -= 1
        if self._left == 0:
            raise self._exc
        return self._real.step(token)


class _ScriptedModel:
    """The real model (fed as usual), but the tokens it chooses are `script`'s."""

    def __init__(self, real: object, script: list[int]) -> None:
        self._real, self._script = real, iter(script)

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def prefill(self, ids: list[int]) -> int:
        self._real.prefill(ids)
        return next(self._script)

    def step(self, token: int) -> int:
        self._real.step(token)
        return next(self._script)


def test_pieces_are_the_streams_text_whatever_came_before(tiny, monkeypatch):
    """A token's text is remembered the first time it is decoded with nothing
    pending, and used only then: a lone continuation byte (U+FFFD alone) ends
    a character when a lead byte came before it, plain ASCII after a cut
    character completes nothing. The pieces are the whole stream's text."""
    tok = llm.tokenizer()
    byte_id = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    lead, cont, ascii_a = byte_id[b"\xc3"], byte_id[b"\xa9"], byte_id[b"a"]
    script = [cont, ascii_a, lead, cont, cont, lead, ascii_a, cont, lead, lead, ascii_a, cont]
    monkeypatch.setattr(llm.default_session, "model",
                        _ScriptedModel(llm.load(), [*script, llm.default_session.eot_id]))
    pieces = list(llm.generate(PROMPT, heal=False, temperature=0, draft=None))
    want = b"".join(tok.token_bytes(i) for i in script).decode("utf-8", "replace")
    assert "".join(pieces) == want == "\ufffda\u00e9\ufffd\ufffda\ufffd\ufffd\ufffda\ufffd"
    assert llm.stats()["tokens"] == len(script)


def test_remembered_texts_are_capped_and_change_nothing(tiny, monkeypatch):
    """The session remembers at most llm_session._TEXTS_MAX token texts; the story is
    the same with any cap (none remembered, a few, the default)."""
    stories, held = [], []
    for cap in (0, 3, llm_session._TEXTS_MAX):
        monkeypatch.setattr(llm_session, "_TEXTS_MAX", cap)
        llm.default_session._texts = None
        stories.append("".join(llm.generate(PROMPT, heal=False, seed=4, max_tokens=40, draft=None)))
        held.append(len(llm.default_session._texts))
    assert stories[0] == stories[1] == stories[2] and stories[0]
    assert held[0] == 0 and held[1] == 3 and 3 < held[2] <= 40


def test_engine_error_is_raised_and_recorded(tiny, monkeypatch):
    err = _llm.Error("bad state: simulated")
    monkeypatch.setattr(llm.default_session, "model", _InterruptingModel(llm.load(), 2, err))
    with pytest.raises(_llm.Error, match="simulated"):
        "".join(llm.generate(PROMPT, heal=False, seed=1))
    assert (llm.stats()["stop"], llm.stats()["tokens"]) == ("error", 2)
    assert llm.stop_message() == "[stopped: error]"


def test_ctrl_c_stops_story(tiny, capsys, monkeypatch):
    monkeypatch.setattr(llm.default_session, "model", _InterruptingModel(llm.load(), 3))
    with pytest.raises(KeyboardInterrupt):
        llm.story(PROMPT, heal=False, seed=1)
    assert capsys.readouterr().out.endswith("\n[stopped: interrupted]\n")
    assert llm.stats()["stop"] == "interrupted"
    assert llm.stats()["tokens"] == 3


@pytest.mark.parametrize("call, err, text", [
    (lambda: llm.story(""), ValueError, "empty prompt"),
    (lambda: llm.story(" \n\t"), ValueError, "empty prompt"),
    (lambda: llm.generate("Once upon a time " * 30), ValueError,
     "tokens and the context holds 64, so a prompt can have at most 63"),
    (lambda: llm.generate("Once", max_tokens=0), ValueError, "max_tokens must be at least 1"),
    (lambda: llm.generate("Once", max_tokens=2.5), TypeError, "max_tokens must be an int"),
    (lambda: llm.generate("Once", temperature=-0.1), ValueError,
     "temperature must be >= 0 (0 means greedy), got -0.1"),
    (lambda: llm.generate("Once", temperature=float("nan")), ValueError, "temperature must be"),
    (lambda: llm.generate("Once", top_k=-1), ValueError, "top_k must be >= 0"),
    (lambda: llm.generate("Once", top_k=281), ValueError,
     "top_k must be 0..256, or 0 / 280 for the whole vocabulary, got 281"),
    (lambda: llm.generate("Once", top_k=257), ValueError,
     "top_k must be 0..256, or 0 / 280 for the whole vocabulary, got 257"),
    (lambda: llm.generate("Once", seed=2**64), ValueError, "seed must be in 0..2**64-1"),
    (lambda: llm.generate("Once", seed="1"), TypeError, "seed must be an int or None"),
    (lambda: llm.generate("Once", heal=1), TypeError, "heal must be True or False, not int"),
    (lambda: llm.generate("Once", max_token=3), TypeError,
     "unknown option 'max_token'; the options are: max_tokens, temperature, top_k, seed"),
    (lambda: llm.story(b"Once"), TypeError, "prompt must be a str, not bytes"),
    (lambda: llm.chat(temp=1), TypeError, "unknown option 'temp'"),
])
def test_errors_are_readable_and_immediate(tiny, call, err, text):
    with pytest.raises(err) as e:
        call()  # generate() itself raises: no need to start iterating
    assert text in str(e.value)


def test_long_prompt_message_counts_tokens(tiny):
    n = len(llm.tokenizer().encode("Once upon a time " * 30))
    with pytest.raises(ValueError, match=f"it is {n} tokens"):
        llm.generate("Once upon a time " * 30)


def test_load_without_image_on_cpython_says_what_to_do(tiny_model):
    llm.unload()
    try:
        with pytest.raises(TypeError, match=r"call llm\.load\(path_to_image\) first"):
            llm.story("Once")
    finally:
        llm.load(str(tiny_model.image))


def test_load_reuses_and_switches(tiny_model, small_model):
    m = llm.load(str(tiny_model.image))
    assert llm.load() is m and llm.load(str(tiny_model.image)) is m
    llm.load(str(small_model.image))
    assert llm.tokenizer().vocab_size == 900
    with pytest.raises(_llm.Error):
        m.pos()  # the old model was closed
    llm.load(str(tiny_model.image))
    assert llm.tokenizer().vocab_size == 280


# ---- the host board: tools/chat.py and mpllm.board.hostboard --------------------------------


def run_chat(args: list[str], cwd: Path, env_extra: dict[str, str], stdin: str = "",
             ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPLLM_CACHE")}
    env.update(env_extra, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, str(ROOT / "tools" / "chat.py"), *args], cwd=cwd,
                          env=env, input=stdin, capture_output=True, text=True, timeout=120,
                          check=False)


def test_chat_py_prints_a_story_from_a_fresh_cwd(tiny, tmp_path, capsys):
    r = run_chat(["--board", "host", "--image", str(tiny.image), "--seed", "4",
                  "--max-tokens", "9", "--stats", PROMPT], tmp_path,
                 {"MPLLM_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    llm.story(PROMPT, seed=4, max_tokens=9)
    assert r.stdout == capsys.readouterr().out
    assert r.stdout.startswith(PROMPT) and r.stdout.endswith("[stopped: token budget 9 reached]\n")
    assert "stop: budget   prompt tokens: 14   story tokens: 9   seed: 4" in r.stderr
    assert "ms/token" in r.stderr and "tok/s" in r.stderr
    # --no-heal: the story after the prompt's own ids, as llama2.c's run.c writes it
    r = run_chat(["--board", "host", "--image", str(tiny.image), "--seed", "4",
                  "--max-tokens", "9", "--no-heal", PROMPT], tmp_path,
                 {"MPLLM_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    ids = llm.tokenizer().encode(PROMPT)
    assert r.stdout == (PROMPT + text_of(engine_tokens(tiny.image, ids, 9, 0.8, 40, 4))
                        + "\n[stopped: token budget 9 reached]\n")


def test_chat_py_errors(tiny, tmp_path):
    r = run_chat(["--image", str(tmp_path / "missing.img"), "x"], tmp_path, {})
    assert r.returncode == 2 and f"--image {tmp_path / 'missing.img'}: file not found" in r.stderr
    r = run_chat(["--image", str(tiny.image), "--max-tokens", "0", "x"], tmp_path, {})
    assert r.returncode == 2 and "max_tokens must be at least 1" in r.stderr
    r = run_chat(["--board", "n16r8", "--port", "/dev/ttyACM0", "--seed", "3", PROMPT],
                 tmp_path, {})
    assert r.returncode == 0
    assert r.stdout.strip() == ("mpremote connect /dev/ttyACM0 exec "
                                "'import llm; llm.story(\"Once upon a time\", seed=3)'")
    r = run_chat(["--no-heal"], tmp_path, {})
    assert r.returncode == 2 and "--no-heal is for a story from a prompt" in r.stderr
    # the board without PSRAM is a board too (flash.py --board n8 writes it): before,
    # "invalid choice: 'n8'"
    r = run_chat(["--board", "n8", "--port", "/dev/ttyACM0", "--greedy", PROMPT], tmp_path, {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("mpremote connect /dev/ttyACM0 exec "
                                "'import llm; llm.story(\"Once upon a time\", temperature=0.0)'")
    r = run_chat(["--board", "n8", "--image", str(tiny.image), PROMPT], tmp_path, {})
    assert r.returncode == 2 and "tools/flash.py --board n8 --image" in r.stderr


def test_hostboard_converts_once_and_again_when_sources_change(tiny_model, tmp_path, capfd):
    from mpllm.board import hostboard

    src = tmp_path / "src"
    src.mkdir()
    mb = Path(shutil.copy(tiny_model.model_bin, src / "model.bin"))
    tj = Path(shutil.copy(tiny_model.tokenizer_json, src / "tokenizer.json"))
    cache = tmp_path / "cache"
    img = hostboard.ensure_image(mb, tj, cache)
    first = capfd.readouterr().err
    assert "first run only" in first and img.is_file() and img.parent == cache / "images"
    stamp = img.stat().st_mtime_ns
    assert hostboard.ensure_image(mb, tj, cache) == img
    assert capfd.readouterr().err == ""  # reused silently
    assert img.stat().st_mtime_ns == stamp
    tj.write_text(tj.read_text() + "\n")  # same tokenizer, new bytes: a new hash
    img2 = hostboard.ensure_image(mb, tj, cache)
    assert img2 != img and img2.is_file() and "first run only" in capfd.readouterr().err
    # a damaged cached image is converted again when the engine rejects it
    data = bytearray(img2.read_bytes())
    data[-1] ^= 0xFF
    img2.write_bytes(bytes(data))
    mod = hostboard.open_sources(mb, tj, cache)
    assert mod is llm and "cannot be used" in capfd.readouterr().err
    assert "".join(llm.generate(PROMPT, heal=False, temperature=0, max_tokens=3))
    llm.load(str(tiny_model.image))


def test_demo_model_story_on_the_host_board(tmp_path):
    demo = ROOT / "models" / "demo"
    assert (demo / "model.bin").is_file() and (demo / "tokenizer.json").is_file(), \
        "the bundled demo model (models/demo/model.bin + tokenizer.json) is missing"
    env = {"MPLLM_CACHE": str(tmp_path / "cache")}
    r = run_chat(["--board", "host", "--greedy", "--max-tokens", "30", PROMPT], tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert "first run only" in r.stderr
    assert r.stdout.startswith(PROMPT) and len(r.stdout) > len(PROMPT) + 30
    again = run_chat(["--greedy", "--max-tokens", "30", PROMPT], tmp_path, env)
    assert again.returncode == 0 and again.stdout == r.stdout
    assert "first run only" not in again.stderr


def test_chat_py_stops_quietly_when_the_reader_goes_away(tiny, tmp_path):
    """`chat.py ... | head -c 20`: the closed pipe ends the story, no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPLLM_CACHE")}
    p = subprocess.Popen([sys.executable, str(ROOT / "tools" / "chat.py"), "--image",
                          str(tiny.image), "--seed", "2", "--max-tokens", "200", PROMPT],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.read(20)
    p.stdout.close()  # the reader leaves mid-story
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err, err


# ---- the board's Python as one session object ------------------------------------

BOARD_MODULES = ROOT / "firmware" / "modules"


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """The modules built on llm (llm_chat, llm_serve, llm_bench) and the host
    tools use a session's public names only: `llm._x` (or `llm_chat._x`, ...)
    outside its own module is a reach-in."""
    names = [p.stem for p in BOARD_MODULES.glob("*.py")]
    reach = re.compile(r"(?<![\w.])(" + "|".join(names) + r")\._[a-z]\w*")
    found = []
    for folder in (ROOT / "firmware", ROOT / "tools"):
        for path in sorted(folder.rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in reach.finditer(line):
                    if m.group(1) != path.stem:
                        found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert found == []


def test_no_module_level_import_circle_on_the_board() -> None:
    """firmware/modules' imports at module level (a function's own import,
    like llm.chat()'s, is not one) point one way only."""
    import ast

    names = {p.stem for p in BOARD_MODULES.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((BOARD_MODULES / (name + ".py")).read_text(encoding="utf-8"))
        deps: set[str] = set()
        for node in tree.body:  # top level, try/if blocks at top level included
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    break
                if isinstance(sub, ast.Import):
                    deps |= {a.name for a in sub.names}
                elif isinstance(sub, ast.ImportFrom) and sub.module:
                    deps.add(sub.module)
        graph[name] = deps & names
    assert "llm_session" in graph["llm_chat"]  # the check sees imports at all

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and reaches(d, goal, seen | {d}))
                   for d in graph[start])

    assert [n for n in sorted(names) if reaches(n, n, set())] == []


def test_a_session_of_its_own_leaves_the_default_one_alone(tiny) -> None:  # type: ignore[no-untyped-def]
    """Two sessions, two models (CPython): a story in one tells the same
    text as in the default session, and neither's stats nor context record
    are the other's."""
    mine = llm.Session()
    mine.load(str(tiny.image))
    try:
        want = "".join(llm.generate(PROMPT, seed=3, max_tokens=8))
        before = llm.stats()
        assert "".join(mine.generate(PROMPT, seed=3, max_tokens=8)) == want
        assert llm.stats() == before and mine.stats()["seed"] == 3
        ids = llm.tokenizer().encode(PROMPT)
        assert llm.context_match(ids + [0]) == len(ids)  # the default model still holds it
        mine.forget_context()
        assert llm.context_match(ids + [0]) == len(ids) and mine.context_match(ids + [0]) == 0
    finally:
        mine.unload()
    assert llm.default_session.model is not None


def test_a_plain_load_opens_the_model_plain(tiny, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """llm.load(plain=True) gives plain to the constructor, so that on a board
    without the memory for the image's seq_len the context the binding fits
    leaves room for plain mode's float V (set afterwards, it found none on the
    emulated N8)."""
    import _llm as binding

    asked: list[dict[str, object]] = []
    real = binding.Model

    def model(*args: object, **kw: object) -> object:
        asked.append(kw)
        return real(*args, **kw)

    llm.unload()
    monkeypatch.setattr(binding, "Model", model)
    m = llm.load(str(tiny.image), plain=True)
    assert asked == [{"plain": True}] and m.plain()
    llm.unload()
    m = llm.load(str(tiny.image), context=40)
    assert asked[-1] == {"context": 40} and not m.plain()
    llm.unload()  # the next test's model opens afresh, at the image's seq_len
