"""Scripted co-writing sessions: how often a model ends the story at once or
says nothing when a person writes a story with it.

    python -m mpllm.board.cowrite_eval                       # the bundled demo model
    python -m mpllm.board.cowrite_eval --model llama2c-demo
    python -m mpllm.board.cowrite_eval --files OLD/model.bin OLD/tokenizer.json

Ten sessions of five lines each, written as a person writes them (a whole
sentence, a sentence left open for the model to finish, a line of dialogue, a
new event, lower case or no full stop now and then), each with its own fixed
seed, are typed into llm_chat.CoWriter on the host board (the same code as
`tools/chat.py` and the web chat) with the chat's default options. Each
reply is printed, and counted as

- empty: no visible text (the model only finished the person's last word);
- ended at once: the model ended the story (its end token) without a
  sentence of its own (three words or more) after the person's line;
- ended: the model ended the story in that reply at all.

Whether a reply is broken English is for a reader to judge from the printed
transcripts; it is not counted here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: (seed, the person's five lines) of each session
SESSIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (11, ("Once upon a time there was a little dog named Max.",
          "Max found a red ball in the garden",
          "Then a big cat came and took the ball.",
          "\"Give it back!\" said Max.",
          "the cat ran up a tree and")),
    (12, ("Lily had a blue kite.",
          "One windy day she went to the hill with her dad",
          "The kite flew so high that it got stuck in a tree.",
          "Lily was sad. Her dad said",
          "Then a bird came to help.")),
    (13, ("There was a robot called Bolt who lived in a toy shop.",
          "Every night Bolt woke up and walked around the shop.",
          "one night he heard a noise behind the door",
          "It was a little mouse. \"Who are you?\" asked the mouse.",
          "Bolt and the mouse became")),
    (14, ("Once upon a time, a girl named Mia wanted to fly.",
          "She made wings out of paper",
          "She jumped off the bed but she fell on the floor.",
          "Her grandma came in and laughed.",
          "\"I know a better way,\" said grandma.")),
    (15, ("It was raining and Tom was bored.",
          "He looked out of the window and saw a frog",
          "The frog said, \"Come and play with me!\"",
          "So Tom put on his boots and ran outside.",
          "They jumped in the puddles until")),
    (16, ("Once upon a time there was a dragon who was scared of fire.",
          "All the other dragons laughed at him.",
          "One day a little girl came to the cave",
          "\"Why are you sad?\" she asked.",
          "The dragon told her his secret and")),
    (17, ("Sam and his sister Anna went to the beach.",
          "They built a big sand castle with a tall tower",
          "then a wave came",
          "Anna found a shell with a tiny crab inside.",
          "The crab said thank you and")),
    (18, ("Ben was a bear who loved honey.",
          "One morning there was no honey left in his jar.",
          "He went into the forest to look for bees",
          "The bees were angry. \"That is our honey!\"",
          "Ben said sorry and")),
    (19, ("Zoe got a new puppy for her birthday.",
          "The puppy was small and brown and it liked to dig",
          "One day the puppy dug a big hole in the garden and found",
          "Zoe's mom was not happy.",
          "\"Let us fill the hole together,\" said Zoe.")),
    (20, ("Once upon a time, in a little town, there lived an old man and his cat.",
          "The cat was called Pepper.",
          "Pepper liked to sit on the roof and look at the moon",
          "One night the moon came down to say hello!",
          "Pepper was so surprised that")),
)

#: a sentence end: . ! or ? (a closing quote may follow) before a space or the end
_SENTENCE_END = re.compile(r"[.!?]\"?(?=\s|$)")
#: the line ends a sentence when its end is one
_LINE_END = re.compile(r"[.!?]\"?$")


@dataclass
class Turn:
    line: str
    reply: str
    stop: str  # llm.stats()["stop"]: "eot" when the model ended the story
    empty: bool = False
    ended_at_once: bool = False


@dataclass
class Session:
    seed: int
    turns: list[Turn] = field(default_factory=list)

    def transcript(self) -> str:
        """The story as written, each person's line marked with "> "."""
        out = []
        for t in self.turns:
            out.append(f"> {t.line}")
            out.append(f"  {t.reply.strip()}" + ("  [the end]" if t.stop == "eot" else ""))
        return "\n".join(out)


def own_sentences(line: str, reply: str) -> int:
    """Sentences of three words or more that the model finished in `reply`
    ("The end." is not one); when the person's line did not end a sentence,
    the reply's first sentence end closes the person's, not one of its own."""
    finished = _SENTENCE_END.split(reply)[:-1]  # the text after the last end is unfinished
    if not _LINE_END.search(line.rstrip()):
        finished = finished[1:]
    return sum(len(s.split()) >= 3 for s in finished)


def judge(line: str, reply: str, stop: str) -> Turn:
    """One turn, counted (see the module's docstring)."""
    ended = stop == "eot"
    return Turn(line, reply, stop, empty=not reply.strip(),
                ended_at_once=ended and own_sentences(line, reply) == 0)


def run_session(llm: object, seed: int, lines: Sequence[str]) -> Session:
    """One story written with llm_chat.CoWriter on the loaded model."""
    import llm_chat

    writer = llm_chat.CoWriter(seed=seed)
    out = Session(seed)
    for line in lines:
        reply = "".join(writer.turn(line))
        out.turns.append(judge(line, reply, llm.stats()["stop"]))  # type: ignore[attr-defined]
    return out


def counts(sessions: Sequence[Session]) -> dict[str, int]:
    turns = [t for s in sessions for t in s.turns]
    return {"replies": len(turns), "empty": sum(t.empty for t in turns),
            "ended_at_once": sum(t.ended_at_once for t in turns),
            "ended": sum(t.stop == "eot" for t in turns)}


def main(argv: Sequence[str] | None = None) -> int:
    from ..atomic import atomic_write_bytes, check_output
    from . import hostboard

    ap = argparse.ArgumentParser(
        prog="python -m mpllm.board.cowrite_eval",
        description="Ten scripted co-writing sessions on the host board; prints each "
                    "session and how many replies were empty or ended the story at once.")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="a bundled model by name (default: demo)")
    src.add_argument("--files", nargs=2, metavar=("MODEL", "TOKENIZER"),
                     help="a model file and its tokenizer (converted once, then cached)")
    src.add_argument("--image", help="a converted model image")
    ap.add_argument("--json", metavar="FILE", help="also write the sessions and counts here")
    args = ap.parse_args(argv)
    try:
        if args.json:
            check_output(args.json)  # before the sessions, not after them
        hostboard.import_llm()  # first: the conversion's drafter runs the engine
        if args.image:
            image = Path(args.image)
        elif args.files:
            image = hostboard.ensure_image(Path(args.files[0]), Path(args.files[1]))
        else:
            image = hostboard.ensure_image(*hostboard.named_sources(args.model or "demo"))
        llm = hostboard.open_image(image)
    except (hostboard.HostBoardError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sessions = []
    for i, (seed, lines) in enumerate(SESSIONS, 1):
        s = run_session(llm, seed, lines)
        sessions.append(s)
        print(f"--- session {i} (seed {seed})\n{s.transcript()}", flush=True)
    c = counts(sessions)
    print(f"{c['replies']} replies: {c['empty']} empty, {c['ended_at_once']} ended the story "
          f"at once, {c['ended']} ended it at all")
    if args.json:
        doc = {"counts": c, "sessions": [asdict(s) for s in sessions]}
        atomic_write_bytes(Path(args.json), (json.dumps(doc, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
