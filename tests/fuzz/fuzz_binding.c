/*
 * libFuzzer harness for the binding core (native/binding/llm_bind.c): the
 * argument decoding both bindings of `_llm` share, driven as a binding
 * drives it, on a small model that stays open across the calls of one input.
 *
 * One input is a sequence of calls. Each call's bytes pick a method (or a
 * close, a Model(same path) re-mode, a self-test line), its positional count,
 * its keyword names (the real ones, wrong ones, empty, arbitrary bytes) and
 * then each argument's value as a binding would have read it: ints with
 * their overflow side, any double (NaN, inf), bools, token lists of any
 * length, best_of's skip bitmaps of any length. Checked, besides
 * ASan/UBSan: every refusal has a kind and a one-line message; a match
 * never gives two parameters one argument; a result is a well-formed value
 * stream; closing frees every block.
 *
 * The model is $MPLLM_FUZZ_IMAGE (tests/fuzz/fuzzrun.py makes it and builds
 * this file). Runs, the corpus and the long run: tests/fuzz/fuzzrun.py.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm_bind.h"
#include "port_host.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *image;   /* 16-byte aligned: used in place when immutable */
static uint8_t *shifted; /* the same bytes at an odd address: always copied */
static size_t image_len;

static int opens(const uint8_t *data, size_t len);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("MPLLM_FUZZ_IMAGE");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (f == NULL) {
        fprintf(stderr, "fuzz_binding: set MPLLM_FUZZ_IMAGE to a model image "
                        "(tests/fuzz/fuzzrun.py does)\n");
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    image_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    if (posix_memalign((void **)&image, 16, image_len) != 0 ||
        fread(image, 1, image_len, f) != image_len) {
        fprintf(stderr, "fuzz_binding: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    shifted = malloc(image_len + 1);
    if (shifted == NULL) exit(2);
    memcpy(shifted + 1, image, image_len);
    if (!opens(image, image_len)) {
        fprintf(stderr, "fuzz_binding: %s does not open: make it again with the current "
                        "converter (tests/fuzz/fuzzrun.py does)\n", path);
        exit(2);
    }
    return 0;
}

static int opens(const uint8_t *data, size_t len) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = NULL;
    llm_error err;
    if (llm_open(&e, data, len, &hp.port, &err) != LLM_OK) return 0;
    llm_close(e);
    return 1;
}

/* ---- reading the input -------------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t u8(reader *r) {
    if (r->n == 0) return 0;
    r->n--;
    return *r->p++;
}

static uint64_t u64(reader *r) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)u8(r) << (8 * i);
    return v;
}

/* ---- the checks ---------------------------------------------------------- */

static void check_error(llm_bind_kind kind, const llm_bind_error *err) {
    if (kind != err->kind || kind > LLM_BIND_INTERRUPT) abort();
    size_t len = strnlen(err->message, sizeof err->message);
    if (len == sizeof err->message) abort(); /* not terminated */
    if (kind == LLM_BIND_OK) {
        if (len != 0) abort();
        return;
    }
    if (len == 0 || memchr(err->message, '\n', len) != NULL) abort(); /* one line */
}

/* The value stream llm_bind_result emits: containers hold exactly the values
 * they announce, at indexes 0, 1, ...; dict values have keys. */
typedef struct stream {
    int depth;
    size_t left[LLM_BIND_MAX_DEPTH + 1], next[LLM_BIND_MAX_DEPTH + 1];
    llm_bind_type kind[LLM_BIND_MAX_DEPTH + 1];
    unsigned sum; /* every byte a value points at is read (ASan checks it) */
} stream;

static int put(void *ctx, const llm_bind_value *v) {
    stream *s = ctx;
    if (v->depth != s->depth || v->type > LLM_BIND_DICT) abort();
    if (s->depth > 0) {
        int d = s->depth - 1;
        if (v->index != s->next[d]++ || s->left[d] == 0) abort();
        if ((s->kind[d] == LLM_BIND_DICT) != (v->key != NULL)) abort();
        s->left[d]--;
    }
    if (v->type == LLM_BIND_STR || v->type == LLM_BIND_BYTES) {
        const uint8_t *b = v->p;
        if (v->n > 0 && b == NULL) abort();
        for (size_t i = 0; i < v->n; i++) s->sum += b[i];
    }
    if (v->key != NULL) s->sum += (unsigned)strlen(v->key);
    if (v->type >= LLM_BIND_LIST && v->n > 0) {
        if (s->depth == LLM_BIND_MAX_DEPTH) abort();
        s->kind[s->depth] = v->type;
        s->left[s->depth] = v->n;
        s->next[s->depth] = 0;
        s->depth++;
    }
    while (s->depth > 0 && s->left[s->depth - 1] == 0) s->depth--;
    return 1;
}

/* ---- one call, as a binding makes it ------------------------------------- */

#define MAX_IDS 64 /* token lists longer than this test only the count check */
#define MAX_BITS 8192 /* best_of skip bitmaps: 65536 head ids */

static const char *const NAMES[] = {
    "temperature", "top_k", "seed", "tokens", "token", "context", "max_len", "pos", "on",
    "skip", "", "Temperature", "tokens ", "plain",
};
#define N_NAMES (sizeof NAMES / sizeof NAMES[0])

static void call(llm_bind_model *m, reader *r, uint8_t op) {
    llm_bind_error err;
    const llm_bind_method_id id = (llm_bind_method_id)(op % LLM_BIND_METHOD_COUNT);
    const llm_bind_method *meth = llm_bind_method_at(id);
    const uint8_t shape = u8(r);
    const size_t n_pos = shape % 5u, n_kw = (shape / 5u) % 5u;
    char own[LLM_BIND_MAX_PARAMS + 2][16];
    const char *kw[LLM_BIND_MAX_PARAMS + 2];
    for (size_t k = 0; k < n_kw; k++) {
        uint8_t pick = u8(r);
        if (pick < 200) {
            kw[k] = NAMES[pick % N_NAMES];
        } else { /* any bytes, as a str's UTF-8 may hold */
            size_t len = u8(r) % sizeof own[k];
            for (size_t i = 0; i < len; i++) own[k][i] = (char)(u8(r) | 1);
            own[k][len] = 0;
            kw[k] = own[k];
        }
    }
    int slot[LLM_BIND_MAX_PARAMS];
    llm_bind_kind kind = llm_bind_match(meth, n_pos, kw, n_kw, slot, &err);
    check_error(kind, &err);
    if (kind != LLM_BIND_OK) return;
    for (int j = 0; j < LLM_BIND_MAX_PARAMS; j++) {
        if (slot[j] < 0) {
            if (j < meth->n_required) abort();
            continue;
        }
        if (j >= meth->n_params) abort();
        int in_pos = slot[j] < (int)n_pos;
        int in_kw = slot[j] >= LLM_BIND_MAX_PARAMS && slot[j] < LLM_BIND_MAX_PARAMS + (int)n_kw;
        if (!in_pos && !in_kw) abort();
        for (int i = 0; i < j; i++)
            if (slot[i] == slot[j]) abort();
    }

    /* 1. the arguments, as the binding read them */
    llm_bind_arg args[LLM_BIND_MAX_PARAMS];
    llm_bind_int raw[LLM_BIND_MAX_PARAMS][MAX_IDS];
    int32_t ids[LLM_BIND_MAX_PARAMS][MAX_IDS];
    static uint8_t bits[LLM_BIND_MAX_PARAMS][MAX_BITS];
    memset(args, 0, sizeof args);
    for (int j = 0; j < meth->n_params; j++) {
        const llm_bind_param *p = &meth->params[j];
        llm_bind_arg *a = &args[j];
        if (slot[j] < 0) continue;
        a->given = 1;
        switch (p->kind) {
        case LLM_BIND_P_INT:
        case LLM_BIND_P_U64:
        case LLM_BIND_P_TOKEN: {
            uint8_t side = u8(r) % 8u;
            a->i.overflow = side == 6 ? 1 : side == 7 ? -1 : 0;
            a->i.value = a->i.overflow ? 0 : (int64_t)u64(r);
            break;
        }
        case LLM_BIND_P_FLOAT: {
            uint64_t bits = u64(r);
            memcpy(&a->f, &bits, sizeof a->f);
            break;
        }
        case LLM_BIND_P_BOOL: a->on = u8(r) & 1; break;
        case LLM_BIND_P_TOKENS: {
            uint8_t len = u8(r);
            /* mostly short lists; now and then a count past any limit */
            size_t n = len < 0xF0 ? len % (MAX_IDS + 1u) : (size_t)1 << (len - 0xE0);
            kind = llm_bind_tokens(m, p, n, &err);
            check_error(kind, &err);
            if (kind != LLM_BIND_OK) return;
            if (n > MAX_IDS) return; /* the binding would iterate that many */
            for (size_t i = 0; i < n; i++) {
                uint8_t how = u8(r);
                raw[j][i].overflow = how == 0xFF ? 1 : how == 0xFE ? -1 : 0;
                raw[j][i].value = raw[j][i].overflow ? 0
                                  : how < 0x80  ? (int64_t)(how % 40u) /* in range */
                                                : (int64_t)u64(r);
            }
            a->n = n;
            a->ids = ids[j];
            break;
        }
        case LLM_BIND_P_BITS: {
            /* mostly a bit per head id (what the call accepts), else any length */
            const size_t want =
                m->engine != NULL ? (llm_get_config(m->engine)->vocab_out + 7u) / 8u : 1u;
            uint8_t how = u8(r);
            size_t n = how < 0xC0 ? want : (size_t)(how - 0xC0) * 3u;
            if (n > MAX_BITS) return;
            for (size_t i = 0; i < n; i++) bits[j][i] = how & 1 ? u8(r) : (uint8_t)(0xFF ^ u8(r));
            a->n = n;
            a->bits = bits[j];
            break;
        }
        default: abort();
        }
    }

    /* 2. the model is still open; token ids against its vocabulary */
    kind = llm_bind_ready(m, &err);
    check_error(kind, &err);
    if (kind != LLM_BIND_OK) return;
    for (int j = 0; j < meth->n_params; j++) {
        if (meth->params[j].kind != LLM_BIND_P_TOKENS || !args[j].given) continue;
        for (size_t i = 0; i < args[j].n; i++) {
            kind = llm_bind_token(m, &meth->params[j], raw[j][i], &ids[j][i], &err);
            check_error(kind, &err);
            if (kind != LLM_BIND_OK) return;
        }
    }

    /* 3. the call; 4. its result */
    llm_bind_out out;
    m->busy = 1;
    kind = llm_bind_call(m, id, args, &out, &err);
    check_error(kind, &err);
    if (kind == LLM_BIND_OK) {
        if (out.n > LLM_BIND_MAX_IDS) abort();
        stream s = {0};
        llm_bind_sink sink = {put, &s};
        if (!llm_bind_result(m, id, &out, &sink) || s.depth != 0) abort();
    }
    m->busy = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    llm_host_port hp;
    llm_port_host_init(&hp);
    hp.capacity[LLM_REGION_BULK] = 64u << 20;
    llm_bind_model m = {NULL, &hp.port, NULL, 0};
    llm_bind_error err;
    const uint8_t *placed;
    const uint8_t how = u8(&r);
    const int plain = (how >> 1) & 1, fast = (how >> 2) & 1;
    /* an odd address, or a buffer that may change, makes the binding copy */
    llm_bind_kind kind = llm_bind_place(&m, how & 1 ? shifted + 1 : image, image_len,
                                        (how >> 3) & 1, &placed, &err);
    check_error(kind, &err);
    if (kind != LLM_BIND_OK || ((uintptr_t)placed & 15u) != 0) abort();
    kind = llm_bind_open(&m, placed, image_len, plain, fast, 0, NULL, &err);
    check_error(kind, &err);
    if (kind != LLM_BIND_OK) {
        if (!(plain && fast)) abort(); /* the image opened at start */
        if (hp.live_blocks != 0 || m.copy != NULL) abort();
        return 0;
    }
    for (int calls = 0; calls < 24 && r.n > 0; calls++) {
        uint8_t op = u8(&r);
        if (op < 0xF0) {
            call(&m, &r, op);
        } else if (op < 0xF4) {
            if (m.engine != NULL) {
                kind = llm_bind_remode(&m, op & 1, u8(&r) & 1, (op >> 1) & 1, u8(&r) & 1, &err);
                check_error(kind, &err);
            }
        } else if (op < 0xF8) {
            char line[48];
            size_t len = u8(&r) % sizeof line;
            for (size_t i = 0; i < len; i++) line[i] = (char)u8(&r);
            line[len] = 0;
            if (len == 0) snprintf(line, sizeof line, "PROBE x DIFFERS");
            llm_bind_selftest t = {{0}, 0, 0, 0, 0};
            llm_bind_selftest_line(&t, line);
            char summary[200];
            llm_bind_selftest_summary(&t, summary, sizeof summary);
            stream s = {0};
            llm_bind_sink sink = {put, &s};
            if (!llm_bind_selftest_result(&t, &sink) || s.depth != 0) abort();
        } else {
            llm_bind_close(&m); /* the calls after it find the model closed */
        }
    }
    llm_bind_close(&m);
    llm_bind_close(&m); /* twice: a finaliser after close() */
    if (hp.live_blocks != 0) abort();
    return 0;
}
