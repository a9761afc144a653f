"""Write stories with the TinyStories model (`tools/chat.py`, `mpllm-chat`).

    python tools/chat.py --board host "Once upon a time"   # one story on the PC
    python tools/chat.py                                   # interactive, on the PC
    python tools/chat.py --board n16r8 --port /dev/ttyACM0 "Once upon a time"
                                          # prints the mpremote command for the board

The host board runs the board's own llm.py over the CPython engine, with the
bundled demo model (converted once into the cache, see mpllm.board.hostboard),
another model named with --model (llama2c-demo bundled; release and
stories260k downloaded once, verified against their pins) or the image given
with --image. The chat saves its story when it leaves (default_stories_dir).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from ..image_cache import check_image_file
from . import hostboard
from .modes import add_mode_flags


def _options(args: argparse.Namespace) -> dict[str, object]:
    """The llm options the user gave (llm.py owns the defaults)."""
    opts: dict[str, object] = {"max_tokens": args.max_tokens, "top_k": args.top_k,
                               "temperature": 0.0 if args.greedy else args.temperature,
                               "seed": args.seed, "heal": False if args.no_heal else None}
    return {k: v for k, v in opts.items() if v is not None}


def _board_command(args: argparse.Namespace, opts: dict[str, object]) -> str:
    """The mpremote command that does the same on a board."""
    port = args.port or "PORT"
    call = ", ".join(f"{k}={v!r}" for k, v in opts.items())
    if args.prompt is None:
        code = f"import llm; llm.chat({call})"
        return (f"mpremote connect {shlex.quote(port)} repl\n"
                f"then at the >>> prompt: {code}")
    # json's string literal is valid Python and uses double quotes, which
    # survive the shell's single quotes.
    code = f"import llm; llm.story({', '.join([json.dumps(args.prompt)] + ([call] if call else []))})"
    return f"mpremote connect {shlex.quote(port)} exec {shlex.quote(code)}"


def _print_stats(s: dict[str, object]) -> None:
    def num(key: str, fmt: str) -> str:
        v = s.get(key)
        return "-" if v is None else format(v, fmt)

    print(f"stop: {s.get('stop')}   prompt tokens: {s.get('prompt_tokens')}   "
          f"story tokens: {s.get('tokens')}   seed: {s.get('seed')}", file=sys.stderr)
    if s.get("tokens_per_pass"):
        print(f"speculative: {num('tokens_per_pass', '.2f')} tokens per pass, "
              f"{s.get('accepted')}/{s.get('drafted')} guesses kept", file=sys.stderr)
    if "head_rows_fraction" in s:
        print(f"head rows scored: {num('head_rows_fraction', '.1%')}", file=sys.stderr)
    print(f"time to first token: {num('ttft_ms', '.1f')} ms   "
          f"engine: {num('engine_ms_per_token', '.2f')} ms/token   "
          f"round trip: {num('tok_per_s', '.1f')} tok/s", file=sys.stderr)


def default_stories_dir() -> Path:
    """Where the chat saves its stories: $XDG_DATA_HOME/mpllm/stories, else
    ~/.local/share/mpllm/stories."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mpllm" / "stories"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # before the story (opening, a download, the first conversion): one
        # line, no traceback; a conversion writes its image whole or not at all
        # and a download resumes from its .part file
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`chat.py ... | head`): stop quietly; point
        # stdout at /dev/null so the interpreter's final flush cannot fail too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    try:
        llm = hostboard.import_llm()
        import llm_chat  # (beside llm)
    except hostboard.HostBoardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(
        description="Write a story (or chat) with the TinyStories model.")
    ap.add_argument("prompt", nargs="?", help="how the story begins (none: interactive chat)")
    ap.add_argument("--board", choices=["host", "n16r8", "n8"], default="host",
                    help="host: run on this PC (default); n16r8 or n8: show the command for a "
                         "board")
    ap.add_argument("--port", help="the board's serial port (with --board n16r8 or n8)")
    ap.add_argument("--image", help="a converted model image (default: the bundled demo model)")
    ap.add_argument("--model", metavar="NAME",
                    help="a model by name instead of --image: demo (the default, bundled), "
                         "llama2c-demo (bundled, llama2.c's format), release (the esp32-ai "
                         "release model), stories260k or stories15m (llama2.c's); release, "
                         "stories260k and stories15m are downloaded once (sizes and sha256 "
                         "pinned in models/NAME.json); each is converted once, then cached")
    ap.add_argument("--max-tokens", type=int,
                    help=f"story tokens at most ({llm.MAX_TOKENS}); in the chat, per reply "
                         f"({llm_chat.TURN_TOKENS}), and a reply goes on to the end of its sentence, "
                         f"{llm_chat.FINISH_TOKENS} tokens more at most")
    ap.add_argument("--stories", metavar="DIR",
                    help=f"the chat saves its story here when it leaves (default "
                         f"{default_stories_dir()})")
    ap.add_argument("--temperature", type=float,
                    help=f"sampling temperature, 0 = greedy ({llm.TEMPERATURE})")
    ap.add_argument("--top-k", type=int, help=f"sample among the k best, 0 = all ({llm.TOP_K})")
    ap.add_argument("--seed", type=int, help="sampling seed (default: a fresh one per story)")
    ap.add_argument("--greedy", action="store_true", help="always take the most likely token")
    ap.add_argument("--no-heal", action="store_true",
                    help="feed the prompt's tokens as they are (as llama2.c's run.c does); by "
                         "default a prompt ending in a word has the model re-write that word, "
                         "so the story never starts inside it")
    ap.add_argument("--stats", action="store_true",
                    help="print timing and token counts after the (last) story, to stderr")
    add_mode_flags(ap)
    args = ap.parse_args(argv)
    opts = _options(args)
    if args.no_heal and args.prompt is None:
        ap.error("--no-heal is for a story from a prompt (the chat always heals a line)")
    if args.fast and args.plain:
        ap.error("--fast and --plain exclude each other (plain is the exact reference)")

    if args.board != "host":
        if args.image or args.model:
            ap.error(f"--image and --model are for the host board; the board reads its "
                     f"flashed model (tools/flash.py --board {args.board} --image ... or "
                     f"--model NAME writes one)")
        if args.stories:
            ap.error("--stories is for the host board (on a board, llm.chat(stories=DIR))")
        if args.plain or args.fast:
            ap.error("--plain and --fast are for the host board (on a board: "
                     "llm.load(plain=True) / llm.load(fast=True))")
        if args.draft != "auto":
            opts["draft"] = None if args.draft == "none" else args.draft
        if not args.port:
            print("(give --port to fill in the serial port)", file=sys.stderr)
        print(_board_command(args, opts))
        return 0
    if args.port:
        ap.error("--port is for a board (--board n16r8 or n8)")
    if args.model and args.image:
        ap.error("--model and --image exclude each other (an image is a converted model)")
    if args.prompt is not None and not _is_utf8(args.prompt):
        ap.error("the prompt is not UTF-8 text (as this system passed it to the command)")
    if args.prompt is not None and args.stories:
        ap.error("--stories is for the chat (no prompt)")

    try:
        if args.image:
            image = check_image_file(args.image)
        else:
            image = hostboard.ensure_image(*(hostboard.named_sources(args.model) if args.model
                                             else hostboard.demo_sources()))
        llm = hostboard.open_image(image)
        llm.load(plain=args.plain, fast=args.fast)
        if args.plain:  # plain mode: every speed-up off, drafting too
            if args.draft not in ("auto", "none"):
                ap.error("--plain decodes without drafting; leave out --draft")
            opts["draft"] = None
        elif args.draft != "auto":
            opts["draft"] = None if args.draft == "none" else args.draft
    except (hostboard.HostBoardError, RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.prompt is None and sys.stdin is not None and hasattr(sys.stdin, "reconfigure"):
        # Bytes that are not UTF-8 stop the chat with a message about the input, not
        # (escaped, as a C locale reads them) a codec error about the text later on.
        sys.stdin.reconfigure(errors="strict")
    try:
        if args.prompt is None:
            llm.chat(**opts, stories=str(args.stories or default_stories_dir()))
            if args.stats:
                _print_stats(llm.stats())
            return 0
        try:
            llm.story(args.prompt, **opts)
        except KeyboardInterrupt:
            return 130
        if args.stats:
            _print_stats(llm.stats())
    except UnicodeDecodeError as e:  # only reading stdin decodes here
        print(f"error: the input is not UTF-8 text (byte {e.object[e.start]:#04x}: {e.reason})",
              file=sys.stderr)
        return 2
    except (ValueError, TypeError, RuntimeError) as e:  # RuntimeError: _llm.Error
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _is_utf8(text: str) -> bool:
    # a command-line argument that is not UTF-8 arrives with surrogate escapes
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

