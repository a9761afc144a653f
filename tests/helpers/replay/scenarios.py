"""One llm.py session, run the same way on CPython and on MicroPython unix.

    python scenarios.py MODULES EOT_SEED record OUT_DIR     (real engine, recording)
    micropython scenarios.py MODULES EOT_SEED replay        (replay double)
    micropython scenarios.py MODULES EOT_SEED miss          (asks for an unrecorded story)

MODULES is firmware/modules (llm.py; on CPython the built `_llm` is in
build/inplace, two levels up from it).
EOT_SEED is a seed whose high-temperature story ends in <|endoftext|>. The
model is found the way the board finds its own: llm.load() with no argument
($MPLLM_REPLAY_IMAGE for the recording proxy, $MPLLM_REPLAY for the double).
Chat input comes from stdin. Everything llm.py prints goes to stdout, and the
two runs must print the same bytes.
"""

import sys

HERE = sys.argv[0].rsplit("/", 1)[0] if "/" in sys.argv[0] else "."
MODULES = sys.argv[1]
EOT_SEED = int(sys.argv[2])
MODE = sys.argv[3]

if MODE == "record":
    # The real extension (build/inplace) must win over the double beside this script.
    ENGINE = MODULES + "/../../build/inplace"
    sys.path[:] = [MODULES, ENGINE] + [p for p in sys.path if p not in (HERE, "")] + [HERE]
    import record

    record.install(sys.argv[4])
else:
    sys.path.insert(0, MODULES)
    sys.path.insert(0, HERE)

import llm


def show_stats():
    s = llm.stats()
    print(
        "stats:",
        s["stop"],
        s["prompt_tokens"],
        s["tokens"],
        s["max_tokens"],
        s["seq_len"],
        s["top_k"],
        s["seed"],
    )
    print("note:", llm.stop_message())


def attempt(what, fn):
    try:
        fn()
        print(what, "-> no error")
    except (ValueError, TypeError) as e:
        print(what, "->", type(e).__name__ + ":", e)


llm.load()
if MODE == "miss":
    llm.story("Once upon a time", seed=123456789, max_tokens=3)
    sys.exit(0)

llm.story("Once upon a time", seed=11, max_tokens=12)
show_stats()
llm.story("Once upon a time", temperature=0)
show_stats()
llm.story("Once upon a time", seed=EOT_SEED, temperature=3.0, top_k=0)
show_stats()
llm.story("Tom said: caf\u00e9, na\u00efve \u2014 \u00bfs\u00ed?", seed=5, max_tokens=8)
show_stats()
pieces = list(llm.generate("Once", seed=2, max_tokens=9))
print("pieces:", len(pieces), "".join(pieces))
show_stats()

attempt("empty", lambda: llm.story(""))
attempt("blank", lambda: llm.story("  \n"))
attempt("long", lambda: llm.story("Once upon a time " * 40))
attempt("max_tokens=0", lambda: llm.story("Once", max_tokens=0))
attempt("temperature=-1", lambda: llm.story("Once", temperature=-1))
attempt("top_k=-1", lambda: llm.story("Once", top_k=-1))
attempt("top_k huge", lambda: llm.story("Once", top_k=1000000))
attempt("seed=-1", lambda: llm.story("Once", seed=-1))
attempt("bad option", lambda: llm.story("Once", max_token=5))
attempt("bytes prompt", lambda: llm.story(b"Once"))
attempt("chat bad option", lambda: llm.chat(tokens=3))

llm.chat(seed=3, max_tokens=6, stories=None)  # stdin: two stories, an empty line, /quit
show_stats()
llm.chat(temperature=0, max_tokens=4, stories=None)  # stdin: one story, then end of input
show_stats()
print("done")

if MODE == "record":
    record.save()
