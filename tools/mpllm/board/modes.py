"""The engine's modes as the commands take them: what --plain, --fast and
--draft mean is said here once, for chat.py and bench.py alike."""

from __future__ import annotations

import argparse

#: speculative decoding's drafters by name (llm.generate's draft= takes the same)
DRAFTS = ("auto", "none", "lookup", "ngram")


def add_mode_flags(p: argparse.ArgumentParser) -> None:
    """--plain, --fast and --draft on a command's parser."""
    p.add_argument("--plain", action="store_true",
                   help="the engine with every speed-up off (every head row scored, one core, V "
                        "cached as floats, no drafting): the same story, slower; for checking "
                        "the speed-ups")
    p.add_argument("--fast", action="store_true",
                   help="fast mode (LOSSY, opt-in): attention over an int8 KV cache with a cheap "
                        "exp; the stories differ from exact mode's (bench.py --fast --quality "
                        "measures by how much)")
    p.add_argument("--draft", choices=DRAFTS, default="auto",
                   help="speculative decoding's drafter: the image's n-gram table of what the "
                        "model itself writes (built by convert), or prompt lookup; the story is "
                        "the same, the engine just makes fewer passes (default auto: the table "
                        "when the image has one)")
