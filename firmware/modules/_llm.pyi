"""`_llm`: the mpllm C engine as a Python module.

The ONE description of the API. Two bindings implement it and must match:
native/python/mod_llm.c (CPython, `pip install -e .`) and
native/micropython/modllm.c (the board, and the MicroPython unix port). What
they decide (argument rules, messages, exception kinds, field names) is
written once, in native/binding/llm_bind.c; tests hold both to the same
exception type and message for the same call.

Errors:
  * `_llm.Error` (a RuntimeError) for everything the engine reports: a bad or
    corrupted image, an unsupported version, no memory, a full context, a call
    out of order or on a closed model. str(error) is "<status>: <what was
    wrong>", where <status> is one of: "bad argument", "bad image",
    "unsupported version", "checksum mismatch", "bad config", "out of memory",
    "context full", "bad state".
  * KeyboardInterrupt (Ctrl-C) stops a long prefill between passes; the
    prefill then changes nothing (the position, the sampler's stream and the
    last logits are as before). Other calls are short and run to the end;
    a Ctrl-C during one (Model() and close() included) is raised when it
    ends, by the call itself, and never cuts opening or releasing a model
    half-way. MicroPython's own rule on the unix port's builds without
    asynchronous KeyboardInterrupt (the GIL build): a second SIGINT that
    arrives while the first is still pending, not yet raised, ends the
    process at once with exit status 1 and no output (ports/unix/
    unix_mphal.c, sighandler: "die straight away"). The binding leaves no
    such moment in its own calls; Python code between two calls can still
    meet it.
  * TypeError / ValueError for arguments the binding rejects before calling
    the engine (wrong types, token ids outside the embedding, empty prompt,
    negative temperature, top_k above MAX_TOP_K but not the whole vocabulary,
    seed outside u64, a path with a NUL character). Booleans are not token
    ids (TypeError). A token id outside int64 is named ">= 2**63" or
    "< -2**63" in the message.
  * OSError when a path cannot be opened (CPython and the MicroPython unix
    port; on the board a missing partition is an Error): exactly OSError on
    both (MicroPython has no FileNotFoundError), with errno set and args
    (errno, "cannot open model image '<path>': <reason>"); str() is each
    runtime's rendering of those (MicroPython adds the errno's name).

Where the MicroPython binding (native/micropython/modllm.c) differs:
  * Model() with no argument opens the flash partition labelled "model"; a
    str names a partition on the board and a file on the unix port.
  * One model is open at a time and stays open across calls (it is freed on
    soft reset): Model(same source) returns the open model, Model(another
    source) closes it once the new image has passed its checks (a bad image
    leaves the open model as it was). On CPython every call opens a new model.
  * tokenizer() returns a `Section`: the image's bytes read in place
    (index -> int, slice -> bytes, len(); index errors word as CPython's
    memoryview's), an Error once the model is closed (by close(), by
    Model(another source) or llm.load(another image)). It lends no buffer:
    memoryview(section) and bytes(section) are a TypeError; section[a:b]
    copies just those bytes. Why: a MicroPython memoryview holds only the
    pointer it was lent, not the object that lent it, and the GC follows
    only pointers to the start of a heap block, so nothing could keep the
    image mapped while a view lives: a view kept past close() would read
    unmapped flash (a crash on the board, SIGSEGV on unix). A copy per view
    instead would spend the board's RAM (368 KB on the release model) on
    bytes flash already holds.

Determinism: for the same image, sampler settings and tokens, every call
returns the same tokens and the same logits bytes on every host and on the
board (docs/DESIGN-FACTS.md). reset() restarts the sampler's random stream from its seed.
"""

import sys
from typing import Final

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

__version__: Final[str]

#: top_k's limit, except top_k == vocab_out (the whole vocabulary)
MAX_TOP_K: Final[int]

class Error(RuntimeError): ...

def selftest() -> dict[str, object]:
    """Every PIE kernel against its scalar reference on fixed seeds, and the
    probes of what the silicon does where the host model is unverified
    (rur.accx_1, srs.accx, vmul.s8, float add/mul/div/sqrt with subnormals).
    On a PC the PIE kernels run through the exact host model. Prints a
    summary line and returns {"kernels": "pie-native" | "pie-emu", "passed",
    "failures", "probes", "probe_differences" (ints), "ok" (no failures),
    "lines" (every line of native/engine/selftest.h's report)}."""

def build_info() -> str:
    """e.g. "mpllm 0.1.0 kernels=ref numerics=exact placement=... port=host".

    kernels is "ref" (scalar C), "pie" (ESP32-S3 vector unit) or "pie-emu"
    (the PIE kernels run through the exact host model of the vector unit)."""

def plan(image: object, *, fast: int | None = None, bulk: int | None = None,
         context: int | None = 0, plain: bool = False, bulk_is_fast: bool | None = None,
         block_overhead: int | None = None) -> dict[str, object]:
    """Where Model(image, context=..., plain=...) would place every block, and
    whether it opens, WITHOUT opening it: the engine's own open run dry, every
    block counted against the memory below instead of allocated (one set of
    placement rules: the plan is Model.memory() after that open). Cheap: no
    copy, no KV cache; Model() searches its default context over plans.

    The memory: fast / bulk, the bytes internal SRAM / PSRAM can still give
    (None: what this port says: on the board its free bytes, the port's
    reserve kept; on a PC no limit); bulk_is_fast: BULK requests served from
    internal SRAM (a board without PSRAM; None: the port's); block_overhead:
    bytes a block costs beyond its own, rounded up to 16 (None: the port's: 0
    on a PC, 32 on the board). The port's rule: a FAST request that does not
    fit goes to BULK (unless bulk_is_fast), a BULK one that does not fit
    fails (the weights are then read in place from flash, the head gives way
    to the KV cache, as at open). context: 0 (the default) for the image's
    seq_len; None for the context Model(image) opens at with none asked
    (its own search over plans, against the memory above: what a board
    would open with; "why" the seq_len's refusal if none opens).
    A buffer that is not 16-byte aligned is copied.

    Returns {"opens": bool, "why": "" or the open's error ("out of memory:
    ..."), "context": the positions it holds (0 if it does not open),
    "spilled": bytes of weights read in place for want of RAM
    (0: every weight in RAM), "blocks": [(name, region, bytes), ...] as
    Model.memory() ([] if it does not open)}. A bad image, or a context past
    its seq_len, is Error as for Model(); a negative size ValueError. The
    board's heap can be fragmented: a plan that fits its free bytes may
    still find no single block for the KV cache (Model() then says so)."""

class Model:
    def __init__(self, image: object, *, plain: bool = False, fast: bool = False,
                 context: int | None = None) -> None:
        """Open and validate a model image (every checksum is verified, and every
        head weight against its certificate tile's box).

        plain=True turns every speed-up off: the head scores every row into a
        logits buffer, nothing is split across cores, V rows are cached as
        floats and exp/erf run one element at a time. The tokens and logits are
        the same bits; only speed, memory traffic and the head counters differ.
        It is the reference the speed-ups are tested against (see set_plain()).

        fast=True (opt-in, LOSSY; not with plain): attention over an int8 KV
        cache, scored by the int8 kernel, with a cheap exp (see set_fast()).

        context=N (1..the image's seq_len) sizes the KV cache and the
        attention scores for N positions, so a board with little RAM can hold
        the model: config()["seq_len"] is then N, and a token past it
        is refused (Error "context full") as at the image's seq_len. The
        tokens and logits of every position are the same bits as without a
        cap. A context past the image's seq_len is Error "bad argument".
        None: the image's seq_len; where that finds no memory (a board without
        PSRAM), 256 positions (a whole story; the seq_len if shorter) if they
        open at all, the weights that find no RAM read in place from flash (or
        the longest context with every weight in RAM, if longer); where 256
        do not open, the longest context with every weight in RAM if that
        holds at least 64 positions (else the longest that opens); plain=True:
        with its float V too. Found over plans (plan(): about 20, two
        bisections, against the memory the port says it can give), then
        opened once; where none opens, Error "out of memory" with the
        message of the open at the image's seq_len.
        MicroPython: Model(the open model's path) without context keeps the
        open model's; with another one the model is opened again.

        CPython: `image` is a path (str or os.PathLike; memory-mapped read-only)
        or a bytes-like object (a read-only, 16-byte aligned one is used in
        place and kept alive until close(); any other is copied once, so later
        changes to it cannot reach the engine). MicroPython: see above."""
    def config(self) -> dict[str, int | float | bool | str | dict[str, object]]:
        """vocab_rows, vocab_out, dim, n_layers, n_heads, head_dim, ffn, ple_dim,
        seq_len, group, eot_id, flags, max_draft, n_kv_heads (ints: seq_len is
        the positions the engine holds: the image's, or Model(context=N)'s N;
        max_draft is
        the longest guess of the image's n-gram drafter, 0 without one;
        n_kv_heads the K/V heads, n_heads or a divisor of it), rope_theta and
        norm_eps (floats: the RoPE base and the rmsnorm epsilon), arch (str:
        "esp32ai", the PLE TinyStories model, or "llama2c", llama2.c's Llama;
        ple_dim is 0 there), tied_head (bool), weights (str: the layer
        matrices' format, "int4", "int8", "fp32" or "mixed"; group is the int4
        matrices') and weights_choice (dict: {} when the converter measured
        nothing, else "chosen" (str), "positions" (int) and per format it
        tried, by name, (greedy agreement with the fp32 forward 0..1, mean
        |logit difference|, image bytes): (float, float, int))."""
    def reset(self) -> None:
        """Back to position 0: empty context, no logits, stats cleared, sampler
        stream restarted from its seed. The model stays open."""
    def sampler(self, temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> None:
        """How next tokens are chosen from now on. temperature == 0 or seed == 0:
        greedy (lowest id wins a tie). Otherwise Gumbel-max over the top_k best
        logits (top_k == 0 or vocab_out: all; otherwise at most 256, larger is an
        Error; above vocab_out a ValueError) scaled by 1/temperature, with the engine's seeded
        PCG32 stream, so a seed gives the same story everywhere."""
    def prefill(self, tokens: list[int]) -> int:
        """Feed prompt tokens at the current position (the head runs for the last
        one only) and return the next token. Nothing changes if it raises."""
    def step(self, token: int) -> int:
        """Feed one token, return the next."""
    def verify(self, tokens: list[int]) -> list[int]:
        """Speculative decoding's pass: feed 1..8 tokens at once (the last accepted
        token, then drafts) in one pass over the weights, and return for each
        prefix the token plain decoding would choose next (the same tokens and
        logits as that many step() calls, the sampler's stream included). Keep
        the drafts that match (tokens[i + 1] == result[i]) and rewind() past
        the rest; the result after the last match is the next token."""
    def draft(self, context: list[int], max_len: int) -> list[int]:
        """Up to max_len (capped at config()["max_draft"]) guesses for verify()
        from the image's self-distilled n-gram table, after context (its last
        3 tokens matter; an empty context gives []): the draft stops where the table's
        confidence no longer pays for a position in the pass. [] without a
        table. Guesses never change what is decoded."""
    def logits(self) -> bytes:
        """vocab_out float32 little-endian values from the last head evaluation
        (a copy). Raises Error ("bad state") before the first prefill/step.
        Decoding does not keep logits (the certified head picks the token
        without them), so the first call after an evaluation runs the full head
        once on that evaluation's input: the same bits plain mode computes."""
    def best_of(self, tokens: list[int] | None = None,
                skip: bytes | bytearray | memoryview | None = None) -> int:
        """The likeliest of some token ids at the last head evaluation: the id
        of the largest logit (the lowest id on a tie) among `tokens` (head
        ids 0..vocab_out-1, repeats allowed; None: every id), leaving out those
        whose bit is set in `skip` (bit i & 7 of byte i >> 3, vocab_out bits
        rounded up to bytes). The same choice as a scan of logits() over those
        ids, without that vector: for a list only the listed ids' head rows
        are computed (the same bits the full head gives them); for every id
        the full head runs once, inside the engine. Token healing's choice
        (llm.py). ValueError for an id out of range, no ids, or a skip of the
        wrong length; TypeError for a skip that is not bytes-like; Error ("bad
        argument") for a NaN logit among them or no id left, ("bad state")
        before the first prefill/step. Not counted in stats()."""
    def set_plain(self, on: bool) -> None:
        """Plain mode on or off from the next token on (see __init__). When V is
        cached as int16 dots that no row can outgrow, the float V cache only
        plain mode writes is placed by the first set_plain(True) (memory()'s
        "kv_values"): Error "out of memory", plain mode left off, if it finds
        no room."""
    def plain(self) -> bool:
        """Whether plain mode is on."""
    def set_fast(self, on: bool) -> None:
        """Fast mode (LOSSY, opt-in) on or off. The KV cache changes form, so
        only at position 0 (Error "bad state" otherwise: reset() first), and
        not while plain mode is on (set_plain(True) on a fast model is a
        ValueError). Decoding in fast mode is still exactly reproducible, and
        verify() still equals step() calls; it is exact mode's stories that
        it does not reproduce."""
    def fast(self) -> bool:
        """Whether fast mode is on."""
    def set_k_dots(self, on: bool) -> None:
        """K cached as its exact int16 integer dots beside V's (off by default):
        each cached k is rebuilt and RoPE re-applied when read, with the
        operations that made plain mode's floats, so the same tokens and
        logits bits; half the K bytes read, for that compute (the cost model
        prices it slower on the S3: a switch for a board's own A/B). From the
        next token on; rows cached before keep their form. No effect in plain
        or fast mode, or when the qkv rows are several scale groups. The first
        set_k_dots(True) places its scratch (memory()'s "k_rebuilt"): Error
        "out of memory", K left as floats, if it finds no room."""
    def k_dots(self) -> bool:
        """Whether K is cached as dots (set_k_dots)."""
    def set_preload(self, on: bool) -> None:
        """Cache preload hints (off by default; llm.h, llm_set_preload): before
        the next weight matrix, the layer's cached K and V rows and the head's
        next tile, the engine asks the port to stage their first bytes in the
        data cache (on the ESP32-S3 the ROM's Cache_Start_DCache_Preload; on
        the host and the unix port a counter only). A hint: the same tokens
        and logits bits on or off; only a board can say whether it pays
        (bench.py --port PORT --ab). Off in plain mode. Error "bad config"
        when the port has no preload hook."""
    def preload(self) -> bool:
        """Whether cache preload hints are on (set_preload)."""
    def tokenizer(self) -> memoryview:
        """The image's tokenizer section (layout: native/engine/image_format.h),
        read in place, never copied: on CPython a read-only memoryview that
        keeps the image bytes alive (after close(), and after the model is
        replaced), so a kept view always reads the right bytes; on MicroPython
        a Section that checks the model at every access and lends no buffer
        (see the module notes), so a kept one raises Error instead."""
    def pos(self) -> int:
        """Tokens in the context (the position the next token goes to)."""
    def rewind(self, pos: int) -> None:
        """Drop positions >= pos (0 <= pos <= pos(); else ValueError), in O(1): the
        next token fed goes to position pos. The sampler's random stream goes back
        to where it stood once pos was decoded (after the evaluation that proposed
        the token for pos), so for the same sampler settings decoding continues
        exactly as if the dropped positions had never been decoded (rejected
        drafts, undo). Logits are gone until the next
        prefill/step."""
    def stats(self) -> dict[str, object]:
        """Since the last reset (or open):
        tokens (int: tokens through the layers), prefill_tokens (int: in the last
        prefill), heads (int: head evaluations), ttft_ms (float: wall time of the
        last prefill, sampling included), stage_ms (dict: embed, attn, ffn, ple,
        head, sample -> float ms, summed), total_ms (float: sum of stage_ms),
        bytes (dict: flash, fast, bulk -> int bytes read: weights, norms, RoPE
        rows, embedding/PLE rows, KV cache reads and writes, head rows scored
        and the token ids read (head_ids), the head's tile boxes; activations are not
        counted), head_rows (int: head rows scored, summed over evaluations;
        head_rows / (heads * vocab_out) is the share the certificate kept),
        head_tiles, head_waves (int: tiles scored, and the waves they were
        scored in), head_ids (int: head rows whose token id was read: every row
        on the dense route, on the certified one only the rows that could
        enter the candidate list), handoffs (int: pieces of work sent to the second core),
        v_wide, k_wide (int: cached V and K rows kept as floats because their
        integer dots did not fit int16; the others are kept as dots, the same
        values), preloads, preload_bytes (int: cache preload hints handed to
        the port while set_preload is on, and the bytes they asked for)."""
    def memory(self) -> list[tuple[str, str, int]]:
        """(name, region, bytes) for every placed section and buffer; region is
        "flash" (read in place from the image), "fast" (internal SRAM) or "bulk"
        (PSRAM). On the host the port records what the engine asked for."""
    def close(self) -> None:
        """Release the engine and the image. Idempotent; any other call on a
        closed model raises Error ("bad state")."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...
