/*
 * The engine: open (validate + place), one forward pass, prefill/step, stats.
 *
 * Shaped like llama2.c's run.c: the weights (what the image gives, after
 * staging) and the run state (what one token writes) are separate structs
 * with a shape comment on every buffer, and there is exactly one forward pass
 * (`forward`). Kernels, placement, plain mode and the core split change which
 * code multiplies, where bytes live and which rows the head scores, never the
 * model arithmetic, whose operation order is the numerics contract of
 * tools/mpllm/reference.py (mirrored there, compared bit for bit by tests).
 *
 * Memory: everything the engine owns comes from the port (the engine struct
 * included), all of it during llm_open. The forward pass allocates nothing.
 * Byte accounting (llm_stats.bytes) lives in the helpers that read the bytes
 * (matvec, the row lookups, rmsnorm, attention, the head), not between the
 * math lines.
 */
#include <math.h>
#include <string.h>

#include "head.h"
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

typedef struct llm_layer_weights {
    const float *attn_norm;  /* [dim] */
    llm_mat qkv;             /* [3*dim, dim]: q rows, k rows, v rows */
    llm_mat attn_proj;       /* [dim, dim] */
    const float *ffn_norm;   /* [dim] */
    llm_mat gate, up;        /* [ffn, dim] */
    llm_mat down;            /* [dim, ffn] */
    llm_mat ple_gate;        /* [ple_dim, dim] */
    llm_mat ple_proj;        /* [dim, ple_dim] */
    const float *ple_norm;   /* [dim] */
} llm_layer_weights;

typedef struct llm_weights {
    const float *rope;            /* [seq_len][head_dim]: cos[head_dim/2] | sin, in the image */
    llm_q4 embed;                 /* [vocab_rows, dim], read in place */
    llm_rows ple_rows;            /* [vocab_rows, n_layers*ple_dim], read in place */
    llm_mat ple_model_proj;       /* [n_layers*ple_dim, dim] */
    const float *ple_proj_norm;   /* [ple_dim], shared by the n_layers slices */
    llm_layer_weights *layers;    /* [n_layers] */
    const float *out_norm;        /* [dim] */
    llm_head head;                /* [vocab_out, dim] in tile order, + certificate */
    llm_region norms_region;
} llm_weights;

/* A quantized matvec input (llm_quantize_act): q has cols rounded up to 32. */
typedef struct llm_act {
    int8_t *q;
    float scale;
} llm_act;

typedef struct llm_run_state {
    float *x;        /* [dim] residual stream */
    float *xb;       /* [dim] normed input of a branch */
    float *xb2;      /* [dim] output of a branch */
    float *qkv;      /* [3*dim] this position's q | k | v */
    float *att;      /* [dim] attention output, heads side by side */
    float *hb, *hb2; /* [max(dim, ffn, ple_dim)] FFN / PLE hidden */
    float *ple;      /* [n_layers*ple_dim] this token's PLE inputs */
    float *trow;     /* [n_layers*ple_dim] this token's PLE table row */
    float *scores;   /* [n_heads][seq_len] attention scores */
    float *att_max, *att_den; /* [n_heads] softmax max and denominator */
    llm_act act;     /* [widest rounded to 32] input of the next matvec */
    llm_act head_in; /* [cols_padded] input of the last head evaluation */
    /* the KV cache, rows 64-byte aligned (whole cache lines: llm_open) */
    float *key_cache;   /* [n_layers][seq_len][dim] */
    int16_t *value_dots; /* [n_layers][seq_len][dim] V as the exact integer dots */
    float *value_scale; /* [n_layers][seq_len] the position's activation scale */
    float *value_cache; /* [n_layers][seq_len][dim] V as floats: wide rows only */
    uint8_t *value_wide; /* [n_layers][seq_len] 1: the row is in value_cache */
    /* [seq_len + 1] the sampler's stream once position p was decoded (after
     * the draws of the head evaluation there; inside a prompt, no draws) */
    llm_rng *rng_at;
    float *ones;        /* [dim] 1.0f: scales that make the kernel return dots */
    float *logits;   /* [vocab_out] dense route and llm_logits() only */
    llm_head_scratch head; /* bounds, heap, one wave of values */
    llm_candidates cand;   /* the sampler's k best of the last evaluation */
} llm_run_state;

struct llm_engine {
    llm_port port;
    llm_image_info image;
    llm_config cfg;
    llm_weights w;
    llm_run_state s;
    llm_region kv_region, logits_region;
    int v_dots; /* V cached as int16 dots (its rows are one scale group) */

    /* constants of the forward pass, computed once */
    float inv_sqrt_dim, sqrt_ple_dim, inv_sqrt_head_dim;

    /* state */
    uint32_t pos;
    int have_head;   /* head_in holds an evaluation */
    int have_logits; /* s.logits holds that evaluation's logits */
    int plain;
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
           " numerics=exact head=certified placement=embed+ple_rows:flash,core:fast>bulk,"
           "head+kv+logits:bulk,act+tiles+norms:fast port=" LLM_PORT_NAME;
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

/* As place(), 64-byte aligned: PSRAM is read through the data cache in
 * 64-byte lines, so a stream that starts on a line boundary touches no line
 * it does not use (a 384-byte KV row is six lines, not seven). */
static void *place64(llm_engine *e, const char *name, size_t bytes, llm_region wanted,
                     llm_region *placed) {
    uint8_t *p = place(e, name, bytes + 48u, wanted, placed);
    if (p == NULL) return NULL;
    e->placements[e->n_placements - 1u].bytes = (uint32_t)bytes;
    return p + ((64u - ((uintptr_t)p & 63u)) & 63u);
}

/* Stage a Q4 matrix into RAM: FAST first, then BULK, else read it in place. */
static void stage_mat(llm_engine *e, const char *name, const llm_q4 *src, llm_mat *dst,
                      llm_region first) {
    size_t codes = (size_t)src->rows * src->row_bytes;
    size_t scales = (size_t)src->rows * src->n_groups * sizeof(float);
    dst->w = *src;
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

static llm_status open_fail(llm_engine *e, llm_status st) {
    llm_close(e);
    return st;
}

/* The head: staged into BULK in the certificate's row order when the image
 * has one (each staged row checked against its tile's box), else staged or
 * read in place in id order with no certificate. */
static llm_status stage_head(llm_engine *e, llm_error *err) {
    const llm_config *c = &e->cfg;
    llm_head *h = &e->w.head;
    int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
    uint32_t sec = tied ? LLM_SEC_EMBED : LLM_SEC_LAYER0 + LLM_LSEC_COUNT * c->n_layers + 1u;
    const char *name = tied ? "head" : section_name(e, sec);
    llm_q4 src;
    llm_image_q4_view(&e->image, sec, &src);
    src.rows = c->vocab_out; /* tied: the first vocab_out embedding rows */
    llm_tiles t;
    llm_image_tiles_view(&e->image, &t);
    memset(h, 0, sizeof *h);
    h->cols_padded = src.row_bytes * 2u;
    h->rows_region = h->ids_region = h->boxes_region = LLM_REGION_FLASH;

    const size_t codes = (size_t)src.rows * src.row_bytes;
    const size_t scales = (size_t)src.rows * src.n_groups * sizeof(float);
    const int certified = t.n_tiles > 0 && src.n_groups == 1u;
    if (certified) {
        /* checked whether or not it is used below, so an image opens (or is
         * refused) the same everywhere: a permutation, else the staged copy
         * would lose or repeat rows, and every weight inside its box */
        llm_region seen_region;
        uint8_t *seen = e->port.alloc(e->port.ctx, (t.rows + 7u) / 8u, LLM_REGION_FAST, &seen_region);
        if (seen == NULL) return llm_fail(err, LLM_E_NOMEM, "no memory to check the head order");
        llm_status st = llm_head_check_order(&t, seen, err);
        e->port.free(e->port.ctx, seen);
        if (st != LLM_OK) return st;
        st = llm_head_check_boxes(&src, &t, err);
        if (st != LLM_OK) return st;
    }
    uint8_t *p = NULL;
    llm_region got = LLM_REGION_BULK;
    if (certified) p = place64(e, name, codes + scales, LLM_REGION_BULK, &got);
    if (p == NULL) {
        /* no room for the staged copy in its tile order: the dense route on
         * the rows in id order (staged elsewhere or read in place) */
        llm_mat m;
        stage_mat(e, name, &src, &m, LLM_REGION_BULK);
        h->w = m.w;
        h->rows_region = m.region;
        return LLM_OK;
    }
    for (uint32_t i = 0; i < src.rows; i++) {
        memcpy(p + (size_t)i * src.row_bytes, src.codes + (size_t)t.order[i] * src.row_bytes,
               src.row_bytes);
        memcpy(p + codes + (size_t)i * sizeof(float), &src.scales[t.order[i]], sizeof(float));
    }
    h->w = src;
    h->w.codes = p;
    h->w.scales = (const float *)(void *)(p + codes);
    h->rows_region = got;

    /* ids and boxes: small, read per evaluation. Ids per scored row (BULK);
     * boxes for every tile, every evaluation (FAST). Else read in place. */
    size_t ids_bytes = round16((size_t)t.rows * 2u);
    uint16_t *ids = place(e, "head_ids", ids_bytes, LLM_REGION_BULK, &h->ids_region);
    if (ids != NULL) {
        memcpy(ids, t.order, (size_t)t.rows * 2u);
        h->ids = ids;
    } else {
        h->ids = t.order;
    }
    size_t box_bytes = (size_t)t.n_tiles * 2u * h->cols_padded;
    size_t sc_bytes = round16((size_t)t.n_tiles * sizeof(float));
    uint8_t *b = place(e, "head_tiles", sc_bytes + box_bytes, LLM_REGION_FAST, &h->boxes_region);
    if (b != NULL) {
        memcpy(b, t.scales, (size_t)t.n_tiles * sizeof(float));
        memcpy(b + sc_bytes, t.boxes, box_bytes);
        h->tile_scale = (const float *)(void *)b;
        h->boxes = (const int8_t *)(b + sc_bytes);
    } else {
        h->tile_scale = t.scales;
        h->boxes = t.boxes;
    }
    h->tile_rows = t.tile_rows;
    h->n_tiles = t.n_tiles;
    return LLM_OK;
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
    const uint32_t H = c->n_heads;

    /* the engine struct, layer table and placement list: one FAST block */
    uint32_t cap = info.n_sections + 16u;
    size_t off_layers = round16(sizeof(llm_engine));
    size_t off_place = off_layers + round16((size_t)L * sizeof(llm_layer_weights));
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
    e->w.layers = (llm_layer_weights *)(void *)(base + off_layers);
    e->placements = (llm_placement *)(void *)(base + off_place);
    e->owned = (void **)(void *)(base + off_owned);
    e->cap_placements = cap;
    record(e, "engine", got, total, e);

    /* rows read per token stay where they are: in the (mapped) image */
    e->w.rope = (const float *)(const void *)llm_image_payload(&info, LLM_SEC_ROPE, NULL);
    llm_image_q4_view(&info, LLM_SEC_EMBED, &e->w.embed);
    llm_image_rows_view(&info, LLM_SEC_PLE_ROWS, &e->w.ple_rows);
    record(e, section_name(e, LLM_SEC_ROPE), LLM_REGION_FLASH, (size_t)S * c->head_dim * 4u, NULL);
    {
        uint32_t sz;
        llm_image_payload(&info, LLM_SEC_EMBED, &sz);
        record(e, section_name(e, LLM_SEC_EMBED), LLM_REGION_FLASH, sz, NULL);
        llm_image_payload(&info, LLM_SEC_PLE_ROWS, &sz);
        record(e, section_name(e, LLM_SEC_PLE_ROWS), LLM_REGION_FLASH, sz, NULL);
    }

    /* the head first among the large BULK blocks: its layout decides the
     * scratch sizes below */
    st = stage_head(e, err);
    if (st != LLM_OK) return open_fail(e, st);

    /* activations: required, FAST asked */
    {
        llm_run_state *s = &e->s;
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
        size_t o_scores = nf; nf += round16((size_t)H * S);
        size_t o_amax = nf; nf += round16(H);
        size_t o_aden = nf; nf += round16(H);
        size_t o_wide = nf; nf += round16(((size_t)L * S + 3u) / 4u); /* bytes, in floats */
        size_t o_ones = nf; nf += round16(D); /* scales of 1: the V rows' integer dots */
        size_t act_bytes = round16(((size_t)widest + 31u) / 32u * 32u);
        size_t head_in_bytes = round16(e->w.head.cols_padded);
        size_t scratch = llm_head_scratch_bytes(&e->w.head);
        size_t bytes = nf * sizeof(float) + act_bytes + head_in_bytes + scratch;
        float *a = place(e, "activations", bytes, LLM_REGION_FAST, NULL);
        if (a == NULL)
            return open_fail(e, llm_fail(err, LLM_E_NOMEM, "no memory for activations (%lu bytes)",
                                         (unsigned long)bytes));
        memset(a, 0, bytes);
        s->x = a + o_x;
        s->xb = a + o_xb;
        s->xb2 = a + o_xb2;
        s->qkv = a + o_qkv;
        s->att = a + o_att;
        s->hb = a + o_hb;
        s->hb2 = a + o_hb2;
        s->ple = a + o_ple;
        s->trow = a + o_trow;
        s->scores = a + o_scores;
        s->att_max = a + o_amax;
        s->att_den = a + o_aden;
        s->value_wide = (uint8_t *)(void *)(a + o_wide);
        s->ones = a + o_ones;
        for (uint32_t i = 0; i < D; i++) s->ones[i] = 1.0f;
        uint8_t *q = (uint8_t *)(void *)(a + nf);
        s->act.q = (int8_t *)q;
        s->head_in.q = (int8_t *)(q + act_bytes);
        llm_head_scratch_init(&s->head, &e->w.head, q + act_bytes + head_in_bytes);
    }
    /* logits: only the dense route and llm_logits() write them, so BULK
     * (internal SRAM is worth more than a buffer decoding never touches) */
    e->s.logits = place(e, "logits", (size_t)c->vocab_out * sizeof(float), LLM_REGION_BULK,
                        &e->logits_region);
    if (e->s.logits == NULL)
        return open_fail(e, llm_fail(err, LLM_E_NOMEM, "no memory for logits (%lu bytes)",
                                     (unsigned long)c->vocab_out * 4u));
    /* KV cache: required, BULK asked. V is kept as the exact int16 dots of its
     * qkv rows plus the position's activation scale when those rows are one
     * scale group: attention recomputes each value with the kernel's own two
     * roundings, so the floats (and every result) are the same bits at half
     * the PSRAM traffic. A position whose dots do not fit int16 keeps its V
     * row as floats instead (value_wide). */
    {
        const llm_q4 *qkv0;
        llm_q4 view;
        llm_image_q4_view(&info, LLM_SEC_LAYER0 + LLM_LSEC_QKV, &view);
        qkv0 = &view;
        e->v_dots = qkv0->n_groups == 1u;
        /* in 64 bits: size_t is 32 bits on the board, and a valid-looking
         * config could wrap it to a tiny allocation */
        const uint64_t cells = (uint64_t)L * S * D;
        const uint64_t rng_bytes = ((uint64_t)(S + 1u) * sizeof(llm_rng) + 63u) & ~(uint64_t)63u;
        const uint64_t kv64 = cells * sizeof(float) * 2u + (e->v_dots ? cells * 2u : 0u) +
                              (uint64_t)L * S * sizeof(float) + 3u * 64u + rng_bytes;
        if (kv64 > (uint64_t)SIZE_MAX / 2u)
            return open_fail(e, llm_fail(err, LLM_E_NOMEM, "the KV cache (%llu bytes) exceeds "
                                         "this machine's address space",
                                         (unsigned long long)kv64));
        uint8_t *kv = place64(e, "kv_cache", (size_t)kv64, LLM_REGION_BULK, &e->kv_region);
        if (kv == NULL)
            return open_fail(e, llm_fail(err, LLM_E_NOMEM, "no memory for the KV cache (%lu bytes)",
                                         (unsigned long)kv64));
        memset(kv, 0, (size_t)kv64);
        /* each array starts on a cache line (row sizes are multiples of 64 at
         * the release shape; every size is a multiple of 16 anyway) */
        size_t at = 0;
        e->s.key_cache = (float *)(void *)(kv + at);
        at += (size_t)((cells * 4u + 63u) & ~(uint64_t)63u);
        e->s.value_cache = (float *)(void *)(kv + at);
        at += (size_t)((cells * 4u + 63u) & ~(uint64_t)63u);
        e->s.value_scale = (float *)(void *)(kv + at);
        at += ((size_t)L * S * 4u + 63u) & ~(size_t)63u;
        e->s.rng_at = (llm_rng *)(void *)(kv + at);
        at += (size_t)rng_bytes;
        e->s.value_dots = e->v_dots ? (int16_t *)(void *)(kv + at) : NULL;
    }

    /* optional staging last, so required buffers get memory first and
     * weights that find none are read in place instead */
    /* norms: small, read every token: one FAST block */
    {
        size_t n_norm = (size_t)P + (size_t)L * 3u * D + D;
        float *norms = place(e, "norms", n_norm * sizeof(float), LLM_REGION_FAST,
                             &e->w.norms_region);
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
        NORM(e->w.ple_proj_norm, LLM_SEC_PLE_PROJ_NORM, P)
        for (uint32_t l = 0; l < L; l++) {
            uint32_t s0 = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l;
            NORM(e->w.layers[l].attn_norm, s0 + LLM_LSEC_ATTN_NORM, D)
            NORM(e->w.layers[l].ffn_norm, s0 + LLM_LSEC_FFN_NORM, D)
            NORM(e->w.layers[l].ple_norm, s0 + LLM_LSEC_PLE_NORM, D)
        }
        NORM(e->w.out_norm, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L, D)
#undef NORM
        if (norms == NULL) {
            e->w.norms_region = LLM_REGION_FLASH;
            record(e, "norms", LLM_REGION_FLASH, n_norm * sizeof(float), NULL);
        }
    }

    /* core matrices: FAST, else BULK, else in place */
    {
        llm_q4 src;
        llm_image_q4_view(&info, LLM_SEC_PLE_MODEL_PROJ, &src);
        stage_mat(e, section_name(e, LLM_SEC_PLE_MODEL_PROJ), &src, &e->w.ple_model_proj,
                  LLM_REGION_FAST);
        for (uint32_t l = 0; l < L; l++) {
            uint32_t s0 = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l;
            llm_layer_weights *ly = &e->w.layers[l];
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
                stage_mat(e, section_name(e, s0 + mats[k].k), &src, mats[k].m, LLM_REGION_FAST);
            }
        }
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
    e->have_head = 0;
    e->have_logits = 0;
    memset(&e->stats, 0, sizeof e->stats);
    llm_rng_seed(&e->rng, e->sampler.seed);
    e->s.rng_at[0] = e->rng;
}

llm_status llm_rewind(llm_engine *e, uint32_t pos, llm_error *err) {
    if (e == NULL) return llm_fail(err, LLM_E_ARG, "llm_rewind: NULL engine");
    if (pos > e->pos)
        return llm_fail(err, LLM_E_ARG, "cannot rewind to position %lu: the context holds %lu",
                        (unsigned long)pos, (unsigned long)e->pos);
    /* the cache is append-only: rows >= pos are simply written again later;
     * the stream goes back to where it stood once pos was decoded */
    e->pos = pos;
    e->rng = e->s.rng_at[pos];
    e->have_head = 0;
    e->have_logits = 0;
    return ok(err);
}

const llm_config *llm_get_config(const llm_engine *e) { return e ? &e->cfg : NULL; }
uint32_t llm_pos(const llm_engine *e) { return e ? e->pos : 0; }

void llm_set_plain(llm_engine *e, int plain) {
    if (e) e->plain = plain != 0;
}

int llm_plain(const llm_engine *e) { return e ? e->plain : 0; }

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
    e->s.rng_at[e->pos] = e->rng;
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

/* The core split plain mode turns off. */
static llm_splitter splitter(const llm_engine *e) {
    llm_splitter sp = {NULL, NULL};
    if (!e->plain && e->port.parallel_rows != NULL) {
        sp.split = e->port.parallel_rows;
        sp.ctx = e->port.ctx;
    }
    return sp;
}

static void rmsnorm(llm_engine *e, float *out, const float *x, const float *w, uint32_t n) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + 1e-6f);
    for (uint32_t i = 0; i < n; i++) out[i] = (w[i] * x[i]) * inv;
    e->stats.bytes[e->w.norms_region] += (uint64_t)n * sizeof(float);
}

/* out[i] = silu(a[i]) * b[i] with silu(v) = v / (1 + expf(-v)), and
 * out[i] = gelu(a[i]) * b[i] with gelu(v) = (0.5 v)(1 + erff(v * 0.70710678)):
 * four elements at a time through llm_expf4 / llm_erff4 (the same bits as one
 * at a time; independent chains let the S3's FPU overlap its latencies). */
static void silu_mul(float *out, const float *a, const float *b, uint32_t n, int one_at_a_time) {
    uint32_t i = 0;
    for (; !one_at_a_time && i + 4u <= n; i += 4u) {
        float e[4] = {-a[i], -a[i + 1u], -a[i + 2u], -a[i + 3u]};
        llm_expf4(e, e);
#pragma GCC unroll 4
        for (uint32_t k = 0; k < 4u; k++) out[i + k] = (a[i + k] / (1.0f + e[k])) * b[i + k];
    }
    for (; i < n; i++) out[i] = (a[i] / (1.0f + llm_expf(-a[i]))) * b[i];
}

static void gelu_mul(float *out, const float *a, const float *b, uint32_t n, int one_at_a_time) {
    uint32_t i = 0;
    for (; !one_at_a_time && i + 4u <= n; i += 4u) {
        float r[4];
        for (uint32_t k = 0; k < 4u; k++) r[k] = a[i + k] * 0.70710678f;
        llm_erff4(r, r);
#pragma GCC unroll 4
        for (uint32_t k = 0; k < 4u; k++) out[i + k] = ((0.5f * a[i + k]) * (1.0f + r[k])) * b[i + k];
    }
    for (; i < n; i++) out[i] = ((0.5f * a[i]) * (1.0f + llm_erff(a[i] * 0.70710678f))) * b[i];
}

/* Quantize x[0..n) as the input of the matvecs that follow. */
static void quantize(llm_act *a, const float *x, uint32_t n) {
    llm_quantize_act(x, n, (n + 31u) / 32u * 32u, a->q, &a->scale);
}

/* y = m . in, on the calling core: a core matrix is too small to pay for a
 * hand-off (the cost model, tools/mpllm/costmodel.py, weighs it). */
static void matvec(llm_engine *e, const llm_mat *m, const llm_act *in, float *y) {
    llm_matvec_q4(&m->w, in->q, in->scale, y, 0, m->w.rows);
    e->stats.bytes[m->region] += (uint64_t)m->w.rows * m->w.row_bytes +
                                 (uint64_t)m->w.rows * m->w.n_groups * sizeof(float);
}

/* The qkv matvec when V is cached as dots: q and k rows as usual; the V rows
 * through the same kernel with every scale 1 and xscale 1, which makes it
 * return (0 + (float)g * 1) * 1 = (float)g, the exact integer dot (|g| <
 * 2^24). Same bytes read as one full call. */
static void matvec_qk_vdots(llm_engine *e, const llm_mat *m, const llm_act *in, float *y) {
    const uint32_t D = e->cfg.dim;
    llm_matvec_q4(&m->w, in->q, in->scale, y, 0, 2u * D);
    llm_q4 v = m->w;
    v.codes += (size_t)2u * D * v.row_bytes;
    v.scales = e->s.ones;
    v.rows = D;
    llm_matvec_q4(&v, in->q, 1.0f, y + 2u * D, 0, D);
    e->stats.bytes[m->region] += (uint64_t)m->w.rows * m->w.row_bytes +
                                 (uint64_t)m->w.rows * m->w.n_groups * sizeof(float);
}

/* Embedding row: kernel layout, 32-column blocks of nibbles. */
static void embed_row(llm_engine *e, uint32_t token, float *out) {
    const llm_q4 *w = &e->w.embed;
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
    const llm_rows *t = &e->w.ple_rows;
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

/* This position's RoPE row: cos[head_dim/2] then sin[head_dim/2]. */
static const float *rope_row(llm_engine *e, uint32_t pos) {
    e->stats.bytes[LLM_REGION_FLASH] += (uint64_t)e->cfg.head_dim * sizeof(float);
    return e->w.rope + (size_t)pos * e->cfg.head_dim;
}

/* Attention of heads [h0, h1) at one layer and position. Positions are the
 * outer loop, so each K and V row (all heads of a position, contiguous) is
 * fetched from PSRAM once per layer, cache line by cache line; per head, every
 * float sum still runs in ascending t exactly as the numerics contract says:
 * scores dot(q,k) summed in i order then scaled, the max, w = expf(s - max),
 * denom += w and ao += w*v in ascending t, then ao /= denom. */
typedef struct attn_job {
    llm_engine *e;
    uint32_t layer, pos;
    const float *v_scale; /* [dim] the layer's V row scales (qkv rows 2*dim..) */
} attn_job;

static void attention_heads(void *arg, uint32_t h0, uint32_t h1) {
    const attn_job *j = arg;
    llm_engine *e = j->e;
    llm_run_state *s = &e->s;
    const uint32_t D = e->cfg.dim, Dh = e->cfg.head_dim, S = e->cfg.seq_len, pos = j->pos;
    const float *kc = s->key_cache + (size_t)j->layer * S * D;
    const float *vc = s->value_cache + (size_t)j->layer * S * D;
    for (uint32_t h = h0; h < h1; h++) s->att_max[h] = -1e30f;
    for (uint32_t t = 0; t <= pos; t++) {
        const float *krow = kc + (size_t)t * D;
        for (uint32_t h = h0; h < h1; h++) {
            const float *q = s->qkv + h * Dh, *k = krow + h * Dh;
            float sc = 0.0f;
            for (uint32_t i = 0; i < Dh; i++) sc += q[i] * k[i];
            sc *= e->inv_sqrt_head_dim;
            s->scores[(size_t)h * S + t] = sc;
            if (sc > s->att_max[h]) s->att_max[h] = sc;
        }
    }
    /* the weights w = expf(s - max), written over the scores: independent, so
     * four at a time; the sums below still run in ascending t */
    for (uint32_t h = h0; h < h1; h++) {
        float *w = s->scores + (size_t)h * S;
        const float m = s->att_max[h];
        uint32_t t = 0;
        for (; !e->plain && t + 4u <= pos + 1u; t += 4u) {
            float d[4] = {w[t] - m, w[t + 1u] - m, w[t + 2u] - m, w[t + 3u] - m};
            llm_expf4(d, w + t);
        }
        for (; t <= pos; t++) w[t] = llm_expf(w[t] - m);
        for (uint32_t i = 0; i < Dh; i++) s->att[h * Dh + i] = 0.0f;
        s->att_den[h] = 0.0f;
    }
    const size_t row0 = (size_t)j->layer * S;
    for (uint32_t t = 0; t <= pos; t++) {
        if (s->value_dots == NULL || s->value_wide[row0 + t]) {
            const float *vrow = vc + (size_t)t * D;
            for (uint32_t h = h0; h < h1; h++) {
                float w = s->scores[(size_t)h * S + t];
                s->att_den[h] += w;
                const float *v = vrow + h * Dh;
                float *ao = s->att + h * Dh;
                for (uint32_t i = 0; i < Dh; i++) ao[i] += w * v[i];
            }
            continue;
        }
        /* v = (0 + (float)g * scale) * xscale: the kernel's own operations
         * (kernels.h contract, one group), so the same float bits */
        const int16_t *g = s->value_dots + (row0 + t) * D;
        const float xs = s->value_scale[row0 + t];
        for (uint32_t h = h0; h < h1; h++) {
            float w = s->scores[(size_t)h * S + t];
            s->att_den[h] += w;
            const int16_t *gh = g + h * Dh;
            const float *sc = j->v_scale + h * Dh;
            float *ao = s->att + h * Dh;
            for (uint32_t i = 0; i < Dh; i++) {
                float acc = 0.0f;
                acc += (float)gh[i] * sc[i];
                ao[i] += w * (acc * xs);
            }
        }
    }
    for (uint32_t h = h0; h < h1; h++)
        for (uint32_t i = 0; i < Dh; i++) s->att[h * Dh + i] /= s->att_den[h];
}

/* Store this position's k, v, then attend, split across cores by heads.
 * With V as dots, qkv[2D..3D) holds the exact integer dots (matvec_qk_vdots)
 * and `vs` the layer's V row scales; v_scale is the qkv input's scale. */
static void attention(llm_engine *e, uint32_t l, uint32_t pos, const float *vs, float v_scale) {
    const uint32_t D = e->cfg.dim, S = e->cfg.seq_len;
    llm_run_state *s = &e->s;
    const size_t row = (size_t)l * S + pos;
    uint64_t v_bytes = (uint64_t)D * sizeof(float);
    memcpy(s->key_cache + row * D, s->qkv + D, D * sizeof(float));
    if (s->value_dots != NULL && !e->plain) {
        const float *g = s->qkv + 2u * D;
        int fits = 1;
        for (uint32_t i = 0; i < D; i++) fits &= g[i] >= -32767.0f && g[i] <= 32767.0f;
        s->value_wide[row] = (uint8_t)!fits;
        if (fits) {
            for (uint32_t i = 0; i < D; i++) s->value_dots[row * D + i] = (int16_t)g[i];
            s->value_scale[row] = v_scale;
            v_bytes = (uint64_t)D * 2u + sizeof(float);
        } else {
            /* too wide for int16: the floats the kernel would have given */
            for (uint32_t i = 0; i < D; i++) {
                float acc = 0.0f;
                acc += g[i] * vs[i];
                s->value_cache[row * D + i] = acc * v_scale;
            }
            e->stats.v_wide++;
        }
    } else {
        /* plain mode (or rows of several scale groups): V as the kernel's floats */
        memcpy(s->value_cache + row * D, s->qkv + 2u * D, D * sizeof(float));
        if (s->value_dots != NULL) s->value_wide[row] = 1;
    }
    attn_job job = {e, l, pos, vs};
    llm_splitter sp = splitter(e);
    if (sp.split != NULL && e->cfg.n_heads > 1u) {
        sp.split(sp.ctx, attention_heads, &job, e->cfg.n_heads);
        e->stats.handoffs++;
    } else {
        attention_heads(&job, 0, e->cfg.n_heads);
    }
    /* this position's k and v written, every position's read once: K rows as
     * floats, V rows as dots + scale, or floats where wide */
    uint64_t read = (uint64_t)(pos + 1u) * D * sizeof(float);
    for (uint32_t t = 0; t <= pos; t++)
        read += s->value_dots != NULL && !s->value_wide[(size_t)l * S + t]
                    ? (uint64_t)D * 2u + sizeof(float)
                    : (uint64_t)D * sizeof(float);
    e->stats.bytes[e->kv_region] += (uint64_t)D * sizeof(float) + v_bytes + read;
}

/* One token through the layers at e->pos; with run_head, the final norm and
 * the head's quantized input (the head itself runs in select_next). */
static void forward(llm_engine *e, uint32_t token, int run_head) {
    const llm_config *c = &e->cfg;
    const uint32_t D = c->dim, L = c->n_layers, P = c->ple_dim, F = c->ffn;
    const uint32_t Dh = c->head_dim, half = Dh / 2u, pos = e->pos;
    llm_run_state *s = &e->s;
    float *x = s->x;
    uint64_t t = now(e);

    /* embedding, PLE input and this position's RoPE row */
    embed_row(e, token, x);
    quantize(&s->act, x, D);
    matvec(e, &e->w.ple_model_proj, &s->act, s->ple);
    for (uint32_t i = 0; i < L * P; i++) s->ple[i] *= e->inv_sqrt_dim;
    for (uint32_t l = 0; l < L; l++)
        rmsnorm(e, s->ple + l * P, s->ple + l * P, e->w.ple_proj_norm, P);
    ple_row(e, token, s->trow);
    for (uint32_t i = 0; i < L * P; i++)
        s->ple[i] = (s->ple[i] + s->trow[i] * e->sqrt_ple_dim) * 0.70710678f;
    const float *rope_cos = rope_row(e, pos);
    const float *rope_sin = rope_cos + half;
    lap(e, LLM_STAGE_EMBED, &t);

    for (uint32_t l = 0; l < L; l++) {
        const llm_layer_weights *ly = &e->w.layers[l];

        /* attention */
        rmsnorm(e, s->xb, x, ly->attn_norm, D);
        quantize(&s->act, s->xb, D);
        if (s->value_dots != NULL && !e->plain)
            matvec_qk_vdots(e, &ly->qkv, &s->act, s->qkv);
        else
            matvec(e, &ly->qkv, &s->act, s->qkv);
        for (uint32_t h = 0; h < 2u * c->n_heads; h++) { /* q heads then k heads */
            float *v = s->qkv + h * Dh;
            for (uint32_t i = 0; i < half; i++) {
                float co = rope_cos[i], si = rope_sin[i];
                float a = v[i], b = v[i + half];
                v[i] = a * co - b * si;
                v[i + half] = b * co + a * si;
            }
        }
        attention(e, l, pos, ly->qkv.w.scales + 2u * D, s->act.scale);
        quantize(&s->act, s->att, D);
        matvec(e, &ly->attn_proj, &s->act, s->xb2);
        for (uint32_t i = 0; i < D; i++) x[i] += s->xb2[i];
        lap(e, LLM_STAGE_ATTN, &t);

        /* SwiGLU FFN */
        rmsnorm(e, s->xb, x, ly->ffn_norm, D);
        quantize(&s->act, s->xb, D);
        matvec(e, &ly->gate, &s->act, s->hb);
        matvec(e, &ly->up, &s->act, s->hb2);
        silu_mul(s->hb, s->hb, s->hb2, F, e->plain);
        quantize(&s->act, s->hb, F);
        matvec(e, &ly->down, &s->act, s->xb2);
        for (uint32_t i = 0; i < D; i++) x[i] += s->xb2[i];
        lap(e, LLM_STAGE_FFN, &t);

        /* PLE branch, on the raw residual */
        quantize(&s->act, x, D);
        matvec(e, &ly->ple_gate, &s->act, s->hb);
        gelu_mul(s->hb, s->hb, s->ple + l * P, P, e->plain);
        quantize(&s->act, s->hb, P);
        matvec(e, &ly->ple_proj, &s->act, s->xb2);
        rmsnorm(e, s->xb2, s->xb2, ly->ple_norm, D);
        for (uint32_t i = 0; i < D; i++) x[i] += s->xb2[i];
        lap(e, LLM_STAGE_PLE, &t);
    }
    e->stats.tokens++;

    if (run_head) {
        rmsnorm(e, x, x, e->w.out_norm, D);
        quantize(&s->head_in, x, D);
        e->have_head = 1;
        e->have_logits = 0;
        lap(e, LLM_STAGE_HEAD, &t);
    }
}

static void charge_head(llm_engine *e, const llm_head_work *work, int dense) {
    const llm_head *h = &e->w.head;
    e->stats.heads++;
    e->stats.head_rows += work->rows;
    e->stats.head_tiles += work->tiles;
    e->stats.head_waves += work->waves;
    e->stats.handoffs += work->handoffs;
    e->stats.bytes[h->rows_region] += (uint64_t)work->rows *
                                      (h->w.row_bytes + (uint64_t)h->w.n_groups * sizeof(float));
    if (h->ids != NULL) e->stats.bytes[h->ids_region] += (uint64_t)work->rows * 2u;
    if (!dense)
        e->stats.bytes[h->boxes_region] += (uint64_t)h->n_tiles * (2u * h->cols_padded +
                                                                   sizeof(float));
    else /* the logits buffer, written by the head and read by the sampler */
        e->stats.bytes[e->logits_region] += (uint64_t)e->cfg.vocab_out * 2u * sizeof(float);
}

/* The head and the sampler for the evaluation forward() prepared. The
 * certified route when plain mode is off and its preconditions hold (head.c),
 * else the dense route; both choose the same token (head.c's proof). The
 * sampler only fails on NaN logits (a broken model): the token that produced
 * them has been consumed, so the position has moved on. */
static llm_status select_next(llm_engine *e, int32_t *next, llm_error *err) {
    const llm_head *h = &e->w.head;
    llm_run_state *s = &e->s;
    const uint32_t V = e->cfg.vocab_out;
    uint64_t t = now(e);
    llm_splitter sp = splitter(e);
    llm_head_work work;
    const uint32_t k = llm_sampler_candidates_needed(&e->sampler, V);
    if (!e->plain && k > 0 && llm_head_certifiable(h, s->head_in.scale)) {
        llm_candidates_init(&s->cand, k);
        llm_status st = llm_head_certify(h, &s->head, s->head_in.q, s->head_in.scale, &s->cand,
                                         &sp, &work, err);
        charge_head(e, &work, 0);
        lap(e, LLM_STAGE_HEAD, &t);
        if (st != LLM_OK) return st;
        st = llm_sample_candidates(&s->cand, &e->sampler, &e->rng, next, err);
        lap(e, LLM_STAGE_SAMPLE, &t);
        return st;
    }
    llm_head_dense(h, &s->head, s->head_in.q, s->head_in.scale, s->logits, &sp, &work);
    e->have_logits = 1;
    charge_head(e, &work, 1);
    lap(e, LLM_STAGE_HEAD, &t);
    llm_status st = llm_sample(s->logits, V, &e->sampler, &e->rng, next, err);
    lap(e, LLM_STAGE_SAMPLE, &t);
    return st;
}

const float *llm_logits(llm_engine *e) {
    if (e == NULL || !e->have_head) return NULL;
    if (!e->have_logits) {
        llm_head_work work;
        llm_head_dense(&e->w.head, &e->s.head, e->s.head_in.q, e->s.head_in.scale, e->s.logits,
                       NULL, &work);
        e->have_logits = 1;
    }
    return e->s.logits;
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
        e->s.rng_at[e->pos] = e->rng; /* positions inside a prompt: no draw yet */
    }
    llm_status st = select_next(e, next, err);
    e->s.rng_at[e->pos] = e->rng;
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
    st = select_next(e, next, err);
    e->s.rng_at[e->pos] = e->rng;
    return st == LLM_OK ? ok(err) : st;
}
