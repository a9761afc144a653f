"""llm_chat: writing a story together (llm.chat(), and llm_chat.CoWriter for
tools that keep stories themselves, such as llm_serve).

The same file on the board (frozen next to llm.py), on MicroPython unix and on
CPython. A module of its own so that a session that only tells stories never
loads it: llm.chat() imports it when it is called. It drives the engine
through an llm_session.Session (the open model, the tokenizer, the one generation
loop, and the one record of what the model's context holds).
"""

import os
import sys

import llm_session

#: story tokens of one co-writing reply at most: a few sentences a turn
TURN_TOKENS = 60
#: chat()'s replies go on past max_tokens to a sentence end, this many tokens
#: more at most (CoWriter's finish; Session.run)
FINISH_TOKENS = 30
#: where chat() saves a story when it leaves or starts a new one (relative:
#: the current directory; on a board, its filesystem's)
STORIES_DIR = "stories"
#: when a turn would not fit the context, the story's first this many tokens
#: (its opening) and the most recent ones stay; the middle is forgotten
ROLLOVER_START = 32

HELP = (
    "Write a story together: type a line and press Enter, and the model goes on\n"
    "from it. The whole story so far stays in its memory.\n"
    "  /new        start a new story (the last one is saved first)\n"
    "  /undo       take back the last turn (your line and the reply); shows the story\n"
    "  /story      show the story so far\n"
    "  /save FILE  write the story to FILE\n"
    "  /seed N     sampling seed N from now on (0: always the likeliest token)\n"
    "  /temp T     sampling temperature T from now on (0: always the likeliest)\n"
    "  /quit       leave (as Ctrl-D does)\n"
    "  /help       this list\n"
    "Ctrl-C stops a reply or clears the line; Ctrl-C twice or Ctrl-D leaves,\n"
    "and the story is saved to a file.\n"
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
        llm_session.default_session, opened if it is not); generate()'s options;
        max_tokens is per reply (default TURN_TOKENS) and seed is the
        story's (default: a fresh one); finish (default 0): a reply goes on
        past max_tokens to the end of its sentence, this many tokens more at
        most (Session.run's finish)."""
        self.session = llm_session.default_session if session is None else session
        options.setdefault("max_tokens", TURN_TOKENS)
        finish = options.pop("finish", 0)
        if not isinstance(finish, int) or isinstance(finish, bool) or finish < 0:
            raise ValueError(f"finish must be an int >= 0, got {finish!r}")
        self.finish = finish
        self.max_tokens, self.temperature, self.top_k, seed = llm_session.check_options(options)
        self.seed = llm_session.fresh_seed() if seed is None else seed
        model = self.session.load()
        model.sampler(self.temperature, self.top_k, 0)  # the engine's rules, now
        self.draft = self.session.paced(llm_session.drafter(model, options.get("draft", "auto")))
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
        self.seed = llm_session.check_options({"seed": seed})[3]

    def set_temperature(self, temperature):
        self.temperature = llm_session.check_options({"temperature": temperature})[1]

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
        reply = self.max_tokens + self.finish
        if stable == 0 or len(self.tokens) + len(ids) + reply > self.session.seq_len:
            return  # nothing stable yet, or this turn rolls over: Enter does it
        self.session.context_prefill(want)  # its choice is not used: Enter samples afresh

    def _rollover(self, ids, extra):
        """Make room for `ids`, `extra` more positions and a reply: keep the
        story's opening and the most recent ids (half of the room left, so
        that the next turns do not roll over at once). Returns how many ids
        were dropped."""
        # for the story before the line
        room = self.session.seq_len - self.max_tokens - self.finish - len(ids) - extra
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
        heal, extra = self.session.last_word(ids, ends)
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

    def _reply(self, want, context, kept, seed, heal):
        reply = []
        pieces = []
        try:
            for piece in self.session.run(want, self.max_tokens, self.temperature, self.top_k,
                                          seed, self.draft, kept, reply, heal, self.finish):
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
        self._decoder = llm_session.Utf8Decoder()
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
    Ctrl-C clears the line (as a shell does); a second Ctrl-C in a row raises
    KeyboardInterrupt. Ctrl-D on an empty line is the end of input (EOFError)."""
    console.raw(True)  # before the prompt: a key typed at once is not echoed twice
    llm_session.write(prompt)
    line = []
    cleared = False  # the last key was a Ctrl-C
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
                if cleared:
                    raise KeyboardInterrupt
                cleared = True
                hint = "" if line else "  " + AGAIN
                line = []
                console.raw(False)
                llm_session.write("^C" + hint + "\n" + prompt)
                console.raw(True)
                continue
            cleared = False
            if c in ("\x7f", "\b"):
                if line:
                    line.pop()
                    llm_session.write("\b \b")
            elif c >= " ":
                line.append(c)
                llm_session.write(c)
            else:
                continue
            if type_ahead and not console.waiting():
                writer.type_ahead("".join(line))
    finally:
        console.raw(False)
        llm_session.write("\n")


def terminal_width(console):
    """The columns to wrap the story at, 0 for none: $COLUMNS, else the
    terminal's width (CPython), else 80; 0 when the output is no terminal."""
    isatty = getattr(sys.stdout, "isatty", None)
    if console is None and not (isatty is not None and isatty()):
        return 0
    getenv = getattr(os, "getenv", None)
    try:
        columns = int(getenv("COLUMNS") or 0) if getenv is not None else 0
    except ValueError:
        columns = 0
    if columns <= 0 and hasattr(os, "get_terminal_size"):
        try:
            columns = os.get_terminal_size(sys.stdout.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
    return columns if columns > 0 else 80


class Wrap:
    """Text written to the console, wrapped at `width` columns between words
    (0: as it is). A word that starts within the last HOLD columns of a line
    is held until the space after it, so that it can start the next line
    instead; elsewhere each character is written at once (the reply's first
    word is never held back). A space is written with the word after it, so
    that no line ends in one. end() writes what is held."""

    HOLD = 16

    def __init__(self, width, column=0):
        self.width = width
        self.column = column
        self.word = ""  # held
        self.open = False  # a word being written at once
        self.space = False  # a space not written yet
        self.hold_at = width - min(self.HOLD, width // 4)

    def write(self, text):
        if not self.width:
            llm_session.write(text)
            return
        out = []
        for c in text:
            if c == " ":
                self._flush(out)
                if self.space:  # two spaces: the first one now
                    self._put(" ", out)
                self.space = True
            elif c == "\n":
                self._flush(out)
                self.space = False
                out.append(c)
                self.column = 0
            elif self.word:
                self.word += c
            elif self.open:
                self._put(c, out)
            elif self.column + self.space >= self.hold_at:
                self.word = c
            else:
                if self.space:
                    self._put(" ", out)
                    self.space = False
                self.open = True
                self._put(c, out)
        if out:
            llm_session.write("".join(out))

    def _put(self, c, out):
        if self.column + 1 > self.width:  # a word longer than the line
            out.append("\n")
            self.column = 0
        out.append(c)
        self.column += 1

    def _flush(self, out):
        """The word ends: write it, on the next line if it does not fit."""
        self.open = False
        word = self.word
        if word:
            if self.column and self.column + self.space + len(word) > self.width:
                out.append("\n")
                self.column = 0
            elif self.space:
                out.append(" ")
                self.column += 1
            self.space = False
            out.append(word)
            self.column += len(word)
            self.word = ""

    def end(self):
        out = []
        self._flush(out)
        if self.space:
            out.append(" ")
            self.column += 1
            self.space = False
        if out:
            llm_session.write("".join(out))


def _makedirs(path):
    if hasattr(os, "makedirs"):
        os.makedirs(path, exist_ok=True)
        return
    parts = path.split("/")  # MicroPython: one level at a time
    for i in range(1, len(parts) + 1):
        if parts[i - 1]:
            try:
                os.mkdir("/".join(parts[:i]))
            except OSError:
                pass  # there already (else the file's open below says why)


def save_story(text, path):
    """Write the story to `path` whole or not at all (a .part file renamed
    over it). OSError says why it could not."""
    part = path + ".part"
    with open(part, "wb") as f:
        f.write(text.encode("utf-8"))
        if not text.endswith("\n"):
            f.write(b"\n")
    try:
        replace = getattr(os, "replace", None)
        if replace is not None:
            replace(part, path)
        else:
            try:
                os.rename(part, path)
            except OSError:  # a board's FAT will not rename over a file
                os.remove(path)
                os.rename(part, path)
    except OSError:
        try:
            os.remove(part)
        except OSError:
            pass
        raise


def _next_story_file(folder):
    """folder/story-N.txt with the first N above every story file there."""
    _makedirs(folder)
    top = 0
    for name in os.listdir(folder):
        if name.startswith("story-") and name.endswith(".txt") and name[6:-4].isdigit():
            top = max(top, int(name[6:-4]))
    return folder.rstrip("/") + "/story-" + str(top + 1) + ".txt"


class _Keeper:
    """Keeps the chat's stories: saves one (to a new file in `folder`) when
    the chat leaves or starts another, unless it is saved as it stands."""

    def __init__(self, folder):
        self.folder = folder
        self.text = None  # the story as last saved,
        self.path = None  # and where

    def save(self, text, path=None):
        """Save `text` (to `path`, else a new file); the note to print."""
        if path is None:
            if self.text == text:
                return f"[the story is saved in {self.path}]"
            if self.folder is None:
                return ""  # told not to save
        try:
            if path is None:
                path = _next_story_file(self.folder)
            save_story(text, path)
        except OSError as e:
            return (f"[cannot save the story to {path or self.folder}: "
                    f"{getattr(e, 'strerror', None) or e}]")
        self.text, self.path = text, path
        return f"[story saved to {path}]"

    def keep(self, text, width):
        """Save `text` before it goes (leaving, /new); when that fails, show
        it, the one copy left."""
        note = self.save(text) if text.strip() else ""
        if note:
            llm_session.write(note + "\n")
        if note.startswith("[cannot"):
            llm_session.write("[the story, so that it is not lost:]\n")
            _show(text, width)


def _number(arg, convert):
    if not arg:
        raise ValueError("no number")
    return convert(arg)


def _chat_command(writer, line, keeper, wrap_width):
    """Run a /command; False for a line that is none, "quit" to leave."""
    word, _, arg = line.partition(" ")
    arg = arg.strip()
    if word in ("/help", "/new", "/undo", "/story", "/quit") and arg:
        llm_session.write(f"[{word} takes no argument]\n")
    elif word == "/help":
        llm_session.write(HELP)
    elif word == "/quit":
        return "quit"
    elif word == "/new":
        keeper.keep(writer.text, wrap_width)
        writer.new()
        llm_session.write("[a new story]\n")
    elif word == "/undo":
        if not writer.undo():
            llm_session.write("[nothing to take back]\n")
        else:
            llm_session.write("[took back the last turn; the story now:]\n" if writer.text
                      else "[took back the last turn; the story is empty]\n")
            _show(writer.text, wrap_width)
    elif word == "/story":
        if writer.text:
            _show(writer.text, wrap_width)
        else:
            llm_session.write("[the story is empty]\n")
    elif word == "/save":
        if not arg:
            llm_session.write("[/save needs a file name, e.g. /save story.txt]\n")
        elif not writer.text.strip():
            llm_session.write("[nothing to save yet]\n")
        else:
            llm_session.write(keeper.save(writer.text, arg) + "\n")
    elif word == "/seed":
        try:
            writer.set_seed(_number(arg, int))
            llm_session.write(f"[seed {arg}]\n")
        except (ValueError, TypeError):
            llm_session.write("[/seed needs a whole number from 0 to 2**64-1, e.g. /seed 7]\n")
    elif word == "/temp":
        try:
            writer.set_temperature(_number(arg, float))
            llm_session.write(f"[temp {arg}]\n")
        except (ValueError, TypeError):
            llm_session.write("[/temp needs a number, 0 or more, e.g. /temp 0.8 (0: always the "
                      "likeliest)]\n")
    elif word.startswith("/") and word[1:].isalpha():
        llm_session.write(f"[no command {word}; /help lists them]\n")
    else:
        return False
    return True


def _show(text, width):
    w = Wrap(width)
    w.write(llm_session.shown(text))
    w.end()
    llm_session.write("\n")


#: What the chat says when the model ends the story right after a line (it
#: wrote <|endoftext|> first); the line stays in the story.
ENDED_AT_ONCE = ("[the model ends the story here: /undo takes your line back, "
                 "/new starts another]")
#: What a first Ctrl-C at the prompt says (piped input: the terminal echoed ^C)
AGAIN = "(Ctrl-C again or Ctrl-D leaves)"


def chat(**options):
    """Write a story together, line by line, until told to stop (CoWriter).

    Takes CoWriter's options: session (default llm_session.default_session),
    max_tokens per reply (default TURN_TOKENS), finish (default
    FINISH_TOKENS: a reply goes on to the end of its sentence, that many
    tokens past max_tokens at most), temperature, top_k, seed (one seed for
    the story; turn k uses seed + k), draft; type_ahead (default True): at a
    terminal, the line is read a key at a time and what cannot change any
    more is prefilled while it is typed, so Enter has little left to compute
    (the text is the same either way); stories (default STORIES_DIR, None:
    do not save): the folder a story is saved to, as story-N.txt, when the
    chat leaves or /new starts another.

    /help lists the commands. An empty line is ignored; Ctrl-C stops a reply,
    clears the line at the prompt, and a second Ctrl-C in a row leaves, as do
    Ctrl-D (the end of input) and /quit. The story is wrapped at the
    terminal's width.
    """
    type_ahead = options.pop("type_ahead", True)
    keeper = _Keeper(options.pop("stories", STORIES_DIR))
    options.setdefault("finish", FINISH_TOKENS)
    writer = CoWriter(**options)
    console = _Console.open()
    llm_session.write(HELP)
    interrupted = False  # the last prompt ended in a Ctrl-C (input(): piped input)
    while True:
        pieces = None
        wrap = Wrap(0)
        try:
            try:
                if console is None:
                    line = input("> ")
                else:
                    line = _read_line(console, writer, "> ", type_ahead)
            except KeyboardInterrupt:
                if console is not None:
                    break  # (_read_line ended the line)
                if interrupted:
                    llm_session.write("\n")
                    break
                interrupted = True
                llm_session.write("\n" + AGAIN + "\n")
                continue
            except EOFError:
                if console is None:  # (_read_line ends its line)
                    llm_session.write("\n")
                break
            interrupted = False
            line = line.strip()
            if not line:
                continue
            width = terminal_width(console)
            done = _chat_command(writer, line, keeper, width)
            if done == "quit":
                break
            if done:
                continue
            pieces = writer.turn(line)
            if writer.rolled:
                llm_session.write(f"[the story is longer than the model's memory: it keeps the beginning "
                          f"and the latest part ({writer.rolled} tokens forgotten)]\n")
            wrap = Wrap(width)
            for piece in pieces:
                wrap.write(llm_session.shown(piece))
            wrap.end()
            s = writer.session.stats()
            note = llm_session.stop_message(s) if s["stop"] not in (llm_session.STOP_EOT, llm_session.STOP_BUDGET) else ""
            if s["stop"] == llm_session.STOP_EOT and not s["tokens"]:
                # nothing written: else the line would be answered with an empty one
                llm_session.write(ENDED_AT_ONCE + "\n")
            else:
                llm_session.write("\n" + note + "\n" if note else "\n")
        except KeyboardInterrupt:
            wrap.end()
            llm_session.write("\n[reply stopped]\n")
        except ValueError as e:
            if isinstance(e, UnicodeError):  # input that is not text: the caller's to say
                raise
            llm_session.write(str(e) + "\n")
        finally:
            if pieces is not None:
                pieces.close()  # MicroPython does not close an abandoned generator
    keeper.keep(writer.text, terminal_width(console))
