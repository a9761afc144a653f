/*
 * The engine: one forward pass, prefill/step/rewind, the head and the
 * sampler per evaluation, stats. Opening and placement: engine_open.c; the
 * structs: engine_state.h. One file on purpose: the forward pass reads top to
 * bottom.
 *
 * Shaped like llama2.c's run.c: the weights (what the image gives, after
 * staging) and the run state (what one token writes) are separate structs
 * with a shape comment on every buffer, and there is exactly one forward pass
 * (`forward`). Kernels, placement, plain mode and the core split change which
 * code multiplies, where bytes live and which rows the head scores, never the
 * model arithmetic, whose operation order is the numerics contract of
 * tools/mpllm/reference/forward.py (mirrored there, compared bit for bit by tests).
 *
 * Memory: the forward pass allocates nothing (llm_open placed it all).
 * Byte accounting (llm_stats.bytes) lives in the helpers that read the bytes
 * (matvec, the row lookups, rmsnorm, attention, the head), not between the
 * math lines.
 */
#include <math.h>
#include <string.h>

#include "align_up.h"
#include "engine_state.h"
#include "hot.h"
#include "llm_error.h"
#include "llm_names.h"
#include "mathf.h"
#include "simd.h"

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
    /* logits() stays valid when the evaluation that proposed the token for
     * pos is one of the last pass's (its input is still in its column) */
    if (e->have_head && pos >= e->head_pos0 && pos - e->head_pos0 < e->head_n) {
        uint32_t col = e->head_col0 + (pos - e->head_pos0);
        if (col != e->head_col) e->have_logits = 0;
        e->head_col = col;
    } else {
        e->have_head = 0;
        e->have_logits = 0;
    }
    return llm_engine_ok(err);
}

const llm_config *llm_get_config(const llm_engine *e) { return e ? &e->cfg : NULL; }
uint32_t llm_pos(const llm_engine *e) { return e ? e->pos : 0; }

void llm_set_interrupt(llm_engine *e, int (*poll)(void *ctx), void *ctx) {
    if (e == NULL) return;
    e->interrupt_poll = poll;
    e->interrupt_ctx = ctx;
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

llm_status llm_set_sampler(llm_engine *e, const llm_sampler_options *opt, llm_error *err) {
    if (e == NULL || opt == NULL) return llm_fail(err, LLM_E_ARG, "llm_set_sampler: NULL argument");
    llm_status st = llm_sampler_check(opt, e->cfg.vocab_out, err);
    if (st != LLM_OK) return st;
    e->sampler = *opt;
    llm_rng_seed(&e->rng, opt->seed);
    e->s.rng_at[e->pos] = e->rng;
    return llm_engine_ok(err);
}

/* ---- the forward pass -------------------------------------------------- */

static uint64_t now(const llm_engine *e) { return e->port.now_us(e->port.ctx); }

/* Charge the time since *t to a stage and restart the clock. */
static void LLM_HOT lap(llm_engine *e, llm_stage stage, uint64_t *t) {
    uint64_t n = now(e);
    e->stats.stage_us[stage] += n - *t;
    *t = n;
}

/* The core split plain mode turns off. */
static llm_splitter LLM_HOT splitter(const llm_engine *e) {
    llm_splitter sp = {NULL, e->port.ctx, NULL};
    if (!e->plain && e->port.parallel_rows != NULL) sp.split = e->port.parallel_rows;
    if (!e->plain && e->preload) sp.preload = e->port.preload;
    return sp;
}

/* ---- cache preload hints (llm_set_preload) ------------------------------- */

/* Ask the port to start staging the first LLM_PRELOAD_MAX_BYTES of
 * [addr, addr + bytes) while this core computes on what it has. A hint:
 * nothing the engine computes reads anything it changes. Memory in internal
 * SRAM has no cache in front of it and is never asked for. */
static void LLM_HOT preload(llm_engine *e, const void *addr, size_t bytes, llm_region region) {
    if (!e->preload || e->plain || bytes == 0 || region == LLM_REGION_FAST) return;
    if (bytes > LLM_PRELOAD_MAX_BYTES) bytes = LLM_PRELOAD_MAX_BYTES;
    e->port.preload(e->port.ctx, addr, bytes);
    e->stats.preloads++;
    e->stats.preload_bytes += bytes;
}

/* The matrix layer l's pass reads after `cur` (the next layer's qkv after
 * the last of a layer; NULL after the last layer's). */
static const llm_mat *LLM_HOT mat_after(const llm_engine *e, uint32_t l, const llm_mat *cur) {
    const llm_layer_weights *ly = &e->w.layers[l];
    if (cur == &ly->qkv) return &ly->attn_proj;
    if (cur == &ly->attn_proj) return &ly->gate;
    if (cur == &ly->gate) return &ly->up;
    if (cur == &ly->up) return &ly->down;
    if (cur == &ly->down && e->cfg.ple_dim != 0) return &ly->ple_gate;
    if (cur == &ly->ple_gate) return &ly->ple_proj;
    return l + 1u < e->cfg.n_layers ? &e->w.layers[l + 1u].qkv : NULL;
}

/* Before the matvec of `cur`: the start of the matrix after it. */
static void LLM_HOT preload_after(llm_engine *e, uint32_t l, const llm_mat *cur) {
    if (!e->preload) return;
    const llm_mat *next = mat_after(e, l, cur);
    if (next != NULL)
        preload(e, next->w.data, (size_t)next->w.rows * next->w.row_bytes, next->region);
}

/* Before layer l's qkv matvec: its oldest cached K and V rows, which
 * attention reads first (plain and fast mode keep other forms: no hint). */
static void LLM_HOT preload_kv(llm_engine *e, uint32_t l, uint32_t rows) {
    if (!e->preload || e->fast || rows == 0) return;
    const llm_run_state *s = &e->s;
    const size_t row0 = (size_t)l * e->cfg.seq_len;
    preload(e, s->kv_k + row0 * e->cfg.kv_dim, (size_t)rows * e->cfg.kv_dim * sizeof(float),
            e->kv_region);
    if (s->kv_v != NULL)
        preload(e, s->kv_v + row0 * s->v_stride, (size_t)rows * s->v_stride * sizeof(int16_t),
                e->kv_region);
}

static void LLM_HOT rmsnorm(llm_engine *e, float *out, const float *x, const float *w, uint32_t n) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + e->cfg.norm_eps); /* the image's epsilon */
    for (uint32_t i = 0; i < n; i++) out[i] = (w[i] * x[i]) * inv;
    e->stats.bytes[e->w.norms_region] += (uint64_t)n * sizeof(float);
}

#if LLM_SIMD
/* silu_mul on the host's vector lanes: the exps through llm_expf_n (the same
 * bits), then (a / (1 + e)) * b lane-wise, the scalar operations. Host-only,
 * out of line (not the board's code). */
static __attribute__((noinline)) void silu_mul_simd(float *out, const float *a, const float *b,
                                                    uint32_t n) {
    float e[256];
    for (uint32_t i0 = 0; i0 < n; i0 += 256u) {
        const uint32_t k = n - i0 < 256u ? n - i0 : 256u;
        for (uint32_t i = 0; i < k; i++) e[i] = -a[i0 + i];
        llm_expf_n(e, e, k);
        uint32_t i = 0;
        for (; i + 4u <= k; i += 4u)
            llm_f4_store(out + i0 + i, (llm_f4_load(a + i0 + i) / (1.0f + llm_f4_load(e + i))) *
                                           llm_f4_load(b + i0 + i));
        for (; i < k; i++) out[i0 + i] = (a[i0 + i] / (1.0f + e[i])) * b[i0 + i];
    }
}
#endif

/* out[i] = silu(a[i]) * b[i] with silu(v) = v / (1 + expf(-v)), and
 * out[i] = gelu(a[i]) * b[i] with gelu(v) = (0.5 v)(1 + erff(v * 0.70710678)):
 * four elements at a time through llm_expf4 / llm_erff4 (the same bits as one
 * at a time; independent chains let the S3's FPU overlap its latencies). */
static void LLM_HOT silu_mul(float *out, const float *a, const float *b, uint32_t n, int one_at_a_time) {
    uint32_t i = 0;
#if LLM_SIMD
    if (!one_at_a_time) {
        silu_mul_simd(out, a, b, n);
        return;
    }
#endif
    for (; !one_at_a_time && i + 4u <= n; i += 4u) {
        float e[4] = {-a[i], -a[i + 1u], -a[i + 2u], -a[i + 3u]};
        llm_expf4(e, e);
#pragma GCC unroll 4
        for (uint32_t k = 0; k < 4u; k++) out[i + k] = (a[i + k] / (1.0f + e[k])) * b[i + k];
    }
    for (; i < n; i++) out[i] = (a[i] / (1.0f + llm_expf(-a[i]))) * b[i];
}

static void LLM_HOT gelu_mul(float *out, const float *a, const float *b, uint32_t n, int one_at_a_time) {
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

/* x[0..n) becomes position c's input of the matvecs that follow: quantized
 * at once for int4 matrices (as every image before the other formats was);
 * the form int8 matrices read is made when they first ask (act_in). */
static void LLM_HOT __attribute__((noinline)) quantize(llm_engine *e, uint32_t c, const float *x,
                                                       uint32_t n) {
    llm_src *src = &e->s.src[c][0];
    src->x = x;
    src->n = n;
    src->q8_group = 0;
    if (e->core_q4) {
        llm_act *a = &e->s.col[c].act;
        llm_quantize_act(x, n, (uint32_t)llm_align_up(n, LLM_IMAGE_BLOCK_COLS), a->q, &a->scale);
    }
}

/* Position c's input `which` (0: the matvecs', 1: the head's) in the form
 * an int8 or fp32 matrix reads (kernels.h contracts). Not LLM_HOT and never
 * inlined: an int4 image never comes here, so its instruction RAM does not
 * hold it (hot.h). */
static __attribute__((noinline)) llm_vin act_in(llm_engine *e, uint32_t c, uint32_t which,
                                                const llm_wmat *w) {
    llm_src *src = &e->s.src[c][which];
    const llm_act *a = which ? &e->s.col[c].head_in : &e->s.col[c].act;
    if (w->kind == LLM_IMAGE_KIND_Q8) {
        const uint32_t group = w->group >= src->n ? src->n : w->group;
        if (src->q8_group != group) {
            llm_quantize_act_groups(src->x, src->n, group,
                                    (uint32_t)llm_align_up(src->n, LLM_IMAGE_BLOCK_COLS),
                                    src->q8, src->q8_scale);
            src->q8_group = group;
        }
    }
    llm_vin v = {src->x, a->q, a->scale, src->q8, src->q8_scale};
    return v;
}

/* An int8 or fp32 matrix through wmat.c (not LLM_HOT, never inlined: see
 * act_in). */
static __attribute__((noinline)) void matvec_other(llm_engine *e, const llm_mat *mat,
                                                   uint32_t first, uint32_t rows, uint32_t m,
                                                   float *const *y) {
    const llm_wmat w = llm_wmat_rows(&mat->w, first, rows);
    llm_vin vin[LLM_BATCH_MAX];
    const llm_vin *in[LLM_BATCH_MAX];
    for (uint32_t c = 0; c < m; c++) {
        vin[c] = act_in(e, c, 0, &w);
        in[c] = &vin[c];
    }
    llm_wmat_matvec(&w, in, m, y, 0, rows);
}

/* Position c's head input for an int8 or fp32 head (head_input): x in its
 * own buffer (fp32: llm_logits() may read it after the column moved on) or
 * quantized in the head's groups. Not LLM_HOT (see act_in). */
static __attribute__((noinline)) void head_input_other(llm_engine *e, uint32_t c,
                                                       const float *x) {
    llm_src *src = &e->s.src[c][1];
    if (src->own != NULL) {
        memcpy(src->own, x, e->cfg.dim * sizeof(float));
        x = src->own;
    }
    src->x = x;
    src->n = e->cfg.dim;
    src->q8_group = 0;
    (void)act_in(e, c, 1, &e->w.head.w);
}

/* The dense head on position c's head input, any kind (select_next,
 * llm_logits). */
static void head_dense(llm_engine *e, uint32_t c, const llm_splitter *sp, llm_head_work *work) {
    const llm_act *in = &e->s.col[c].head_in;
    if (e->w.head.w.kind == LLM_IMAGE_KIND_Q4) {
        const llm_vin vin = {NULL, in->q, in->scale, NULL, NULL};
        llm_head_dense(&e->w.head, &e->s.head, &vin, e->s.logits, sp, work);
    } else {
        const llm_vin vin = act_in(e, c, 1, &e->w.head.w);
        llm_head_dense(&e->w.head, &e->s.head, &vin, e->s.logits, sp, work);
    }
}

/* A float buffer of position c of the pass: `field` is one of llm_col's
 * float pointers, named by its offset. */
#define COL(e, c, field) ((e)->s.col[(c)].field)

/* y[c] = m . act[c] for the m positions of the pass, on the calling core (a
 * core matrix is too small to pay for a hand-off; the cost model,
 * tools/mpllm/costmodel/, weighs it). Several positions go through the
 * many-columns kernel, which reads each weight once for all of them; the
 * values are the single-vector kernel's either way. `rows` limits the call to
 * the first rows of the matrix, `unit` runs it with every scale and xscale 1
 * (below). Bytes are charged once: the weights are read once per pass. */
static void LLM_HOT matvec_rows(llm_engine *e, const llm_mat *mat, uint32_t first, uint32_t rows,
                        uint32_t m, float *const *y, int unit) {
    if (mat->w.kind != LLM_IMAGE_KIND_Q4) {
        matvec_other(e, mat, first, rows, m, y);
        return;
    }
    llm_q4 w = llm_wmat_q4(&mat->w);
    w.codes += (size_t)first * w.row_bytes;
    w.scales = unit ? e->s.ones : w.scales + (size_t)first * w.n_groups;
    w.rows = rows;
    const int8_t *xq[LLM_BATCH_MAX];
    float xs[LLM_BATCH_MAX];
    for (uint32_t c = 0; c < m; c++) {
        xq[c] = e->s.col[c].act.q;
        xs[c] = unit ? 1.0f : e->s.col[c].act.scale;
    }
    if (m == 1u)
        llm_matvec_q4(&w, xq[0], xs[0], y[0], 0, rows);
    else
        llm_matvec_q4_cols(&w, xq, xs, m, y, 0, rows);
}

static void LLM_HOT charge_mat(llm_engine *e, const llm_mat *m) {
    e->stats.bytes[m->region] += (uint64_t)m->w.rows * llm_wmat_row_cost(&m->w);
}

/* Every position's act through one matrix into its `out` buffer. */
#define MATVEC(e, mat, m, field)                                  \
    do {                                                          \
        float *ys_[LLM_BATCH_MAX];                                \
        for (uint32_t c_ = 0; c_ < (m); c_++) ys_[c_] = COL(e, c_, field); \
        matvec_rows((e), (mat), 0, (mat)->w.rows, (m), ys_, 0);   \
        charge_mat((e), (mat));                                   \
    } while (0)

/* The qkv matvec when V (and with k_dots K) is cached as dots: the q rows
 * (and K's without k_dots) as usual; the kv_dim V rows (and K's) through the
 * same kernel with every scale 1 and xscale 1, which makes it return (0 +
 * (float)g * 1) * 1 = (float)g, the exact integer dot (|g| < 2^24). Same
 * bytes read as one full call. */
static void LLM_HOT matvec_kv_dots(llm_engine *e, const llm_mat *mat, uint32_t m, int k_dots) {
    const uint32_t dots0 = e->cfg.dim + (k_dots ? 0u : e->cfg.kv_dim);
    float *ys[LLM_BATCH_MAX];
    for (uint32_t c = 0; c < m; c++) ys[c] = COL(e, c, qkv);
    matvec_rows(e, mat, 0, dots0, m, ys, 0);
    /* kv_dim rows a call: the unit scales (s.ones) are dim >= kv_dim long */
    for (uint32_t r = dots0; r < e->cfg.dim + 2u * e->cfg.kv_dim; r += e->cfg.kv_dim) {
        for (uint32_t c = 0; c < m; c++) ys[c] = COL(e, c, qkv) + r;
        matvec_rows(e, mat, r, e->cfg.kv_dim, m, ys, 1);
    }
    charge_mat(e, mat);
}

/* RoPE on one pair (a, b) of a head, split-half: (a cos - b sin, b cos +
 * a sin). The one copy of these operations: attention_block rotates q and
 * k with it (rope_rotate) and attention rebuilds cached k from its dots
 * with it (cached_k), so both give the same bits. */
static inline void rope_pair(float a, float b, float co, float si, float *x, float *y) {
    *x = a * co - b * si;
    *y = b * co + a * si;
}

/* One head's RoPE, `rope` a position's row (cos[half] then sin[half]). */
static inline void rope_rotate(float *v, const float *rope, uint32_t half) {
    for (uint32_t i = 0; i < half; i++)
        rope_pair(v[i], v[i + half], rope[i], rope[half + i], &v[i], &v[i + half]);
}

/* A k (or v) value from its exact integer dot: the kernel's own operations
 * for a one-group row (kernels.h contract: acc = 0; acc += (float)g *
 * scale; y = acc * xscale), so the float the matvec would have given. */
static inline float from_dot(float g, float scale, float xscale) {
    float acc = 0.0f;
    acc += g * scale;
    return acc * xscale;
}

/* Embedding row: int4 in the kernel layout (32-column blocks of nibbles),
 * another kind through wmat.c. */
static void LLM_HOT embed_row(llm_engine *e, uint32_t token, float *out) {
    const llm_wmat *w = &e->w.embed;
    e->stats.bytes[LLM_REGION_FLASH] += llm_wmat_row_cost(w);
    if (w->kind != LLM_IMAGE_KIND_Q4) {
        llm_wmat_row_values(w, token, out);
        return;
    }
    const uint8_t *row = w->data + (size_t)token * w->row_bytes;
    const float *sc = w->scales + (size_t)token * w->n_groups;
    for (uint32_t j = 0; j < w->cols; j++) {
        uint8_t byte = row[16u * (j / 32u) + (j % 16u)];
        int code = (j % 32u) < 16u ? (byte & 0x0F) : (byte >> 4);
        out[j] = (float)(code - 8) * sc[j / w->group];
    }
}

/* PLE row: source nibble order, fp16 scales beside the codes. */
static void LLM_HOT ple_row(llm_engine *e, uint32_t token, float *out) {
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

/* Position pos's RoPE row, cos[head_dim/2] then sin[head_dim/2] (charged
 * by the caller: attention reads cached positions' rows too). */
static LLM_HOT const float *rope_at(const llm_engine *e, uint32_t pos) {
    return e->w.rope + (size_t)pos * e->cfg.head_dim;
}

/* This position's RoPE row, read for its q and k. */
static LLM_HOT const float *rope_row(llm_engine *e, uint32_t pos) {
    e->stats.bytes[LLM_REGION_FLASH] += (uint64_t)e->cfg.head_dim * sizeof(float);
    return rope_at(e, pos);
}

/* Attention of heads [h0, h1) at one layer for the m positions of a pass
 * (position c at pos + c sees cache rows 0..pos + c). Query head h reads kv
 * head h / group (group = n_heads / n_kv_heads: grouped-query attention; 1
 * for esp32-ai). Rows are the outer loop, so each K and V row (all kv heads
 * of a position, contiguous) is fetched from PSRAM once per layer for all m
 * positions, cache line by cache line; for every position and head each
 * float sum still runs in ascending t exactly as the numerics contract says:
 * scores dot(q,k) summed in i order then scaled, the max, w = expf(s - max),
 * denom += w and ao += w*v in ascending t, then ao /= denom. The job carries
 * the pass's constants, so each phase starts from it. */
typedef struct attn_job {
    llm_engine *e;
    llm_run_state *s;
    uint32_t layer, pos, m, last; /* last = pos + m - 1: the newest row read */
    uint32_t KVD, Dh, S, group;  /* kv_dim, head_dim, seq_len, n_heads / n_kv_heads */
    const float *k_scale; /* [kv_dim] the layer's K row scales (qkv rows dim..) */
    const float *v_scale; /* [kv_dim] the layer's V row scales (qkv rows dim + kv_dim..) */
} attn_job;

/* Cached row t's k for kv head kv (head_dim floats, rotated): the floats
 * where the row is wide, else rebuilt into slot `slot` of buf (head_dim
 * floats each) from its dots (from_dot,
 * then rope_pair with position t's RoPE row: the operations that made the
 * floats plain mode stores, so the same bits). */
static LLM_HOT const float *cached_k(const attn_job *j, uint32_t t, uint32_t kv, float *buf,
                                     uint32_t slot) {
    const llm_run_state *s = j->s;
    const size_t row = (size_t)j->layer * j->S + t;
    if (s->kv_wide[row] & LLM_K_WIDE) return s->kv_k + row * j->KVD + kv;
    const int16_t *g = (const int16_t *)(const void *)(s->kv_k + row * j->KVD) + kv;
    const float *sc = j->k_scale + kv, *rope = rope_at(j->e, t);
    const float xs = s->kv_scale[row];
    const uint32_t half = j->Dh / 2u;
    float *out = buf + (size_t)slot * j->Dh; /* (buf is placed once a row is dots) */
    /* each pair rebuilt and rotated in registers */
    for (uint32_t i = 0; i < half; i++)
        rope_pair(from_dot((float)g[i], sc[i], xs),
                  from_dot((float)g[i + half], sc[i + half], xs), rope[i], rope[half + i],
                  &out[i], &out[i + half]);
    return out;
}

/* Phase 1 for one position over four rows t..t+3: four independent sums,
 * each still in i order (so the same bits), which also keeps the in-order
 * FPU from waiting on one chain. Each kv head's four k are fetched (or
 * rebuilt) once for the query heads that share it. */
static void LLM_HOT scores_rows4(const attn_job *j, uint32_t t, uint32_t h0, uint32_t h1) {
    llm_col *col = &j->s->col[0];
    const uint32_t Dh = j->Dh;
    const float inv = j->e->inv_sqrt_head_dim;
    /* this call's four rows (NULL while K is floats: no row is rebuilt) */
    float *buf = j->s->k_rebuilt != NULL ? j->s->k_rebuilt + (size_t)h0 * 4u * Dh : NULL;
    const float *k0 = NULL, *k1 = NULL, *k2 = NULL, *k3 = NULL;
    uint32_t have = UINT32_MAX;
    for (uint32_t h = h0; h < h1; h++) {
        const uint32_t kv = (h / j->group) * Dh;
        if (kv != have) {
            k0 = cached_k(j, t, kv, buf, 0);
            k1 = cached_k(j, t + 1u, kv, buf, 1);
            k2 = cached_k(j, t + 2u, kv, buf, 2);
            k3 = cached_k(j, t + 3u, kv, buf, 3);
            have = kv;
        }
        const float *q = col->qkv + h * Dh;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (uint32_t i = 0; i < Dh; i++) {
            const float qi = q[i];
            s0 += qi * k0[i];
            s1 += qi * k1[i];
            s2 += qi * k2[i];
            s3 += qi * k3[i];
        }
        float *sc = col->scores + (size_t)h * j->S + t;
        sc[0] = s0 * inv;
        sc[1] = s1 * inv;
        sc[2] = s2 * inv;
        sc[3] = s3 * inv;
        for (uint32_t r = 0; r < 4u; r++)
            if (sc[r] > col->att_max[h]) col->att_max[h] = sc[r];
    }
}

#if LLM_SIMD
/* Phase 1 on the host's vector lanes, one position (m == 1, not plain mode),
 * over rows 0.. four at a time while their k are floats: lane r holds row
 * t + r's sum, which runs in i order from +0 like the scalar one (q[i]
 * times k_{t+r}[i], added), then is scaled: the same bits as
 * scores_rows4. The four rows' k are transposed (moves only) so that a
 * vector holds one i of four rows.
 *
 * The max: lane r keeps the running max of rows t = r mod 4 by the scalar
 * rule (s > max), then the lanes are taken in order. That is the scalar
 * max's value (NaN skipped the same way); only which zero wins a tie of +0
 * and -0 could differ, so a zero max is taken again row by row in t order.
 * The same bits either way. Dh is a constant in the callers below, so the
 * loops over i unroll. */
static inline __attribute__((always_inline)) uint32_t scores_head(const attn_job *j,
                                                                   uint32_t h, uint32_t end,
                                                                   const uint32_t Dh) {
    llm_col *col = &j->s->col[0];
    const uint32_t KVD = j->KVD;
    const uint32_t kv = (h / j->group) * Dh;
    const float *k0 = j->s->kv_k + (size_t)j->layer * j->S * KVD + kv;
    const float *q = col->qkv + h * Dh;
    float *sc = col->scores + (size_t)h * j->S;
    const llm_f4 inv = llm_f4_splat(j->e->inv_sqrt_head_dim);
    llm_f4 mx = llm_f4_splat(col->att_max[h]);
    uint32_t t = 0;
    for (; t < end; t += 4u) {
        const float *k = k0 + (size_t)t * KVD;
        llm_f4 acc = llm_f4_splat(0.0f);
        for (uint32_t i = 0; i < Dh; i += 4u) {
            llm_f4 kt[4];
            llm_f4_transpose(llm_f4_load(k + i), llm_f4_load(k + KVD + i),
                             llm_f4_load(k + 2u * KVD + i), llm_f4_load(k + 3u * KVD + i), kt);
            acc += llm_f4_splat(q[i]) * kt[0];
            acc += llm_f4_splat(q[i + 1u]) * kt[1];
            acc += llm_f4_splat(q[i + 2u]) * kt[2];
            acc += llm_f4_splat(q[i + 3u]) * kt[3];
        }
        acc *= inv;
        llm_f4_store(sc + t, acc);
        const llm_i4 gt = acc > mx; /* per lane: all ones or 0 (NaN: 0) */
        mx = (llm_f4)(((llm_i4)acc & gt) | ((llm_i4)mx & ~gt));
    }
    float m = col->att_max[h];
    for (uint32_t r = 0; r < 4u; r++)
        if (mx[r] > m) m = mx[r];
    if (m == 0.0f) { /* +0 or -0: the first in t order, as the scalar loop */
        m = col->att_max[h];
        for (uint32_t u = 0; u < end; u++)
            if (sc[u] > m) m = sc[u];
    }
    col->att_max[h] = m;
    return t;
}

/* Returns the first row it did not score. Not LLM_HOT, and kept out of
 * line: host-only code, not the board's. */
static __attribute__((noinline)) uint32_t scores_simd(const attn_job *j, uint32_t h0,
                                                       uint32_t h1) {
    const uint8_t *wide = j->s->kv_wide + (size_t)j->layer * j->S;
    uint32_t end = 0; /* rows [0, end): blocks of four float k rows */
    while (end + 3u <= j->last &&
           (wide[end] & wide[end + 1u] & wide[end + 2u] & wide[end + 3u] & LLM_K_WIDE))
        end += 4u;
    for (uint32_t h = h0; h < h1; h++) {
        switch (j->Dh) {
        case 8u: scores_head(j, h, end, 8u); break;
        case 16u: scores_head(j, h, end, 16u); break;
        case 32u: scores_head(j, h, end, 32u); break;
        default: scores_head(j, h, end, j->Dh); break;
        }
    }
    return end;
}
#endif

/* Phase 1: scores s_t = dot(q, k_t) / sqrt(head_dim) (summed in i order, then
 * scaled) for every cached t a position sees, and their max; each row's k
 * fetched (or rebuilt) once per kv head for all m positions; one position's
 * rows four at a time (not in plain mode). */
static void LLM_HOT attention_scores(const attn_job *j, uint32_t h0, uint32_t h1) {
    llm_run_state *s = j->s;
    const uint32_t Dh = j->Dh, S = j->S, pos = j->pos;
    const int rows4 = j->m == 1u && !j->e->plain;
    /* this call's rows (NULL while K is floats: no row is rebuilt) */
    float *buf = s->k_rebuilt != NULL ? s->k_rebuilt + (size_t)h0 * 4u * Dh : NULL;
    for (uint32_t c = 0; c < j->m; c++)
        for (uint32_t h = h0; h < h1; h++) s->col[c].att_max[h] = -1e30f;
    uint32_t t0 = 0;
#if LLM_SIMD
    if (rows4 && Dh % 4u == 0) t0 = scores_simd(j, h0, h1);
#endif
    for (uint32_t t = t0; t <= j->last; t++) {
        if (rows4 && t + 3u <= j->last) {
            scores_rows4(j, t, h0, h1);
            t += 3u;
            continue;
        }
        const float *k = NULL;
        uint32_t have = UINT32_MAX;
        for (uint32_t h = h0; h < h1; h++) {
            const uint32_t kv = (h / j->group) * Dh;
            if (kv != have) {
                k = cached_k(j, t, kv, buf, 0);
                have = kv;
            }
            for (uint32_t c = t > pos ? t - pos : 0u; c < j->m; c++) {
                llm_col *col = &s->col[c];
                const float *q = col->qkv + h * Dh;
                float sc = 0.0f;
                for (uint32_t i = 0; i < Dh; i++) sc += q[i] * k[i];
                sc *= j->e->inv_sqrt_head_dim;
                col->scores[(size_t)h * S + t] = sc;
                if (sc > col->att_max[h]) col->att_max[h] = sc;
            }
        }
    }
}

/* Phase 2: the weights w_t = expf(s_t - max), written over the scores:
 * independent, so four at a time (one at a time in plain mode); the output
 * and the denominator start at 0. */
static void LLM_HOT attention_weights(const attn_job *j, uint32_t h0, uint32_t h1) {
    const uint32_t Dh = j->Dh, S = j->S, pos = j->pos;
    for (uint32_t c = 0; c < j->m; c++) {
        llm_col *col = &j->s->col[c];
        for (uint32_t h = h0; h < h1; h++) {
            float *w = col->scores + (size_t)h * S;
            const float mx = col->att_max[h];
            uint32_t t = 0;
#if LLM_SIMD
            /* the host's vector lanes, the same bits (mathf.h) */
            if (!j->e->plain) {
                llm_expf_sub_n(w, mx, w, pos + c + 1u);
                t = pos + c + 1u;
            }
#endif
            for (; !j->e->plain && t + 4u <= pos + c + 1u; t += 4u) {
                float d[4] = {w[t] - mx, w[t + 1u] - mx, w[t + 2u] - mx, w[t + 3u] - mx};
                llm_expf4(d, w + t);
            }
            for (; t <= pos + c; t++) w[t] = llm_expf(w[t] - mx);
            for (uint32_t i = 0; i < Dh; i++) col->att[h * Dh + i] = 0.0f;
            col->att_den[h] = 0.0f;
        }
    }
}

/* Phase 3 for one position over four rows t..t+3 held as dots (no position
 * of the pass is newer than t+3): for each head and element, ao stays in a
 * register across the four rows and v is recomputed where it is used, in
 * the same operations and the same ascending t as the row-at-a-time loop
 * below, so the same bits. (The loop's acc = 0 + g * scale is dropped here:
 * it only turns -0 into +0, and w * -0 added to ao changes nothing, since ao
 * starts at +0 and a sum that reaches 0 is +0.) */
static void LLM_HOT values_rows4(const attn_job *j, uint32_t t, uint32_t h0, uint32_t h1) {
    llm_run_state *s = j->s;
    const uint32_t Dh = j->Dh, S = j->S;
    const size_t row = (size_t)j->layer * S + t;
    const uint32_t vs = s->v_stride;
    const int16_t *g0 = s->kv_v + row * vs, *g1 = g0 + vs, *g2 = g1 + vs, *g3 = g2 + vs;
    const float x0 = s->kv_scale[row], x1 = s->kv_scale[row + 1u],
                x2 = s->kv_scale[row + 2u], x3 = s->kv_scale[row + 3u];
    llm_col *col = &s->col[0];
    for (uint32_t h = h0; h < h1; h++) {
        const uint32_t kv = (h / j->group) * Dh;
        const float *sc = j->v_scale + kv, *w = col->scores + (size_t)h * S + t;
        float den = col->att_den[h];
        den += w[0];
        den += w[1];
        den += w[2];
        den += w[3];
        col->att_den[h] = den;
        float *ao = col->att + h * Dh;
        for (uint32_t i = 0; i < Dh; i++) {
            const float si = sc[i];
            float a = ao[i];
            a += w[0] * (((float)g0[kv + i] * si) * x0);
            a += w[1] * (((float)g1[kv + i] * si) * x1);
            a += w[2] * (((float)g2[kv + i] * si) * x2);
            a += w[3] * (((float)g3[kv + i] * si) * x3);
            ao[i] = a;
        }
    }
}

/* Rows t..t+3 all held as dots, and seen by every position of a one-position
 * pass; not in plain mode (the same rule as scores_rows4). */
static int LLM_HOT rows4_as_dots(const attn_job *j, uint32_t t) {
    if (j->m != 1u || j->e->plain || t + 3u > j->last) return 0;
    const uint8_t *wide = j->s->kv_wide + (size_t)j->layer * j->S + t;
    return !((wide[0] | wide[1] | wide[2] | wide[3]) & LLM_V_WIDE);
}

/* Cached row `row`'s V floats (a wide row): in its V row when that is wide
 * enough, else in plain mode's array. */
static LLM_HOT float *v_floats(const llm_run_state *s, size_t row, uint32_t KVD) {
    if (s->kv_v_floats != NULL) return s->kv_v_floats + row * KVD;
    return (float *)(void *)(s->kv_v + row * s->v_stride);
}

#if LLM_SIMD
/* Phase 3 on the host's vector lanes, one position (m == 1, not plain mode),
 * over rows [0, end) whose V are floats, for NH heads at once (Dh and NH
 * constants in the callers, so the accumulators stay in registers): lane i
 * of a head's output holds ao[i], which adds w_t * v_t[i] in ascending t as
 * the scalar loop does (lane-wise: the same bits); denom adds w_t in
 * ascending t. The heads' sums are independent chains run side by side. */
static inline __attribute__((always_inline)) void values_heads(const attn_job *j, uint32_t h,
                                                                uint32_t end, const uint32_t NH,
                                                                const uint32_t Dh) {
    llm_run_state *s = j->s;
    llm_col *col = &s->col[0];
    const size_t row0 = (size_t)j->layer * j->S;
    llm_f4 a[4][LLM_MAX_HEAD_DIM / 4u];
    float den[4];
    const float *w[4];
    uint32_t kv[4];
    for (uint32_t q = 0; q < NH; q++) {
        kv[q] = ((h + q) / j->group) * Dh;
        w[q] = col->scores + (size_t)(h + q) * j->S;
        den[q] = col->att_den[h + q];
        for (uint32_t c = 0; c < Dh / 4u; c++) a[q][c] = llm_f4_load(col->att + (h + q) * Dh + 4u * c);
    }
    for (uint32_t t = 0; t < end; t++) {
        const float *v = v_floats(s, row0 + t, j->KVD);
        for (uint32_t q = 0; q < NH; q++) {
            const float wt = w[q][t];
            den[q] += wt;
            const llm_f4 ws = llm_f4_splat(wt);
            for (uint32_t c = 0; c < Dh / 4u; c++) a[q][c] += ws * llm_f4_load(v + kv[q] + 4u * c);
        }
    }
    for (uint32_t q = 0; q < NH; q++) {
        col->att_den[h + q] = den[q];
        for (uint32_t c = 0; c < Dh / 4u; c++) llm_f4_store(col->att + (h + q) * Dh + 4u * c, a[q][c]);
    }
}

/* Returns the first row it did not read. Host-only, out of line (as
 * scores_simd). */
static __attribute__((noinline)) uint32_t values_simd(const attn_job *j, uint32_t h0,
                                                       uint32_t h1) {
    const uint8_t *wide = j->s->kv_wide + (size_t)j->layer * j->S;
    uint32_t end = 0;
    while (end <= j->last && (wide[end] & LLM_V_WIDE)) end++;
    uint32_t h = h0;
    if (j->Dh == 8u)
        for (; h + 4u <= h1; h += 4u) values_heads(j, h, end, 4u, 8u);
    else if (j->Dh == 16u)
        for (; h + 2u <= h1; h += 2u) values_heads(j, h, end, 2u, 16u);
    for (; h < h1; h++) values_heads(j, h, end, 1u, j->Dh);
    return end;
}
#endif

/* Phase 3: denom += w_t and out += w_t v_t in ascending t, each V row read
 * once for all m positions (from its dots and scale, or as floats where
 * wide); one position's rows four at a time where they are dots. */
static void LLM_HOT attention_values(const attn_job *j, uint32_t h0, uint32_t h1) {
    llm_run_state *s = j->s;
    const uint32_t KVD = j->KVD, Dh = j->Dh, S = j->S, pos = j->pos;
    const size_t row0 = (size_t)j->layer * S;
    float v[LLM_MAX_HEAD_DIM];
    uint32_t t0 = 0;
#if LLM_SIMD
    if (j->m == 1u && !j->e->plain && Dh % 4u == 0) t0 = values_simd(j, h0, h1);
#endif
    for (uint32_t t = t0; t <= j->last; t++) {
        if (rows4_as_dots(j, t)) {
            values_rows4(j, t, h0, h1);
            t += 3u;
            continue;
        }
        const int wide = (s->kv_wide[row0 + t] & LLM_V_WIDE) != 0;
        const float *vc = wide ? v_floats(s, row0 + t, KVD) : NULL;
        const int16_t *g = wide ? NULL : s->kv_v + (row0 + t) * s->v_stride;
        const float xs = wide ? 0.0f : s->kv_scale[row0 + t];
        const uint32_t c0 = t > pos ? t - pos : 0u;
        for (uint32_t h = h0; h < h1; h++) {
            const uint32_t kv = (h / j->group) * Dh; /* this head's kv head */
            const float *vh;
            if (wide) {
                vh = vc + kv;
            } else {
                /* the kernel's floats from the dots, computed once for all
                 * m positions */
                for (uint32_t i = 0; i < Dh; i++)
                    v[i] = from_dot((float)g[kv + i], j->v_scale[kv + i], xs);
                vh = v;
            }
            for (uint32_t c = c0; c < j->m; c++) {
                llm_col *col = &s->col[c];
                float w = col->scores[(size_t)h * S + t];
                col->att_den[h] += w;
                float *ao = col->att + h * Dh;
                for (uint32_t i = 0; i < Dh; i++) ao[i] += w * vh[i];
            }
        }
    }
}

static void LLM_HOT attention_heads(void *arg, uint32_t h0, uint32_t h1) {
    const attn_job *j = arg;
    const uint32_t Dh = j->Dh;
    attention_scores(j, h0, h1);
    attention_weights(j, h0, h1);
    attention_values(j, h0, h1);
    /* out /= denom */
    for (uint32_t c = 0; c < j->m; c++) {
        llm_col *col = &j->s->col[c];
        for (uint32_t h = h0; h < h1; h++)
            for (uint32_t i = 0; i < Dh; i++) col->att[h * Dh + i] /= col->att_den[h];
    }
}

/* Whether n dots fit int16. */
static int LLM_HOT dots_fit(const float *g, uint32_t n) {
    int fits = 1;
    for (uint32_t i = 0; i < n; i++) fits &= g[i] >= -32767.0f && g[i] <= 32767.0f;
    return fits;
}

/* Store one position's k and v (kv_dim each) in the cache; returns the
 * bytes written. With dots (`dots`), col->qkv[dim + kv_dim..) holds V's
 * exact integer dots (matvec_kv_dots) and, with `k_dots`, col->qkv[dim..)
 * K's (not rotated); ks and vs are the layer's K and V row scales,
 * col->act.scale the qkv input's scale and `rope` the position's RoPE row; a
 * row whose dots do not fit int16 is stored as the floats attention would
 * rebuild. Otherwise col->qkv holds the kernel's floats (k rotated), which
 * are stored as they are. */
static uint64_t LLM_HOT store_kv(llm_engine *e, uint32_t l, uint32_t p, const llm_col *col,
                                 int dots, int k_dots, const float *ks, const float *vs,
                                 const float *rope) {
    const uint32_t D = e->cfg.kv_dim, S = e->cfg.seq_len, Q = e->cfg.dim, Dh = e->cfg.head_dim;
    llm_run_state *s = &e->s;
    const size_t row = (size_t)l * S + p;
    float *kf = s->kv_k + row * D;
    int16_t *vg = s->kv_v + row * s->v_stride;
    const float *k = col->qkv + Q, *v = k + D;
    if (!dots) {
        /* plain mode (or rows of several scale groups): both as floats */
        memcpy(kf, k, D * sizeof(float));
        memcpy(v_floats(s, row, D), v, D * sizeof(float));
        s->kv_wide[row] = LLM_K_WIDE | LLM_V_WIDE;
        return (uint64_t)D * 2u * sizeof(float);
    }
    const uint8_t wide = (uint8_t)((k_dots && dots_fit(k, D) ? 0u : LLM_K_WIDE) |
                                   (dots_fit(v, D) ? 0u : LLM_V_WIDE));
    const float xs = col->act.scale;
    s->kv_wide[row] = wide;
    s->kv_scale[row] = xs;
    uint64_t written = sizeof(float);
    if (!k_dots) {
        memcpy(kf, k, D * sizeof(float));
        written += (uint64_t)D * sizeof(float);
    } else if (wide & LLM_K_WIDE) {
        /* too wide for int16: the rotated floats a rebuild would give */
        for (uint32_t i = 0; i < D; i++) kf[i] = from_dot(k[i], ks[i], xs);
        for (uint32_t h = 0; h < D; h += Dh) rope_rotate(kf + h, rope, Dh / 2u);
        e->stats.k_wide++;
        written += (uint64_t)D * sizeof(float);
    } else {
        int16_t *kg = (int16_t *)(void *)kf;
        for (uint32_t i = 0; i < D; i++) kg[i] = (int16_t)k[i];
        written += (uint64_t)D * 2u;
    }
    if (wide & LLM_V_WIDE) {
        /* (only where some V row can be wide: its V row holds the floats) */
        float *vf = v_floats(s, row, D);
        for (uint32_t i = 0; i < D; i++) vf[i] = from_dot(v[i], vs[i], xs);
        e->stats.v_wide++;
        written += (uint64_t)D * sizeof(float);
    } else {
        for (uint32_t i = 0; i < D; i++) vg[i] = (int16_t)v[i];
        written += (uint64_t)D * 2u;
    }
    return written;
}

/* The bytes of cached row `row` attention reads in the KV region: K's and
 * V's dots (+ the scale once) or floats, as kv_wide says. */
static uint64_t LLM_HOT kv_row_bytes(const llm_engine *e, size_t row) {
    const uint64_t D = e->cfg.kv_dim;
    const uint8_t wide = e->s.kv_wide[row];
    if (wide == (LLM_K_WIDE | LLM_V_WIDE)) return D * 2u * sizeof(float);
    return sizeof(float) + (wide & LLM_K_WIDE ? D * sizeof(float) : D * 2u) +
           (wide & LLM_V_WIDE ? D * sizeof(float) : D * 2u);
}

/* The pass's k and v rows into the cache, then attention for all of its
 * positions, split across cores by heads. */
static void fast_heads(void *arg, uint32_t h0, uint32_t h1) {
    const attn_job *j = arg;
    llm_fast_attention_heads(j->e, j->layer, j->pos, j->m, h0, h1);
}

/* Attention's heads across the two cores (one hand-off), or on this one. */
static void LLM_HOT run_heads(llm_engine *e, void (*heads)(void *, uint32_t, uint32_t), attn_job *job) {
    llm_splitter sp = splitter(e);
    if (sp.split != NULL && e->cfg.n_heads > 1u) {
        sp.split(sp.ctx, heads, job, e->cfg.n_heads);
        e->stats.handoffs++;
    } else {
        heads(job, 0, e->cfg.n_heads);
    }
}

static void LLM_HOT attention(llm_engine *e, uint32_t l, uint32_t pos, uint32_t m, int dots,
                              int k_dots, const float *const *rope) {
    const llm_config *cf = &e->cfg;
    const uint32_t D = cf->kv_dim, S = cf->seq_len, Q = cf->dim;
    llm_run_state *s = &e->s;
    const float *ks = e->w.layers[l].qkv.w.scales + Q;
    attn_job job = {e, s, l, pos, m, pos + m - 1u, D, cf->head_dim, S,
                    cf->n_heads / cf->n_kv_heads, ks, ks + D};
    if (e->fast) {
        for (uint32_t c = 0; c < m; c++)
            llm_fast_store_kv(e, l, pos + c, s->col[c].qkv + Q, s->col[c].qkv + Q + D);
        run_heads(e, fast_heads, &job);
        e->stats.bytes[e->kv_region] += llm_fast_kv_bytes(e, m) + llm_fast_kv_bytes(e, pos + m);
        return;
    }
    uint64_t written = 0;
    for (uint32_t c = 0; c < m; c++)
        written += store_kv(e, l, pos + c, &s->col[c], dots, k_dots, ks, ks + D, rope[c]);
    run_heads(e, attention_heads, &job);
    /* every cache row the pass reads, once (kv_row_bytes), and the RoPE row
     * of each one whose k is rebuilt from dots (in flash: the image's) */
    uint64_t read = 0, rope_rows = 0;
    for (uint32_t t = 0; t < pos + m; t++) {
        read += kv_row_bytes(e, (size_t)l * S + t);
        rope_rows += !(s->kv_wide[(size_t)l * S + t] & LLM_K_WIDE);
    }
    e->stats.bytes[e->kv_region] += written + read;
    e->stats.bytes[LLM_REGION_FLASH] += rope_rows * cf->head_dim * sizeof(float);
}

/* The inputs of the m positions of a pass (token t at position p):
 *   x = E[t]                                  embedding row, int4 -> float
 * with PLE (esp32-ai; ple_dim == 0 skips these):
 *   ple = W_ple_model_proj x / sqrt(dim)      every layer's PLE input at once
 *   ple_l = rmsnorm(ple_l) * ple_proj_norm    per layer slice l (ple_dim wide)
 *   ple = (ple + T_ple[t] sqrt(ple_dim)) / sqrt(2)   plus the token's PLE row
 * and each position's RoPE row (cos then sin) into rope[]. */
static void LLM_HOT embed_inputs(llm_engine *e, const int32_t *tokens, uint32_t m, const float **rope) {
    const uint32_t D = e->cfg.dim, L = e->cfg.n_layers, P = e->cfg.ple_dim;
    llm_run_state *s = &e->s;
    for (uint32_t c = 0; c < m; c++) {
        llm_col *col = &s->col[c];
        embed_row(e, (uint32_t)tokens[c], col->x);
        quantize(e, c, col->x, D);
    }
    for (uint32_t c = 0; c < m; c++) rope[c] = rope_row(e, e->pos + c);
    if (P == 0) return;
    MATVEC(e, &e->w.ple_model_proj, m, ple);
    for (uint32_t c = 0; c < m; c++) {
        llm_col *col = &s->col[c];
        for (uint32_t i = 0; i < L * P; i++) col->ple[i] *= e->inv_sqrt_dim;
        for (uint32_t l = 0; l < L; l++)
            rmsnorm(e, col->ple + l * P, col->ple + l * P, e->w.ple_proj_norm, P);
        ple_row(e, (uint32_t)tokens[c], col->trow);
        for (uint32_t i = 0; i < L * P; i++)
            col->ple[i] = (col->ple[i] + col->trow[i] * e->sqrt_ple_dim) * 0.70710678f;
    }
}

/* xb = rmsnorm(x) * norm, quantized as the input of the matvecs that follow,
 * for the m positions of the pass. */
static void LLM_HOT __attribute__((noinline)) norm_input(llm_engine *e, uint32_t m,
                                                         const float *norm) {
    llm_run_state *s = &e->s;
    for (uint32_t c = 0; c < m; c++) {
        rmsnorm(e, s->col[c].xb, s->col[c].x, norm, e->cfg.dim);
        quantize(e, c, s->col[c].xb, e->cfg.dim);
    }
}

/* x += xb2: a branch's output into the residual stream. */
static void LLM_HOT add_branch(llm_engine *e, uint32_t m) {
    const uint32_t D = e->cfg.dim;
    for (uint32_t c = 0; c < m; c++)
        for (uint32_t i = 0; i < D; i++) e->s.col[c].x[i] += e->s.col[c].xb2[i];
}

/* Layer l's attention for the pass's m positions (g = n_heads / n_kv_heads):
 *   xb = rmsnorm(x) * attn_norm
 *   q | k | v = W_qkv xb          n_heads q heads, n_kv_heads k and v heads
 *   q, k rotated by RoPE, split-half: (a, b) -> (a cos - b sin, b cos + a sin)
 *   att_h = softmax(q_h . k_{h/g}[0..p] / sqrt(head_dim)) v_{h/g}[0..p]   every head h
 *   x += W_attn_proj att */
static void LLM_HOT attention_block(llm_engine *e, uint32_t l, uint32_t m, const float *const *rope) {
    const llm_config *cf = &e->cfg;
    const llm_layer_weights *ly = &e->w.layers[l];
    const uint32_t D = cf->dim, Dh = cf->head_dim, half = Dh / 2u;
    llm_run_state *s = &e->s;
    norm_input(e, m, ly->attn_norm);
    preload_kv(e, l, e->pos);
    preload_after(e, l, &ly->qkv);
    /* V (and with k_dots K) as dots: a k kept as dots is rotated where it is
     * rebuilt (store_kv, attention) */
    const int dots = e->kv_dots && !e->plain && !e->fast;
    const int k_dots = dots && e->k_dots;
    if (dots)
        matvec_kv_dots(e, &ly->qkv, m, k_dots);
    else
        MATVEC(e, &ly->qkv, m, qkv);
    const uint32_t rotated = cf->n_heads + (k_dots ? 0u : cf->n_kv_heads); /* q, k heads */
    for (uint32_t c = 0; c < m; c++)
        for (uint32_t h = 0; h < rotated; h++) rope_rotate(s->col[c].qkv + h * Dh, rope[c], half);
    attention(e, l, e->pos, m, dots, k_dots, rope);
    for (uint32_t c = 0; c < m; c++) quantize(e, c, s->col[c].att, D);
    preload_after(e, l, &ly->attn_proj);
    MATVEC(e, &ly->attn_proj, m, xb2);
    add_branch(e, m);
}

/* Layer l's SwiGLU feed-forward:
 *   xb = rmsnorm(x) * ffn_norm
 *   hb = silu(W_gate xb) * (W_up xb)
 *   x += W_down hb */
static void LLM_HOT ffn_block(llm_engine *e, uint32_t l, uint32_t m) {
    const llm_layer_weights *ly = &e->w.layers[l];
    const uint32_t F = e->cfg.ffn;
    llm_run_state *s = &e->s;
    norm_input(e, m, ly->ffn_norm);
    preload_after(e, l, &ly->gate);
    MATVEC(e, &ly->gate, m, hb);
    preload_after(e, l, &ly->up);
    MATVEC(e, &ly->up, m, hb2);
    for (uint32_t c = 0; c < m; c++) {
        silu_mul(s->col[c].hb, s->col[c].hb, s->col[c].hb2, F, e->plain);
        quantize(e, c, s->col[c].hb, F);
    }
    preload_after(e, l, &ly->down);
    MATVEC(e, &ly->down, m, xb2);
    add_branch(e, m);
}

/* Layer l's per-layer-embedding (PLE) branch, on the raw residual:
 *   hb = gelu(W_ple_gate x) * ple_l
 *   x += rmsnorm(W_ple_proj hb) * ple_norm */
static void LLM_HOT ple_block(llm_engine *e, uint32_t l, uint32_t m) {
    const llm_layer_weights *ly = &e->w.layers[l];
    const uint32_t D = e->cfg.dim, P = e->cfg.ple_dim;
    llm_run_state *s = &e->s;
    for (uint32_t c = 0; c < m; c++) quantize(e, c, s->col[c].x, D);
    preload_after(e, l, &ly->ple_gate);
    MATVEC(e, &ly->ple_gate, m, hb);
    for (uint32_t c = 0; c < m; c++) {
        gelu_mul(s->col[c].hb, s->col[c].hb, s->col[c].ple + l * P, P, e->plain);
        quantize(e, c, s->col[c].hb, P);
    }
    preload_after(e, l, &ly->ple_proj);
    MATVEC(e, &ly->ple_proj, m, xb2);
    for (uint32_t c = 0; c < m; c++) {
        llm_col *col = &s->col[c];
        rmsnorm(e, col->xb2, col->xb2, ly->ple_norm, D);
        for (uint32_t i = 0; i < D; i++) col->x[i] += col->xb2[i];
    }
}

/* The head's input, made at once in the form the head's kind reads (the
 * certified route reads its scale first; llm_logits() may ask after the
 * column's buffers moved on). */
static void LLM_HOT head_input(llm_engine *e, uint32_t c, const float *x) {
    if (e->w.head.w.kind != LLM_IMAGE_KIND_Q4) {
        head_input_other(e, c, x);
        return;
    }
    llm_act *a = &e->s.col[c].head_in;
    llm_quantize_act(x, e->cfg.dim, (uint32_t)llm_align_up(e->cfg.dim, LLM_IMAGE_BLOCK_COLS),
                     a->q, &a->scale);
}

/* Which positions of a pass get the output head's input (not attention
 * heads: those are h below). */
enum { OUT_NONE, OUT_LAST, OUT_ALL };

/* m tokens (1 <= m <= n_cols) through the model at positions e->pos ..
 * e->pos + m - 1, as one pass: every weight is read once for the m
 * positions, each position computing exactly what it would alone:
 *   x, ple = embed_inputs(token)
 *   for each layer l: x = attention_block(x); x = ffn_block(x);
 *                     x = ple_block(x, ple_l)   (with PLE: esp32-ai)
 *   head_in = quantize(rmsnorm(x) * out_norm)   for the last position or all
 * (the head itself, logits = W_head head_in, runs in select_next). Arguments
 * were checked by the caller; e->pos is not moved here. */
static void LLM_HOT forward(llm_engine *e, const int32_t *tokens, uint32_t m, int out) {
    llm_run_state *s = &e->s;
    uint64_t t = now(e);
    const float *rope[LLM_BATCH_MAX];
    embed_inputs(e, tokens, m, rope);
    lap(e, LLM_STAGE_EMBED, &t);
    for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
        attention_block(e, l, m, rope);
        lap(e, LLM_STAGE_ATTN, &t);
        ffn_block(e, l, m);
        lap(e, LLM_STAGE_FFN, &t);
        if (e->cfg.ple_dim == 0) continue; /* llama2.c: no PLE branch */
        ple_block(e, l, m);
        lap(e, LLM_STAGE_PLE, &t);
    }
    e->stats.tokens += m;

    if (out != OUT_NONE) {
        for (uint32_t c = out == OUT_ALL ? 0u : m - 1u; c < m; c++) {
            llm_col *col = &s->col[c];
            rmsnorm(e, col->x, col->x, e->w.out_norm, e->cfg.dim);
            head_input(e, c, col->x);
        }
        lap(e, LLM_STAGE_HEAD, &t);
    }
}

/* `evals` head evaluations whose rows were fetched once (work->rows_read)
 * and their tile boxes read once per evaluation. */
static void LLM_HOT charge_head(llm_engine *e, const llm_head_work *work, int dense, uint32_t evals) {
    const llm_head *h = &e->w.head;
    e->stats.heads += evals;
    e->stats.head_rows += work->rows;
    e->stats.head_tiles += work->tiles;
    e->stats.head_waves += work->waves;
    e->stats.handoffs += work->handoffs;
    e->stats.bytes[h->rows_region] += (uint64_t)work->rows_read * llm_head_row_cost(h);
    e->stats.head_ids += work->ids;
    e->stats.preloads += work->preloads;
    e->stats.preload_bytes += work->preload_bytes;
    if (h->ids != NULL) e->stats.bytes[h->ids_region] += (uint64_t)work->ids * 2u;
    if (!dense)
        e->stats.bytes[h->boxes_region] += (uint64_t)evals * h->n_tiles *
                                           (2u * h->cols_padded + sizeof(float));
    else /* the logits buffer, written by the head and read by the sampler */
        e->stats.bytes[e->logits_region] += (uint64_t)e->cfg.vocab_out * 2u * sizeof(float);
}

/* Column c's head input is the last evaluation (what llm_logits() reads);
 * its logits are not computed yet. */
static void LLM_HOT note_evaluation(llm_engine *e, uint32_t c) {
    e->have_head = 1;
    e->head_col = c;
    e->have_logits = 0;
}

/* The last pass evaluated the head for n positions: column col0 + c
 * proposed the token of position pos0 + c (what rewind keeps for
 * llm_logits()). */
static void note_pass(llm_engine *e, uint32_t pos0, uint32_t col0, uint32_t n) {
    e->head_pos0 = pos0;
    e->head_col0 = col0;
    e->head_n = n;
}

/* The head and the sampler for position c of the pass forward() prepared.
 * The certified route when plain mode is off and its preconditions hold
 * (head.c), else the dense route; both choose the same token (head.c's
 * proof). The sampler only fails on NaN logits (a broken model): the token
 * that produced them has been consumed, so the position has moved on. */
static llm_status LLM_HOT select_next(llm_engine *e, uint32_t c, int32_t *next, llm_error *err) {
    const llm_head *h = &e->w.head;
    llm_run_state *s = &e->s;
    const llm_act *in = &s->col[c].head_in;
    const uint32_t V = e->cfg.vocab_out;
    uint64_t t = now(e);
    llm_splitter sp = splitter(e);
    llm_head_work work;
    note_evaluation(e, c);
    const uint32_t k = llm_sampler_candidates_needed(&e->sampler, V);
    if (!e->plain && k > 0 && llm_head_certifiable(h, in->scale)) {
        llm_candidates_init(&s->cand, k);
        llm_status st = llm_head_certify(h, &s->head, in->q, in->scale, &s->cand, &sp, &work, err);
        charge_head(e, &work, 0, 1);
        lap(e, LLM_STAGE_HEAD, &t);
        if (st != LLM_OK) return st;
        st = llm_sample_candidates(&s->cand, &e->sampler, &e->rng, next, err);
        lap(e, LLM_STAGE_SAMPLE, &t);
        return st;
    }
    head_dense(e, c, &sp, &work);
    e->have_logits = 1;
    charge_head(e, &work, 1, 1);
    lap(e, LLM_STAGE_HEAD, &t);
    llm_status st = llm_sample(s->logits, V, &e->sampler, &e->rng, next, err);
    lap(e, LLM_STAGE_SAMPLE, &t);
    return st;
}

/* The certified head for the pass's n positions in one scan, when every one
 * of them may take the certified route (select_next's conditions); 0 when one
 * may not (the caller then evaluates them one by one). */
static int certify_many(llm_engine *e, uint32_t n, llm_status *st, llm_error *err) {
    const llm_head *h = &e->w.head;
    llm_run_state *s = &e->s;
    const uint32_t k = llm_sampler_candidates_needed(&e->sampler, e->cfg.vocab_out);
    if (e->plain || k == 0 || s->many == NULL) return 0;
    const int8_t *xq[LLM_BATCH_MAX];
    float xs[LLM_BATCH_MAX];
    llm_candidates *cand[LLM_BATCH_MAX];
    for (uint32_t c = 0; c < n; c++) {
        if (!llm_head_certifiable(h, s->col[c].head_in.scale)) return 0;
        xq[c] = s->col[c].head_in.q;
        xs[c] = s->col[c].head_in.scale;
        cand[c] = &s->cands[c];
        llm_candidates_init(cand[c], k);
    }
    uint64_t t = now(e);
    llm_head_work work;
    llm_splitter sp = splitter(e);
    *st = llm_head_certify_many(h, &s->head, s->many, &sp, xq, xs, n, cand, &work, err);
    charge_head(e, &work, 0, n);
    lap(e, LLM_STAGE_HEAD, &t);
    return 1;
}

const float *llm_logits(llm_engine *e) {
    if (e == NULL || !e->have_head) return NULL;
    if (!e->have_logits) {
        llm_head_work work;
        head_dense(e, e->head_col, NULL, &work);
        e->have_logits = 1;
    }
    return e->s.logits;
}

/* The head input of the last evaluation in the form the head's kind reads
 * (what head_dense passes). */
static llm_vin last_head_in(llm_engine *e) {
    const llm_act *in = &e->s.col[e->head_col].head_in;
    if (e->w.head.w.kind == LLM_IMAGE_KIND_Q4) {
        const llm_vin vin = {NULL, in->q, in->scale, NULL, NULL};
        return vin;
    }
    return act_in(e, e->head_col, 1, &e->w.head.w);
}

/* Whether (v, id) comes before (bv, best) in the sampler's order: larger
 * value first, lower id on a tie (best < 0: nothing chosen yet). */
static int beats(float v, int32_t id, float bv, int32_t best) {
    return best < 0 || v > bv || (v == bv && id < best);
}

static int skipped(const uint8_t *skip, uint32_t id) {
    return skip != NULL && ((skip[id >> 3] >> (id & 7u)) & 1u) != 0;
}

llm_status llm_best_of(llm_engine *e, const int32_t *ids, uint32_t n, const uint8_t *skip,
                       int32_t *best, llm_error *err) {
    if (e == NULL || best == NULL || (ids != NULL && n == 0) || (ids == NULL && n != 0))
        return llm_fail(err, LLM_E_ARG, "llm_best_of: no engine, no output, or no token ids");
    const uint32_t V = e->cfg.vocab_out;
    for (uint32_t i = 0; ids != NULL && i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= V)
            return llm_fail(err, LLM_E_ARG, "token id %ld is not a head row (0..%lu)",
                            (long)ids[i], (unsigned long)V - 1u);
    if (!e->have_head)
        return llm_fail(err, LLM_E_STATE, "no head evaluation yet: prefill or step first");
    /* every id: the dense head once (or the logits it already wrote) */
    const float *logits = ids == NULL || e->have_logits ? llm_logits(e) : NULL;
    llm_vin in = {NULL, NULL, 0.0f, NULL, NULL};
    if (logits == NULL) in = last_head_in(e);
    const uint32_t count = ids == NULL ? V : n;
    int32_t chosen = -1;
    float top = 0.0f;
    for (uint32_t i = 0; i < count; i++) {
        const int32_t id = ids == NULL ? (int32_t)i : ids[i];
        if (skipped(skip, (uint32_t)id)) continue;
        const float v = logits != NULL ? logits[id] : llm_head_row(&e->w.head, &in, (uint32_t)id);
        if (v != v) return llm_fail(err, LLM_E_ARG, "logit %ld is NaN", (long)id);
        if (beats(v, id, top, chosen)) {
            chosen = id;
            top = v;
        }
    }
    if (chosen < 0)
        return llm_fail(err, LLM_E_ARG, "no candidate left: every token id given is skipped");
    *best = chosen;
    return LLM_OK;
}

static llm_status check_tokens(const llm_engine *e, const int32_t *tokens, uint32_t n,
                               llm_error *err) {
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= e->cfg.vocab_rows)
            return llm_fail(err, LLM_E_ARG, "token id %ld out of range 0..%lu", (long)tokens[i],
                            (unsigned long)e->cfg.vocab_rows - 1u);
    return LLM_OK;
}

static llm_status check_room(const llm_engine *e, uint32_t n, llm_error *err) {
    if ((uint64_t)e->pos + n > e->cfg.seq_len)
        return llm_fail(err, LLM_E_CONTEXT, "%lu tokens at position %lu exceed the context "
                        "of %lu positions", (unsigned long)n, (unsigned long)e->pos,
                        (unsigned long)e->cfg.seq_len);
    return LLM_OK;
}

llm_status llm_prefill(llm_engine *e, const int32_t *tokens, uint32_t n, int32_t *next,
                       llm_error *err) {
    if (e == NULL || next == NULL || (tokens == NULL && n > 0))
        return llm_fail(err, LLM_E_ARG, "llm_prefill: NULL argument");
    if (n == 0) return llm_fail(err, LLM_E_ARG, "llm_prefill: no tokens");
    /* check everything before touching the state: a failed call changes nothing */
    llm_status st = check_room(e, n, err);
    if (st == LLM_OK) st = check_tokens(e, tokens, n, err);
    if (st != LLM_OK) return st;
    uint64_t t0 = now(e);
    /* the prompt in passes of up to n_cols tokens, the head for the last one;
     * an interrupt between passes undoes the call (the cache is append-only,
     * the last evaluation's head input is untouched: nothing to restore but
     * the position and the stream) */
    const uint32_t pos0 = e->pos;
    const llm_rng rng0 = e->rng;
    const llm_stats stats0 = e->stats;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n;) {
        if (i > 0 && e->interrupt_poll != NULL && e->interrupt_poll(e->interrupt_ctx)) {
            e->pos = pos0;
            e->rng = rng0;
            /* the counters too, but the time spent stays spent */
            uint64_t spent[LLM_STAGE_COUNT];
            memcpy(spent, e->stats.stage_us, sizeof spent);
            e->stats = stats0;
            memcpy(e->stats.stage_us, spent, sizeof spent);
            return llm_fail(err, LLM_E_INTERRUPTED, "prefill interrupted after %lu of %lu "
                            "tokens: nothing was kept", (unsigned long)i, (unsigned long)n);
        }
        uint32_t m = n - i < e->s.n_cols ? n - i : e->s.n_cols;
        forward(e, tokens + i, m, i + m == n ? OUT_LAST : OUT_NONE);
        for (uint32_t c = 0; c < m; c++)
            e->s.rng_at[++e->pos] = e->rng; /* positions inside a prompt: no draw yet */
        last = m - 1u;
        i += m;
    }
    st = select_next(e, last, next, err);
    e->s.rng_at[e->pos] = e->rng;
    note_pass(e, e->pos, last, 1);
    e->stats.prefill_tokens = n;
    e->stats.prefill_us = now(e) - t0;
    return st == LLM_OK ? llm_engine_ok(err) : st;
}

llm_status LLM_HOT llm_step(llm_engine *e, int32_t token, int32_t *next, llm_error *err) {
    if (e == NULL || next == NULL) return llm_fail(err, LLM_E_ARG, "llm_step: NULL argument");
    if (e->pos >= e->cfg.seq_len)
        return llm_fail(err, LLM_E_CONTEXT, "all %lu positions used (reset first)",
                        (unsigned long)e->cfg.seq_len);
    llm_status st = check_tokens(e, &token, 1, err);
    if (st != LLM_OK) return st;
    forward(e, &token, 1, OUT_LAST);
    e->pos++;
    st = select_next(e, 0, next, err);
    e->s.rng_at[e->pos] = e->rng;
    note_pass(e, e->pos, 0, 1);
    return st == LLM_OK ? llm_engine_ok(err) : st;
}

llm_status llm_verify(llm_engine *e, const int32_t *tokens, uint32_t m, int32_t *next,
                      llm_error *err) {
    if (e == NULL || next == NULL || tokens == NULL)
        return llm_fail(err, LLM_E_ARG, "llm_verify: NULL argument");
    if (m == 0 || m > LLM_VERIFY_MAX)
        return llm_fail(err, LLM_E_ARG, "llm_verify: %lu tokens, a pass takes 1..%u",
                        (unsigned long)m, (unsigned)LLM_VERIFY_MAX);
    llm_status st = check_room(e, m, err);
    if (st == LLM_OK) st = check_tokens(e, tokens, m, err);
    if (st != LLM_OK) return st;
    /* passes of n_cols positions (all of them when the batch buffers were
     * placed); each position's head in order, so the sampler's stream sees the
     * same draws as m steps */
    for (uint32_t i = 0; i < m;) {
        uint32_t n = m - i < e->s.n_cols ? m - i : e->s.n_cols;
        forward(e, tokens + i, n, OUT_ALL);
        note_pass(e, e->pos + 1u, 0, n);
        if (n > 1u && certify_many(e, n, &st, err)) {
            /* one scan found every position's candidates; the draws still go
             * position by position, in order */
            for (uint32_t c = 0; c < n && st == LLM_OK; c++) {
                uint64_t t = now(e);
                e->pos++;
                note_evaluation(e, c);
                st = llm_sample_candidates(&e->s.cands[c], &e->sampler, &e->rng, &next[i + c],
                                           err);
                e->s.rng_at[e->pos] = e->rng;
                lap(e, LLM_STAGE_SAMPLE, &t);
            }
            if (st != LLM_OK) return st;
        } else {
            for (uint32_t c = 0; c < n; c++) {
                e->pos++;
                st = select_next(e, c, &next[i + c], err);
                e->s.rng_at[e->pos] = e->rng;
                if (st != LLM_OK) return st;
            }
        }
        i += n;
    }
    return llm_engine_ok(err);
}
