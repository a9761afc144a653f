/*
 * The engine: open (validate + place), one forward pass, prefill/step, stats.
 *
 * There is exactly one forward pass (`forward`). Kernels and placement change
 * which code multiplies and where bytes live, never the model arithmetic,
 * whose operation order is DESIGN §3 to the letter: the Python reference
 * (tools/mpllm/reference.py) mirrors it and the tests compare raw bits.
 *
 * Memory: everything the engine owns comes from the port (the engine struct
 * included), all of it during llm_open. The forward pass allocates nothing.
 */
#include <math.h>
#include <string.h>

#include "image.h"
#include "kernels.h"
#include "llm.h"
#include "llm_error.h"
#include "llm_names.h"
#include "mathf.h"
#include "sampler.h"

/* A matrix and the region its bytes are read from (for llm_stats.bytes). */
typedef struct llm_mat {
    llm_q4 w;
    llm_region region;
} llm_mat;

typedef struct llm_layer {
    const float *attn_norm, *ffn_norm, *ple_norm;
    llm_mat qkv, attn_proj, gate, up, down, ple_gate, ple_proj;
} llm_layer;

struct llm_engine {
    llm_port port;
    llm_image_info image;
    llm_config cfg;

    /* weights */
    const float *rope;       /* [seq_len][head_dim], in the image */
    llm_q4 embed;            /* all vocab_rows rows, read in place */
    llm_rows ple_rows;       /* read in place */
    llm_mat ple_model_proj;
    const float *ple_proj_norm;
    llm_layer *layers;
    const float *out_norm;
    llm_mat head;
    llm_region norms_region;

    /* activations (one FAST block) */
    float *x, *xb, *xb2, *qkv, *att, *hb, *hb2, *ple, *trow, *scores;
    int8_t *xq;
    float xscale;
    float *logits;
    float *key_cache, *value_cache; /* [n_layers][seq_len][dim] each */
    llm_region kv_region;

    /* constants of the forward pass, computed once */
    float inv_sqrt_dim, sqrt_ple_dim, inv_sqrt_head_dim;

    /* state */
    uint32_t pos;
    int have_logits;
    llm_sampler_options sampler;
    llm_rng rng;
    llm_stats stats;

    /* what went where, and what to free */
    llm_placement *placements;
    void **owned;
    uint32_t n_placements, cap_placements;
};

/* ---- status ------------------------------------------------------------ */

static llm_status ok(llm_error *err) {
    if (err != NULL) {
        err->status = LLM_OK;
        err->message[0] = 0;
    }
    return LLM_OK;
}

const char *llm_status_name(llm_status status) {
    switch (status) {
    case LLM_OK: return "ok";
    case LLM_E_ARG: return "bad argument";
    case LLM_E_FORMAT: return "bad image";
    case LLM_E_VERSION: return "unsupported version";
    case LLM_E_CHECKSUM: return "checksum mismatch";
    case LLM_E_CONFIG: return "bad config";
    case LLM_E_NOMEM: return "out of memory";
    case LLM_E_CONTEXT: return "context full";
    case LLM_E_STATE: return "bad state";
    }
    return "unknown status";
}

/* ---- build info -------------------------------------------------------- */

#if defined(LLM_KERNELS_PIE) && defined(__XTENSA__)
#define LLM_KERNELS_BUILT "pie"
#elif defined(LLM_KERNELS_PIE)
#define LLM_KERNELS_BUILT "pie-emu" /* PIE kernels through pie.h's host model */
#else
#define LLM_KERNELS_BUILT "ref"
#endif
#ifndef LLM_PORT_NAME
#define LLM_PORT_NAME "unnamed"
#endif

const char *llm_build_info(void) {
    return "mpllm " LLM_VERSION " kernels=" LLM_KERNELS_BUILT
           " numerics=exact placement=embed+ple_rows:flash,core:fast>bulk,head+kv:bulk,"
           "act+logits+norms:fast port=" LLM_PORT_NAME;
}

/* ---- placement --------------------------------------------------------- */

static const char *const region_names[LLM_REGION_COUNT] = {"flash", "fast", "bulk"};

static void record(llm_engine *e, const char *name, llm_region region, size_t bytes, void *owned) {
    /* cap_placements is sized at open for every entry open can make */
    if (e->n_placements >= e->cap_placements) return;
    e->placements[e->n_placements].name = name;
    e->placements[e->n_placements].region = region;
    e->placements[e->n_placements].bytes = (uint32_t)bytes;
    e->owned[e->n_placements] = owned;
    e->n_placements++;
}

/* Ask for `wanted`; the port may answer with another region. NULL if none. */
static void *place(llm_engine *e, const char *name, size_t bytes, llm_region wanted,
                   llm_region *placed) {
    llm_region got = wanted;
    void *p = e->port.alloc(e->port.ctx, bytes, wanted, &got);
    if (p == NULL) return NULL;
    if ((uintptr_t)p % 16u != 0 || (unsigned)got >= LLM_REGION_COUNT) {
        /* a port breaking its contract would make PIE loads read wrong bytes */
        e->port.free(e->port.ctx, p);
        return NULL;
    }
    record(e, name, got, bytes, p);
    if (placed) *placed = got;
    return p;
}

/* Stage a Q4 matrix into RAM: FAST first, then BULK, else read it in place. */
static void stage_mat(llm_engine *e, const char *name, const llm_q4 *src, uint32_t rows,
                      llm_mat *dst, llm_region first) {
    size_t codes = (size_t)rows * src->row_bytes;
    size_t scales = (size_t)rows * src->n_groups * sizeof(float);
    dst->w = *src;
    dst->w.rows = rows;
    llm_region got = first;
    uint8_t *p = place(e, name, codes + scales, first, &got);
    if (p == NULL && first == LLM_REGION_FAST) p = place(e, name, codes + scales, LLM_REGION_BULK, &got);
    if (p == NULL) {
        dst->region = LLM_REGION_FLASH;
        record(e, name, LLM_REGION_FLASH, codes + scales, NULL);
        return;
    }
    memcpy(p, src->codes, codes);
    memcpy(p + codes, src->scales, scales);
    dst->w.codes = p;
    dst->w.scales = (const float *)(void *)(p + codes);
    dst->region = got;
}

static const char *section_name(const llm_engine *e, uint32_t i) {
    /* table names equal the expected ones (checked) and are at most 15 chars,
     * so the NUL-padded bytes in the image are a valid C string */
    return (const char *)(e->image.data + LLM_IMAGE_HEADER_BYTES +
                          (size_t)i * LLM_IMAGE_SECTION_BYTES);
}

static size_t round16(size_t n) { return (n + 15u) & ~(size_t)15u; }

void llm_close(llm_engine *e) {
    if (e == NULL) return;
    llm_port port = e->port;
    for (uint32_t i = e->n_placements; i-- > 0;)
        if (e->owned[i] != NULL && e->owned[i] != (void *)e) port.free(port.ctx, e->owned[i]);
    port.free(port.ctx, e);
}

llm_status llm_open(llm_engine **out, const uint8_t *image, size_t len, const llm_port *port,
                    llm_error *err) {
    if (out == NULL) return llm_fail(err, LLM_E_ARG, "llm_open: out is NULL");
    *out = NULL;
    if (port == NULL || port->alloc == NULL || port->free == NULL || port->now_us == NULL)
        return llm_fail(err, LLM_E_ARG, "llm_open: port needs alloc, free and now_us");
    llm_image_info info;
    llm_status st = llm_image_check(image, len, &info, err);
    if (st != LLM_OK) return st;
    const llm_config *c = &info.config;
    const uint32_t D = c->dim, L = c->n_layers, P = c->ple_dim, F = c->ffn, S = c->seq_len;

    /* the engine struct, layer table and placement list: one FAST block */
    uint32_t cap = info.n_sections + 16u;
    size_t off_layers = round16(sizeof(llm_engine));
    size_t off_place = off_layers + round16((size_t)L * sizeof(llm_layer));
    size_t off_owned = off_place + round16((size_t)cap * sizeof(llm_placement));
    size_t total = off_owned + (size_t)cap * sizeof(void *);
    llm_region got = LLM_REGION_FAST;
    uint8_t *base = port->alloc(port->ctx, total, LLM_REGION_FAST, &got);
    if (base == NULL)
        return llm_fail(err, LLM_E_NOMEM, "no memory for the engine state (%lu bytes)",
                        (unsigned long)total);
    memset(base, 0, total);
    llm_engine *e = (llm_engine *)(void *)base;
    e->port = *port;
    e->image = info;
    e->cfg = *c;
    e->layers = (llm_layer *)(void *)(base + off_layers);
    e->placements = (llm_placement *)(void *)(base + off_place);
    e->owned = (void **)(void *)(base + off_owned);
    e->cap_placements = cap;
    record(e, "engine", got, total, e);

    /* rows read per token stay where they are: in the (mapped) image */
    e->rope = (const float *)(const void *)llm_image_payload(&info, LLM_SEC_ROPE, NULL);
    llm_image_q4_view(&info, LLM_SEC_EMBED, &e->embed);
    llm_image_rows_view(&info, LLM_SEC_PLE_ROWS, &e->ple_rows);
    record(e, section_name(e, LLM_SEC_ROPE), LLM_REGION_FLASH, (size_t)S * c->head_dim * 4u, NULL);
    {
        uint32_t sz;
        llm_image_payload(&info, LLM_SEC_EMBED, &sz);
        record(e, section_name(e, LLM_SEC_EMBED), LLM_REGION_FLASH, sz, NULL);
        llm_image_payload(&info, LLM_SEC_PLE_ROWS, &sz);
        record(e, section_name(e, LLM_SEC_PLE_ROWS), LLM_REGION_FLASH, sz, NULL);
    }

    /* activations: required, FAST asked */
    {
        uint32_t widest = D > F ? D : F;
        if (P > widest) widest = P;
        size_t nf = 0;
        size_t o_x = nf; nf += round16(D);
        size_t o_xb = nf; nf += round16(D);
        size_t o_xb2 = nf; nf += round16(D);
        size_t o_qkv = nf; nf += round16(3u * (size_t)D);
        size_t o_att = nf; nf += round16(D);
        size_t o_hb = nf; nf += round16(widest);
        size_t o_hb2 = nf; nf += round16(widest);
        size_t o_ple = nf; nf += round16((size_t)L * P);
        size_t o_trow = nf; nf += round16((size_t)L * P);
        size_t o_scores = nf; nf += round16(S);
        size_t xq_bytes = round16(((size_t)widest + 31u) / 32u * 32u);
        size_t bytes = nf * sizeof(float) + xq_bytes;
        float *a = place(e, "activations", bytes, LLM_REGION_FAST, NULL);
        if (a == NULL) {
            llm_close(e);
            return llm_fail(err, LLM_E_NOMEM, "no memory for activations (%lu bytes)",
                            (unsigned long)bytes);
        }
        memset(a, 0, bytes);
        e->x = a + o_x;
        e->xb = a + o_xb;
        e->xb2 = a + o_xb2;
        e->qkv = a + o_qkv;
        e->att = a + o_att;
        e->hb = a + o_hb;
        e->hb2 = a + o_hb2;
        e->ple = a + o_ple;
        e->trow = a + o_trow;
        e->scores = a + o_scores;
        e->xq = (int8_t *)(void *)(a + nf);
    }
    e->logits = place(e, "logits", (size_t)c->vocab_out * sizeof(float), LLM_REGION_FAST, NULL);
    if (e->logits == NULL) {
        llm_close(e);
        return llm_fail(err, LLM_E_NOMEM, "no memory for logits (%lu bytes)",
                        (unsigned long)c->vocab_out * 4u);
    }
    /* KV cache: required, BULK asked */
    {
        /* in 64 bits: size_t is 32 bits on the board, and a valid-looking
         * config could wrap it to a tiny allocation */
        uint64_t kv64 = (uint64_t)L * S * D * sizeof(float);
        if (2u * kv64 > (uint64_t)SIZE_MAX) {
            llm_close(e);
            return llm_fail(err, LLM_E_NOMEM, "the KV cache (%llu bytes) exceeds this "
                            "machine's address space", (unsigned long long)(2u * kv64));
        }
        size_t kv = (size_t)kv64;
        e->key_cache = place(e, "kv_cache", 2u * kv, LLM_REGION_BULK, &e->kv_region);
        if (e->key_cache == NULL) {
            llm_close(e);
            return llm_fail(err, LLM_E_NOMEM, "no memory for the KV cache (%lu bytes)",
                            (unsigned long)(2u * kv));
        }
        memset(e->key_cache, 0, 2u * kv);
        e->value_cache = e->key_cache + (size_t)L * S * D;
    }

    /* optional staging last, so required buffers get memory first and
     * weights that find none are read in place instead */
    /* norms: small, read every token: one FAST block */
    {
        size_t n_norm = (size_t)P + (size_t)L * 3u * D + D;
        float *norms = place(e, "norms", n_norm * sizeof(float), LLM_REGION_FAST, &e->norms_region);
        const float *src;
        float *at = norms;
#define NORM(dst, sec, n)                                                       \
    src = (const float *)(const void *)llm_image_payload(&info, (sec), NULL);  \
    if (norms != NULL) {                                                        \
        memcpy(at, src, (size_t)(n) * sizeof(float));                           \
        (dst) = at;                                                             \
        at += (n);                                                              \
    } else {                                                                    \
        (dst) = src;                                                            \
    }
        NORM(e->ple_proj_norm, LLM_SEC_PLE_PROJ_NORM, P)
        for (uint32_t l = 0; l < L; l++) {
            uint32_t s0 = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l;
            NORM(e->layers[l].attn_norm, s0 + LLM_LSEC_ATTN_NORM, D)
            NORM(e->layers[l].ffn_norm, s0 + LLM_LSEC_FFN_NORM, D)
            NORM(e->layers[l].ple_norm, s0 + LLM_LSEC_PLE_NORM, D)
        }
        NORM(e->out_norm, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L, D)
#undef NORM
        if (norms == NULL) {
            e->norms_region = LLM_REGION_FLASH;
            record(e, "norms", LLM_REGION_FLASH, n_norm * sizeof(float), NULL);
        }
    }

    /* core matrices: FAST, else BULK, else in place */
    {
        llm_q4 src;
        llm_image_q4_view(&info, LLM_SEC_PLE_MODEL_PROJ, &src);
        stage_mat(e, section_name(e, LLM_SEC_PLE_MODEL_PROJ), &src, src.rows, &e->ple_model_proj,
                  LLM_REGION_FAST);
        for (uint32_t l = 0; l < L; l++) {
            uint32_t s0 = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l;
            llm_layer *ly = &e->layers[l];
            struct {
                uint32_t k;
                llm_mat *m;
            } mats[] = {
                {LLM_LSEC_QKV, &ly->qkv},   {LLM_LSEC_ATTN_PROJ, &ly->attn_proj},
                {LLM_LSEC_GATE, &ly->gate}, {LLM_LSEC_UP, &ly->up},
                {LLM_LSEC_DOWN, &ly->down}, {LLM_LSEC_PLE_GATE, &ly->ple_gate},
                {LLM_LSEC_PLE_PROJ, &ly->ple_proj},
            };
            for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) {
                llm_image_q4_view(&info, s0 + mats[k].k, &src);
                stage_mat(e, section_name(e, s0 + mats[k].k), &src, src.rows, mats[k].m,
                          LLM_REGION_FAST);
            }
        }
    }

    /* head: BULK, else read in place; tied = the first vocab_out embedding rows */
    {
        llm_q4 src;
        int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
        uint32_t sec = tied ? LLM_SEC_EMBED : LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L + 1u;
        llm_image_q4_view(&info, sec, &src);
        stage_mat(e, tied ? "head" : section_name(e, sec), &src, c->vocab_out, &e->head,
                  LLM_REGION_BULK);
    }

    e->inv_sqrt_dim = 1.0f / sqrtf((float)D);
    e->sqrt_ple_dim = sqrtf((float)P);
    e->inv_sqrt_head_dim = 1.0f / sqrtf((float)c->head_dim);
    llm_reset(e);
    *out = e;
    return ok(err);
}

/* ---- state ------------------------------------------------------------- */

void llm_reset(llm_engine *e) {
    if (e == NULL) return;
    e->pos = 0;
    e->have_logits = 0;
    memset(&e->stats, 0, sizeof e->stats);
    llm_rng_seed(&e->rng, e->sampler.seed);
}

const llm_config *llm_get_config(const llm_engine *e) { return e ? &e->cfg : NULL; }
uint32_t llm_pos(const llm_engine *e) { return e ? e->pos : 0; }
const float *llm_logits(const llm_engine *e) { return e && e->have_logits ? e->logits : NULL; }

void llm_get_stats(const llm_engine *e, llm_stats *out) {
    if (e && out) *out = e->stats;
}

const uint8_t *llm_tokenizer(const llm_engine *e, size_t *len) {
    uint32_t size = 0;
    const uint8_t *p = e ? llm_image_payload(&e->image, LLM_SEC_TOKENIZER, &size) : NULL;
    if (len) *len = size;
    return p;
}

uint32_t llm_placement_count(const llm_engine *e) { return e ? e->n_placements : 0; }

const llm_placement *llm_placement_at(const llm_engine *e, uint32_t i) {
    return e && i < e->n_placements ? &e->placements[i] : NULL;
}

const char *llm_region_name(llm_region r) {
    return (unsigned)r < LLM_REGION_COUNT ? region_names[r] : "unknown";
}

const char *llm_stage_name(llm_stage s) {
    static const char *const names[LLM_STAGE_COUNT] = {"embed", "attn", "ffn",
                                                       "ple",   "head", "sample"};
    return (unsigned)s < LLM_STAGE_COUNT ? names[s] : "unknown";
}

llm_status llm_set_sampler(llm_engine *e, const llm_sampler_options *opt, llm_error *err) {
    if (e == NULL || opt == NULL) return llm_fail(err, LLM_E_ARG, "llm_set_sampler: NULL argument");
    llm_status st = llm_sampler_check(opt, e->cfg.vocab_out, err);
    if (st != LLM_OK) return st;
    e->sampler = *opt;
    llm_rng_seed(&e->rng, opt->seed);
    return ok(err);
}

/* ---- the forward pass -------------------------------------------------- */

static uint64_t now(const llm_engine *e) { return e->port.now_us(e->port.ctx); }

/* Charge the time since *t to a stage and restart the clock. */
static void lap(llm_engine *e, llm_stage stage, uint64_t *t) {
    uint64_t n = now(e);
    e->stats.stage_us[stage] += n - *t;
    *t = n;
}

static void rmsnorm(float *out, const float *x, const float *w, uint32_t n) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + 1e-6f);
    for (uint32_t i = 0; i < n; i++) out[i] = (w[i] * x[i]) * inv;
}

static float silu(float v) { return v / (1.0f + llm_expf(-v)); }
static float gelu(float v) { return (0.5f * v) * (1.0f + llm_erff(v * 0.70710678f)); }

/* Quantize an input vector once; matvecs below reuse it. */
static void quantize(llm_engine *e, const float *x, uint32_t n) {
    llm_quantize_act(x, n, (n + 31u) / 32u * 32u, e->xq, &e->xscale);
}

/* The port may split the rows across cores (DESIGN §7); each row is still one
 * kernel call's work, so the bits do not depend on the split. */
static void matvec(llm_engine *e, const llm_mat *m, float *y) {
    llm_matvec_job job = {&m->w, e->xq, e->xscale, y};
    if (e->port.parallel_rows != NULL)
        e->port.parallel_rows(e->port.ctx, llm_matvec_job_rows, &job, m->w.rows);
    else
        llm_matvec_job_rows(&job, 0, m->w.rows);
    e->stats.bytes[m->region] += (uint64_t)m->w.rows * m->w.row_bytes +
                                 (uint64_t)m->w.rows * m->w.n_groups * sizeof(float);
}

/* Embedding row: kernel layout, 32-column blocks of nibbles. */
static void embed_row(llm_engine *e, uint32_t token, float *out) {
    const llm_q4 *w = &e->embed;
    const uint8_t *row = w->codes + (size_t)token * w->row_bytes;
    const float *sc = w->scales + (size_t)token * w->n_groups;
    for (uint32_t j = 0; j < w->cols; j++) {
        uint8_t byte = row[16u * (j / 32u) + (j % 16u)];
        int code = (j % 32u) < 16u ? (byte & 0x0F) : (byte >> 4);
        out[j] = (float)(code - 8) * sc[j / w->group];
    }
    e->stats.bytes[LLM_REGION_FLASH] += w->row_bytes + (uint64_t)w->n_groups * sizeof(float);
}

/* PLE row: source nibble order, fp16 scales beside the codes. */
static void ple_row(llm_engine *e, uint32_t token, float *out) {
    const llm_rows *t = &e->ple_rows;
    const uint8_t *rec = t->records + (size_t)token * t->row_bytes;
    const uint8_t *sc = rec + (t->cols + 1u) / 2u;
    for (uint32_t j = 0; j < t->cols; j++) {
        uint8_t byte = rec[j >> 1];
        int code = (j & 1u) ? (byte >> 4) : (byte & 0x0F);
        uint32_t g = j / t->group;
        float scale = llm_half_to_float((uint16_t)(sc[2u * g] | sc[2u * g + 1u] << 8));
        out[j] = (float)(code - 8) * scale;
    }
    e->stats.bytes[LLM_REGION_FLASH] += t->row_bytes;
}

static void attention(llm_engine *e, uint32_t l, uint32_t pos) {
    const uint32_t D = e->cfg.dim, H = e->cfg.n_heads, Dh = e->cfg.head_dim, S = e->cfg.seq_len;
    const float *kc = e->key_cache + (size_t)l * S * D;
    const float *vc = e->value_cache + (size_t)l * S * D;
    for (uint32_t h = 0; h < H; h++) {
        const float *q = e->qkv + h * Dh;
        float *ao = e->att + h * Dh;
        float maxs = -1e30f;
        for (uint32_t t = 0; t <= pos; t++) {
            const float *k = kc + (size_t)t * D + h * Dh;
            float s = 0.0f;
            for (uint32_t i = 0; i < Dh; i++) s += q[i] * k[i];
            s *= e->inv_sqrt_head_dim;
            e->scores[t] = s;
            if (s > maxs) maxs = s;
        }
        for (uint32_t i = 0; i < Dh; i++) ao[i] = 0.0f;
        float denom = 0.0f;
        for (uint32_t t = 0; t <= pos; t++) {
            float w = llm_expf(e->scores[t] - maxs);
            denom += w;
            const float *v = vc + (size_t)t * D + h * Dh;
            for (uint32_t i = 0; i < Dh; i++) ao[i] += w * v[i];
        }
        for (uint32_t i = 0; i < Dh; i++) ao[i] /= denom;
    }
    e->stats.bytes[e->kv_region] += 2u * (uint64_t)(pos + 1u) * D * sizeof(float);
}

/* One token through the model at e->pos; the head (and so logits) only if
 * run_head. Arguments were checked by the caller. */
static void forward(llm_engine *e, uint32_t token, int run_head) {
    const llm_config *c = &e->cfg;
    const uint32_t D = c->dim, L = c->n_layers, P = c->ple_dim, F = c->ffn;
    const uint32_t Dh = c->head_dim, half = Dh / 2u, S = c->seq_len, pos = e->pos;
    float *x = e->x;
    uint64_t t = now(e);

    /* embedding, PLE input and this position's RoPE row */
    embed_row(e, token, x);
    quantize(e, x, D);
    matvec(e, &e->ple_model_proj, e->ple);
    for (uint32_t i = 0; i < L * P; i++) e->ple[i] *= e->inv_sqrt_dim;
    for (uint32_t l = 0; l < L; l++) rmsnorm(e->ple + l * P, e->ple + l * P, e->ple_proj_norm, P);
    ple_row(e, token, e->trow);
    for (uint32_t i = 0; i < L * P; i++)
        e->ple[i] = (e->ple[i] + e->trow[i] * e->sqrt_ple_dim) * 0.70710678f;
    const float *rope_cos = e->rope + (size_t)pos * Dh;
    const float *rope_sin = rope_cos + half;
    e->stats.bytes[LLM_REGION_FLASH] += (uint64_t)Dh * sizeof(float);
    lap(e, LLM_STAGE_EMBED, &t);

    for (uint32_t l = 0; l < L; l++) {
        const llm_layer *ly = &e->layers[l];

        /* attention */
        rmsnorm(e->xb, x, ly->attn_norm, D);
        quantize(e, e->xb, D);
        matvec(e, &ly->qkv, e->qkv);
        for (uint32_t h = 0; h < 2u * c->n_heads; h++) { /* q heads then k heads */
            float *v = e->qkv + h * Dh;
            for (uint32_t i = 0; i < half; i++) {
                float co = rope_cos[i], si = rope_sin[i];
                float a = v[i], b = v[i + half];
                v[i] = a * co - b * si;
                v[i + half] = b * co + a * si;
            }
        }
        memcpy(e->key_cache + ((size_t)l * S + pos) * D, e->qkv + D, D * sizeof(float));
        memcpy(e->value_cache + ((size_t)l * S + pos) * D, e->qkv + 2u * D, D * sizeof(float));
        e->stats.bytes[e->kv_region] += 2u * (uint64_t)D * sizeof(float);
        attention(e, l, pos);
        quantize(e, e->att, D);
        matvec(e, &ly->attn_proj, e->xb2);
        for (uint32_t i = 0; i < D; i++) x[i] += e->xb2[i];
        lap(e, LLM_STAGE_ATTN, &t);

        /* SwiGLU FFN */
        rmsnorm(e->xb, x, ly->ffn_norm, D);
        quantize(e, e->xb, D);
        matvec(e, &ly->gate, e->hb);
        matvec(e, &ly->up, e->hb2);
        for (uint32_t i = 0; i < F; i++) e->hb[i] = silu(e->hb[i]) * e->hb2[i];
        quantize(e, e->hb, F);
        matvec(e, &ly->down, e->xb2);
        for (uint32_t i = 0; i < D; i++) x[i] += e->xb2[i];
        lap(e, LLM_STAGE_FFN, &t);

        /* PLE branch, on the raw residual */
        quantize(e, x, D);
        matvec(e, &ly->ple_gate, e->hb);
        for (uint32_t i = 0; i < P; i++) e->hb[i] = gelu(e->hb[i]) * e->ple[l * P + i];
        quantize(e, e->hb, P);
        matvec(e, &ly->ple_proj, e->xb2);
        rmsnorm(e->xb2, e->xb2, ly->ple_norm, D);
        for (uint32_t i = 0; i < D; i++) x[i] += e->xb2[i];
        lap(e, LLM_STAGE_PLE, &t);
    }
    e->stats.bytes[e->norms_region] += ((uint64_t)3u * L * D + P) * sizeof(float);
    e->stats.tokens++;

    if (run_head) {
        rmsnorm(x, x, e->out_norm, D);
        quantize(e, x, D);
        matvec(e, &e->head, e->logits);
        e->stats.bytes[e->norms_region] += (uint64_t)D * sizeof(float);
        e->stats.heads++;
        e->have_logits = 1;
        lap(e, LLM_STAGE_HEAD, &t);
    }
}

/* The sampler only fails on NaN logits (a broken model): the token that
 * produced them has been consumed, so the position has moved on. */
static llm_status sample(llm_engine *e, int32_t *next, llm_error *err) {
    uint64_t t = now(e);
    llm_status st = llm_sample(e->logits, e->cfg.vocab_out, &e->sampler, &e->rng, next, err);
    lap(e, LLM_STAGE_SAMPLE, &t);
    return st;
}

static llm_status check_token(const llm_engine *e, int32_t token, llm_error *err) {
    if (token < 0 || (uint32_t)token >= e->cfg.vocab_rows)
        return llm_fail(err, LLM_E_ARG, "token id %ld out of range 0..%lu", (long)token,
                        (unsigned long)e->cfg.vocab_rows - 1u);
    return LLM_OK;
}

llm_status llm_prefill(llm_engine *e, const int32_t *tokens, uint32_t n, int32_t *next,
                       llm_error *err) {
    if (e == NULL || next == NULL || (tokens == NULL && n > 0))
        return llm_fail(err, LLM_E_ARG, "llm_prefill: NULL argument");
    if (n == 0) return llm_fail(err, LLM_E_ARG, "llm_prefill: no tokens");
    /* check everything before touching the state: a failed call changes nothing */
    if ((uint64_t)e->pos + n > e->cfg.seq_len)
        return llm_fail(err, LLM_E_CONTEXT,
                        "%lu tokens at position %lu exceed seq_len %lu",
                        (unsigned long)n, (unsigned long)e->pos, (unsigned long)e->cfg.seq_len);
    for (uint32_t i = 0; i < n; i++) {
        llm_status st = check_token(e, tokens[i], err);
        if (st != LLM_OK) return st;
    }
    uint64_t t0 = now(e);
    for (uint32_t i = 0; i < n; i++) {
        forward(e, (uint32_t)tokens[i], i + 1u == n);
        e->pos++;
    }
    llm_status st = sample(e, next, err);
    e->stats.prefill_tokens = n;
    e->stats.prefill_us = now(e) - t0;
    return st == LLM_OK ? ok(err) : st;
}

llm_status llm_step(llm_engine *e, int32_t token, int32_t *next, llm_error *err) {
    if (e == NULL || next == NULL) return llm_fail(err, LLM_E_ARG, "llm_step: NULL argument");
    if (e->pos >= e->cfg.seq_len)
        return llm_fail(err, LLM_E_CONTEXT, "all %lu positions used (reset first)",
                        (unsigned long)e->cfg.seq_len);
    llm_status st = check_token(e, token, err);
    if (st != LLM_OK) return st;
    forward(e, (uint32_t)token, 1);
    e->pos++;
    st = sample(e, next, err);
    return st == LLM_OK ? ok(err) : st;
}
