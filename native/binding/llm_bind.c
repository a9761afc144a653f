/* The binding core both bindings of `_llm` share (llm_bind.h). */
#include "llm_bind.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "llm_names.h"

static llm_bind_kind fail(llm_bind_error *err, llm_bind_kind kind, const char *fmt, ...) {
    err->sys_errno = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->kind = kind;
    return kind;
}

static llm_bind_kind ok(llm_bind_error *err) {
    err->kind = LLM_BIND_OK;
    err->sys_errno = 0;
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

static llm_bind_kind engine(llm_status st, const llm_error *e, llm_bind_error *out) {
    return st == LLM_OK ? ok(out) : llm_bind_status(e, out);
}

static llm_bind_kind state(llm_bind_error *err, const char *message) {
    return fail(err, LLM_BIND_ENGINE_ERROR, "%s: %s", llm_status_name(LLM_E_STATE), message);
}

llm_bind_kind llm_bind_not_int(const char *what, const char *type_name, llm_bind_error *out) {
    return fail(out, LLM_BIND_TYPE_ERROR, "%s must be an int, not %.100s", what, type_name);
}

llm_bind_kind llm_bind_not_tokens(const char *what, const char *type_name,
                                  llm_bind_error *out) {
    return fail(out, LLM_BIND_TYPE_ERROR, "%s takes a sequence of token ids, not %.100s", what,
                type_name);
}

llm_bind_kind llm_bind_not_bits(const char *what, const char *type_name, llm_bind_error *out) {
    return fail(out, LLM_BIND_TYPE_ERROR, "%s takes a bytes-like object (a bit per head id), "
                "not %.100s", what, type_name);
}

llm_bind_kind llm_bind_ready(const llm_bind_model *m, llm_bind_error *err) {
    if (m->busy)
        return state(err, "the model is in use (by another thread, or by the call that is "
                          "building its result)");
    return m->engine == NULL ? state(err, "the model is closed") : ok(err);
}

/* "123", or the side of int64 it fell off (it is then not kept). By hand:
 * MicroPython builds route snprintf to a printf without the ll length
 * modifier. */
static const char *shown(llm_bind_int v, char buf[24]) {
    if (v.overflow > 0) return ">= 2**63";
    if (v.overflow < 0) return "< -2**63";
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

/* ---- Model()'s source --------------------------------------------------- */

llm_bind_kind llm_bind_not_image(const char *type_name, llm_bind_error *out) {
    return fail(out, LLM_BIND_TYPE_ERROR, "Model() takes a path (str or os.PathLike) or a "
                "bytes-like image, not %.100s", type_name);
}

llm_bind_kind llm_bind_path(const char *path, size_t len, llm_bind_error *out) {
    /* C's open() would read the path only up to the NUL: another file */
    if (memchr(path, 0, len) != NULL)
        return fail(out, LLM_BIND_VALUE_ERROR, "Model() path has a NUL character at index %lu",
                    (unsigned long)((const char *)memchr(path, 0, len) - path));
    return ok(out);
}

llm_bind_kind llm_bind_map_failed(const llm_error *err, int sys_errno, llm_bind_error *out) {
    if (sys_errno == 0) return llm_bind_status(err, out);
    fail(out, LLM_BIND_OS_ERROR, "%s", err->message);
    out->sys_errno = sys_errno;
    return LLM_BIND_OS_ERROR;
}

llm_bind_kind llm_bind_section_index(size_t len, llm_bind_int i, size_t *at,
                                     llm_bind_error *err) {
    if (i.overflow)
        return fail(err, LLM_BIND_INDEX_ERROR, "cannot fit 'int' into an index-sized integer");
    const int64_t from_start = i.value < 0 ? i.value + (int64_t)len : i.value;
    if (from_start < 0 || from_start >= (int64_t)len)
        return fail(err, LLM_BIND_INDEX_ERROR, "index out of bounds on dimension 1");
    *at = (size_t)from_start;
    return ok(err);
}

/* ---- the model --------------------------------------------------------- */

llm_bind_kind llm_bind_place(llm_bind_model *m, const uint8_t *data, size_t len, int immutable,
                             const uint8_t **placed, llm_bind_error *err) {
    *placed = data;
    /* an empty buffer is copied too: the copy is where the engine says "0 bytes" */
    if (((uintptr_t)data & 15u) == 0 && immutable) return ok(err);
    llm_region where;
    m->copy = m->port->alloc(m->port->ctx, len > 0 ? len : 16u, LLM_REGION_BULK, &where);
    if (m->copy == NULL)
        return fail(err, LLM_BIND_MEMORY_ERROR,
                    "no memory for an aligned copy of the image (%lu bytes)", (unsigned long)len);
    if (len > 0) memcpy(m->copy, data, len); /* data may be NULL when empty */
    *placed = m->copy;
    return ok(err);
}

llm_bind_kind llm_bind_modes(int plain, int fast, llm_bind_error *err) {
    if (plain && fast)
        return fail(err, LLM_BIND_VALUE_ERROR, "plain (the exact reference) and fast (lossy) "
                    "exclude each other");
    return ok(err);
}

llm_bind_kind llm_bind_context(llm_bind_int context, uint32_t *out, llm_bind_error *err) {
    char buf[24];
    if (context.overflow || context.value < 1 || context.value > (int64_t)UINT32_MAX)
        return fail(err, LLM_BIND_VALUE_ERROR, "context must be a number of positions from 1 "
                    "to the image's seq_len, not %s", shown(context, buf));
    *out = (uint32_t)context.value;
    return ok(err);
}

/* In plain mode its float V is placed at open, so that the head gives way to
 * it as to the KV cache (llm_open_options). */
static llm_status open_at(const llm_bind_model *m, const uint8_t *data, size_t len,
                          uint32_t context, int plain, llm_engine **out, llm_error *e) {
    const llm_open_options options = {context, plain};
    return llm_open_with(out, data, len, m->port, &options, e);
}

/* The context fitting_context chooses by default when the image's seq_len
 * finds no memory but this does (or the seq_len, if shorter): room for a
 * prompt and a whole story of ~200 tokens. A weight read in place from flash
 * costs less than a story cut short, so it is taken with weights in flash
 * rather than a shorter context with every weight in RAM. */
#define STORY_CONTEXT 256u

/* Where STORY_CONTEXT does not open either: the shortest context fitting_context
 * prefers with every weight in RAM to a longer one with some read in place
 * (or half the image's seq_len, for a small test model). */
#define FIT_MIN_CONTEXT 64u

/* What Model() plans against: the image, and the memory its port says it
 * can still give (port->memory; open_fitting plans only with one); the
 * image as the first plan checked it, so that the others skip its checks. */
typedef struct fit {
    const uint8_t *data;
    size_t len;
    const llm_port *port;
    llm_memory memory;
    int plain;
    struct llm_checked checked;
} fit;

/* Whether the plan at `context` opens (in plain mode if asked: its float V
 * placed at open finds room too), with every weight in RAM if `in_ram`. A
 * plan places nothing. */
static int plans_at(fit *f, uint32_t context, int in_ram, llm_plan *plan, llm_error *e) {
    const llm_open_options options = {context, f->plain};
    *plan = (llm_plan){.checked = f->checked};
    const llm_status st = llm_plan_open(plan, f->data, f->len, f->port, &f->memory, &options, e);
    f->checked = plan->checked;
    return st == LLM_OK && (!in_ram || plan->spilled == 0);
}

/* The longest context in lo..hi that plans_at (lo does): opening is monotone
 * in the context (the KV cache grows with it and is placed before the
 * weights). */
static uint32_t longest(fit *f, uint32_t lo, uint32_t hi, int in_ram) {
    llm_plan plan;
    llm_error e;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1u) / 2u;
        if (plans_at(f, mid, in_ram, &plan, &e)) lo = mid;
        else hi = mid - 1u;
    }
    return lo;
}

/* The context Model() opens at when none is asked (0 if none opens; *e then
 * says why, as the open at the image's seq_len would): the image's seq_len
 * if it opens. Where that finds no memory (on a board without PSRAM the KV
 * cache of every position finds no room): STORY_CONTEXT if it opens at all
 * (weights that find no RAM read in place), or the longest context at which
 * every weight is in RAM if that is longer; where STORY_CONTEXT does not
 * open, the longest context with every weight in RAM, unless that is
 * shorter than FIT_MIN_CONTEXT (then, as for a model whose weights never all
 * fit, the longest that opens, the rest read in place). llm.story() then
 * works on such a board without a context to choose; Model(context=N)
 * chooses another. Found over plans (two bisections, about 20 for a seq_len
 * of 512), so the model is opened once. */
static uint32_t fitting_context(fit *f, llm_error *e) {
    llm_plan plan;
    llm_error probe_err;
    if (plans_at(f, 0, 0, &plan, e)) return plan.seq_len;
    const uint32_t seq_len = plan.image_seq_len;
    if (e->status != LLM_E_NOMEM || !plans_at(f, 1, 0, &plan, &probe_err)) return 0;
    const uint32_t opens = longest(f, 1, seq_len - 1u, 0);
    const uint32_t story = STORY_CONTEXT < seq_len ? STORY_CONTEXT : seq_len;
    const uint32_t in_ram =
        plans_at(f, 1, 1, &plan, &probe_err) ? longest(f, 1, opens, 1) : 0u;
    if (opens >= story) return in_ram > story ? in_ram : story;
    if (in_ram >= (FIT_MIN_CONTEXT < seq_len / 2u ? FIT_MIN_CONTEXT : seq_len / 2u))
        return in_ram;
    return opens;
}

/* Model()'s one open: at the context asked, else at fitting_context's. */
/* A plan counts free bytes, not the heap's blocks: where the planned context
 * still finds no block (a fragmented heap), a shorter one is opened for real,
 * an eighth shorter each time, so that Model() never fails where a shorter
 * context opens (the old search's promise, kept by real opens only here). */
static llm_status open_shorter(const llm_bind_model *m, const uint8_t *data, size_t len,
                               uint32_t context, int plain, llm_engine **out, llm_error *e) {
    llm_status st = LLM_E_NOMEM;
    while (st == LLM_E_NOMEM && context > 1u) {
        context -= context / 8u > 0u ? context / 8u : 1u;
        st = open_at(m, data, len, context, plain, out, e);
    }
    return st;
}

static llm_status open_fitting(const llm_bind_model *m, const uint8_t *data, size_t len,
                               uint32_t context, int plain, llm_engine **out, llm_error *e) {
    const int planned = context == 0 && m->port->memory != NULL;
    if (planned) {
        fit f = {data, len, m->port, {{0}, 0, 0}, plain, {NULL, 0, {0}, 0}};
        m->port->memory(m->port->ctx, &f.memory);
        context = fitting_context(&f, e);
        if (context == 0) return e->status;
    }
    /* (a port that cannot say its memory: opened at the image's seq_len, or refused) */
    llm_status st = open_at(m, data, len, context, plain, out, e);
    if (st == LLM_E_NOMEM && planned) st = open_shorter(m, data, len, context, plain, out, e);
    if (st != LLM_OK || !plain) return st;
    st = llm_set_plain(*out, 1, e); /* (llm_bind_open sets it again: a no-op) */
    if (st != LLM_OK) {
        llm_close(*out);
        *out = NULL;
    }
    return st;
}

llm_bind_kind llm_bind_open(llm_bind_model *m, const uint8_t *data, size_t len, int plain,
                            int fast, uint32_t context, int (*poll)(void *ctx),
                            llm_bind_error *err) {
    llm_error e;
    llm_engine *opened = NULL;
    if (llm_bind_modes(plain, fast, err) == LLM_BIND_OK &&
        engine(open_fitting(m, data, len, context, plain, &opened, &e), &e, err) == LLM_BIND_OK) {
        m->engine = opened;
        llm_set_interrupt(opened, poll, NULL);
        if (engine(llm_set_plain(opened, plain, &e), &e, err) == LLM_BIND_OK &&
            engine(llm_set_fast(opened, fast, &e), &e, err) == LLM_BIND_OK)
            return LLM_BIND_OK;
    }
    llm_bind_close(m);
    return err->kind;
}

static llm_bind_kind set_plain(llm_engine *e, int on, llm_bind_error *err) {
    if (on && llm_fast(e))
        return fail(err, LLM_BIND_VALUE_ERROR, "a fast model cannot be plain (the exact "
                    "reference): set_fast(False) first");
    llm_error le;
    return engine(llm_set_plain(e, on, &le), &le, err);
}

llm_bind_kind llm_bind_remode(llm_bind_model *m, int plain_given, int plain, int fast_given,
                              int fast, llm_bind_error *err) {
    llm_engine *e = m->engine;
    llm_error le;
    if (llm_bind_modes(plain_given && plain, fast_given && fast, err) != LLM_BIND_OK) return err->kind;
    if (fast_given && fast != llm_fast(e)) {
        if (fast && engine(llm_fast_fits(e, &le), &le, err) != LLM_BIND_OK)
            return err->kind; /* refused before anything changed */
        llm_reset(e);
        if (fast) llm_set_plain(e, 0, NULL);
        if (engine(llm_set_fast(e, fast, &le), &le, err) != LLM_BIND_OK) return err->kind;
    }
    return plain_given ? set_plain(e, plain, err) : ok(err);
}

void llm_bind_close(llm_bind_model *m) {
    if (m->engine != NULL) llm_close(m->engine);
    m->engine = NULL;
    if (m->copy != NULL) m->port->free(m->port->ctx, m->copy);
    m->copy = NULL;
}

/* ---- methods ----------------------------------------------------------- */

/* a prompt longer than the context is the engine's "context full" */
#define ANY_LENGTH (UINT32_MAX / 2u)

static const llm_bind_method METHODS[LLM_BIND_METHOD_COUNT] = {
    [LLM_BIND_M_config] = {"config", 0, 0, 0, {{0}}},
    [LLM_BIND_M_reset] = {"reset", 0, 0, 0, {{0}}},
    [LLM_BIND_M_sampler] = {"sampler", 3, 0, 0,
                            {{"temperature", "temperature", LLM_BIND_P_FLOAT, 0, 0, 0, 0},
                             {"top_k", "top_k", LLM_BIND_P_INT, 0, 0, 0, 0},
                             {"seed", "seed", LLM_BIND_P_U64, 0, 0, 0, 0}}},
    [LLM_BIND_M_prefill] = {"prefill", 1, 1, 1, {{"tokens", "prefill()", LLM_BIND_P_TOKENS, 1,
                                               ANY_LENGTH, 0, 0}}},
    [LLM_BIND_M_step] = {"step", 1, 1, 1,
                         {{"token", "a token id", LLM_BIND_P_TOKEN, 0, 0, 0, 0}}},
    [LLM_BIND_M_verify] = {"verify", 1, 1, 1, {{"tokens", "verify()", LLM_BIND_P_TOKENS, 1,
                                             LLM_VERIFY_MAX, 0, 0}}},
    [LLM_BIND_M_draft] = {"draft", 2, 2, 0,
                          {{"context", "draft()", LLM_BIND_P_TOKENS, 0, ANY_LENGTH, 0, 0},
                           {"max_len", "draft() max_len", LLM_BIND_P_INT, 0, 0, 0, 0}}},
    [LLM_BIND_M_logits] = {"logits", 0, 0, 0, {{0}}},
    [LLM_BIND_M_best_of] = {"best_of", 2, 0, 1,
                            {{"tokens", "best_of()", LLM_BIND_P_TOKENS, 1, ANY_LENGTH, 1, 1},
                             {"skip", "best_of() skip", LLM_BIND_P_BITS, 0, 0, 0, 1}}},
    [LLM_BIND_M_pos] = {"pos", 0, 0, 0, {{0}}},
    [LLM_BIND_M_rewind] = {"rewind", 1, 1, 0, {{"pos", "rewind() position", LLM_BIND_P_INT, 0,
                                             0, 0, 0}}},
    [LLM_BIND_M_stats] = {"stats", 0, 0, 0, {{0}}},
    [LLM_BIND_M_memory] = {"memory", 0, 0, 0, {{0}}},
    [LLM_BIND_M_set_plain] = {"set_plain", 1, 1, 0, {{"on", "on", LLM_BIND_P_BOOL, 0, 0, 0, 0}}},
    [LLM_BIND_M_plain] = {"plain", 0, 0, 0, {{0}}},
    [LLM_BIND_M_set_fast] = {"set_fast", 1, 1, 0, {{"on", "on", LLM_BIND_P_BOOL, 0, 0, 0, 0}}},
    [LLM_BIND_M_fast] = {"fast", 0, 0, 0, {{0}}},
    [LLM_BIND_M_set_k_dots] = {"set_k_dots", 1, 1, 0, {{"on", "on", LLM_BIND_P_BOOL, 0, 0, 0, 0}}},
    [LLM_BIND_M_k_dots] = {"k_dots", 0, 0, 0, {{0}}},
    [LLM_BIND_M_set_preload] = {"set_preload", 1, 1, 0, {{"on", "on", LLM_BIND_P_BOOL, 0, 0, 0, 0}}},
    [LLM_BIND_M_preload] = {"preload", 0, 0, 0, {{0}}},
};

const llm_bind_method *llm_bind_method_at(llm_bind_method_id id) { return &METHODS[id]; }

llm_bind_kind llm_bind_match(const llm_bind_method *m, size_t n_pos, const char *const kw[],
                             size_t n_kw, int slot[LLM_BIND_MAX_PARAMS], llm_bind_error *err) {
    /* past LLM_BIND_MAX_PARAMS the binding kept no names: too many either way */
    if (m->n_params == 0 && n_pos + n_kw > 0)
        return fail(err, LLM_BIND_TYPE_ERROR, "%s() takes no arguments (%lu given)", m->name,
                    (unsigned long)(n_pos + n_kw));
    if (n_pos > m->n_params || n_kw > LLM_BIND_MAX_PARAMS)
        return fail(err, LLM_BIND_TYPE_ERROR, "%s() takes at most %u argument%s (%lu given)",
                    m->name, (unsigned)m->n_params, m->n_params == 1 ? "" : "s",
                    (unsigned long)(n_pos + n_kw));
    for (int j = 0; j < LLM_BIND_MAX_PARAMS; j++) slot[j] = j < (int)n_pos ? j : -1;
    for (size_t k = 0; k < n_kw; k++) {
        int j = 0;
        while (j < m->n_params && strcmp(m->params[j].name, kw[k]) != 0) j++;
        if (j == m->n_params)
            return fail(err, LLM_BIND_TYPE_ERROR, "%s() got an unexpected keyword argument "
                        "'%.40s'", m->name, kw[k]);
        if (slot[j] >= 0)
            return fail(err, LLM_BIND_TYPE_ERROR, "%s() got multiple values for argument '%s'",
                        m->name, kw[k]);
        slot[j] = LLM_BIND_MAX_PARAMS + (int)k;
    }
    for (int j = 0; j < m->n_required; j++)
        if (slot[j] < 0)
            return fail(err, LLM_BIND_TYPE_ERROR, "%s() missing required argument '%s'",
                        m->name, m->params[j].name);
    return ok(err);
}

llm_bind_kind llm_bind_tokens(const llm_bind_model *m, const llm_bind_param *p, size_t n,
                              llm_bind_error *err) {
    (void)m;
    if (n < p->min_n && p->min_n == 1)
        return fail(err, LLM_BIND_VALUE_ERROR, "%s needs at least one token", p->what);
    if (n < p->min_n)
        return fail(err, LLM_BIND_VALUE_ERROR, "%s needs at least %lu tokens", p->what,
                    (unsigned long)p->min_n);
    if (n > p->max_n)
        return fail(err, LLM_BIND_VALUE_ERROR, "%s takes at most %lu tokens, got %lu", p->what,
                    (unsigned long)p->max_n, (unsigned long)n);
    return ok(err);
}

llm_bind_kind llm_bind_token(const llm_bind_model *m, const llm_bind_param *p, llm_bind_int v,
                             int32_t *out, llm_bind_error *err) {
    const llm_config *c = llm_get_config(m->engine);
    const uint32_t rows = p != NULL && p->head ? c->vocab_out : c->vocab_rows;
    char buf[24];
    if (v.overflow || v.value < 0 || v.value >= (int64_t)rows)
        return fail(err, LLM_BIND_VALUE_ERROR, "token id %s out of range 0..%lu", shown(v, buf),
                    (unsigned long)rows - 1u);
    *out = (int32_t)v.value;
    return ok(err);
}

static llm_bind_kind sampler(llm_engine *e, const llm_bind_arg a[3], llm_bind_error *err) {
    const uint32_t vocab = llm_get_config(e)->vocab_out;
    const double temperature = a[0].given ? a[0].f : 0.0;
    const llm_bind_int top_k = a[1].given ? a[1].i : (llm_bind_int){0, 0};
    const llm_bind_int seed = a[2].given ? a[2].i : (llm_bind_int){0, 0};
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
    if (seed.overflow) return fail(err, LLM_BIND_VALUE_ERROR, "seed must be in 0..2**64-1");
    llm_sampler_options opt = {(float)temperature, (uint32_t)top_k.value, (uint64_t)seed.value};
    llm_error le;
    return engine(llm_set_sampler(e, &opt, &le), &le, err);
}

static llm_bind_kind rewind_to(llm_engine *e, llm_bind_int pos, llm_bind_error *err) {
    const uint32_t now = llm_pos(e);
    char buf[24];
    if (pos.overflow || pos.value < 0 || pos.value > (int64_t)now)
        return fail(err, LLM_BIND_VALUE_ERROR, "rewind position must be in 0..%lu (the context "
                    "holds %lu tokens), got %s", (unsigned long)now, (unsigned long)now,
                    shown(pos, buf));
    llm_error le;
    return engine(llm_rewind(e, (uint32_t)pos.value, &le), &le, err);
}

/* best_of(tokens=None, skip=None): of the ids given (or every head id),
 * those whose bit in skip is clear; skip has a bit per head id. */
static llm_bind_kind best_of(llm_engine *e, const llm_bind_arg a[2], llm_bind_out *out,
                             llm_bind_error *err) {
    const uint32_t vocab = llm_get_config(e)->vocab_out, bytes = (vocab + 7u) / 8u;
    if (a[1].given && a[1].n != bytes)
        return fail(err, LLM_BIND_VALUE_ERROR, "best_of() skip takes a bit per head id: %lu "
                    "bytes for %lu ids, got %lu", (unsigned long)bytes, (unsigned long)vocab,
                    (unsigned long)a[1].n);
    llm_error le;
    out->n = 1;
    return engine(llm_best_of(e, a[0].given ? a[0].ids : NULL, a[0].given ? (uint32_t)a[0].n : 0u,
                              a[1].given ? a[1].bits : NULL, out->ids, &le),
                  &le, err);
}

static llm_bind_kind draft(llm_engine *e, const llm_bind_arg a[2], llm_bind_out *out,
                           llm_bind_error *err) {
    const llm_bind_int n = a[1].i;
    char buf[24];
    if (n.overflow < 0 || (n.overflow == 0 && n.value < 0))
        return fail(err, LLM_BIND_VALUE_ERROR, "draft() max_len must be >= 0, got %s",
                    shown(n, buf));
    const uint32_t want = n.overflow > 0 || n.value > (int64_t)LLM_IMAGE_DRAFTS_MAX
                              ? LLM_IMAGE_DRAFTS_MAX
                              : (uint32_t)n.value;
    out->n = llm_draft(e, a[0].ids, (uint32_t)a[0].n, want, out->ids);
    return ok(err);
}

llm_bind_kind llm_bind_call(llm_bind_model *m, llm_bind_method_id id,
                            const llm_bind_arg a[LLM_BIND_MAX_PARAMS], llm_bind_out *out,
                            llm_bind_error *err) {
    llm_engine *e = m->engine;
    llm_error le;
    int32_t token;
    out->n = 0;
    /* the binding checked llm_bind_ready (and may have set busy since) */
    if (e == NULL) return state(err, "the model is closed");
    switch (id) {
    case LLM_BIND_M_reset: llm_reset(e); break;
    case LLM_BIND_M_sampler: return sampler(e, a, err);
    case LLM_BIND_M_prefill:
        out->n = 1;
        return engine(llm_prefill(e, a[0].ids, (uint32_t)a[0].n, out->ids, &le), &le, err);
    case LLM_BIND_M_step:
        if (llm_bind_token(m, NULL, a[0].i, &token, err) != LLM_BIND_OK) return err->kind;
        out->n = 1;
        return engine(llm_step(e, token, out->ids, &le), &le, err);
    case LLM_BIND_M_verify:
        out->n = (uint32_t)a[0].n;
        return engine(llm_verify(e, a[0].ids, (uint32_t)a[0].n, out->ids, &le), &le, err);
    case LLM_BIND_M_draft: return draft(e, a, out, err);
    case LLM_BIND_M_logits:
        if (llm_logits(e) == NULL)
            return state(err, "no logits yet: call prefill() or step() first");
        break;
    case LLM_BIND_M_best_of: return best_of(e, a, out, err);
    case LLM_BIND_M_rewind: return rewind_to(e, a[0].i, err);
    case LLM_BIND_M_set_plain: return set_plain(e, a[0].on, err);
    case LLM_BIND_M_set_fast: return engine(llm_set_fast(e, a[0].on, &le), &le, err);
    case LLM_BIND_M_set_k_dots: return engine(llm_set_k_dots(e, a[0].on, &le), &le, err);
    case LLM_BIND_M_set_preload: return engine(llm_set_preload(e, a[0].on, &le), &le, err);
    default: break; /* the rest only read */
    }
    return ok(err);
}

/* ---- return values ----------------------------------------------------- */

/* The sink, and the containers being filled: how many values each still takes. */
typedef struct emitter {
    const llm_bind_sink *sink;
    int depth;
    size_t left[LLM_BIND_MAX_DEPTH], at[LLM_BIND_MAX_DEPTH];
} emitter;

static int put(emitter *em, llm_bind_type type, const char *key, int64_t i, double f,
               const void *p, size_t n) {
    const int d = em->depth;
    const llm_bind_value v = {type, d, d > 0 ? em->at[d - 1]++ : 0, key, i, f, p, n};
    if (d > 0) em->left[d - 1]--;
    if (type >= LLM_BIND_LIST && n > 0) {
        if (d == LLM_BIND_MAX_DEPTH) return 0; /* no value here nests deeper */
        em->left[d] = n;
        em->at[d] = 0;
        em->depth++;
    }
    while (em->depth > 0 && em->left[em->depth - 1] == 0) em->depth--;
    return em->sink->put(em->sink->ctx, &v);
}
static int put_int(emitter *s, const char *key, int64_t i) {
    return put(s, LLM_BIND_INT, key, i, 0, NULL, 0);
}
static int put_float(emitter *s, const char *key, double f) {
    return put(s, LLM_BIND_FLOAT, key, 0, f, NULL, 0);
}
static int put_bool(emitter *s, const char *key, int on) {
    return put(s, LLM_BIND_BOOL, key, on != 0, 0, NULL, 0);
}
static int put_str(emitter *s, const char *key, const char *str) {
    return put(s, LLM_BIND_STR, key, 0, 0, str, strlen(str));
}
static int open_container(emitter *s, llm_bind_type type, const char *key, size_t n) {
    return put(s, type, key, 0, 0, NULL, n);
}

/* config()'s "weights": the layer matrices' format ("int4", "int8", "fp32"
 * or "mixed"), and "weights_choice": the converter's choice, "chosen" and
 * "positions", and per format it tried (agreement, mean_abs_diff, bytes)
 * under the format's name ({} when it measured none). */
static int weights(const llm_engine *e, emitter *s) {
    llm_weights_info w;
    llm_get_weights(e, &w);
    int good = put_str(s, "weights", llm_weights_name(w.layers_kind)) &&
               open_container(s, LLM_BIND_DICT, "weights_choice", w.chosen ? 2u + w.n_tried : 0u);
    if (!good || w.chosen == 0) return good;
    const char *chosen = llm_weights_name(w.chosen);
    good = put_str(s, "chosen", chosen ? chosen : "?") && put_int(s, "positions", w.positions);
    for (uint32_t k = 0; good && k < w.n_tried; k++) {
        const char *name = llm_weights_name(w.tried[k].kind);
        good = open_container(s, LLM_BIND_TUPLE, name ? name : "?", 3) &&
               put_float(s, NULL, w.tried[k].agreement) &&
               put_float(s, NULL, w.tried[k].mean_abs_diff) && put_int(s, NULL, w.tried[k].bytes);
    }
    return good;
}

static int config(const llm_engine *e, emitter *s) {
    const llm_config *c = llm_get_config(e);
    const struct {
        const char *name;
        uint32_t value;
    } f[] = {
        {"vocab_rows", c->vocab_rows}, {"vocab_out", c->vocab_out}, {"dim", c->dim},
        {"n_layers", c->n_layers},     {"n_heads", c->n_heads},     {"head_dim", c->head_dim},
        {"ffn", c->ffn},               {"ple_dim", c->ple_dim},     {"seq_len", c->seq_len},
        {"group", c->group},           {"eot_id", c->eot_id},       {"flags", c->flags},
        {"max_draft", llm_draft_max(e)}, {"n_kv_heads", c->n_kv_heads},
    };
    const size_t n = sizeof f / sizeof f[0];
    /* the image's arch as the family names the host tools use (mpllm Config.family) */
    const char *arch = c->arch == LLM_ARCH_LLAMA ? "llama2c" : "esp32ai";
    int good = open_container(s, LLM_BIND_DICT, NULL, n + 6);
    for (size_t i = 0; good && i < n; i++) good = put_int(s, f[i].name, f[i].value);
    return good && put_float(s, "rope_theta", c->rope_theta) &&
           put_float(s, "norm_eps", c->norm_eps) && put_str(s, "arch", arch) &&
           put_bool(s, "tied_head", c->flags & LLM_IMAGE_FLAG_TIED_HEAD) && weights(e, s);
}

static int stats(const llm_engine *e, emitter *s) {
    llm_stats st;
    llm_get_stats(e, &st);
    const struct {
        const char *name;
        uint64_t value;
    } f[] = {
        {"tokens", st.tokens},         {"prefill_tokens", st.prefill_tokens},
        {"heads", st.heads},           {"head_rows", st.head_rows},
        {"head_tiles", st.head_tiles}, {"head_waves", st.head_waves},
        {"handoffs", st.handoffs},     {"v_wide", st.v_wide},
        {"k_wide", st.k_wide},         {"head_ids", st.head_ids},
        {"preloads", st.preloads},     {"preload_bytes", st.preload_bytes},
    };
    const size_t n = sizeof f / sizeof f[0];
    uint64_t total_us = 0;
    int good = open_container(s, LLM_BIND_DICT, NULL, n + 4);
    for (size_t i = 0; good && i < n; i++) good = put_int(s, f[i].name, (int64_t)f[i].value);
    good = good && put_float(s, "ttft_ms", (double)st.prefill_us / 1000.0) &&
           open_container(s, LLM_BIND_DICT, "stage_ms", LLM_STAGE_COUNT);
    for (int i = 0; good && i < LLM_STAGE_COUNT; i++) {
        good = put_float(s, llm_stage_name((llm_stage)i), (double)st.stage_us[i] / 1000.0);
        total_us += st.stage_us[i];
    }
    good = good && put_float(s, "total_ms", (double)total_us / 1000.0) &&
           open_container(s, LLM_BIND_DICT, "bytes", LLM_REGION_COUNT);
    for (int r = 0; good && r < LLM_REGION_COUNT; r++)
        good = put_int(s, llm_region_name((llm_region)r), (int64_t)st.bytes[r]);
    return good;
}

static int memory(const llm_engine *e, emitter *s) {
    const uint32_t n = llm_placement_count(e);
    int good = open_container(s, LLM_BIND_LIST, NULL, n);
    for (uint32_t i = 0; good && i < n; i++) {
        const llm_placement *p = llm_placement_at(e, i);
        good = open_container(s, LLM_BIND_TUPLE, NULL, 3) && put_str(s, NULL, p->name) &&
               put_str(s, NULL, llm_region_name(p->region)) && put_int(s, NULL, p->bytes);
    }
    return good;
}

static int ids(const llm_bind_out *out, emitter *s) {
    int good = open_container(s, LLM_BIND_LIST, NULL, out->n);
    for (uint32_t i = 0; good && i < out->n; i++) good = put_int(s, NULL, out->ids[i]);
    return good;
}

int llm_bind_result(const llm_bind_model *m, llm_bind_method_id id, const llm_bind_out *out,
                    const llm_bind_sink *sink) {
    llm_engine *e = m->engine;
    emitter em = {sink, 0, {0}, {0}}, *s = &em;
    switch (id) {
    case LLM_BIND_M_config: return config(e, s);
    case LLM_BIND_M_prefill:
    case LLM_BIND_M_step:
    case LLM_BIND_M_best_of: return put_int(s, NULL, out->ids[0]);
    case LLM_BIND_M_verify:
    case LLM_BIND_M_draft: return ids(out, s);
    case LLM_BIND_M_logits:
        /* float32 little-endian: every supported target is (the engine checks at open) */
        return put(s, LLM_BIND_BYTES, NULL, 0, 0, llm_logits(e),
                   (size_t)llm_get_config(e)->vocab_out * 4u);
    case LLM_BIND_M_pos: return put_int(s, NULL, llm_pos(e));
    case LLM_BIND_M_stats: return stats(e, s);
    case LLM_BIND_M_memory: return memory(e, s);
    case LLM_BIND_M_plain: return put_bool(s, NULL, llm_plain(e));
    case LLM_BIND_M_fast: return put_bool(s, NULL, llm_fast(e));
    case LLM_BIND_M_k_dots: return put_bool(s, NULL, llm_k_dots(e));
    case LLM_BIND_M_preload: return put_bool(s, NULL, llm_preload(e));
    default: return put(s, LLM_BIND_NONE, NULL, 0, 0, NULL, 0);
    }
}

/* ---- _llm.plan() ------------------------------------------------------- */

/* A region's free bytes as given: a non-negative int (past 2**63: as good
 * as unlimited). */
static llm_bind_kind region_bytes(const char *what, llm_bind_int v, uint64_t *out,
                                  llm_bind_error *err) {
    char buf[24];
    if (v.overflow < 0 || (v.overflow == 0 && v.value < 0))
        return fail(err, LLM_BIND_VALUE_ERROR, "plan() %s must be a number of bytes >= 0 (or "
                    "None: the port's), not %s", what, shown(v, buf));
    *out = v.overflow > 0 ? LLM_MEMORY_UNLIMITED : (uint64_t)v.value;
    return ok(err);
}

/* The memory plan() counts against: the port's, as Model() would plan,
 * with what the arguments give in its place. */
static llm_bind_kind plan_memory(const llm_port *port, const llm_bind_plan_args *a,
                                 llm_memory *m, llm_bind_error *err) {
    *m = (llm_memory){{0, LLM_MEMORY_UNLIMITED, LLM_MEMORY_UNLIMITED}, 0, 0};
    if (port->memory != NULL) port->memory(port->ctx, m);
    char buf[24];
    const llm_bind_int o = a->block_overhead;
    if (a->overhead_given && (o.overflow || o.value < 0 || o.value > 4096))
        return fail(err, LLM_BIND_VALUE_ERROR, "plan() block_overhead must be 0..4096 bytes, "
                    "not %s", shown(o, buf));
    if (a->overhead_given) m->block_overhead = (uint32_t)o.value;
    if (a->bulk_is_fast_given) m->bulk_is_fast = a->bulk_is_fast;
    if (a->fast_given && region_bytes("fast", a->fast, &m->free[LLM_REGION_FAST], err))
        return err->kind;
    if (a->bulk_given && region_bytes("bulk", a->bulk, &m->free[LLM_REGION_BULK], err))
        return err->kind;
    return ok(err);
}

llm_bind_kind llm_bind_plan(const llm_port *port, const uint8_t *data, size_t len,
                            const llm_bind_plan_args *a, llm_placement *blocks, uint32_t cap,
                            llm_bind_plan_out *out, llm_bind_error *err) {
    llm_memory memory;
    char buf[24];
    memset(out, 0, sizeof *out);
    if (plan_memory(port, a, &memory, err) != LLM_BIND_OK) return err->kind;
    if (a->context.overflow || a->context.value < 0 || a->context.value > (int64_t)UINT32_MAX)
        return fail(err, LLM_BIND_VALUE_ERROR, "plan() context must be 0 (the image's seq_len) "
                    "or a number of positions, not %s", shown(a->context, buf));
    llm_error e;
    uint32_t context = (uint32_t)a->context.value;
    struct llm_checked checked = {NULL, 0, {0}, 0};
    if (a->fit) { /* Model()'s own choice (fitting_context), so no caller keeps a copy of it */
        fit f = {data, len, port, memory, a->plain, checked};
        context = fitting_context(&f, &e);
        checked = f.checked;
        if (context == 0 && e.status != LLM_E_NOMEM) return llm_bind_status(&e, err);
        if (context == 0) {
            out->opens = 0;
            snprintf(out->why, sizeof out->why, "%s: %s", llm_status_name(e.status), e.message);
            return ok(err);
        }
    }
    const llm_open_options options = {context, a->plain};
    out->plan = (llm_plan){.blocks = blocks, .cap = cap, .checked = checked};
    const llm_status st = llm_plan_open(&out->plan, data, len, port, &memory, &options, &e);
    if (st != LLM_OK && st != LLM_E_NOMEM) return llm_bind_status(&e, err);
    out->opens = st == LLM_OK;
    if (!out->opens) snprintf(out->why, sizeof out->why, "%s: %s", llm_status_name(st), e.message);
    return ok(err);
}

int llm_bind_plan_result(const llm_bind_plan_out *out, const llm_bind_sink *sink) {
    emitter em = {sink, 0, {0}, {0}}, *s = &em;
    const llm_plan *p = &out->plan;
    const uint32_t n = out->opens ? (p->n < p->cap ? p->n : p->cap) : 0u;
    int good = open_container(s, LLM_BIND_DICT, NULL, 5) && put_bool(s, "opens", out->opens) &&
               put_str(s, "why", out->why) && put_int(s, "context", p->seq_len) &&
               put_int(s, "spilled", (int64_t)p->spilled) &&
               open_container(s, LLM_BIND_LIST, "blocks", n);
    for (uint32_t i = 0; good && i < n; i++)
        good = open_container(s, LLM_BIND_TUPLE, NULL, 3) && put_str(s, NULL, p->blocks[i].name) &&
               put_str(s, NULL, llm_region_name(p->blocks[i].region)) &&
               put_int(s, NULL, p->blocks[i].bytes);
    return good;
}

/* ---- _llm.selftest() --------------------------------------------------- */

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

void llm_bind_selftest_summary(const llm_bind_selftest *t, char *buf, size_t size) {
    snprintf(buf, size, "selftest (kernels=%s): %u kernel checks passed, %u failed; %u probes, "
             "%u differ from the host model", t->kernels, (unsigned)t->passed,
             (unsigned)t->failures, (unsigned)t->probes, (unsigned)t->probe_differences);
}

int llm_bind_selftest_result(const llm_bind_selftest *t, const llm_bind_sink *sink) {
    emitter em = {sink, 0, {0}, {0}}, *s = &em;
    return open_container(s, LLM_BIND_DICT, NULL, LLM_BIND_SELFTEST_FIELDS) &&
           put_str(s, "kernels", t->kernels) && put_int(s, "passed", t->passed) &&
           put_int(s, "failures", t->failures) && put_int(s, "probes", t->probes) &&
           put_int(s, "probe_differences", t->probe_differences) &&
           put_bool(s, "ok", t->failures == 0);
}
