/*
 * The engine: one forward pass, prefill/step/rewind, the head and the
 * sampler per evaluation, stats. Opening and placement: engine_open.c; the
 * structs: engine_state.h.
 *
 * Shaped like llama2.c's run.c: the weights (what the image gives, after
 * staging) and the run state (what one token writes) are separate structs
 * with a shape comment on every buffer, and there is exactly one forward pass
 * (`forward`). Kernels, placement, plain mode and the core split change which
 * code multiplies, where bytes live and which rows the head scores, never the
 * model arithmetic, whose operation order is the numerics contract of
 * tools/mpllm/reference.py (mirrored there, compared bit for bit by tests).
 *
 * Memory: the forward pass allocates nothing (llm_open placed it all).
 * Byte accounting (llm_stats.bytes) lives in the helpers that read the bytes
 * (matvec, the row lookups, rmsnorm, attention, the head), not between the
 * math lines.
 */
#include <math.h>
#include <string.h>

#include "engine_state.h"
#include "llm_error.h"
#include "llm_names.h"
#include "mathf.h"

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
    return llm_engine_ok(err);
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
    return st == LLM_OK ? llm_engine_ok(err) : st;
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
    return st == LLM_OK ? llm_engine_ok(err) : st;
}
