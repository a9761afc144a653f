/*
 * The binding core: everything both bindings of `_llm` (CPython:
 * native/python, MicroPython: native/micropython) decide, written once in
 * plain C with no Python header. Each binding is thin glue in its own dialect:
 * it turns Python objects into the C values below, runs llm_bind_call, and
 * turns the values llm_bind_result hands it back into Python objects.
 *
 * A method call, as both bindings make it:
 *   1. read the arguments the method's table entry (llm_bind_method_at)
 *      names, running whatever user code that takes (iterating a sequence,
 *      __float__, __bool__);
 *   2. then, and only then, check that the model is still open (user code may
 *      have closed it) and read token ids against the open engine;
 *   3. llm_bind_call: every other rule, and the engine call (no Python object
 *      is touched, so CPython releases the GIL around it);
 *   4. llm_bind_result: the return value, as a stream of llm_bind_values.
 * A failure at any step is an llm_bind_error: the exception kind and its
 * message, raised by the binding's one raise function.
 */
#ifndef LLM_BIND_H
#define LLM_BIND_H

#include <stddef.h>
#include <stdint.h>

#include "image_format.h"
#include "llm.h"
#include "sampler.h"

/* top_k's limit below the whole vocabulary: _llm.MAX_TOP_K */
#define LLM_BIND_MAX_TOP_K LLM_SAMPLER_MAX_TOP_K

/* ---- errors ------------------------------------------------------------ */

/* The Python exception a check or an engine call asks for. */
typedef enum llm_bind_kind {
    LLM_BIND_OK = 0,
    LLM_BIND_TYPE_ERROR,
    LLM_BIND_VALUE_ERROR,
    LLM_BIND_ENGINE_ERROR, /* _llm.Error, the engine's message */
    LLM_BIND_MEMORY_ERROR,
    LLM_BIND_INTERRUPT,    /* KeyboardInterrupt (the runtime's pending one) */
    LLM_BIND_INDEX_ERROR,
    LLM_BIND_OS_ERROR,     /* OSError (exactly: MicroPython has no subclasses), errno in sys_errno */
} llm_bind_kind;

typedef struct llm_bind_error {
    llm_bind_kind kind;
    int sys_errno; /* LLM_BIND_OS_ERROR: OSError(sys_errno, message) */
    char message[192];
} llm_bind_error;

/* The kind and message of an engine failure. */
llm_bind_kind llm_bind_status(const llm_error *err, llm_bind_error *out);
/* TypeError "<what> must be an int, not <type_name>" (bools included) */
llm_bind_kind llm_bind_not_int(const char *what, const char *type_name, llm_bind_error *out);
/* TypeError "<what> takes a sequence of token ids, not <type_name>": a token
 * list that is not iterable */
llm_bind_kind llm_bind_not_tokens(const char *what, const char *type_name, llm_bind_error *out);

/* TypeError "<what> takes a bytes-like object (a bit per head id), not
 * <type_name>": a BITS argument without the buffer protocol */
llm_bind_kind llm_bind_not_bits(const char *what, const char *type_name, llm_bind_error *out);

/* ---- Model()'s source --------------------------------------------------- */

/* TypeError: Model() given neither a path nor a bytes-like object. */
llm_bind_kind llm_bind_not_image(const char *type_name, llm_bind_error *out);
/* A path as the binding read it (len bytes, UTF-8 or the file system's
 * bytes): ValueError when it holds a NUL, which would cut it short. */
llm_bind_kind llm_bind_path(const char *path, size_t len, llm_bind_error *out);
/* A path that could not be mapped (the port's llm_error and the errno behind
 * it, 0 if none): OSError(errno, the port's message) when the system said
 * why, else the engine's Error. */
llm_bind_kind llm_bind_map_failed(const llm_error *err, int sys_errno, llm_bind_error *out);

/* ---- the model as both bindings hold it -------------------------------- */

typedef struct llm_bind_model {
    llm_engine *engine; /* NULL: closed ("bad state: the model is closed") */
    llm_port *port;     /* the binding's port: outlives the engine */
    void *copy;         /* the private aligned copy of a caller's buffer */
    /* set by the binding from the engine call until its result is built:
     * another thread, or a finaliser run by an allocation while the result
     * is built, then finds the model in use instead of closing it under
     * the call */
    int busy;
} llm_bind_model;

/* "bad state: the model is in use (...)" while busy, "bad state: the model
 * is closed" unless m is open */
llm_bind_kind llm_bind_ready(const llm_bind_model *m, llm_bind_error *err);

/* The bytes the engine will read. A caller's buffer is used in place only
 * when it is 16-byte aligned (the kernels' loads) and cannot change under the
 * open model (`immutable`, like bytes); otherwise m keeps one aligned private
 * copy (from the port, freed by llm_bind_close) and the binding drops its
 * reference to the original: the image is held once. */
llm_bind_kind llm_bind_place(llm_bind_model *m, const uint8_t *data, size_t len, int immutable,
                             const uint8_t **placed, llm_bind_error *err);
/* Open the engine on the placed bytes in the modes asked for (plain and fast
 * exclude each other) holding `context` positions (0: the image's seq_len,
 * or where that finds no memory a whole story's context, weights read in
 * place if need be: see fitting_context), polling `poll` between a long prefill's passes.
 * On a failure m is closed (its copy freed). */
llm_bind_kind llm_bind_open(llm_bind_model *m, const uint8_t *data, size_t len, int plain,
                            int fast, uint32_t context, int (*poll)(void *ctx),
                            llm_bind_error *err);
/* plain (the exact reference) and fast (lossy) exclude each other: checked
 * before a binding gives anything up */
llm_bind_kind llm_bind_modes(int plain, int fast, llm_bind_error *err);
/* Model(the same path) on MicroPython's shared model: the modes asked for,
 * given = 0 keeping the current one; a change of fast mode starts over at
 * position 0. Refused (nothing changed) when the modes cannot be. */
llm_bind_kind llm_bind_remode(llm_bind_model *m, int plain_given, int plain, int fast_given,
                              int fast, llm_bind_error *err);
void llm_bind_close(llm_bind_model *m);

/* ---- methods ----------------------------------------------------------- */

/* Model's methods (close, tokenizer, __enter__/__exit__ are the bindings'
 * own: they concern the Python object): X(name, docstring).
 *
 * Adding a method (neither binding's glue changes: each defines its Python
 * function and its method-table entry from this list):
 *   1. X(name, "name(args) -> what: one line.") below;
 *   2. its entry in METHODS (llm_bind.c): each parameter's keyword, its name
 *      in messages and its kind (llm_bind_param_kind), how many are
 *      required, and computes = 1 if it runs the layers (CPython then
 *      releases the GIL around it);
 *   3. its rules and its engine call: a case in llm_bind_call (none for a
 *      method that only reads);
 *   4. its return value: a case in llm_bind_result (none: it returns None);
 *   5. its signature and docstring in firmware/modules/_llm.pyi (a test
 *      fails while the list and the .pyi differ:
 *      tests/test_micropython_binding.py::test_method_list_matches_the_pyi);
 *   6. its bad calls in SAME_OUTCOME (tests/test_micropython_binding.py):
 *      both bindings must raise alike.
 * MicroPython finds the new name's qstr (MP_QSTR_name) by preprocessing
 * modllm.c, and an incremental build re-scans only changed .c files: rebuild
 * the unix port clean (or touch modllm.c) after adding a method. */
#define LLM_BIND_METHODS(X)                                                                     \
    X(config, "config() -> dict: the model's dimensions.")                                      \
    X(reset, "reset(): back to position 0, same model (stats cleared).")                        \
    X(sampler, "sampler(temperature=0.0, top_k=0, seed=0): how next tokens are picked.")        \
    X(prefill, "prefill(tokens) -> next token: run the prompt, head on the last token only.")   \
    X(step, "step(token) -> next token.")                                                       \
    X(verify, "verify(tokens) -> the next token after each prefix, in one pass.")               \
    X(draft, "draft(context, max_len) -> up to max_len guesses from the image's n-gram table.") \
    X(logits, "logits() -> bytes: float32 little-endian logits of the last head evaluation.")   \
    X(best_of, "best_of(tokens=None, skip=None) -> the likeliest of these ids (their rows only).") \
    X(pos, "pos() -> tokens in the context.")                                                   \
    X(rewind, "rewind(pos): drop positions >= pos, as if they were never decoded.")             \
    X(stats, "stats() -> dict: ms per stage, token counts, TTFT, bytes read per region.")       \
    X(memory, "memory() -> [(name, region, bytes)]: where each section and buffer lives.")      \
    X(set_plain, "set_plain(on): every speed-up off (dense head, one core); same results.")    \
    X(plain, "plain() -> whether plain mode is on.")                                            \
    X(set_fast, "set_fast(on): attention over an int8 KV cache (LOSSY); at position 0 only.")  \
    X(fast, "fast() -> whether fast (lossy) mode is on.")                                       \
    X(set_k_dots, "set_k_dots(on): cache K as its exact int16 dots (RoPE re-applied on read).") \
    X(k_dots, "k_dots() -> whether K is cached as dots.")                                      \
    X(set_preload, "set_preload(on): cache preload hints (same results; priced by a board).")  \
    X(preload, "preload() -> whether cache preload hints are on.")

typedef enum llm_bind_method_id {
#define LLM_BIND_ID(name, doc) LLM_BIND_M_##name,
    LLM_BIND_METHODS(LLM_BIND_ID)
#undef LLM_BIND_ID
    LLM_BIND_METHOD_COUNT
} llm_bind_method_id;

/* How a binding reads one argument. */
typedef enum llm_bind_param_kind {
    LLM_BIND_P_INT,    /* an int, not a bool (rewind's position, draft's max_len) */
    LLM_BIND_P_U64,    /* an int read as 64 bits (the seed) */
    LLM_BIND_P_TOKEN,  /* an int: a token id */
    LLM_BIND_P_TOKENS, /* any iterable of token ids, min_n..max_n of them */
    LLM_BIND_P_FLOAT,  /* anything with __float__ */
    LLM_BIND_P_BOOL,   /* anything with __bool__ */
    LLM_BIND_P_BITS,   /* a bytes-like object: a bit per token id (best_of's skip) */
} llm_bind_param_kind;

typedef struct llm_bind_param {
    const char *name; /* its keyword */
    const char *what; /* its name in messages: "rewind() position" */
    llm_bind_param_kind kind;
    uint32_t min_n, max_n; /* LLM_BIND_P_TOKENS */
    int head;              /* LLM_BIND_P_TOKENS: head rows (0..vocab_out-1), not
                            * embedding rows (0..vocab_rows-1) */
    int or_none;           /* None is read as the argument omitted */
} llm_bind_param;

#define LLM_BIND_MAX_PARAMS 3
typedef struct llm_bind_method {
    const char *name;
    uint8_t n_params, n_required; /* the first n_required are required */
    uint8_t computes; /* runs the layers: CPython releases the GIL around it */
    llm_bind_param params[LLM_BIND_MAX_PARAMS];
} llm_bind_method;

const llm_bind_method *llm_bind_method_at(llm_bind_method_id id);

/* Which argument each parameter gets. The binding lists its n_pos positional
 * arguments at 0..n_pos-1 and its n_kw keyword arguments (names in kw) at
 * LLM_BIND_MAX_PARAMS + 0..n_kw-1, as far as those fit; slot[j] is then the
 * index of parameter j's argument, or -1 when it is omitted. Python's
 * TypeErrors: too many, unknown keyword, repeated, missing. */
llm_bind_kind llm_bind_match(const llm_bind_method *m, size_t n_pos, const char *const kw[],
                             size_t n_kw, int slot[LLM_BIND_MAX_PARAMS], llm_bind_error *err);

/* An integer argument as a binding read it: its value, or which way it fell
 * outside int64 (for LLM_BIND_P_U64: outside 0..2**64-1, the bits in value).
 * value is 0 whenever overflow is set. */
typedef struct llm_bind_int {
    int64_t value;
    int overflow; /* 0, +1 above the range, -1 below it */
} llm_bind_int;

/* Model(context=N): ValueError unless N >= 1 (and fits 32 bits: the engine
 * then refuses one past the image's seq_len); *out = N. */
llm_bind_kind llm_bind_context(llm_bind_int context, uint32_t *out, llm_bind_error *err);

/* tokenizer()[i] on a section of len bytes: *at, the byte's offset (i < 0
 * counts from the end), or the IndexError CPython's memoryview gives
 * (tokenizer() is one there), so both bindings say the same. */
llm_bind_kind llm_bind_section_index(size_t len, llm_bind_int i, size_t *at,
                                     llm_bind_error *err);

/* One argument as the binding read it (given = 0: omitted, its default). */
typedef struct llm_bind_arg {
    int given;
    llm_bind_int i;     /* INT, U64, TOKEN */
    double f;           /* FLOAT */
    int on;             /* BOOL */
    const int32_t *ids; /* TOKENS: n ids, checked by llm_bind_tokens */
    const uint8_t *bits; /* BITS: n bytes, the binding's own (no caller's buffer) */
    size_t n;
} llm_bind_arg;

/* TOKENS: the count is within the parameter's limits (before the ids are
 * read), then each id in the embedding's range, or the head's for a `head`
 * parameter (p; NULL: a single token, the embedding's) (llm_bind_token). */
llm_bind_kind llm_bind_tokens(const llm_bind_model *m, const llm_bind_param *p, size_t n,
                              llm_bind_error *err);
llm_bind_kind llm_bind_token(const llm_bind_model *m, const llm_bind_param *p, llm_bind_int v,
                             int32_t *out, llm_bind_error *err);

/* What a computing method returned, kept until llm_bind_result reads it. */
#define LLM_BIND_MAX_IDS \
    (LLM_VERIFY_MAX > LLM_IMAGE_DRAFTS_MAX ? LLM_VERIFY_MAX : LLM_IMAGE_DRAFTS_MAX)
typedef struct llm_bind_out {
    int32_t ids[LLM_BIND_MAX_IDS];
    uint32_t n;
} llm_bind_out;

/* Every remaining rule, then the engine. Touches no Python object. */
llm_bind_kind llm_bind_call(llm_bind_model *m, llm_bind_method_id id,
                            const llm_bind_arg args[LLM_BIND_MAX_PARAMS], llm_bind_out *out,
                            llm_bind_error *err);

/* ---- return values ----------------------------------------------------- */

typedef enum llm_bind_type {
    LLM_BIND_NONE,
    LLM_BIND_INT,   /* i */
    LLM_BIND_FLOAT, /* f */
    LLM_BIND_BOOL,  /* i */
    LLM_BIND_STR,   /* p, n bytes (UTF-8) */
    LLM_BIND_BYTES, /* p, n bytes (copied at once: it may point into the engine) */
    LLM_BIND_LIST,  /* n items: the n values that follow (each a whole value) */
    LLM_BIND_TUPLE, /* n items, as LIST */
    LLM_BIND_DICT,  /* n entries: the n values that follow, each with its key */
} llm_bind_type;

#define LLM_BIND_MAX_DEPTH 3 /* containers inside containers, at most */
typedef struct llm_bind_value {
    llm_bind_type type;
    int depth;       /* containers around it: 0 for the return value itself */
    size_t index;    /* its place in the container around it */
    const char *key; /* its key, when that container is a DICT */
    int64_t i;
    double f;
    const void *p;
    size_t n;
} llm_bind_value;

/* A binding's builder: put() turns one value into an object and stores it at
 * its index (or key) in the last container put at depth - 1; 0 on failure
 * (CPython: an exception is set). */
typedef struct llm_bind_sink {
    int (*put)(void *ctx, const llm_bind_value *v);
    void *ctx;
} llm_bind_sink;

/* The return value of a method llm_bind_call has just run. */
int llm_bind_result(const llm_bind_model *m, llm_bind_method_id id, const llm_bind_out *out,
                    const llm_bind_sink *sink);

/* ---- _llm.plan() ------------------------------------------------------- */

/* plan()'s arguments as the binding read them: fast / bulk the free bytes
 * of each region (not given: what the port says it can give, unlimited if
 * it cannot say), context (0: the image's seq_len), block_overhead and
 * bulk_is_fast (not given: the port's); fit: context None, the context
 * Model() chooses with none asked, against that memory. */
typedef struct llm_bind_plan_args {
    llm_bind_int fast, bulk, context, block_overhead;
    int fast_given, bulk_given, overhead_given, bulk_is_fast, bulk_is_fast_given, plain;
    int fit;
} llm_bind_plan_args;

/* What llm_bind_plan found: whether it opens and, if not, why (the open's
 * own message); the blocks in the caller's array (n may exceed cap: call
 * again with n entries). */
typedef struct llm_bind_plan_out {
    int opens;
    char why[192]; /* "<status>: <message>", as _llm.Error words it */
    llm_plan plan;
} llm_bind_plan_out;

/* The plan of opening `data` (16-byte aligned: the binding copies a buffer
 * that is not) through `port` (scratch only) under the memory the args
 * describe. An image the engine refuses, or a context past its seq_len, is
 * the engine's Error; a plan that finds no memory is not an error (opens
 * False, why). */
llm_bind_kind llm_bind_plan(const llm_port *port, const uint8_t *data, size_t len,
                            const llm_bind_plan_args *a, llm_placement *blocks, uint32_t cap,
                            llm_bind_plan_out *out, llm_bind_error *err);
/* plan()'s dict: opens, why ("" when it opens), context, spilled, blocks (a
 * list of (name, region, bytes) tuples, Model.memory()'s after that open). */
int llm_bind_plan_result(const llm_bind_plan_out *out, const llm_bind_sink *sink);

/* ---- _llm.selftest() --------------------------------------------------- */

/* The kernel self-test's lines (native/engine/selftest.h) summed up. */
typedef struct llm_bind_selftest {
    char kernels[16]; /* "pie-native" on the S3, "pie-emu" on a PC */
    uint32_t passed, failures, probes, probe_differences;
} llm_bind_selftest;
void llm_bind_selftest_line(llm_bind_selftest *acc, const char *line);
/* The one-line summary selftest() prints. */
void llm_bind_selftest_summary(const llm_bind_selftest *t, char *buf, size_t size);
/* selftest()'s dict without its "lines" (the binding adds the list it kept):
 * a DICT of LLM_BIND_SELFTEST_FIELDS entries. */
#define LLM_BIND_SELFTEST_FIELDS 6u
int llm_bind_selftest_result(const llm_bind_selftest *t, const llm_bind_sink *sink);

#endif
