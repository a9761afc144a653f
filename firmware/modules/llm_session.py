"""llm_session: the session the board's Python is built on, on the board, on
MicroPython unix and on CPython.

The heavy lifting (the forward pass, sampling) is the native module `_llm`;
the tokenizer is llm_tokenizer.py. A Session holds the open model with its
tokenizer and the config figures the loop needs, the record of what the
model's context holds, the last generation's stats and the one generation
loop (Session.run); `default_session` is the one the REPL's functions use.
Beside it: generate()'s options (check_options, fresh_seed, drafter), why a
story stopped (stop_message) and the console a story streams to (write,
shown). llm.py (the REPL's functions and chat()), llm_chat, llm_serve and
llm_bench are built on this module; it imports none of them. The same file
must run unmodified on MicroPython 1.28 (ESP32-S3 and unix port) and on
CPython 3.10+, so it sticks to what both have: no `re`, no dataclasses, no
properties, no typing imports, and few imports at module level.
"""

# The loop is deliberately thin: one `_llm.Model` held open for the session,
# the prompt encoded here, one engine call per token, each token's bytes
# streamed through a Utf8Decoder. Everything numeric happens in the engine.
#
# Context: prompt + story must fit seq_len positions (256 for the release
# model). The last story token never needs to be fed back, so a prompt of n
# tokens leaves room for seq_len - n story tokens.
#
# Non-ASCII prompts are accepted everywhere (see llm_tokenizer.py's notes):
# the text is always kept exactly; only for characters outside _TOK_COVERED
# may MicroPython split the prompt into different tokens than CPython, and so
# tell a different story from the same seed.

import sys
import time

from llm_tokenizer import Tokenizer, Utf8Decoder  # also llm.Tokenizer, llm.Utf8Decoder

try:  # MicroPython: microsecond ticks that wrap, compared with ticks_diff
    _ticks_us = time.ticks_us
    _ticks_diff = time.ticks_diff
except AttributeError:  # CPython
    _perf_counter = time.perf_counter

    def _ticks_us():
        return int(_perf_counter() * 1000000)

    def _ticks_diff(end, start):
        return end - start


# The Pacer's clock: the work of this thread. On a board that is the wall
# clock; on a PC other programs' work would otherwise count as ours.
try:
    _thread_time = time.thread_time

    def _work_us():
        return int(_thread_time() * 1000000)

    def _work_diff(end, start):
        return end - start
except AttributeError:  # MicroPython
    _work_us = _ticks_us
    _work_diff = _ticks_diff


def _ms_since(start):
    """Wall milliseconds since a _ticks_us() reading."""
    return _ticks_diff(_ticks_us(), start) / 1000


# Defaults like upstream's firmware sampler; max_tokens fits a default prompt
# into the 256-token context with room to spare.
MAX_TOKENS = 200
TEMPERATURE = 0.8
TOP_K = 40
_OPTIONS = ("max_tokens", "temperature", "top_k", "seed", "draft")
#: generate()'s own: heal=False feeds a prompt's ids as they are (as run.c does)
_STORY_OPTIONS = _OPTIONS + ("heal",)
#: token texts a session remembers at most (Session.run): the words a story
#: uses again and again (~50 KB of the heap when full)
_TEXTS_MAX = 1024
#: drafted tokens one verify pass checks at most (the engine takes 8 positions:
#: the last token and up to 7 drafts)
MAX_DRAFT = 7


def prompt_lookup(context, max_len, max_ngram=3):
    """A drafter: the tokens that followed the latest earlier occurrence of the
    context's last n tokens (n = 3, 2, 1), at most max_len of them; [] if none."""
    n_ctx = len(context)
    n = min(max_ngram, n_ctx - 1)
    while n > 0:
        start = n_ctx - n - 1
        while start >= 0:
            k = 0
            while k < n and context[start + k] == context[n_ctx - n + k]:
                k += 1
            if k == n:
                return list(context[start + n:start + n + max_len])
            start -= 1
        n -= 1
    return []

STOP_EOT = "eot"  # the model wrote <|endoftext|> (llama2.c: BOS or EOS)
STOP_BUDGET = "budget"  # max_tokens story tokens were written
STOP_CONTEXT = "context"  # prompt + story filled the context
STOP_INTERRUPTED = "interrupted"  # Ctrl-C, or the caller stopped iterating
STOP_ERROR = "error"  # an exception ended it


def fresh_seed():
    """A new non-zero sampling seed (30 bits: a small int on MicroPython)."""
    s = 0
    try:
        import os

        b = os.urandom(4)
        s = b[0] | b[1] << 8 | b[2] << 16 | (b[3] & 0x3F) << 24
    except (ImportError, AttributeError, OSError, NotImplementedError):
        pass
    if not s:
        s = _ticks_us() & 0x3FFFFFFF
    return s or 1


def check_options(options, names=_OPTIONS):
    """(max_tokens, temperature, top_k, seed) from generate()'s keyword
    options (a dict; the option names allowed: `names`), checked:
    TypeError/ValueError naming what is wrong."""
    for name in options:
        if name not in names:
            raise TypeError(f"unknown option {name!r}; the options are: " + ", ".join(names))
    max_tokens = options.get("max_tokens", MAX_TOKENS)
    temperature = options.get("temperature", TEMPERATURE)
    top_k = options.get("top_k", TOP_K)
    seed = options.get("seed", None)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise TypeError(f"max_tokens must be an int, not {type(max_tokens).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature must be a number, not {type(temperature).__name__}")
    if not temperature >= 0 or temperature > 3.0e38:  # `not >=` also catches NaN
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int, not {type(top_k).__name__}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 means all tokens), got {top_k}")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
        if seed < 0 or seed >> 64:
            raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    return max_tokens, float(temperature), top_k, seed


class Pacer:
    """The image's drafter, used only while it pays on this machine's clock
    (draft="auto"). A verify pass is worth its time when the tokens it
    writes cost less each than a plain step; how much less depends on the
    board (the S3 streams weights from PSRAM, a PC computes), on the model
    and on the story, so it is measured here, as the story is written,
    never assumed. Either way the story is the same (a pass keeps only what
    plain decoding writes): pacing changes the time, not the tokens.

    The decoding loop asks drafting() before each token it must decode,
    then reports the time of what it did: stepped(us) for a plain step,
    passed(us, tokens) for a verify pass. Both costs are running means
    (each new reading weighs 1/8), so one slow pass (a garbage collection,
    a line printed) does not decide. Now and then a decision goes the other
    way (a probe), so that a cost that changed along the story is seen
    again: PROBE decisions after the first, and each time a probe leaves the
    choice as it was, twice as long until the next (up to PROBE_MAX), so that
    where one way is plainly the cheaper (a PC, whose verify pass costs about
    what its steps do) probing does not cost a few per cent for ever."""

    PROBE = 32
    PROBE_MAX = 256

    def __init__(self, draft):
        self.draft = draft
        self.step_us = 0.0  # a plain step (0: not measured yet)
        self.pass_us = 0.0  # a verify pass
        self.pass_tokens = 0.0  # tokens a verify pass writes
        self.decisions = 0
        self.interval = self.PROBE  # decisions from one probe to the next
        self.since = 0  # decisions since the last probe
        self.probed = None  # the choice the last probe went against, until it is weighed

    def __call__(self, context, n):
        return self.draft(context, n)

    def drafting(self):
        """Whether the next token comes from a verify pass (True) or a plain
        step: first one of each, then the cheaper per token, except at a probe."""
        self.decisions += 1
        if not self.step_us:
            return False
        if not self.pass_us:
            return True
        better = self.pass_us < self.pass_tokens * self.step_us
        if self.probed is not None:  # the probe's reading is in: weigh it
            same = better == self.probed
            self.interval = min(2 * self.interval, self.PROBE_MAX) if same else self.PROBE
            self.probed = None
        self.since += 1
        if self.since < self.interval:
            return better
        self.since = 0
        self.probed = better
        return not better

    def stepped(self, us):
        self.step_us = us if not self.step_us else self.step_us + (us - self.step_us) / 8

    def passed(self, us, tokens):
        if not self.pass_us:
            self.pass_us, self.pass_tokens = us, tokens
        else:
            self.pass_us += (us - self.pass_us) / 8
            self.pass_tokens += (tokens - self.pass_tokens) / 8


def drafter(model, draft="auto", paced=True):
    """The drafting function a draft= option names (None: decode plainly).
    "auto" gives the image's drafter in a Pacer (unless paced=False: a
    benchmark of the drafter itself), used only while it pays."""
    if draft == "none":
        draft = None
    if draft is not None and not callable(draft) and draft not in ("auto", "ngram", "lookup"):
        raise ValueError(
            f"draft must be 'auto', 'ngram', 'lookup', None or a function, not {draft!r}")
    if not (hasattr(model, "verify") and hasattr(model, "rewind")):
        return None  # an engine without verify passes decodes plainly
    has_table = hasattr(model, "draft") and model.config().get("max_draft", 0) > 0
    pace = False
    if draft == "auto":
        plain = model.plain() if hasattr(model, "plain") else False
        draft = "ngram" if has_table and not plain else None
        pace = paced
    if draft == "ngram":
        if not has_table:
            raise ValueError("draft='ngram': this image has no n-gram drafter table "
                             "(convert.py leaves it out where it does not pay, and says "
                             "so; --drafter-stories 0 stores none)")
        ngram = lambda context, n: model.draft(context[-3:], n)
        return Pacer(ngram) if pace else ngram
    if draft == "lookup":
        return prompt_lookup
    return draft


def decode_tokens(model, token, n, draft=None, context=None, stops=(), counts=None):
    """The n tokens plain decoding writes after `token` (the engine's last
    choice, not yet fed), one at a time: model.step, or with a drafter
    (function (context ids, n) -> guesses; `context` the ids fed so far)
    verify passes that feed the token and up to MAX_DRAFT guesses at once
    and keep what plain decoding would have chosen, so the tokens are the
    same. No guess is kept past a stop id (`stops`: the tokenizer's
    stop_ids, or None). `counts` (a dict) gets produced
    (tokens the engine chose), passes, drafted and accepted added to it, and
    steps (plain steps a Pacer took between passes)."""
    if counts is None:
        counts = {}
    for key in ("produced", "steps", "passes", "drafted", "accepted"):
        counts.setdefault(key, 0)
    if stops is None:
        stops = ()
    cfg = model.config()
    seq_len = cfg["seq_len"]
    vocab = cfg["vocab_out"]
    pacer = draft if isinstance(draft, Pacer) else None
    made = 0
    while made < n:
        if draft is None or pacer is not None and not pacer.drafting():
            t = _work_us()
            if pacer is not None:
                context.append(token)  # (the drafter's context, as verify_pass keeps it)
            token = model.step(token)
            if pacer is not None:
                pacer.stepped(_work_diff(_work_us(), t))
                counts["steps"] += 1
            counts["produced"] += 1
            made += 1
            yield token
        else:
            chosen = verify_pass(model, token, n - made, draft, context, stops, counts,
                                 seq_len, vocab, pacer)
            made += len(chosen)
            yield from chosen
            token = chosen[-1]


def verify_pass(model, token, n, draft, context, stops, counts, seq_len, vocab, pacer=None):
    """One verify pass of decode_tokens (n >= 1 tokens left to write): feeds
    `token` and the drafter's guesses, appends what it fed for good to
    `context`, adds to `counts`, tells `pacer` (a Pacer, or None) the pass's
    time and tokens; returns the tokens plain decoding writes next, 1 to n of
    them (the engine's choice after `token` and after each guess kept)."""
    t = _work_us()
    context.append(token)
    at = model.pos()
    n_guess = min(n, seq_len - at, MAX_DRAFT + 1) - 1
    guess = draft(context, n_guess) if n_guess > 0 else []
    if type(guess) is not list or len(guess) > n_guess:  # (the engine's drafter gives a list)
        guess = list(guess)[:n_guess]
    for g in guess:  # a guess is a token id of this model, or an error now
        if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < vocab:
            raise ValueError(f"the drafter returned {g!r}, not a token id 0..{vocab - 1}")
    got = model.verify([token] + guess)
    n_guess = len(guess)
    a = 0  # guesses kept
    while a < n_guess and guess[a] == got[a] and got[a] not in stops:
        a += 1
    model.rewind(at + a + 1)
    if a:
        context.extend(guess[:a])
    counts["passes"] += 1
    counts["drafted"] += n_guess
    counts["accepted"] += a
    counts["produced"] += a + 1
    del got[a + 1:]  # (the engine's fresh list: cut in place, not copied)
    if pacer is not None:
        pacer.passed(_work_diff(_work_us(), t), len(got))
    return got


def _new_stats(n_prompt, kept, max_tokens, seq_len, temperature, top_k, seed):
    """stats() of a generation that starts now (see stats() for the keys)."""
    return {
        "stop": None,
        "prompt_tokens": n_prompt,
        "prefilled": n_prompt - kept,
        "tokens": 0,
        "max_tokens": max_tokens,
        "seq_len": seq_len,
        "temperature": temperature,
        "top_k": top_k,
        "seed": seed,
        "ttft_ms": None,
        "engine_ttft_ms": None,
        "engine_ms_per_token": None,
        "wall_ms": None,
        "tok_per_s": None,
        "head_rows_fraction": None,
        "produced": 0,
        "steps": 0,
        "passes": 0,
        "drafted": 0,
        "accepted": 0,
        "tokens_per_pass": None,
    }


def _end_stats(stats, model, stop, start, at_prefill, vocab_out):
    """Fill in the figures known once a generation has ended."""
    wall = _ms_since(start)
    stats["stop"] = stop
    stats["wall_ms"] = wall
    if wall > 0:
        stats["tok_per_s"] = stats["tokens"] * 1000 / wall
    if at_prefill is None:
        return  # nothing reached the engine
    stats["engine_ttft_ms"] = at_prefill["ttft_ms"]
    end = model.stats()
    produced = stats["produced"]
    if produced > 0:
        stats["engine_ms_per_token"] = (end["total_ms"] - at_prefill["total_ms"]) / produced
    if stats["passes"]:
        stats["tokens_per_pass"] = (produced - stats["steps"]) / stats["passes"]
    if end.get("heads") and "head_rows" in end:  # (a test double has no counters)
        stats["head_rows_fraction"] = end["head_rows"] / (end["heads"] * vocab_out)


def _quotes(token_bytes, ids):
    """How many double quotes the text of `ids` holds."""
    return sum(token_bytes(i).count(b'"') for i in ids)


def ends_sentence(token_bytes, story, quotes=0):
    """Whether the text of the ids `story` (after a context holding `quotes`
    double quotes) ends a sentence: in ".", "!" or "?" outside quotes, or in
    one of them and a closing quote ('."'). Trailing spaces do not count;
    a comma and a closing quote ('," she said') do not end one."""
    tail = b""
    i = len(story)
    while i and len(tail.rstrip()) < 2:
        i -= 1
        tail = token_bytes(story[i]) + tail
    if (quotes + _quotes(token_bytes, story)) % 2:
        return False  # inside a quote (or after an opening one): not yet
    tail = tail.rstrip()
    if tail[-1:] == b'"':
        tail = tail[:-1]
    return tail[-1:] in (b".", b"!", b"?")


def word_byte(c):
    """Whether byte c can be part of a word (co-writing never starts a reply
    inside the line's last word): an ASCII letter or digit, or
    any byte of a non-ASCII character (the same rule on every runtime)."""
    return c >= 0x80 or 0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A or 0x30 <= c <= 0x39


def _spells(b, left):
    """Whether a token of text b goes on spelling the bytes `left`: it is
    their beginning, or all of them followed by a byte no word has."""
    if len(b) <= len(left):
        return left.startswith(b)
    return b.startswith(left) and not word_byte(b[len(left)])


def _mark(model):
    """What changes whenever the model is fed or rewound: (tokens fed, position)."""
    return (model.stats()["tokens"], model.pos())


class Session:
    """One open model and what goes with it: its tokenizer, the config
    figures the loop needs, the record of what its context holds, the last generation's stats, and the
    one generation loop (run). llm's functions use llm.default_session; on
    MicroPython the binding holds one model at a time, so one session at a
    time has it open."""

    def __init__(self):
        self.model = None  # the open _llm.Model
        self.source = None  # what it was opened from (None: the binding's default)
        self.tokenizer = None  # its Tokenizer
        # of its config(): what the loop needs (the whole dict costs ~2 KB of
        # a board's heap)
        self.seq_len = 0
        self.eot_id = 0
        self.stop_ids = ()  # the tokenizer's: where a story ends
        self.vocab_out = 0
        self._inside = None  # _inside_word()'s bitmap, once it is needed
        self._texts = None  # run()'s remembered token texts, by id, once it is needed
        self.last = {}  # stats of the last (or running) generation
        self._pacer = None  # (model, Pacer): draft="auto"'s costs, kept from story to story
        # The ids the model's context holds, in order, as far as this session
        # knows (a prefix of them at least). One list for the model, not one
        # per CoWriter: stories that share the model (the web server's, a
        # story() between chat turns) each see what the others left in it.
        self._held = []
        # _mark(model) when _held was written: code that feeds or rewinds the
        # model itself changes it, and _held is then not believed
        # (forget_context() says so outright; llm_bench calls it)
        self._held_mark = None

    def load(self, image=None, plain=None, fast=None, context=None):
        """llm.load(): open the model once and return it; later calls reuse it
        (another context opens it again)."""
        if plain and fast:
            raise ValueError("plain (the exact reference) and fast (lossy) exclude each other")
        model = self.model
        same = model is not None and (image is None or image is self.source or
                                      image == self.source)
        if same and (context is None or context == self.seq_len):
            self._set_modes(model, plain, fast)
            return model
        if same:
            image = self.source  # the open image, held for another context
        was = None  # what to open again if this load fails
        if model is not None:
            try:
                was = (self.source, model.plain() or None, model.fast() or None, self.seq_len)
            except Exception:  # noqa: BLE001 - closed by its holder (`with model:`): none
                was = None
        self.unload()
        try:
            return self._open(image, plain, fast, context)
        except Exception:
            # a load that fails (a context past the image's, a bad file, no
            # memory) leaves the model that was open, open (its context starts
            # over), rather than none: on a PC llm.load() alone cannot find it
            if was is not None:
                try:
                    self._open(*was)
                except Exception:  # noqa: BLE001, S110 - the first failure is the one to raise
                    pass
            raise

    def _open(self, image, plain, fast, context):
        """Open `image` (None: the runtime's default model) as load() asks."""
        import _llm

        # context only when asked: the engine's default is the image's seq_len,
        # or where that finds no memory a context it fits (in plain mode with
        # plain mode's float V, so plain is given to the constructor too)
        kw = {} if context is None else {"context": context}
        if plain:
            kw["plain"] = True
        try:
            model = _llm.Model(**kw) if image is None else _llm.Model(image, **kw)
        except TypeError as e:
            if image is not None:
                raise
            raise TypeError(
                "no model image: this runtime has no default model, so call "
                "llm.load(path_to_image) first (on a PC, python tools/chat.py "
                "converts and loads the demo model) (" + str(e) + ")"
            )
        try:
            cfg = model.config()
            tok = Tokenizer(model.tokenizer(), cfg["vocab_out"])
            if tok.eot_id != cfg["eot_id"]:
                raise ValueError(
                    f"model image is inconsistent: its tokenizer's <|endoftext|> is id "
                    f"{tok.eot_id}, its config says {cfg['eot_id']}"
                )
            self._set_modes(model, plain, fast)
        except BaseException:
            model.close()
            raise
        self.model = model
        self.source = image
        self._pacer = None  # (a new model's costs are its own)
        self.forget_context()
        self.tokenizer = tok
        self.seq_len = cfg["seq_len"]
        self.eot_id = cfg["eot_id"]
        self.stop_ids = tok.stop_ids
        self.vocab_out = cfg["vocab_out"]
        self._inside = None
        self._texts = None
        try:  # the tokenizer built its merge table: give the garbage back now
            import gc

            gc.collect()
        except ImportError:
            pass
        return model

    def _set_modes(self, model, plain, fast):
        """plain= / fast= of load() (None: leave as it is). Fast mode changes the
        KV cache's form, so changing it starts the context over."""
        if fast is not None and bool(fast) != model.fast():
            was_plain = model.plain()
            model.reset()
            self.forget_context()
            try:
                if fast:
                    model.set_plain(False)
                model.set_fast(bool(fast))
            except BaseException:
                model.set_plain(was_plain)  # refused: the modes as they were
                raise
        if plain is not None:
            model.set_plain(plain)

    def unload(self):
        """llm.unload(): close the model and drop the tokenizer."""
        model = self.model
        self.model = None
        self.source = None
        self.tokenizer = None
        self._pacer = None
        self._inside = None
        self._texts = None
        self.forget_context()
        if model is not None:
            model.close()

    def mode(self):
        """llm.mode(): "plain", "exact" or "fast"."""
        model = self.load()
        return "fast" if model.fast() else "plain" if model.plain() else "exact"

    def stats(self):
        """llm.stats(): numbers of the last generation (a copy)."""
        return dict(self.last)

    def prompt_ids(self, prompt, ends=None):
        """Token ids of a prompt, or a clear error why it cannot start a story
        (ends: as the tokenizer's encode)."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, not {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("empty prompt: give the story a beginning, e.g. 'Once upon a time'")
        self.load()
        tok = self.tokenizer
        ids = tok.encode(prompt, ends)
        if tok.decode(ids) != prompt:  # a byte without a token would be dropped silently
            raise ValueError("prompt has characters this model's tokenizer cannot represent")
        n = len(ids)
        seq_len = self.seq_len
        if n >= seq_len:
            raise ValueError(
                f"prompt too long: it is {n} tokens and the context holds {seq_len}, "
                f"so a prompt can have at most {seq_len - 1} (leaving room for the story)"
            )
        return ids

    def generate(self, prompt, **options):
        """llm.generate(): the story after `prompt`, as text pieces."""
        max_tokens, temperature, top_k, seed = check_options(options, _STORY_OPTIONS)
        heal = options.get("heal", True)
        if not isinstance(heal, bool):
            raise TypeError(f"heal must be True or False, not {type(heal).__name__}")
        model = self.load()
        # the engine's own rules for the sampler (top_k's limit is _llm.MAX_TOP_K),
        # checked now rather than once the story has started
        model.reset()
        model.sampler(temperature, top_k, 0)
        draft = self.paced(drafter(model, options.get("draft", "auto")))
        ends = []
        ids = self.prompt_ids(prompt, ends)
        if temperature == 0:
            seed = None
        elif seed is None:
            seed = fresh_seed()
        # A prompt ending in a word ("Tom and his dog") is healed as a
        # co-writing line is: its tokenization there is where the word stops,
        # which the model rarely saw mid-story ("dog" + "o the sun").
        heal = self.last_word(ids, ends)[0] if heal else None
        if heal is not None:
            heal = min(heal, len(ids) - 1)  # one id at least to prefill
        return self.run(ids, max_tokens, temperature, top_k, seed, draft, heal=heal)

    def last_word(self, ids, ends):
        """When text (its ids, and `ends` as encode gives it) ends inside a
        word (a co-writing line, a prompt: the user finished the word): how
        many of its last ids spell its last pre-tokenizer piece, which the
        model re-writes itself before the story (token healing: run's heal),
        and how many more positions that may take at most; else (None, 0)."""
        tok = self.tokenizer
        token_bytes = tok.token_bytes
        if ids[-1] == tok.bos_id or not word_byte(token_bytes(ids[-1])[-1]):
            return None, 0
        if tok.sentencepiece:
            # one piece for the whole line (its merges cross words): the word
            # is the last ids back to the one that starts after a non-word
            # byte (sentencepiece puts the space in front of a word's token)
            n = 0
            while n < len(ids) and ids[-1 - n] != tok.bos_id:
                n += 1
                if not word_byte(token_bytes(ids[-n])[0]):
                    break
        else:
            n = len(ids) - (ends[-2] if len(ends) > 1 else 0)
        spelled = 0
        for i in ids[len(ids) - n:]:
            spelled += len(token_bytes(i))
        return n, spelled - n

    def paced(self, draft):
        """`draft`, or for a Pacer the one this session's model already
        measured: the next story starts from what the last one learned."""
        if isinstance(draft, Pacer):
            kept = self._pacer
            if kept is not None and kept[0] is self.model:
                return kept[1]
            self._pacer = (self.model, draft)
        return draft

    def run(self, ids, max_tokens, temperature, top_k, seed, draft=None, kept=0, out=None,
            heal=None, finish=0):
        """The story after the context `ids`, as text pieces (a generator):
        the one generation loop. seed None: greedy. kept: how many of ids the
        model's context already holds (0: it starts afresh; co-writing keeps
        the story between turns, see context_match). out (a list): gets the
        story's ids.

        heal (token healing, for a line the user ended inside a word): how
        many of the last ids spell the end of that word (at most len(ids) -
        1 - kept). They are backed off and the model re-writes their text
        with tokens of its own choosing (see _heal), then the story starts
        after the word, never inside it. The pieces hold the story only (not
        the re-written text); out gets the ids that re-wrote it before the
        story's (the backed-off ids themselves until the model has re-written
        them), so that out's text after ids[:-heal] is always the word and
        the story, also while the story is being written.

        finish: past max_tokens, go on until the story is at a sentence end
        (ends_sentence), `finish` more tokens at most, so that a reply does
        not stop mid-sentence; stats()' stop is still "budget".
        """
        start = _ticks_us()
        context = ids if heal is None else ids[:len(ids) - heal]
        backed = ids[len(context):]
        healed = []  # the ids that re-wrote the backed-off text, fed
        story = []  # the story's ids
        if out is None:
            out = []
        out.extend(backed)  # (filled as it goes: MicroPython never closes an abandoned run)
        stats = _new_stats(len(context), kept, max_tokens, self.seq_len, temperature, top_k,
                           seed)
        self.last = stats
        stop = STOP_INTERRUPTED
        at_prefill = None
        model = None
        try:
            model = self.load()
            seq_len = self.seq_len
            token_bytes = self.tokenizer.token_bytes
            stops = self.stop_ids
            decoder = Utf8Decoder()
            if kept:
                model.rewind(kept)
            else:
                model.reset()
            if seed is None:
                model.sampler(0.0, 0, 0)
            else:
                model.sampler(temperature, top_k, seed)
            token = model.prefill(context[kept:])
            skip = 0  # bytes of the story's first token that end the word
            if heal is not None:
                token, skip = self._heal(model, token, backed, healed)
                if token is not None:  # re-written: the model's ids replace the user's
                    for _ in backed:
                        out.pop()
                    out.extend(healed)
                stats["prompt_tokens"] = len(context) + len(healed)
            stats["ttft_ms"] = _ms_since(start)
            at_prefill = model.stats()
            n_prompt = len(context) + len(healed)
            budget = min(max_tokens, seq_len - n_prompt)
            last = min(max_tokens + finish, seq_len - n_prompt)  # (finish: see above)
            quotes = None  # of the context, counted once past the budget
            # The loop per story token, kept lean (each bytecode here is paid
            # on the board once a token): methods looked up once, the tokens
            # a verify pass chose beyond the first taken from its list.
            step = model.step
            feed = decoder.feed
            # A token's text, once seen, whenever the decoder holds nothing
            # pending: then the text depends on the token's bytes alone (no
            # bytes sliced or decoded for a token seen before). A dict of the
            # ids seen, at most _TEXTS_MAX of them: a list over a release
            # vocabulary would hold 100 KB of the board's heap.
            texts = self._texts
            if texts is None:
                texts = self._texts = {}
            remembered = texts.get
            story_append = story.append
            out_append = out.append
            pacer = draft if isinstance(draft, Pacer) else None
            if draft is not None:
                fed = context + healed  # the drafter's context: the ids fed so far
                vocab = self.vocab_out
            chosen = []  # the tokens the last verify pass chose
            taken = 0  # of them written
            n = 0  # story tokens written
            while token is not None and token not in stops:
                story_append(token)
                out_append(token)
                n += 1
                stats["tokens"] = n
                if skip:
                    piece = feed(token_bytes(token)[skip:])
                    skip = 0
                else:
                    piece = remembered(token)
                    if piece is None or decoder.pending:
                        b = token_bytes(token)
                        clean = not decoder.pending
                        piece = feed(b)
                        # a char per byte: nothing kept back, nothing joined to what was
                        if clean and len(piece) == len(b) and len(texts) < _TEXTS_MAX:
                            texts[token] = piece
                if piece:
                    yield piece
                if n >= budget:
                    if n >= last:
                        break
                    # past the budget (finish): one token more, unless the story
                    # is at a sentence end. Only here, never on the way to it.
                    if quotes is None:
                        quotes = _quotes(token_bytes, context + healed)
                    if ends_sentence(token_bytes, story, quotes):
                        break
                    budget = n + 1
                if draft is None:
                    token = step(token)
                    stats["produced"] = n
                elif taken < len(chosen):
                    token = chosen[taken]
                    taken += 1
                elif pacer is not None and not pacer.drafting():
                    # (a plain step between passes: the story is the same)
                    t = _work_us()
                    fed.append(token)
                    token = step(token)
                    pacer.stepped(_work_diff(_work_us(), t))
                    stats["produced"] += 1
                    stats["steps"] += 1
                else:
                    chosen = verify_pass(model, token, budget - n, draft, fed, stops, stats,
                                         seq_len, vocab, pacer)
                    token = chosen[0]
                    taken = 1
            if token in stops:
                stop = STOP_EOT
            elif n >= max_tokens:
                stop = STOP_BUDGET
            else:
                stop = STOP_CONTEXT
            piece = decoder.flush()
            if piece:
                yield piece
        except Exception:
            stop = STOP_ERROR  # the engine raised: pass it on, but say so in stats()
            raise
        finally:
            if model is not None:
                # the context holds the ids and the story (the last token chosen is
                # not fed yet; a verify pass may hold guesses beyond it, unknown here)
                held = context + healed + story
                self._hold(model, held[:min(model.pos(), len(held))])
                _end_stats(stats, model, stop, start, at_prefill, self.vocab_out)

    def _heal(self, model, token, backed, healed):
        """Token healing: re-write the text of the backed-off ids `backed`
        after the context the model was just given (`token` its choice), then
        choose the story's first token outside the word. Each token is the
        engine's own choice when it fits (it spells the next bytes of the
        text, or all of it followed by a byte that is no part of a word),
        else the likeliest token that spells the next bytes (_likeliest);
        after the text, the engine's choice if it starts outside the word (or
        ends the story: a stop id), else the likeliest that does. The tokens
        that re-write the text are fed and appended to `healed`. Returns (the
        story's first token, not fed; how many of its bytes end the word),
        or (None, 0) when the context filled first. The engine's seeded
        choices and its logits are the same everywhere, so is the healing."""
        token_bytes = self.tokenizer.token_bytes
        left = b"".join([token_bytes(i) for i in backed])
        while left:
            if token in self.stop_ids or not _spells(token_bytes(token), left):
                token = self._likeliest(model, left)
            b = token_bytes(token)
            if len(b) > len(left):
                return token, len(left)  # it ends the word and starts the story
            if model.pos() + 1 >= self.seq_len:
                return None, 0
            left = left[len(b):]
            healed.append(token)
            token = model.step(token)
        if token not in self.stop_ids and word_byte(token_bytes(token)[0]):
            token = self._likeliest(model, b"")
        return token, 0

    def _likeliest(self, model, left):
        """The token with the highest logit (the lowest id on a tie) among
        those whose text is a beginning of `left` (looked up by their bytes:
        a few, whatever the vocabulary), or with left empty among those that
        start outside a word, the stop ids included. The engine chooses
        (Model.best_of): only the few ids' head rows are computed, and no
        logits vector is copied into the heap (~99 KB on the release shape);
        with left empty it leaves out the ids set in _inside_word's bitmap."""
        if not left:
            return model.best_of(skip=self._inside_word())
        tok = self.tokenizer
        vocab_out = self.vocab_out
        ids = []
        for n in range(1, len(left) + 1):
            i = tok.token_id(left[:n])
            if 0 <= i < vocab_out and i not in tok.special_ids:
                ids.append(i)
        if not ids:
            raise ValueError("no token of this model spells the end of the line's last word")
        return model.best_of(ids)

    def _inside_word(self):
        """A bit per token the story may not start with after a word: its
        text starts with a word byte, or it is a special token that does
        not end a story (stop_ids: <|endoftext|>; llama2.c's BOS and EOS).
        Built once per model (vocab_out / 8 bytes)."""
        bits = self._inside
        if bits is None:
            n = self.vocab_out
            first = self.tokenizer.first_bytes(n)
            bits = bytearray((n + 7) // 8)
            for i in range(n):
                if word_byte(first[i]):
                    bits[i >> 3] |= 1 << (i & 7)
            for i in self.tokenizer.special_ids:
                if i not in self.stop_ids and i < n:
                    bits[i >> 3] |= 1 << (i & 7)
            self._inside = bits
        return bits

    # ---- the context: what the open model holds --------------------------------

    def context_match(self, want):
        """llm.context_match(): how many of `want` the context holds already."""
        model = self.load()
        held = self._held if self._held_mark == _mark(model) else []
        n = min(len(held), len(want) - 1, model.pos())
        k = 0
        while k < n and held[k] == want[k]:
            k += 1
        return k

    def context_prefill(self, want):
        """llm.context_prefill(): make the context hold exactly `want`."""
        k = self.context_match(want + [0])  # all of want may already be there
        if k < len(want):
            model = self.load()
            model.rewind(k)
            self._hold(model, want[:k])  # held whether or not the prefill finishes
            model.prefill(want[k:])
            self._hold(model, want)

    def forget_context(self):
        """llm.forget_context(): the next generation feeds all its ids."""
        self._held = []
        self._held_mark = None

    def _hold(self, model, ids):
        """Record that the model's context holds `ids`, as it stands now."""
        self._held = ids
        self._held_mark = _mark(model)


#: the session llm's functions (and the REPL) use
default_session = Session()


def stop_message(s=None):
    """Why the last story stopped (s: a stats() dict, default the last
    story's), as story() prints it ("" for <|endoftext|>)."""
    if s is None:
        s = default_session.last
    stop = s.get("stop")
    if stop == STOP_BUDGET:
        return f"[stopped: token budget {s['max_tokens']} reached]"
    if stop == STOP_CONTEXT:
        return f"[stopped: context full ({s['seq_len']} tokens)]"
    if stop == STOP_INTERRUPTED:
        return "[stopped: interrupted]"
    if stop == STOP_ERROR:
        return "[stopped: error]"
    return ""


def write(text):
    """Print `text` at once (no newline added): the console a story streams to."""
    sys.stdout.write(text)
    flush = getattr(sys.stdout, "flush", None)
    if flush is not None:
        flush()


def shown(text):
    """`text` safe for a terminal: control characters other than newline and
    tab become U+FFFD. A byte-level model can emit any byte; raw, ESC would
    drive the terminal and 0x04 ends mpremote's output early."""
    for c in text:
        if (c < " " and c != "\n" and c != "\t") or "\x7f" <= c <= "\x9f":
            break
    else:
        return text  # the usual case: nothing to replace, nothing allocated
    out = []
    for c in text:
        if (c < " " and c != "\n" and c != "\t") or "\x7f" <= c <= "\x9f":
            c = "\ufffd"
        out.append(c)
    return "".join(out)
