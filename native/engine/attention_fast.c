/*
 * Fast mode (llm.h llm_set_fast): attention over an int8 KV cache. LOSSY:
 * the only part of the engine that does not follow the numerics contract, so
 * it is off unless asked for, and a quality gate (bench.py --fast --quality)
 * rather than a bit gate checks it.
 *
 * Why: in exact mode every cached K row is 4 bytes per value and every score
 * a scalar float dot, and at 100+ positions attention is the S3's largest
 * stage after the head. Here a K row of a head is head_dim int8 values
 * (padded to 16) with one scale, scored for every position at once by the
 * PIE int8 matrix x vector kernel; V is stored transposed (one row per value
 * index, positions along it) so the weighted sum is the same kernel against
 * the int8-quantized weights; and softmax uses a cheap exp.
 *
 * Per layer l, kv head h, position t (Dhp = head_dim rounded up to 16, Sp =
 * seq_len rounded up to 16):
 *   kq[l][h][t][Dhp], ks[l][h][t]   k_h quantized (llm_quantize_act), scale
 *   vt[l][h][i][Sp],  vs[l][h][t]   v_h quantized, value i of position t at
 *                                   vt[..][i][t]
 * For query head h (reading kv head h / (n_heads / n_kv_heads), as exact
 * attention) at position p: q_h quantized (scale sq);
 *   score_t = ((float)dot(qq, kq_t) * (sq * ks_t)) * inv_sqrt(head_dim)
 *   w_t = fast_exp(score_t - max), den = sum of w_t
 *   u_t = w_t * vs_t quantized to int8 (scale su), zero past p
 *   att_i = ((float)dot(u, vt_i) * su) / den
 * All of it lives in the exact cache's arrays before the sampler's stream
 * states (fast mode is chosen at position 0, so nothing there is live): the
 * K rows, the V rows and the scales, which llm_open makes at least
 * llm_fast_kv_need bytes.
 */
#include <string.h>

#include "align_up.h"
#include "engine_state.h"
#include "llm_error.h"
#include "kernels.h"
#include "mathf.h"

/* The fast arrays' layout in `base`; returns the bytes needed (in 64 bits:
 * on a 32-bit host a large config must not wrap to a small need). */
static uint64_t layout(const llm_config *c, llm_fast_kv *f, uint8_t *base) {
    const uint64_t L = c->n_layers, H = c->n_heads, KVH = c->n_kv_heads, S = c->seq_len;
    const uint64_t dhp = llm_align_up(c->head_dim, 16u), sp = llm_align_up(c->seq_len, 16u);
    uint64_t at = 0;
#define TAKE(field, type, count)                                         \
    do {                                                                 \
        if (base) f->field = (type *)(void *)(base + (size_t)at);        \
        at = llm_align_up(at + (uint64_t)(count) * sizeof(type), 16u);   \
    } while (0)
    TAKE(kq, int8_t, L * KVH * S * dhp);
    TAKE(vt, int8_t, L * KVH * c->head_dim * sp);
    TAKE(ks, float, L * KVH * S);
    TAKE(vs, float, L * KVH * S);
    TAKE(qq, int8_t, (size_t)LLM_BATCH_MAX * H * dhp);
    TAKE(uq, int8_t, (size_t)LLM_BATCH_MAX * H * sp);
    TAKE(dots, int32_t, (size_t)LLM_BATCH_MAX * H * S);
#undef TAKE
    f->dhp = (uint32_t)dhp;
    f->sp = (uint32_t)sp;
    return at;
}

uint64_t llm_fast_kv_need(const llm_config *c) {
    llm_fast_kv f;
    return layout(c, &f, NULL);
}

llm_status llm_fast_fits(const llm_engine *e, llm_error *err) {
    if (e == NULL) return llm_fail(err, LLM_E_ARG, "llm_fast_fits: NULL engine");
    const size_t have = (size_t)((const uint8_t *)(const void *)e->s.rng_at -
                                 (const uint8_t *)(const void *)e->s.kv_k);
    llm_fast_kv f;
    const uint64_t need = layout(&e->cfg, &f, NULL);
    if (need > (uint64_t)have)
        return llm_fail(err, LLM_E_CONFIG, "fast mode needs %lu bytes of KV cache, this "
                        "model's exact cache has %lu (head_dim %lu is too small)",
                        (unsigned long)need, (unsigned long)have,
                        (unsigned long)e->cfg.head_dim);
    return llm_engine_ok(err);
}

llm_status llm_set_fast(llm_engine *e, int fast, llm_error *err) {
    if (e == NULL) return llm_fail(err, LLM_E_ARG, "llm_set_fast: NULL engine");
    if ((fast != 0) == (e->fast != 0)) return llm_engine_ok(err);
    if (e->pos != 0)
        return llm_fail(err, LLM_E_STATE, "fast mode is chosen at position 0 (the KV cache "
                        "holds %lu positions in the other form): reset first",
                        (unsigned long)e->pos);
    if (fast && e->plain)
        return llm_fail(err, LLM_E_STATE, "plain mode is the exact reference: turn it off "
                        "before choosing fast mode");
    if (fast) {
        llm_status st = llm_fast_fits(e, err);
        if (st != LLM_OK) return st;
        const llm_config *c = &e->cfg;
        llm_fast_kv f;
        memset(&f, 0, sizeof f);
        const uint64_t need = layout(c, &f, (uint8_t *)(void *)e->s.kv_k);
        memset(e->s.kv_k, 0, (size_t)need);
        e->s.fast = f;
    }
    e->fast = fast != 0;
    return llm_engine_ok(err);
}

int llm_fast(const llm_engine *e) { return e ? e->fast : 0; }

/* exp(x) for the softmax weights (x <= 0): 2^(x log2 e) as 2^n times a
 * degree-4 polynomial in the fraction (relative error below 4e-6 on
 * [-87, 0]; below -87 the weight is 0). */
static float fast_exp(float x) {
    if (!(x >= -87.0f)) return 0.0f; /* NaN too (only a broken model makes one) */
    float t = x * 1.44269504f;
    int n = (int)t;
    if ((float)n > t) n--;
    float f = t - (float)n;
    float p = 1.0f + f * (0.693147182f + f * (0.240226507f + f * (0.0555041087f +
                                                                  f * 0.00961812911f)));
    union {
        float f;
        uint32_t u;
    } scale;
    scale.u = (uint32_t)(n + 127) << 23;
    return p * scale.f;
}

void llm_fast_store_kv(llm_engine *e, uint32_t l, uint32_t p, const float *k, const float *v) {
    const llm_config *c = &e->cfg;
    llm_fast_kv *f = &e->s.fast;
    const uint32_t H = c->n_kv_heads, Dh = c->head_dim, S = c->seq_len;
    int8_t vq[LLM_MAX_HEAD_DIM + 16u];
    for (uint32_t h = 0; h < H; h++) {
        const size_t lh = (size_t)l * H + h;
        llm_quantize_act(k + h * Dh, Dh, f->dhp, f->kq + (lh * S + p) * f->dhp, &f->ks[lh * S + p]);
        llm_quantize_act(v + h * Dh, Dh, f->dhp, vq, &f->vs[lh * S + p]);
        int8_t *vt = f->vt + lh * Dh * f->sp;
        for (uint32_t i = 0; i < Dh; i++) vt[(size_t)i * f->sp + p] = vq[i];
    }
}

void llm_fast_attention_heads(llm_engine *e, uint32_t l, uint32_t pos, uint32_t m, uint32_t h0,
                              uint32_t h1) {
    const llm_config *c = &e->cfg;
    llm_fast_kv *f = &e->s.fast;
    const uint32_t H = c->n_heads, Dh = c->head_dim, S = c->seq_len;
    const uint32_t KVH = c->n_kv_heads, group = H / KVH;
    for (uint32_t col = 0; col < m; col++) {
        llm_col *cl = &e->s.col[col];
        const uint32_t n = pos + col + 1u;          /* positions this query sees */
        const uint32_t n16 = (uint32_t)llm_align_up(n, 16u);
        for (uint32_t h = h0; h < h1; h++) {
            const size_t lh = (size_t)l * KVH + h / group; /* its kv head's arrays */
            int8_t *qq = f->qq + ((size_t)col * H + h) * f->dhp;
            int8_t *uq = f->uq + ((size_t)col * H + h) * f->sp;
            int32_t *dots = f->dots + ((size_t)col * H + h) * S;
            float *w = cl->scores + (size_t)h * S;
            const float *ks = f->ks + lh * S, *vs = f->vs + lh * S;
            float sq;
            llm_quantize_act(cl->qkv + h * Dh, Dh, f->dhp, qq, &sq);
            llm_matvec_s8(f->kq + lh * S * f->dhp, n, f->dhp, qq, dots);
            float mx = -1e30f;
            for (uint32_t t = 0; t < n; t++) {
                w[t] = ((float)dots[t] * (sq * ks[t])) * e->inv_sqrt_head_dim;
                if (w[t] > mx) mx = w[t];
            }
            /* four exps at a time: independent chains for the in-order FPU */
            uint32_t t = 0;
            for (; t + 4u <= n; t += 4u) {
#pragma GCC unroll 4
                for (uint32_t k = 0; k < 4u; k++) w[t + k] = fast_exp(w[t + k] - mx);
            }
            for (; t < n; t++) w[t] = fast_exp(w[t] - mx);
            float den = 0.0f;
            for (t = 0; t < n; t++) {
                den += w[t];
                w[t] *= vs[t]; /* the V scale folded into the weight */
            }
            float su;
            llm_quantize_act(w, n, n16, uq, &su);
            const int8_t *vt = f->vt + lh * Dh * f->sp;
            for (uint32_t i = 0; i < Dh; i++) {
                int32_t acc;
                llm_matvec_s8(vt + (size_t)i * f->sp, 1, n16, uq, &acc);
                cl->att[h * Dh + i] = ((float)acc * su) / den;
            }
        }
    }
}

uint64_t llm_fast_kv_bytes(const llm_engine *e, uint32_t positions) {
    const llm_config *c = &e->cfg;
    /* per position: its K rows and scales, one value of every V row, the V scales */
    return (uint64_t)positions * c->n_kv_heads *
           ((uint64_t)e->s.fast.dhp + c->head_dim + 2u * sizeof(float));
}
