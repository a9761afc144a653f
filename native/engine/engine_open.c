/*
 * Opening an image: validate it, place every section and buffer through the
 * port (what goes to internal SRAM, PSRAM or stays in flash), stage the head
 * in its certificate's order, and close. Also the engine's names for
 * statuses, regions and stages, and build_info. The forward pass is
 * engine.c.
 *
 * Memory: everything the engine owns comes from the port (the engine struct
 * included), all of it here, in llm_open. The forward pass allocates nothing.
 */
#include <math.h>
#include <string.h>

#include "align_up.h"
#include "engine_state.h"
#include "f32_bits.h"
#include "llm_error.h"
#include "llm_names.h"

/* ---- status ------------------------------------------------------------ */

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
    case LLM_E_INTERRUPTED: return "interrupted";
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

/* placement= is the order each block asks for regions in (a region with no
 * room passes it on; flash is read in place), not where an image's blocks
 * went: Model.memory() / llm_placement_at say that. */
const char *llm_build_info(void) {
    return "mpllm " LLM_VERSION " kernels=" LLM_KERNELS_BUILT
           " numerics=exact modes=exact,plain,fast(lossy) head=certified placement=embed+ple_rows:flash,"
           "core+tiles+norms:fast>bulk>flash,head:bulk>flash,kv+logits:bulk,act:fast>bulk"
           " port=" LLM_PORT_NAME;
}

/* ---- placement --------------------------------------------------------- */

static const char *const region_names[LLM_REGION_COUNT] = {"flash", "fast", "bulk"};

const char *llm_region_name(llm_region r) {
    return (unsigned)r < LLM_REGION_COUNT ? region_names[r] : "unknown";
}

const char *llm_stage_name(llm_stage s) {
    static const char *const names[LLM_STAGE_COUNT] = {"embed", "attn", "ffn",
                                                       "ple",   "head", "sample"};
    return (unsigned)s < LLM_STAGE_COUNT ? names[s] : "unknown";
}

static void record(llm_engine *e, const char *name, llm_region region, size_t bytes, void *owned) {
    /* cap_placements is sized at open for every entry open can make */
    if (e->n_placements >= e->cap_placements) return;
    e->placements[e->n_placements].name = name;
    e->placements[e->n_placements].region = region;
    e->placements[e->n_placements].bytes = (uint32_t)bytes;
    e->owned[e->n_placements] = owned;
    e->n_placements++;
}

/* A position's float buffers (llm_col in engine_state.h) in the order they
 * sit in its block, each with its length in floats: the one list the layout
 * and col_init follow. A length may use col_layout_init's D, LP, widest and c. */
#define COL_FLOATS(X)                          \
    X(x, D)                                    \
    X(xb, D)                                   \
    X(xb2, D)                                  \
    X(qkv, D + 2u * (size_t)c->kv_dim)         \
    X(att, D)                                  \
    X(hb, widest)                              \
    X(hb2, widest)                             \
    X(ple, LP)                                 \
    X(trow, LP)                                \
    X(scores, (size_t)c->n_heads * c->seq_len) \
    X(att_max, c->n_heads)                     \
    X(att_den, c->n_heads)

/* Where one position's buffers sit in its block: the floats of COL_FLOATS
 * first, then its matvec input's int8 forms (q, and q8 with its scales when
 * a matrix reads them), then the head input's (q, q8 with scales, its own
 * copy of x: col_needs). */
typedef struct col_layout {
#define COL_OFFSET_FIELD(name, len) size_t name; /* in floats */
    COL_FLOATS(COL_OFFSET_FIELD)
#undef COL_OFFSET_FIELD
    size_t n_floats, act_bytes, act_q8, act_scales, head_bytes, head_q8, head_scales,
        head_floats, bytes;
} col_layout;

/* What the image's formats ask of the column buffers: int8-in-groups inputs
 * when a core matrix is KIND_Q8, the head's when the head is; the head
 * input's own float copy when the head is KIND_F32M (an int4 or int8 head
 * input is quantized at once, so its floats are not read again). An
 * all-int4 image gets exactly the buffers it always had. */
typedef struct col_needs {
    int core_q8, head_q8, head_floats;
} col_needs;

static void col_layout_init(col_layout *k, const llm_config *c, uint32_t head_cols_padded,
                            const col_needs *need) {
    const size_t D = c->dim, LP = (size_t)c->n_layers * c->ple_dim;
    size_t widest = D > c->ffn ? D : c->ffn;
    if (c->ple_dim > widest) widest = c->ple_dim;
    size_t nf = 0;
#define COL_PLACE(name, len) k->name = nf; nf += llm_align_up(len, 16u);
    COL_FLOATS(COL_PLACE)
#undef COL_PLACE
    k->n_floats = nf;
    k->act_bytes = llm_align_up(widest, LLM_IMAGE_BLOCK_COLS); /* 32 columns: 16-aligned too */
    k->head_bytes = llm_align_up(head_cols_padded, 16u);
    /* one Q8 scale per 32 columns at most */
    k->act_q8 = need->core_q8 ? k->act_bytes : 0u;
    k->act_scales = need->core_q8 ? llm_align_up(k->act_bytes / 32u * sizeof(float), 16u) : 0u;
    k->head_q8 = need->head_q8 ? k->head_bytes : 0u;
    k->head_scales = need->head_q8 ? llm_align_up(k->head_bytes / 32u * sizeof(float), 16u) : 0u;
    k->head_floats = need->head_floats ? llm_align_up(D * sizeof(float), 16u) : 0u;
    k->bytes = nf * sizeof(float) + k->act_bytes + k->act_q8 + k->act_scales + k->head_bytes +
               k->head_q8 + k->head_scales + k->head_floats;
}

/* One matvec input's buffers at b, in this order: its int8 codes (q_bytes),
 * their Q8 copy and its scales (NULL where their bytes are 0). Returns the
 * end. */
static uint8_t *input_init(int8_t **q, llm_src *src, uint8_t *b, size_t q_bytes, size_t q8_bytes,
                           size_t scale_bytes) {
    *q = (int8_t *)(void *)b;
    b += q_bytes;
    src->q8 = q8_bytes ? (int8_t *)(void *)b : NULL;
    b += q8_bytes;
    src->q8_scale = scale_bytes ? (float *)(void *)b : NULL;
    return b + scale_bytes;
}

/* Position k's buffers at base: s->col[k] and s->src[k]. */
static void col_init(llm_run_state *s, uint32_t c, uint8_t *base, const col_layout *k) {
    llm_col *col = &s->col[c];
    llm_src *act = &s->src[c][0], *head = &s->src[c][1];
    float *f = (float *)(void *)base;
#define COL_POINT(name, len) col->name = f + k->name;
    COL_FLOATS(COL_POINT)
#undef COL_POINT
    uint8_t *b = (uint8_t *)(void *)(f + k->n_floats);
    b = input_init(&col->act.q, act, b, k->act_bytes, k->act_q8, k->act_scales);
    act->own = NULL;
    b = input_init(&col->head_in.q, head, b, k->head_bytes, k->head_q8, k->head_scales);
    head->own = k->head_floats ? (float *)(void *)b : NULL;
}

/* The col_needs of the image's layer matrices and of the staged head; sets
 * e->core_q4 (a PLE image is int4 throughout). */
static col_needs col_needs_of(llm_engine *e) {
    col_needs n = {0, e->w.head.w.kind == LLM_IMAGE_KIND_Q8,
                   e->w.head.w.kind == LLM_IMAGE_KIND_F32M};
    static const uint32_t mats[] = {LLM_LSEC_QKV, LLM_LSEC_ATTN_PROJ, LLM_LSEC_GATE,
                                    LLM_LSEC_UP, LLM_LSEC_DOWN};
    e->core_q4 = e->cfg.ple_dim != 0;
    for (uint32_t l = 0; l < e->cfg.n_layers; l++)
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            llm_wmat w;
            llm_image_matrix_view(&e->image, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l + mats[i], &w);
            n.core_q8 |= w.kind == LLM_IMAGE_KIND_Q8;
            e->core_q4 |= w.kind == LLM_IMAGE_KIND_Q4;
        }
    return n;
}

/* What a dry run's place() returns: not NULL (placed), 64-byte aligned, and
 * never memory: a write through it faults instead of corrupting. */
#define LLM_DRY_BLOCK ((void *)(uintptr_t)64u)

/* The port's rule (llm_memory) on the bytes left: the region `bytes` asked
 * in `wanted` takes, charged to *m, or LLM_REGION_FLASH if none has room. */
static llm_region memory_take(llm_memory *m, size_t bytes, llm_region wanted) {
    const uint64_t cost =
        m->block_overhead ? llm_align_up((uint64_t)bytes, 16u) + m->block_overhead : bytes;
    llm_region r = wanted == LLM_REGION_BULK && m->bulk_is_fast ? LLM_REGION_FAST : wanted;
    if (cost > m->free[r]) {
        if (r != LLM_REGION_FAST || m->bulk_is_fast || cost > m->free[LLM_REGION_BULK])
            return LLM_REGION_FLASH;
        r = LLM_REGION_BULK;
    }
    if (m->free[r] != LLM_MEMORY_UNLIMITED) m->free[r] -= cost;
    return r;
}

/* The port's alloc, or in a dry run its count (LLM_DRY_BLOCK). */
static void *port_alloc(llm_engine *e, size_t bytes, llm_region wanted, llm_region *got) {
    if (!e->dry) return e->port.alloc(e->port.ctx, bytes, wanted, got);
    *got = memory_take(&e->left, bytes, wanted);
    return *got == LLM_REGION_FLASH ? NULL : LLM_DRY_BLOCK;
}

/* Ask for `wanted`; the port may answer with another region. NULL if none.
 * A dry run's blocks are recorded as not owned: llm_close frees none. */
static void *place(llm_engine *e, const char *name, size_t bytes, llm_region wanted,
                   llm_region *placed) {
    llm_region got = wanted;
    void *p = port_alloc(e, bytes, wanted, &got);
    if (p == NULL) return NULL;
    if ((uintptr_t)p % 16u != 0 || (unsigned)got >= LLM_REGION_COUNT) {
        /* a port breaking its contract would make PIE loads read wrong bytes */
        e->port.free(e->port.ctx, p);
        return NULL;
    }
    record(e, name, got, bytes, e->dry ? NULL : p);
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
    return (uint8_t *)(uintptr_t)llm_align_up((uintptr_t)p, 64u);
}

/* Stage a matrix into RAM: FAST first, then BULK, else read it in place. */
static void stage_mat(llm_engine *e, const char *name, const llm_wmat *src, llm_mat *dst,
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
        e->spilled_bytes += codes + scales;
        return;
    }
    dst->region = got;
    if (e->dry) return;
    memcpy(p, src->data, codes);
    if (scales) memcpy(p + codes, src->scales, scales);
    dst->w.data = p;
    dst->w.scales = src->scales != NULL ? (const float *)(void *)(p + codes) : NULL;
}

static const char *section_name(const llm_engine *e, uint32_t slot) {
    return llm_image_section_label(&e->image, slot);
}


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

/* The certificate of a head that has one, checked whether or not it is used
 * (so an image opens, or is refused, the same everywhere): its order a
 * permutation, else the staged copy would lose or repeat rows, and every
 * weight inside its tile's box. */
static llm_status check_certificate(llm_engine *e, const llm_wmat *src, const llm_tiles *t,
                                    llm_error *err) {
    const llm_q4 q = llm_wmat_q4(src); /* certified heads are int4 (image.c) */
    const size_t seen_bytes = (t->rows + 7u) / 8u;
    llm_region seen_region;
    /* a dry run counts it (given back at once) and checks in real memory */
    const llm_memory before = e->left;
    if (e->dry && memory_take(&e->left, seen_bytes, LLM_REGION_FAST) == LLM_REGION_FLASH)
        return llm_fail(err, LLM_E_NOMEM, "no memory to check the head order");
    e->left = before;
    uint8_t *seen = e->port.alloc(e->port.ctx, seen_bytes, LLM_REGION_FAST, &seen_region);
    if (seen == NULL) return llm_fail(err, LLM_E_NOMEM, "no memory to check the head order");
    llm_status st = llm_head_check_order(t, seen, err);
    e->port.free(e->port.ctx, seen);
    return st == LLM_OK ? llm_head_check_boxes(&q, t, err) : st;
}

/* Bytes of the head's copy in tile order: each row's codes, and its one
 * scale as the fp16 it is (2 bytes, not the image's 4). */
static size_t tile_order_bytes(const llm_wmat *src) {
    return (size_t)src->rows * (src->row_bytes + sizeof(uint16_t));
}

/* The head's rows copied to p in the certificate's order, the scales as fp16
 * bits after the codes: each is the image's f32 value exactly, which the
 * loader has checked of every int4 scale (image.c), so a scale that is not
 * an fp16 value cannot reach here; were one to, the image is refused as the
 * loader would refuse it, rather than staged with a scale changed. */
static llm_status stage_rows_in_tile_order(llm_head *h, const llm_wmat *src, const llm_tiles *t,
                                           uint8_t *p, llm_region got, llm_error *err) {
    const size_t codes = (size_t)src->rows * src->row_bytes;
    uint16_t *scales16 = (uint16_t *)(void *)(p + codes);
    for (uint32_t i = 0; i < src->rows; i++) {
        const uint32_t id = t->order[i];
        memcpy(p + (size_t)i * src->row_bytes, src->data + (size_t)id * src->row_bytes,
               src->row_bytes);
        if (!llm_f32_bits_to_f16(llm_f32_bits(src->scales[id]), &scales16[i]))
            return llm_fail(err, LLM_E_FORMAT, "head: scale of row %lu is not an fp16 value "
                            "widened to f32", (unsigned long)id);
    }
    h->w = *src;
    h->w.data = p;
    h->w.scales = NULL; /* read through scales16 (head.c staged_rows) */
    h->scales16 = scales16;
    h->rows_region = got;
    return LLM_OK;
}

/* The certificate's ids and boxes: small, read per evaluation. Ids per
 * scored row (BULK); boxes for every tile, every evaluation (FAST). Else
 * read in place. */
static void stage_tiles(llm_engine *e, const llm_tiles *t) {
    llm_head *h = &e->w.head;
    const size_t ids_bytes = llm_align_up((size_t)t->rows * 2u, 16u);
    uint16_t *ids = place(e, "head_ids", ids_bytes, LLM_REGION_BULK, &h->ids_region);
    if (ids == NULL) e->spilled_bytes += ids_bytes;
    else if (!e->dry) memcpy(ids, t->order, (size_t)t->rows * 2u);
    h->ids = ids != NULL && !e->dry ? ids : t->order;
    const size_t box_bytes = (size_t)t->n_tiles * 2u * h->cols_padded;
    const size_t sc_bytes = llm_align_up((size_t)t->n_tiles * sizeof(float), 16u);
    uint8_t *b = place(e, "head_tiles", sc_bytes + box_bytes, LLM_REGION_FAST, &h->boxes_region);
    if (b != NULL && !e->dry) {
        memcpy(b, t->scales, (size_t)t->n_tiles * sizeof(float));
        memcpy(b + sc_bytes, t->boxes, box_bytes);
        h->tile_scale = (const float *)(void *)b;
        h->boxes = (const int8_t *)(b + sc_bytes);
    } else {
        h->tile_scale = t->scales;
        h->boxes = t->boxes;
        if (b == NULL) e->spilled_bytes += sc_bytes + box_bytes;
    }
    h->tile_rows = t->tile_rows;
    h->n_tiles = t->n_tiles;
}

/* The head: staged into BULK in the certificate's row order when the image
 * has one (each staged row checked against its tile's box), else staged or
 * read in place in id order with no certificate; read in place outright when
 * `in_place` (its staged copy left the required buffers no room:
 * llm_open_with's second try). */
static llm_status stage_head(llm_engine *e, int in_place, llm_error *err) {
    const llm_config *c = &e->cfg;
    llm_head *h = &e->w.head;
    int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
    uint32_t sec = tied ? LLM_SEC_EMBED : LLM_SEC_LAYER0 + LLM_LSEC_COUNT * c->n_layers + 1u;
    const char *name = tied ? "head" : section_name(e, sec);
    llm_wmat src;
    llm_image_matrix_view(&e->image, sec, &src);
    src.rows = c->vocab_out; /* tied: the first vocab_out embedding rows */
    llm_tiles t;
    llm_image_tiles_view(&e->image, &t);
    memset(h, 0, sizeof *h);
    h->cols_padded = (uint32_t)llm_align_up(src.cols, LLM_IMAGE_BLOCK_COLS);
    h->rows_region = h->ids_region = h->boxes_region = LLM_REGION_FLASH;

    const size_t bytes = (size_t)src.rows * (src.row_bytes + src.n_groups * sizeof(float));
    /* tiles come only with an int4 head (image.c) */
    const int certified = t.n_tiles > 0 && src.n_groups == 1u && src.kind == LLM_IMAGE_KIND_Q4;
    if (certified) {
        llm_status st = check_certificate(e, &src, &t, err);
        if (st != LLM_OK) return st;
    }
    llm_region got = LLM_REGION_BULK;
    uint8_t *p = certified && !in_place
                     ? place64(e, name, tile_order_bytes(&src), LLM_REGION_BULK, &got)
                     : NULL;
    h->by_id = src; /* (tied: the embedding's first vocab_out rows) */
    if (p == NULL && in_place) {
        h->w = src;
        record(e, name, LLM_REGION_FLASH, bytes, NULL);
        e->spilled_bytes += bytes;
        return LLM_OK;
    }
    if (p == NULL) {
        /* no room for the staged copy in its tile order: the dense route on
         * the rows in id order (staged elsewhere or read in place); the
         * certificate's tables go unused, counted as read in place */
        if (certified) e->spilled_bytes += bytes;
        llm_mat m;
        stage_mat(e, name, &src, &m, LLM_REGION_BULK);
        h->w = h->by_id = m.w;
        h->rows_region = m.region;
        return LLM_OK;
    }
    if (e->dry) {
        h->w = src;
        h->rows_region = got;
    } else {
        llm_status st = stage_rows_in_tile_order(h, &src, &t, p, got, err);
        if (st != LLM_OK) return st;
    }
    stage_tiles(e, &t);
    return LLM_OK;
}

/* The options against a checked image. */
static llm_status check_context(const llm_image_info *info, const llm_open_options *options,
                                llm_error *err) {
    const uint32_t context = options != NULL ? options->context : 0u;
    if (context > info->config.seq_len)
        return llm_fail(err, LLM_E_ARG, "context %lu exceeds the image's seq_len %lu",
                        (unsigned long)context, (unsigned long)info->config.seq_len);
    return llm_engine_ok(err);
}

/* What llm_open_with checks before it allocates: the bytes, then the options
 * against them. */
static llm_status check_open(const uint8_t *image, size_t len, const llm_open_options *options,
                             llm_image_info *info, llm_error *err) {
    llm_status st = llm_image_check(image, len, info, err);
    return st != LLM_OK ? st : check_context(info, options, err);
}

llm_status llm_check_open(const uint8_t *image, size_t len, const llm_open_options *options,
                          llm_error *err) {
    llm_image_info info;
    return check_open(image, len, options, &info, err);
}

llm_status llm_check_image(const uint8_t *image, size_t len, llm_error *err) {
    return llm_check_open(image, len, NULL, err);
}

/* The engine struct, its layer table and its placement list: one FAST
 * block, the first thing placed (NULL: no memory). `dry`: the memory a dry
 * run counts against (NULL: a real open). */
static llm_engine *engine_block(const llm_image_info *info, const llm_port *port,
                                const llm_memory *dry, llm_error *err) {
    const uint32_t cap = info->n_sections + 16u;
    const size_t off_layers = llm_align_up(sizeof(llm_engine), 16u);
    const size_t off_place = off_layers + llm_align_up((size_t)info->config.n_layers *
                                                  sizeof(llm_layer_weights), 16u);
    const size_t off_owned = off_place + llm_align_up((size_t)cap * sizeof(llm_placement), 16u);
    const size_t total = off_owned + (size_t)cap * sizeof(void *);
    llm_region got = LLM_REGION_FAST;
    llm_memory left = dry != NULL ? *dry : (llm_memory){{0}, 0, 0};
    /* a dry run's engine struct is real memory (its scratch) but counted in
     * the plan where a real open's would go */
    if (dry != NULL) got = memory_take(&left, total, LLM_REGION_FAST);
    llm_region real_got = got;
    uint8_t *base = got == LLM_REGION_FLASH ? NULL
                                            : port->alloc(port->ctx, total, LLM_REGION_FAST,
                                                          dry != NULL ? &real_got : &got);
    if (base == NULL) {
        llm_fail(err, LLM_E_NOMEM, "no memory for the engine state (%lu bytes)",
                 (unsigned long)total);
        return NULL;
    }
    memset(base, 0, total);
    llm_engine *e = (llm_engine *)(void *)base;
    e->port = *port;
    e->image = *info;
    e->cfg = info->config;
    e->w.layers = (llm_layer_weights *)(void *)(base + off_layers);
    e->placements = (llm_placement *)(void *)(base + off_place);
    e->owned = (void **)(void *)(base + off_owned);
    e->cap_placements = cap;
    e->dry = dry != NULL;
    e->left = left;
    record(e, "engine", got, total, e);
    return e;
}

/* What stays where it is, in the (mapped) image: the rows read per token
 * (embedding, PLE rows when the model has PLE, RoPE) and the drafter's
 * tables. */
static void read_in_place(llm_engine *e) {
    const llm_image_info *info = &e->image;
    const llm_config *c = &e->cfg;
    e->w.rope = (const float *)(const void *)llm_image_payload(info, LLM_SEC_ROPE, NULL);
    llm_image_matrix_view(info, LLM_SEC_EMBED, &e->w.embed);
    llm_image_drafts_view(info, &e->w.drafts);
    record(e, section_name(e, LLM_SEC_ROPE), LLM_REGION_FLASH,
           (size_t)info->config.seq_len * c->head_dim * 4u, NULL);
    uint32_t sz;
    llm_image_payload(info, LLM_SEC_EMBED, &sz);
    record(e, section_name(e, LLM_SEC_EMBED), LLM_REGION_FLASH, sz, NULL);
    if (c->ple_dim == 0) return;
    llm_image_rows_view(info, LLM_SEC_PLE_ROWS, &e->w.ple_rows);
    llm_image_payload(info, LLM_SEC_PLE_ROWS, &sz);
    record(e, section_name(e, LLM_SEC_PLE_ROWS), LLM_REGION_FLASH, sz, NULL);
}

/* Activations: position 0's buffers and what every pass shares (FAST,
 * required): the KV cache's wide flags, unit scales, the head's scratch. */
static llm_status place_activations(llm_engine *e, const col_layout *lay, llm_error *err) {
    const llm_config *c = &e->cfg;
    const uint32_t D = c->dim;
    const size_t wide_flags = (size_t)c->n_layers * c->seq_len;
    llm_run_state *s = &e->s;
    const size_t shared = llm_align_up(wide_flags, 16u) +
                          llm_align_up((size_t)D * sizeof(float), 16u) +
                          llm_head_scratch_bytes(&e->w.head);
    const size_t bytes = lay->bytes + shared;
    uint8_t *a = place(e, "activations", bytes, LLM_REGION_FAST, NULL);
    if (a == NULL)
        return llm_fail(err, LLM_E_NOMEM, "no memory for activations (%lu bytes)",
                        (unsigned long)bytes);
    if (e->dry) return LLM_OK;
    memset(a, 0, bytes);
    s->n_cols = 1;
    col_init(s, 0, a, lay);
    uint8_t *sh = a + lay->bytes;
    s->kv_wide = sh;
    sh += llm_align_up(wide_flags, 16u);
    s->ones = (float *)(void *)sh;
    for (uint32_t i = 0; i < D; i++) s->ones[i] = 1.0f;
    sh += llm_align_up((size_t)D * sizeof(float), 16u);
    llm_head_scratch_init(&s->head, &e->w.head, sh);
    return LLM_OK;
}

/* Logits: only the dense route and llm_logits() write them, so BULK
 * (internal SRAM is worth more than a buffer decoding never touches). */
static llm_status place_logits(llm_engine *e, llm_error *err) {
    const size_t bytes = (size_t)e->cfg.vocab_out * sizeof(float);
    e->s.logits = place(e, "logits", bytes, LLM_REGION_BULK, &e->logits_region);
    if (e->s.logits == NULL)
        return llm_fail(err, LLM_E_NOMEM, "no memory for logits (%lu bytes)",
                        (unsigned long)bytes);
    return LLM_OK;
}

/* Whether a V row of some layer could give int16 dots a value they cannot
 * hold: |dot| <= 127 * sum |code - 8| over the row's columns (llm_quantize_act
 * clamps to [-127, 127]; padded columns meet zero activations). */
static int v_can_widen(const llm_engine *e) {
    const llm_config *c = &e->cfg;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        llm_wmat w;
        llm_image_matrix_view(&e->image, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l + LLM_LSEC_QKV, &w);
        for (uint32_t r = c->dim + c->kv_dim; r < c->dim + 2u * c->kv_dim; r++) {
            const uint8_t *row = w.data + (size_t)r * w.row_bytes;
            uint32_t sum = 0;
            for (uint32_t j = 0; j < w.cols; j++) {
                uint8_t byte = row[16u * (j / 32u) + (j % 16u)];
                int code = ((j % 32u) < 16u ? (byte & 0x0F) : (byte >> 4)) - 8;
                sum += (uint32_t)(code < 0 ? -code : code);
            }
            if (127u * (uint64_t)sum > 32767u) return 1;
        }
    }
    return 0;
}

/* One float row per position, [n_layers][seq_len][kv_dim] (64-byte
 * aligned rows). */
static uint64_t kv_rows_bytes(const llm_config *c) {
    return llm_align_up((uint64_t)c->n_layers * c->seq_len * c->kv_dim * sizeof(float), 64u);
}

/* Plain mode's V floats where the V rows hold only dots: their own BULK
 * block, placed by the first switch to plain mode. */
static llm_status place_v_floats(llm_engine *e, llm_error *err) {
    const uint64_t bytes = kv_rows_bytes(&e->cfg);
    float *v = place64(e, "kv_values", (size_t)bytes, LLM_REGION_BULK, NULL);
    if (v == NULL)
        return llm_fail(err, LLM_E_NOMEM, "no memory for plain mode's float V cache (%lu bytes)",
                        (unsigned long)bytes);
    if (!e->dry) memset(v, 0, (size_t)bytes);
    e->s.kv_v_floats = v;
    return LLM_OK;
}

llm_status llm_set_plain(llm_engine *e, int plain, llm_error *err) {
    if (e == NULL) return llm_fail(err, LLM_E_ARG, "llm_set_plain: NULL engine");
    if (plain && e->s.v_stride == e->cfg.kv_dim && e->s.kv_v_floats == NULL) {
        llm_status st = place_v_floats(e, err);
        if (st != LLM_OK) return st;
    }
    e->plain = plain != 0;
    return llm_engine_ok(err);
}

llm_status llm_set_k_dots(llm_engine *e, int on, llm_error *err) {
    if (e == NULL) return llm_fail(err, LLM_E_ARG, "llm_set_k_dots: NULL engine");
    if (on && e->s.k_rebuilt == NULL) {
        const size_t bytes = (size_t)e->cfg.n_heads * 4u * e->cfg.head_dim * sizeof(float);
        float *k = place(e, "k_rebuilt", bytes, LLM_REGION_FAST, NULL);
        if (k == NULL) k = place(e, "k_rebuilt", bytes, LLM_REGION_BULK, NULL);
        if (k == NULL)
            return llm_fail(err, LLM_E_NOMEM, "no memory for K as dots' scratch (%lu bytes)",
                            (unsigned long)bytes);
        e->s.k_rebuilt = k;
    }
    e->k_dots = on != 0;
    return llm_engine_ok(err);
}

int llm_k_dots(const llm_engine *e) { return e ? e->k_dots : 0; }

llm_status llm_set_preload(llm_engine *e, int on, llm_error *err) {
    if (e == NULL) return llm_fail(err, LLM_E_ARG, "llm_set_preload: NULL engine");
    if (on && e->port.preload == NULL)
        return llm_fail(err, LLM_E_CONFIG, "this port has no cache preload hook");
    e->preload = on != 0;
    return llm_engine_ok(err);
}

int llm_preload(const llm_engine *e) { return e ? e->preload : 0; }

/* KV cache: required, BULK asked. V is kept as the exact int16 dots of its
 * qkv rows plus the position's activation scale when those rows are one
 * scale group: attention recomputes each value with the kernel's own two
 * roundings, so the floats (and every result) are the same bits at half
 * the PSRAM traffic. K as floats after RoPE, or, with llm_set_k_dots, as
 * its dots (in the first half of its row), each k rebuilt and RoPE
 * re-applied when read (the same bits again, half the K traffic, more
 * compute). A row whose dots do not fit int16 is kept as floats instead
 * (kv_wide); a V row can only be when some V row's codes allow it
 * (v_can_widen), and only then are the V rows float-wide; otherwise plain
 * mode's float V is left to llm_set_plain. Without dots both are floats.
 * Each array starts on a cache line (row sizes are multiples of 64 at the
 * release shape); the sampler's stream states come last: fast mode lays its
 * cache over everything before them (attention_fast.c), which is made large
 * enough for it. */
static llm_status place_kv_cache(llm_engine *e, llm_error *err) {
    const llm_config *c = &e->cfg;
    const uint32_t L = c->n_layers, S = c->seq_len;
    /* the dots are int4 codes times int8 activations: every layer's qkv int4
     * and one group (Q8 and F32M matrices keep K and V as floats) */
    e->kv_dots = 1;
    for (uint32_t l = 0; l < L; l++) {
        llm_wmat qkv;
        llm_image_matrix_view(&e->image, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l + LLM_LSEC_QKV, &qkv);
        e->kv_dots &= qkv.kind == LLM_IMAGE_KIND_Q4 && qkv.n_groups == 1u;
    }
    const int v_floats = !e->kv_dots || v_can_widen(e);
    /* in 64 bits: size_t is 32 bits on the board, and a valid-looking
     * config could wrap it to a tiny allocation */
    const uint64_t k_bytes = kv_rows_bytes(c);
    const uint64_t v_bytes = v_floats ? k_bytes
                                      : llm_align_up((uint64_t)L * S * c->kv_dim * 2u, 64u);
    const uint64_t scale_bytes = llm_align_up((uint64_t)L * S * sizeof(float), 64u);
    const uint64_t rng_bytes = llm_align_up((uint64_t)(S + 1u) * sizeof(llm_rng), 64u);
    const uint64_t exact = k_bytes + v_bytes + scale_bytes;
    const uint64_t fast = llm_align_up(llm_fast_kv_need(c), 64u);
    const uint64_t kv64 = (exact > fast ? exact : fast) + rng_bytes;
    if (kv64 > (uint64_t)SIZE_MAX / 2u)
        return llm_fail(err, LLM_E_NOMEM, "the KV cache (%llu bytes) exceeds this machine's "
                        "address space", (unsigned long long)kv64);
    uint8_t *kv = place64(e, "kv_cache", (size_t)kv64, LLM_REGION_BULK, &e->kv_region);
    if (kv == NULL)
        return llm_fail(err, LLM_E_NOMEM, "no memory for the KV cache (%lu bytes)",
                        (unsigned long)kv64);
    e->s.v_stride = (v_floats ? 2u : 1u) * c->kv_dim; /* (open_placed's plain rule reads it) */
    if (e->dry) return LLM_OK;
    memset(kv, 0, (size_t)kv64);
    e->s.kv_k = (float *)(void *)kv;
    e->s.kv_v = (int16_t *)(void *)(kv + k_bytes);
    e->s.kv_scale = (float *)(void *)(kv + k_bytes + v_bytes);
    e->s.rng_at = (llm_rng *)(void *)(kv + (kv64 - rng_bytes));
    return LLM_OK;
}

/* The other positions of a pass, a verify pass's candidate lists and the
 * many-positions head scan's scratch: optional (without them prefill and
 * verify go one position per pass). */
static void place_batch(llm_engine *e, const col_layout *lay) {
    llm_run_state *s = &e->s;
    const size_t cols_bytes = (LLM_BATCH_MAX - 1u) * lay->bytes;
    const size_t cand_bytes = llm_align_up(LLM_BATCH_MAX * sizeof(llm_candidates), 16u);
    const size_t batch_bytes =
        cols_bytes + cand_bytes +
        llm_align_up(LLM_HEAD_MANY_SCRATCH(e->w.head.n_tiles, e->w.head.tile_rows), 16u);
    uint8_t *batch = place(e, "batch", batch_bytes, LLM_REGION_BULK, NULL);
    if (batch == NULL || e->dry) return;
    memset(batch, 0, batch_bytes);
    s->n_cols = LLM_BATCH_MAX;
    for (uint32_t k = 1; k < LLM_BATCH_MAX; k++)
        col_init(s, k, batch + (size_t)(k - 1u) * lay->bytes, lay);
    s->cands = (llm_candidates *)(void *)(batch + cols_bytes);
    s->many = batch + cols_bytes + cand_bytes;
}

/* Norm vector `sec` (n floats): copied to *at in the norms block, which then
 * moves on, or read in place when there is no block (*at NULL). */
static const float *stage_norm(const llm_engine *e, uint32_t sec, uint32_t n, float **at) {
    const float *src = (const float *)(const void *)llm_image_payload(&e->image, sec, NULL);
    if (*at == NULL) return src;
    float *dst = *at;
    memcpy(dst, src, (size_t)n * sizeof(float));
    *at += n;
    return dst;
}

/* The norms: small, read every token: one FAST block, else in place. Per
 * layer attn_norm, ffn_norm and, with PLE, ple_norm. */
static void stage_norms(llm_engine *e) {
    const uint32_t D = e->cfg.dim, L = e->cfg.n_layers, P = e->cfg.ple_dim;
    const size_t per_layer = P != 0 ? 3u : 2u;
    const size_t bytes = ((size_t)P + (size_t)L * per_layer * D + D) * sizeof(float);
    float *at = place(e, "norms", bytes, LLM_REGION_FAST, &e->w.norms_region);
    if (at == NULL) {
        e->w.norms_region = LLM_REGION_FLASH;
        record(e, "norms", LLM_REGION_FLASH, bytes, NULL);
        e->spilled_bytes += bytes;
    }
    if (e->dry) return;
    if (P != 0) e->w.ple_proj_norm = stage_norm(e, LLM_SEC_PLE_PROJ_NORM, P, &at);
    for (uint32_t l = 0; l < L; l++) {
        const uint32_t s0 = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l;
        llm_layer_weights *ly = &e->w.layers[l];
        ly->attn_norm = stage_norm(e, s0 + LLM_LSEC_ATTN_NORM, D, &at);
        ly->ffn_norm = stage_norm(e, s0 + LLM_LSEC_FFN_NORM, D, &at);
        if (P != 0) ly->ple_norm = stage_norm(e, s0 + LLM_LSEC_PLE_NORM, D, &at);
    }
    e->w.out_norm = stage_norm(e, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L, D, &at);
}

/* Matrix section `sec` staged (FAST, else BULK, else read in place). */
static void stage_section(llm_engine *e, uint32_t sec, llm_mat *dst) {
    llm_wmat src;
    llm_image_matrix_view(&e->image, sec, &src);
    stage_mat(e, section_name(e, sec), &src, dst, LLM_REGION_FAST);
}

/* The core matrices: the PLE projection (with PLE), then each layer's. */
static void stage_core(llm_engine *e) {
    const int ple = e->cfg.ple_dim != 0;
    if (ple) stage_section(e, LLM_SEC_PLE_MODEL_PROJ, &e->w.ple_model_proj);
    for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
        const uint32_t s0 = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l;
        llm_layer_weights *ly = &e->w.layers[l];
        stage_section(e, s0 + LLM_LSEC_QKV, &ly->qkv);
        stage_section(e, s0 + LLM_LSEC_ATTN_PROJ, &ly->attn_proj);
        stage_section(e, s0 + LLM_LSEC_GATE, &ly->gate);
        stage_section(e, s0 + LLM_LSEC_UP, &ly->up);
        stage_section(e, s0 + LLM_LSEC_DOWN, &ly->down);
        if (!ple) continue;
        stage_section(e, s0 + LLM_LSEC_PLE_GATE, &ly->ple_gate);
        stage_section(e, s0 + LLM_LSEC_PLE_PROJ, &ly->ple_proj);
    }
}

/* Placement order: the engine block, then the head first among the large
 * BULK blocks (its layout decides the scratch sizes), the required buffers
 * (activations, logits, KV cache), then what is optional: the staged norms
 * and matrices (weights that find no memory are read in place instead), and
 * last the batch. Every token reads the weights; only verify passes use the
 * batch. With PSRAM the two never compete (FAST and BULK); without it both
 * come from internal SRAM, and the batch must not take what the weights would
 * otherwise get (the emulated N8 read 76 KB of the core from flash at context
 * 64 while the batch took 75 KB of internal SRAM). `head_in_place`: the head
 * read in place from flash (llm_open_with's second try); `plain`: plain
 * mode's float V placed as a required buffer; `dry`: counted, not placed
 * (llm_plan_open); *head_staged: the head's rows took RAM (set on a failure
 * too). A dry run's engine is returned before the forward pass's state is
 * set: it holds only the placement list. */
typedef struct open_how {
    uint32_t context;
    int plain, head_in_place;
    const llm_memory *dry;
} open_how;

static llm_status open_placed(llm_engine **out, const llm_image_info *info, const llm_port *port,
                              const open_how *how, int *head_staged, llm_error *err) {
    llm_engine *e = engine_block(info, port, how->dry, err);
    if (e == NULL) return LLM_E_NOMEM;
    /* every buffer sized by seq_len is sized by the context; the RoPE table
     * (in the image) keeps the image's */
    if (how->context != 0u) e->cfg.seq_len = how->context;
    read_in_place(e);
    llm_status st = stage_head(e, how->head_in_place, err);
    col_layout lay;
    const col_needs needs = col_needs_of(e);
    col_layout_init(&lay, &e->cfg, e->w.head.cols_padded, &needs);
    if (st == LLM_OK) st = place_activations(e, &lay, err);
    if (st == LLM_OK) st = place_logits(e, err);
    if (st == LLM_OK) st = place_kv_cache(e, err);
    /* (the rule of llm_set_plain: V rows that hold only dots get their floats) */
    if (st == LLM_OK && how->plain && e->s.v_stride == e->cfg.kv_dim && e->s.kv_v_floats == NULL)
        st = place_v_floats(e, err);
    *head_staged = e->w.head.rows_region != LLM_REGION_FLASH;
    if (st != LLM_OK) return open_fail(e, st);
    stage_norms(e);
    stage_core(e);
    place_batch(e, &lay);
    *out = e;
    if (e->dry) return llm_engine_ok(err);

    e->inv_sqrt_dim = 1.0f / sqrtf((float)e->cfg.dim);
    e->sqrt_ple_dim = sqrtf((float)e->cfg.ple_dim);
    e->inv_sqrt_head_dim = 1.0f / sqrtf((float)e->cfg.head_dim);
    llm_reset(e);
    return llm_engine_ok(err);
}

/* Opened as open_placed says; where a required buffer then finds no memory
 * while the head's staged copy took some, opened again with the head read in
 * place from flash: a head read from flash costs less than a context that
 * does not open (on a board without PSRAM the head and the KV cache compete
 * for the same internal SRAM). Placement never changes a result. */
/* `checked`: the image's llm_image_check already passed (a plan's), or NULL.
 * A dry run's info goes back through *checked_out. */
static llm_status open_or_plan(llm_engine **out, const uint8_t *image, size_t len,
                               const llm_port *port, const llm_open_options *options,
                               const llm_memory *dry, const llm_image_info *checked,
                               llm_image_info *checked_out, llm_error *err) {
    if (out == NULL) return llm_fail(err, LLM_E_ARG, "llm_open: out is NULL");
    *out = NULL;
    if (port == NULL || port->alloc == NULL || port->free == NULL || port->now_us == NULL)
        return llm_fail(err, LLM_E_ARG, "llm_open: port needs alloc, free and now_us");
    llm_image_info info;
    llm_status st = checked != NULL ? check_context(checked, options, err)
                                    : check_open(image, len, options, &info, err);
    if (st != LLM_OK) return st;
    if (checked != NULL) info = *checked;
    if (checked_out != NULL) *checked_out = info;
    open_how how = {options != NULL ? options->context : 0u,
                    options != NULL && options->plain != 0, 0, dry};
    int head_staged = 0;
    st = open_placed(out, &info, port, &how, &head_staged, err);
    if (st != LLM_E_NOMEM || !head_staged) return st;
    how.head_in_place = 1;
    return open_placed(out, &info, port, &how, &head_staged, err);
}

llm_status llm_open_with(llm_engine **out, const uint8_t *image, size_t len,
                         const llm_port *port, const llm_open_options *options,
                         llm_error *err) {
    return open_or_plan(out, image, len, port, options, NULL, NULL, NULL, err);
}

/* llm_open_with's own steps run dry (open_placed's `dry`): the plan is what
 * the open would place because it is the open, minus the bytes. */
llm_status llm_plan_open(llm_plan *out, const uint8_t *image, size_t len, const llm_port *port,
                         const llm_memory *memory, const llm_open_options *options,
                         llm_error *err) {
    if (out == NULL || memory == NULL || (out->blocks == NULL && out->cap != 0))
        return llm_fail(err, LLM_E_ARG, "llm_plan_open: out, its blocks and memory are needed");
    const struct llm_checked was = out->checked;
    const int reuse = was.data != NULL && was.data == image && was.len == len;
    if (was.data != NULL && !reuse)
        return llm_fail(err, LLM_E_ARG, "llm_plan_open: out->checked is another image's");
    const llm_image_info known = {was.data, was.len, was.config, was.n_sections};
    llm_image_info info = known;
    out->n = 0;
    out->spilled = 0;
    out->seq_len = out->image_seq_len = 0;
    llm_engine *e = NULL;
    const llm_status st = open_or_plan(&e, image, len, port, options, memory,
                                       reuse ? &known : NULL, &info, err);
    if (info.data != NULL) {
        out->checked = (struct llm_checked){info.data, info.len, info.config, info.n_sections};
        out->image_seq_len = info.config.seq_len;
    }
    if (st != LLM_OK) return st;
    out->n = e->n_placements;
    for (uint32_t i = 0; i < e->n_placements && i < out->cap; i++)
        out->blocks[i] = e->placements[i];
    out->spilled = e->spilled_bytes;
    out->seq_len = e->cfg.seq_len;
    llm_close(e);
    return LLM_OK;
}

llm_status llm_open(llm_engine **out, const uint8_t *image, size_t len, const llm_port *port,
                    llm_error *err) {
    return llm_open_with(out, image, len, port, NULL, err);
}

void llm_get_weights(const llm_engine *e, llm_weights_info *out) {
    memset(out, 0, sizeof *out);
    if (e == NULL) return;
    const llm_config *c = &e->image.config;
    llm_wmat w;
    llm_image_matrix_view(&e->image, LLM_SEC_EMBED, &w);
    out->embed_kind = w.kind;
    out->head_kind = e->w.head.w.kind;
    static const uint32_t mats[] = {LLM_LSEC_QKV, LLM_LSEC_ATTN_PROJ, LLM_LSEC_GATE,
                                    LLM_LSEC_UP, LLM_LSEC_DOWN};
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            llm_image_matrix_view(&e->image, LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l + mats[i], &w);
            if (l == 0 && i == 0) out->layers_kind = w.kind;
            else if (out->layers_kind != w.kind) out->layers_kind = 0;
        }
    llm_image_weights choice;
    llm_image_weights_view(&e->image, &choice);
    out->chosen = choice.chosen;
    out->n_tried = choice.n_tried;
    out->positions = choice.positions;
    for (uint32_t k = 0; k < choice.n_tried && k < LLM_WEIGHTS_TRIED_MAX; k++) {
        out->tried[k].kind = choice.tried[k].kind;
        out->tried[k].agreement = choice.tried[k].agreement;
        out->tried[k].mean_abs_diff = choice.tried[k].mean_abs_diff;
        out->tried[k].bytes = choice.tried[k].bytes;
    }
}

const char *llm_weights_name(uint32_t kind) {
    switch (kind) {
    case 0: return "mixed";
    case LLM_IMAGE_KIND_Q4: return "int4";
    case LLM_IMAGE_KIND_Q8: return "int8";
    case LLM_IMAGE_KIND_F32M: return "fp32";
    default: return NULL;
    }
}

uint32_t llm_image_seq_len(const llm_engine *e) { return e ? e->image.config.seq_len : 0u; }

uint64_t llm_spilled_bytes(const llm_engine *e) { return e ? e->spilled_bytes : 0u; }
