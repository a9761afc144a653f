"""llm_chat: writing a story together (llm.chat(), and llm_chat.CoWriter for
tools that keep stories themselves, such as llm_serve).

The same file on the board (frozen next to llm.py), on MicroPython unix and on
CPython. A module of its own so that a session that only tells stories never
loads it: llm.chat() imports it when it is called. It drives the engine
through an llm.Session (the open model, the tokenizer, the one generation
loop, and the one record of what the model's context holds).
"""

import sys

import llm

#: story tokens of one co-writing reply at most: a few sentences a turn
TURN_TOKENS = 60
#: when a turn would not fit the context, the story's first this many tokens
#: (its opening) and the most recent ones stay; the middle is forgotten
ROLLOVER_START = 32

HELP = (
    "Write a story together: type a line and press Enter, and the model goes on\n"
    "from it. The whole story so far stays in its memory.\n"
    "  /new      start a new story\n"
    "  /undo     take back the last turn (your line and the model's reply)\n"
    "  /seed N   sampling seed N from now on (0: always the likeliest token)\n"
    "  /temp T   sampling temperature T from now on (0: always the likeliest)\n"
    "  /help     this list\n"
    "An empty line or Ctrl-D leaves; Ctrl-C stops a reply.\n"
)


class CoWriter:
    """A story written together: each line is appended to the story, and the
    model continues from the whole story so far, which stays in its context.

    Token healing: when a line ends in a word (a letter, digit or non-ASCII
    character: the user has finished it), its last pre-tokenizer piece (" robot")
    is backed off and the model re-writes it with tokens of its own choosing,
    then replies from after the word, never inside it (Session.run's heal).
    The reply shows only what comes after the word; the story's ids are the
    model's spelling of it.

    Determinism: turn k of a story (counting from 0, after /undo the same k
    again) samples with seed + k, so a seeded session gives the same text on
    the PC and on the board, and /undo followed by the same line gives the
    same reply. Rollover (ROLLOVER_START) and what is prefilled while typing
    never change the text: the context is exactly the story's (rolled) ids.
    """

    def __init__(self, session=None, **options):
        """session: the llm.Session whose model writes (default
        llm.default_session, opened if it is not); generate()'s options;
        max_tokens is per reply (default TURN_TOKENS) and seed is the
        story's (default: a fresh one)."""
        self.session = llm.default_session if session is None else session
        options.setdefault("max_tokens", TURN_TOKENS)
        self.max_tokens, self.temperature, self.top_k, seed = llm.check_options(options)
        self.seed = llm.fresh_seed() if seed is None else seed
        model = self.session.load()
        model.sampler(self.temperature, self.top_k, 0)  # the engine's rules, now
        self.draft = llm.drafter(model, options.get("draft", "auto"))
        self.new()

    def new(self):
        """An empty story."""
        self.tokens = []  # the story's ids as the model reads them (rolled over)
        self.text = ""  # the story's text (all of it)
        self._turns = []  # (tokens, text) before each turn, for undo
        self.rolled = 0  # ids the last turn's rollover dropped

    def undo(self):
        """Take back the last turn; False when there is none."""
        if not self._turns:
            return False
        self.tokens, self.text = self._turns.pop()
        return True

    def snapshot(self):
        """The story as it stands, for restore(): the web server writes a
        reply while the line is still being typed and takes it back."""
        return (self.tokens, self.text, list(self._turns), self.rolled)

    def restore(self, snapshot):
        """The story as snapshot() saw it (what the context holds is not the
        story's: the next turn reuses what still matches)."""
        self.tokens, self.text, turns, self.rolled = snapshot
        self._turns = list(turns)

    def set_seed(self, seed):
        self.seed = llm.check_options({"seed": seed})[3]

    def set_temperature(self, temperature):
        self.temperature = llm.check_options({"temperature": temperature})[1]

    def _line(self, line, ends=None):
        """(text, ids) of a typed line as it joins the story: one space
        between the story and the line unless either side has one. A
        llama2.c tokenizer starts only the story with BOS: a later line goes
        on the same text (encode's bos=False)."""
        if self.text and not self.text[-1:].isspace() and not line[:1].isspace():
            line = " " + line
        session = self.session
        session.load()
        ids = session.tokenizer.encode(line, ends, not self.text)
        if session.tokenizer.decode(ids) != line:
            raise ValueError("this line has characters the model's tokenizer cannot represent")
        seq_len = session.seq_len
        if len(ids) >= seq_len:
            raise ValueError(f"line too long: {len(ids)} tokens; the context holds {seq_len}")
        return line, ids

    def type_ahead(self, typed):
        """While `typed` is being typed: prefill the ids that cannot change
        any more (every pre-tokenizer piece but the last two), so that Enter
        has little left to do. Never changes what the turn writes."""
        if not typed.strip():
            return
        ends = []
        try:
            ids = self._line(typed, ends)[1]
        except ValueError:
            return  # Enter will say why
        stable = ends[-3] if len(ends) >= 3 else 0
        want = self.tokens + ids[:stable]
        if stable == 0 or len(self.tokens) + len(ids) + self.max_tokens > self.session.seq_len:
            return  # nothing stable yet, or this turn rolls over: Enter does it
        self.session.context_prefill(want)  # its choice is not used: Enter samples afresh

    def _rollover(self, ids, extra):
        """Make room for `ids`, `extra` more positions and a reply: keep the
        story's opening and the most recent ids (half of the room left, so
        that the next turns do not roll over at once). Returns how many ids
        were dropped."""
        # for the story before the line
        room = self.session.seq_len - self.max_tokens - len(ids) - extra
        if len(self.tokens) <= room:
            return 0
        start = self.tokens[:max(0, min(ROLLOVER_START, room))]
        keep = max(0, (room - len(start)) // 2)
        recent = self.tokens[len(start):][-keep:] if keep else []
        dropped = len(self.tokens) - len(start) - len(recent)
        self.tokens = start + recent
        return dropped

    def turn(self, line):
        """Add a line to the story and write the model's reply; returns an
        iterator of the reply's text pieces (the session's stats() describes
        the turn).
        Raises ValueError at once for a line that cannot join the story."""
        if not isinstance(line, str):
            raise TypeError(f"line must be a str, not {type(line).__name__}")
        if not line.strip():
            raise ValueError("empty line: type how the story goes on")
        ends = []
        text, ids = self._line(line, ends)
        heal, extra = self._last_word(ids, ends)
        before = (self.tokens, self.text)
        self.rolled = self._rollover(ids, extra)
        want = self.tokens + ids
        if heal is not None:
            heal = min(heal, len(want) - 1)  # one id at least to prefill
        context = want if heal is None else want[:len(want) - heal]
        k = len(self._turns)
        seed = None if self.temperature == 0 or self.seed == 0 else (self.seed + k) & 0xFFFFFFFFFFFFFFFF
        self._turns.append(before)
        self.text += text
        return self._reply(want, context, self.session.context_match(context), seed, heal)

    def _last_word(self, ids, ends):
        """When the line ends inside a word (the user finished it): how many
        of its last ids spell its last pre-tokenizer piece, which the model
        re-writes itself before the reply (token healing: Session.run's
        heal), and how many more positions that may take at most; else
        (None, 0)."""
        tok = self.session.tokenizer
        token_bytes = tok.token_bytes
        if ids[-1] == tok.bos_id or not llm.word_byte(token_bytes(ids[-1])[-1]):
            return None, 0
        if tok.sentencepiece:
            # one piece for the whole line (its merges cross words): the word
            # is the last ids back to the one that starts after a non-word
            # byte (sentencepiece puts the space in front of a word's token)
            n = 0
            while n < len(ids) and ids[-1 - n] != tok.bos_id:
                n += 1
                if not llm.word_byte(token_bytes(ids[-n])[0]):
                    break
        else:
            n = len(ids) - (ends[-2] if len(ends) > 1 else 0)
        spelled = 0
        for i in ids[len(ids) - n:]:
            spelled += len(token_bytes(i))
        return n, spelled - n

    def _reply(self, want, context, kept, seed, heal):
        reply = []
        pieces = []
        try:
            for piece in self.session.run(want, self.max_tokens, self.temperature, self.top_k,
                                          seed, self.draft, kept, reply, heal):
                pieces.append(piece)
                yield piece
        finally:
            # what was written stays, also when the reply was interrupted
            # (reply: the ids after the context, the line's last word first)
            self.tokens = context + reply
            self.text += "".join(pieces)


class _Console:
    """The console read a key at a time, where it can be: the board's (its
    stdin is raw already), a terminal on MicroPython unix or CPython (put in
    raw mode while a line is read). None from open() when stdin is no
    terminal (piped input is read line by line with input())."""

    @staticmethod
    def open():
        try:
            import termios
        except ImportError:  # a board: its console is a raw serial line
            board = sys.platform not in ("linux", "darwin", "win32", "cygwin")
            return _Console(None, None) if board else None
        not_a_tty = (OSError,) + ((termios.error,) if hasattr(termios, "error") else ())
        try:
            saved = termios.tcgetattr(0)
        except not_a_tty:
            return None
        return _Console(termios, saved)

    def __init__(self, termios, saved):
        self._termios = termios
        self._saved = saved
        self._poll = None
        try:
            import select

            self._poll = select.poll()
            self._poll.register(sys.stdin, select.POLLIN)
        except (ImportError, AttributeError, OSError, TypeError):
            pass
        self._decoder = llm.Utf8Decoder()
        self._read = getattr(getattr(sys.stdin, "buffer", None), "read", None)

    def raw(self, on):
        """Keys one at a time, no echo, Ctrl-C as a key; output as before.
        Not termios.setraw/tty.setraw: they switch with TCSAFLUSH, which drops
        keys typed ahead (while the previous reply was printed)."""
        t = self._termios
        if t is None:
            return
        attrs = list(self._saved)
        if on:
            def flag(name, linux):  # MicroPython's termios names few flags
                return getattr(t, name, linux)

            attrs[6] = list(attrs[6])
            attrs[0] &= ~(flag("ICRNL", 0o400) | flag("IXON", 0o2000))
            attrs[3] &= ~(flag("ICANON", 0o2) | flag("ECHO", 0o10) | flag("ISIG", 0o1)
                          | flag("IEXTEN", 0o100000))
            attrs[6][flag("VMIN", 6)] = 1
            attrs[6][flag("VTIME", 5)] = 0
        t.tcsetattr(0, t.TCSANOW, attrs)

    def key(self):
        """The next character typed ("" at the end of input)."""
        while True:
            if self._read is not None:
                b = self._read(1)
            else:
                c = sys.stdin.read(1)
                b = c.encode() if c else b""
            if not b:
                return ""
            c = self._decoder.feed(b)
            if c:
                return c

    def waiting(self):
        """Whether more keys are already there (a paste, fast typing)."""
        return self._poll is not None and bool(self._poll.poll(0))


def _read_line(console, writer, prompt, type_ahead):
    """A line typed at the console, echoed, with backspace; while it is typed
    (whenever no more keys are waiting) the co-writer prefills its stable ids.
    Ctrl-C clears a line being typed and raises on an empty one; Ctrl-D on an
    empty line is the end of input."""
    console.raw(True)  # before the prompt: a key typed at once is not echoed twice
    llm.write(prompt)
    line = []
    try:
        while True:
            try:
                c = console.key()
            except KeyboardInterrupt:  # the board's Ctrl-C
                c = "\x03"
            if c in ("\r", "\n"):
                return "".join(line)
            if c == "" or (c == "\x04" and not line):
                raise EOFError
            if c == "\x03":
                if not line:
                    raise KeyboardInterrupt
                line = []
                console.raw(False)
                llm.write("^C\n" + prompt)
                console.raw(True)
                continue
            if c in ("\x7f", "\b"):
                if line:
                    line.pop()
                    llm.write("\b \b")
            elif c >= " ":
                line.append(c)
                llm.write(c)
            else:
                continue
            if type_ahead and not console.waiting():
                writer.type_ahead("".join(line))
    finally:
        console.raw(False)
        llm.write("\n")


def _chat_command(writer, line):
    """Run a /command; False for a line that is none."""
    word, _, arg = line.partition(" ")
    arg = arg.strip()
    if word == "/help":
        llm.write(HELP)
    elif word == "/new":
        writer.new()
        llm.write("[a new story]\n")
    elif word == "/undo":
        llm.write("[took back the last turn]\n" if writer.undo() else "[nothing to take back]\n")
    elif word in ("/seed", "/temp"):
        try:
            if word == "/seed":
                writer.set_seed(int(arg))
            else:
                writer.set_temperature(float(arg))
            llm.write(f"[{word[1:]} {arg}]\n")
        except (ValueError, TypeError) as e:
            llm.write(f"[{word} needs a number: {e}]\n")
    elif word.startswith("/") and word[1:].isalpha():
        llm.write(f"[no command {word}; /help lists them]\n")
    else:
        return False
    return True


#: What the chat says when the model ends the story right after a line (it
#: wrote <|endoftext|> first); the line stays in the story.
ENDED_AT_ONCE = ("[the model ends the story here: /undo takes your line back, "
                 "/new starts another]")


def chat(**options):
    """Write a story together, line by line, until told to stop (CoWriter).

    Takes CoWriter's options: session (default llm.default_session),
    max_tokens per reply (default TURN_TOKENS), temperature, top_k, seed
    (one seed for the story; turn k uses seed + k),
    draft; and type_ahead (default True): at a terminal, the line is read a
    key at a time and what cannot change any more is prefilled while it is
    typed, so Enter has little left to compute (the text is the same either
    way). /help lists the commands. An empty line or Ctrl-D leaves, and so
    does Ctrl-C at an empty prompt; Ctrl-C clears a line being typed and
    stops a reply.
    """
    type_ahead = options.pop("type_ahead", True)
    writer = CoWriter(**options)
    console = _Console.open()
    llm.write(HELP)
    while True:
        try:
            if console is None:
                line = input("> ")
            else:
                line = _read_line(console, writer, "> ", type_ahead)
        except (EOFError, KeyboardInterrupt):
            llm.write("\n")
            return
        line = line.strip()
        if not line:
            return
        if _chat_command(writer, line):
            continue
        try:
            pieces = writer.turn(line)
            if writer.rolled:
                llm.write(f"[the story is longer than the model's memory: it keeps the beginning "
                       f"and the latest part ({writer.rolled} tokens forgotten)]\n")
            for piece in pieces:
                llm.write(llm.shown(piece))
            s = writer.session.stats()
            note = llm.stop_message(s) if s["stop"] not in (llm.STOP_EOT, llm.STOP_BUDGET) else ""
            if s["stop"] == llm.STOP_EOT and not s["tokens"]:
                # nothing written: else the line would be answered with an empty one
                llm.write(ENDED_AT_ONCE + "\n")
            else:
                llm.write("\n" + note + "\n" if note else "\n")
        except KeyboardInterrupt:
            llm.write("\n[reply stopped]\n")
        except ValueError as e:
            llm.write(str(e) + "\n")
