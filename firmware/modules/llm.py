"""llm: what you type at the board's REPL (on MicroPython unix and on CPython
the same): llm.load / story / generate / stats and the rest are thin
functions over llm.default_session, and chat() is the co-writing chat of
llm_chat.py, imported when it is called.

The session itself (Session, its one generation loop, generate()'s options,
the console a story streams to) is llm_session.py, and every public name of
it is also llm's (llm.Session, llm.check_options, llm.Tokenizer, ...).
llm_chat, llm_serve and llm_bench build on the session; only this module,
the top, imports the chat, so the board's imports point one way. The same
file must run unmodified on MicroPython 1.28 (ESP32-S3 and unix port) and on
CPython 3.10+.
"""

from llm_session import (  # the session's names, llm.X as before the split
    MAX_DRAFT,
    MAX_TOKENS,
    STOP_BUDGET,
    STOP_CONTEXT,
    STOP_EOT,
    STOP_ERROR,
    STOP_INTERRUPTED,
    TEMPERATURE,
    TOP_K,
    Pacer,
    Session,
    Tokenizer,
    Utf8Decoder,
    check_options,
    decode_tokens,
    default_session,
    drafter,
    ends_sentence,
    fresh_seed,
    prompt_lookup,
    shown,
    stop_message,
    verify_pass,
    word_byte,
    write,
)

#: what `from llm import *` and the REPL's help see: the session's names and
#: the REPL's functions
__all__ = [
    "MAX_DRAFT",
    "MAX_TOKENS",
    "STOP_BUDGET",
    "STOP_CONTEXT",
    "STOP_EOT",
    "STOP_ERROR",
    "STOP_INTERRUPTED",
    "TEMPERATURE",
    "TOP_K",
    "Pacer",
    "Session",
    "Tokenizer",
    "Utf8Decoder",
    "chat",
    "check_options",
    "context_match",
    "context_prefill",
    "decode_tokens",
    "default_session",
    "drafter",
    "ends_sentence",
    "forget_context",
    "fresh_seed",
    "generate",
    "load",
    "mode",
    "prompt_lookup",
    "shown",
    "stats",
    "stop_message",
    "story",
    "tokenizer",
    "unload",
    "verify_pass",
    "word_byte",
    "write",
]


def load(image=None, plain=None, fast=None, context=None):
    """Open the model once and return it (an `_llm.Model`); later calls reuse it.

    image=None: on the board, the flash `model` partition (the binding's
    default); elsewhere the model already open. On the host give the path
    of a converted image (tools/chat.py does this for you). Another image
    closes the open one first.
    plain=True turns the engine's speed-ups off (the certified head scores
    every row, nothing runs on the second core): the same stories, slower;
    False turns them back on; None leaves the setting as it is.
    fast=True (opt-in, LOSSY): attention over an int8 KV cache with a cheap
    exp; stories differ from exact mode's (bench.py --fast --quality
    measures by how much). Not together with plain=True.
    context=N holds N positions (prompt + story; at most the image's
    seq_len): the KV cache is sized for them, so a board with little RAM
    can hold the model. Stories get the room the context leaves; every
    token is the same as without a cap. None keeps the open model's (when
    opening: the image's seq_len, or on a board without the memory for it,
    such as one without PSRAM, the longest context that keeps every weight
    in RAM if it holds 64 positions, else the longest that opens;
    config()["seq_len"] says which); another N opens the model again. A load
    that fails (a context past the image's seq_len, a missing file) raises and
    leaves the model that was open, open, its context started over.
    """
    return default_session.load(image, plain, fast, context)


def mode():
    """Which engine mode the open model runs: "plain" (the exact reference,
    every speed-up off), "exact" (the default) or "fast" (lossy, opt-in)."""
    return default_session.mode()


def unload():
    """Close the model and drop the tokenizer (frees their memory)."""
    default_session.unload()


def tokenizer():
    """The open model's Tokenizer (opens the default model if none is open)."""
    default_session.load()
    return default_session.tokenizer


def generate(prompt, **options):
    """Write a story after `prompt`; returns an iterator of text pieces.

    Options (keyword only):
      max_tokens   story tokens at most (default 200; <|endoftext|> not counted)
      temperature  0 = greedy, else sample from softmax(logits / temperature)
                   (default 0.8, like upstream)
      top_k        sample among the k most likely tokens, 0 = all (default 40)
      seed         sampling seed: the same seed gives the same story on the
                   PC and on the board. Default: a fresh one per story (see
                   stats()["seed"]). seed=0 is greedy (the engine's rule).
      draft        speculative decoding: "auto" (the default: "ngram" when
                   the image has a drafter table and the model is not in
                   plain mode, paced: used only while a pass costs less per
                   token than a step on this machine, see Pacer; else None),
                   None or "none" (off), "ngram" (the image's self-distilled
                   n-gram table, Model.draft, at every token),
                   "lookup" (prompt_lookup), or a function (context ids, n)
                   -> up to n guessed next ids. The engine checks a guess
                   and the tokens after it in one pass and keeps what plain
                   decoding would have written, so the story is the same;
                   only the number of passes changes
                   (stats()["tokens_per_pass"]).

      heal         True (the default): a prompt that ends inside a word has
                   that word re-written by the model, so that the story
                   starts after it (see below); False: the prompt's ids as
                   the tokenizer gives them (llama2.c's run.c does that)

    The story stops at <|endoftext|> (never yielded), after max_tokens
    tokens, or when prompt + story fill the context; stats() then says
    which. The pieces concatenate to the story's text (prompt excluded).
    A prompt that ends inside a word is healed as a co-writing line is: the
    model re-writes the word's last tokens itself, and the story starts
    after the word, never inside it (Session.last_word, run's heal).
    Raises ValueError/TypeError at once for a bad prompt or option.
    """
    return default_session.generate(prompt, **options)


def stats():
    """Numbers of the last generation (a copy; filled in as it runs).

    stop: "eot", "budget", "context", "interrupted", "error" (None while
    running);
    prompt_tokens (the context before the story: for a co-writing turn the
    whole story so far and the line), prefilled (those of them the turn fed:
    the rest was in the context already), tokens (story tokens,
    <|endoftext|> not counted),
    max_tokens, seq_len, temperature, top_k, seed (None when greedy);
    ttft_ms (wall clock to the first story token, prompt included),
    engine_ttft_ms (the engine's own prefill time), engine_ms_per_token
    (engine time per story token after the first), wall_ms and tok_per_s
    (round trip: story tokens per wall-clock second, output included),
    head_rows_fraction (share of the head's rows the engine scored: the
    certified head skips rows that cannot be chosen; 1.0 in plain mode);
    with a drafter: passes (verify passes), drafted and accepted (guessed
    tokens, and those the engine agreed with), tokens_per_pass; steps (plain
    steps taken between passes where drafting did not pay: see Pacer).
    """
    return default_session.stats()








def story(prompt="Once upon a time", **options):
    """Print a story that starts with `prompt`, as it is written.

    Takes generate()'s options. Control characters in the story are shown
    as U+FFFD (generate() gives the raw text). After the story, says why it
    stopped unless the model ended it itself. Ctrl-C stops the story (and is raised again
    after the note, so a script can still be interrupted).
    """
    pieces = generate(prompt, **options)
    write(prompt)
    try:
        for piece in pieces:
            write(shown(piece))
    except KeyboardInterrupt:
        pieces.close()
        write("\n" + stop_message() + "\n")
        raise
    finally:
        pieces.close()  # MicroPython does not close an abandoned generator
    note = stop_message()
    write("\n" + note + "\n" if note else "\n")


def context_match(want):
    """How many of the ids `want` the open model's context holds already, at
    most all but one (the last is prefilled, so that the engine chooses a
    token): a generation can keep that many and feed only the rest."""
    return default_session.context_match(want)


def context_prefill(want):
    """Make the open model's context hold exactly the ids `want` (rewinding to
    what already matches, prefilling the rest): reading ahead while a line is
    typed. The engine's choice after them is not used."""
    default_session.context_prefill(want)


def forget_context():
    """Forget what the model's context holds: the next generation feeds all
    its ids. Call it after feeding the open model yourself (llm.load()'s
    model.prefill/step/verify/rewind/reset) before the next story or turn."""
    default_session.forget_context()


def chat(**options):
    """Write a story together, line by line (llm_chat.chat: its options,
    commands and keys; /help lists the commands)."""
    # Imported here, not at the top: a session that only tells stories never
    # loads the chat (memory on the board).
    import llm_chat

    return llm_chat.chat(**options)
