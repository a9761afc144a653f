/*
 * What both bindings of `_llm` (CPython: native/python, MicroPython:
 * native/micropython) decide, written once in plain C: the rules and limits
 * of every argument with their messages, the exception kind of every engine
 * status, when a buffer must be copied, and the names and values of the
 * config() and stats() fields. Each binding only turns Python objects into
 * the C values below and the results back, in its own dialect: reading an
 * int (and noticing it is a bool, or too large), raising the kind named
 * here, building the dicts.
 *
 * Checks never touch an engine that user code may have closed: a binding
 * re-reads its engine pointer (its "model is open" check) after anything
 * that runs user code (iterating, __index__, __float__) and before calling
 * in here.
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
/* guesses one draft() returns at most */
#define LLM_BIND_MAX_DRAFT LLM_IMAGE_DRAFTS_MAX

/* The Python exception a check or an engine call asks for. */
typedef enum llm_bind_kind {
    LLM_BIND_OK = 0,
    LLM_BIND_TYPE_ERROR,
    LLM_BIND_VALUE_ERROR,
    LLM_BIND_ENGINE_ERROR, /* _llm.Error, the engine's message */
    LLM_BIND_MEMORY_ERROR,
    LLM_BIND_INTERRUPT,    /* KeyboardInterrupt (the runtime's pending one) */
} llm_bind_kind;

typedef struct llm_bind_error {
    llm_bind_kind kind;
    char message[192];
} llm_bind_error;

/* An integer argument as a binding read it: its value, or which way it fell
 * outside int64 (bools are the binding's to refuse: TypeError). */
typedef struct llm_bind_int {
    int64_t value;
    int overflow; /* 0, +1 above INT64_MAX, -1 below INT64_MIN */
} llm_bind_int;

/* The kind and message of an engine failure. */
llm_bind_kind llm_bind_status(const llm_error *err, llm_bind_error *out);
/* "bad state: the model is closed" */
llm_bind_kind llm_bind_closed(llm_bind_error *out);

/* Argument rules. Each returns LLM_BIND_OK and writes the C value, or the
 * kind to raise with its message. `what` names the call ("prefill()"). */
llm_bind_kind llm_bind_token(const llm_engine *e, llm_bind_int v, int32_t *out,
                             llm_bind_error *err);
llm_bind_kind llm_bind_count(const char *what, size_t n, size_t min_n, size_t max_n,
                             llm_bind_error *err);
llm_bind_kind llm_bind_sampler(const llm_engine *e, double temperature, llm_bind_int top_k,
                               llm_bind_int seed, llm_sampler_options *out,
                               llm_bind_error *err);
llm_bind_kind llm_bind_rewind(const llm_engine *e, llm_bind_int pos, uint32_t *out,
                              llm_bind_error *err);
llm_bind_kind llm_bind_draft_len(llm_bind_int n, uint32_t *out, llm_bind_error *err);
llm_bind_kind llm_bind_modes(int plain, int fast, llm_bind_error *err);
/* set_plain(True) on a fast model */
llm_bind_kind llm_bind_set_plain(const llm_engine *e, int on, llm_bind_error *err);

/* A caller's image buffer is used in place only when it is 16-byte aligned
 * (the kernels' loads) and cannot change under the open model (immutable,
 * like bytes); otherwise the binding keeps one aligned private copy for the
 * model's lifetime and drops its reference to the original. */
int llm_bind_must_copy(const void *data, size_t len, int immutable);

/* config() and stats(): integer fields in order, then the binding adds the
 * non-integer ones (rope_theta, tied_head; stage_ms, total_ms, ttft_ms,
 * bytes) whose names are here too. */
typedef struct llm_bind_field {
    const char *name;
    uint64_t value;
} llm_bind_field;
#define LLM_BIND_CONFIG_INTS 13u
void llm_bind_config(const llm_engine *e, llm_bind_field out[LLM_BIND_CONFIG_INTS]);
#define LLM_BIND_STATS_INTS 8u
void llm_bind_stats(const llm_stats *s, llm_bind_field out[LLM_BIND_STATS_INTS]);
/* milliseconds of a stage / of all stages / of the last prefill */
double llm_bind_stage_ms(const llm_stats *s, llm_stage stage);
double llm_bind_total_ms(const llm_stats *s);
double llm_bind_ttft_ms(const llm_stats *s);

/* _llm.selftest(): the kernel self-test's lines (native/engine/selftest.h)
 * summed up as they are printed. */
typedef struct llm_bind_selftest {
    char kernels[16]; /* "pie-native" on the S3, "pie-emu" on a PC */
    uint32_t passed, failures, probes, probe_differences;
} llm_bind_selftest;
void llm_bind_selftest_line(llm_bind_selftest *acc, const char *line);

#endif
