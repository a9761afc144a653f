/* The rules both bindings of `_llm` share (llm_bind.h). */
#include "llm_bind.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>


static llm_bind_kind fail(llm_bind_error *err, llm_bind_kind kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->kind = kind;
    return kind;
}

static llm_bind_kind ok(llm_bind_error *err) {
    err->kind = LLM_BIND_OK;
    err->message[0] = 0;
    return LLM_BIND_OK;
}

llm_bind_kind llm_bind_status(const llm_error *e, llm_bind_error *out) {
    if (e->status == LLM_OK) return ok(out);
    if (e->status == LLM_E_INTERRUPTED)
        return fail(out, LLM_BIND_INTERRUPT, "%s", e->message);
    /* every other failure is the engine's: _llm.Error "<status>: <message>" */
    return fail(out, LLM_BIND_ENGINE_ERROR, "%s: %s", llm_status_name(e->status), e->message);
}

llm_bind_kind llm_bind_closed(llm_bind_error *out) {
    return fail(out, LLM_BIND_ENGINE_ERROR, "%s: the model is closed",
                llm_status_name(LLM_E_STATE));
}

/* "123", or the side of int64 it fell off. By hand: MicroPython builds
 * route snprintf to a printf without the ll length modifier. */
static const char *shown(llm_bind_int v, char buf[24]) {
    if (v.overflow > 0) return "too large";
    if (v.overflow < 0) return "too negative";
    uint64_t u = v.value < 0 ? 0u - (uint64_t)v.value : (uint64_t)v.value;
    char *p = buf + 23;
    *p = 0;
    do {
        *--p = (char)('0' + u % 10u);
        u /= 10u;
    } while (u);
    if (v.value < 0) *--p = '-';
    return p;
}

llm_bind_kind llm_bind_token(const llm_engine *e, llm_bind_int v, int32_t *out,
                             llm_bind_error *err) {
    const uint32_t rows = llm_get_config(e)->vocab_rows;
    char buf[24];
    if (v.overflow || v.value < 0 || v.value >= (int64_t)rows)
        return fail(err, LLM_BIND_VALUE_ERROR, "token id %s out of range 0..%lu", shown(v, buf),
                    (unsigned long)rows - 1u);
    *out = (int32_t)v.value;
    return ok(err);
}

llm_bind_kind llm_bind_count(const char *what, size_t n, size_t min_n, size_t max_n,
                             llm_bind_error *err) {
    if (n < min_n && min_n == 1)
        return fail(err, LLM_BIND_VALUE_ERROR, "%s needs at least one token", what);
    if (n < min_n)
        return fail(err, LLM_BIND_VALUE_ERROR, "%s needs at least %lu tokens", what,
                    (unsigned long)min_n);
    if (n > max_n)
        return fail(err, LLM_BIND_VALUE_ERROR, "%s takes at most %lu tokens, got %lu", what,
                    (unsigned long)max_n, (unsigned long)n);
    return ok(err);
}

llm_bind_kind llm_bind_sampler(const llm_engine *e, double temperature, llm_bind_int top_k,
                               llm_bind_int seed, llm_sampler_options *out,
                               llm_bind_error *err) {
    const uint32_t vocab = llm_get_config(e)->vocab_out;
    char buf[24];
    /* written so that NaN fails too */
    if (!(temperature >= 0.0) || temperature > FLT_MAX)
        return fail(err, LLM_BIND_VALUE_ERROR, "temperature must be finite and >= 0, got %g",
                    temperature);
    if (top_k.overflow || top_k.value < 0 ||
        (top_k.value > (int64_t)LLM_BIND_MAX_TOP_K && top_k.value != (int64_t)vocab))
        return fail(err, LLM_BIND_VALUE_ERROR, "top_k must be 0..%u, or 0 / %lu for "
                    "the whole vocabulary, got %s", (unsigned)LLM_BIND_MAX_TOP_K,
                    (unsigned long)vocab, shown(top_k, buf));
    /* seed: a u64; the binding hands over its bits with overflow = +1 above
     * 2**64 - 1 and -1 for a negative number */
    if (seed.overflow)
        return fail(err, LLM_BIND_VALUE_ERROR, "seed must be in 0..2**64-1");
    out->temperature = (float)temperature;
    out->top_k = (uint32_t)top_k.value;
    out->seed = (uint64_t)seed.value;
    return ok(err);
}

llm_bind_kind llm_bind_rewind(const llm_engine *e, llm_bind_int pos, uint32_t *out,
                              llm_bind_error *err) {
    const uint32_t now = llm_pos(e);
    char buf[24];
    if (pos.overflow || pos.value < 0 || pos.value > (int64_t)now)
        return fail(err, LLM_BIND_VALUE_ERROR, "rewind position must be in 0..%lu (the context "
                    "holds %lu tokens), got %s", (unsigned long)now, (unsigned long)now,
                    shown(pos, buf));
    *out = (uint32_t)pos.value;
    return ok(err);
}

llm_bind_kind llm_bind_draft_len(llm_bind_int n, uint32_t *out, llm_bind_error *err) {
    char buf[24];
    if (n.overflow < 0 || n.value < 0)
        return fail(err, LLM_BIND_VALUE_ERROR, "draft() max_len must be >= 0, got %s",
                    shown(n, buf));
    *out = n.overflow > 0 || n.value > (int64_t)LLM_BIND_MAX_DRAFT ? LLM_BIND_MAX_DRAFT
                                                                     : (uint32_t)n.value;
    return ok(err);
}

llm_bind_kind llm_bind_modes(int plain, int fast, llm_bind_error *err) {
    if (plain && fast)
        return fail(err, LLM_BIND_VALUE_ERROR, "plain (the exact reference) and fast (lossy) "
                    "exclude each other");
    return ok(err);
}

llm_bind_kind llm_bind_set_plain(const llm_engine *e, int on, llm_bind_error *err) {
    if (on && llm_fast(e))
        return fail(err, LLM_BIND_VALUE_ERROR, "a fast model cannot be plain (the exact "
                    "reference): set_fast(False) first");
    return ok(err);
}

int llm_bind_must_copy(const void *data, size_t len, int immutable) {
    (void)len; /* an empty buffer too: the copy is where the engine says "0 bytes" */
    return ((uintptr_t)data & 15u) != 0 || !immutable;
}

void llm_bind_config(const llm_engine *e, llm_bind_field out[LLM_BIND_CONFIG_INTS]) {
    const llm_config *c = llm_get_config(e);
    const llm_bind_field f[LLM_BIND_CONFIG_INTS] = {
        {"vocab_rows", c->vocab_rows}, {"vocab_out", c->vocab_out}, {"dim", c->dim},
        {"n_layers", c->n_layers},     {"n_heads", c->n_heads},     {"head_dim", c->head_dim},
        {"ffn", c->ffn},               {"ple_dim", c->ple_dim},     {"seq_len", c->seq_len},
        {"group", c->group},           {"eot_id", c->eot_id},       {"flags", c->flags},
        {"max_draft", llm_draft_max(e)},
    };
    memcpy(out, f, sizeof f);
}

void llm_bind_stats(const llm_stats *s, llm_bind_field out[LLM_BIND_STATS_INTS]) {
    const llm_bind_field f[LLM_BIND_STATS_INTS] = {
        {"tokens", s->tokens},         {"prefill_tokens", s->prefill_tokens},
        {"heads", s->heads},           {"head_rows", s->head_rows},
        {"head_tiles", s->head_tiles}, {"head_waves", s->head_waves},
        {"handoffs", s->handoffs},     {"v_wide", s->v_wide},
    };
    memcpy(out, f, sizeof f);
}

double llm_bind_stage_ms(const llm_stats *s, llm_stage stage) {
    return (double)s->stage_us[stage] / 1000.0;
}

double llm_bind_total_ms(const llm_stats *s) {
    uint64_t total = 0;
    for (int i = 0; i < LLM_STAGE_COUNT; i++) total += s->stage_us[i];
    return (double)total / 1000.0;
}

double llm_bind_ttft_ms(const llm_stats *s) { return (double)s->prefill_us / 1000.0; }

static int starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

void llm_bind_selftest_line(llm_bind_selftest *acc, const char *line) {
    const char *differs = strstr(line, " DIFFERS");
    if (starts(line, "selftest kernels=")) {
        snprintf(acc->kernels, sizeof acc->kernels, "%s", line + strlen("selftest kernels="));
    } else if (starts(line, "PASS ")) {
        acc->passed++;
    } else if (starts(line, "FAIL ")) {
        acc->failures++;
    } else if (starts(line, "PROBE ")) {
        acc->probes++;
        acc->probe_differences += differs != NULL;
    } else if (starts(line, "FLOAT ")) {
        acc->probes++;
        acc->failures += differs != NULL; /* a float that is not IEEE-754 breaks the contract */
    }
}
