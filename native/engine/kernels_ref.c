/*
 * Scalar reference kernels (kernels.h). Always compiled, on the board too, so
 * the PIE twins can be checked against them at run time.
 */
#include <math.h>
#include <stddef.h>

#include "kernels.h"

/* Contract: xmax starts at 1e-8f and takes max|x_i| in index order (a strict
 * `>` so the first of equal maxima wins, which cannot change the value);
 * inv = 127.f/xmax; q_i = lrintf(x_i*inv) in the default round-half-to-even
 * mode, clamped to [-127, 127]; entries n..n_padded-1 are 0;
 * *xscale = xmax/127.f. */
void llm_quantize_act(const float *x, uint32_t n, uint32_t n_padded, int8_t *xq,
                      float *xscale) {
    float xmax = 1e-8f;
    for (uint32_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > xmax) xmax = a;
    }
    float inv = 127.f / xmax;
    for (uint32_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        /* a NaN input would make lrintf's result unspecified: map it to 0 */
        long q = v == v ? lrintf(v) : 0;
        xq[i] = (int8_t)(q > 127 ? 127 : (q < -127 ? -127 : q));
    }
    for (uint32_t i = n; i < n_padded; i++) xq[i] = 0;
    *xscale = xmax / 127.f;
}

/* Contract: per row, per group (a group is a whole number of 32-column blocks,
 * or the whole row), g = sum of (code-8)*xq over the group's columns, padded
 * columns included (their xq is 0), exact in int32 (|g| <= 8*127*cols);
 * acc = 0.f; acc += (float)g * scale[group] in group order; y = acc * xscale.
 * Two float roundings per group and one per row; no fused multiply-add
 * (built with -ffp-contract=off). */
void llm_matvec_q4_ref(const llm_q4 *w, const int8_t *xq, float xscale, float *y,
                       uint32_t row_begin, uint32_t row_end) {
    const uint32_t n_blocks = w->row_bytes / 16u;
    uint32_t blocks_per_group = w->group >= w->cols ? n_blocks : w->group / 32u;
    if (blocks_per_group == 0) blocks_per_group = 1; /* contract broken: never hang */
    for (uint32_t r = row_begin; r < row_end; r++) {
        const uint8_t *row = w->codes + (size_t)r * w->row_bytes;
        const float *sc = w->scales + (size_t)r * w->n_groups;
        float acc = 0.f;
        uint32_t gi = 0;
        for (uint32_t b0 = 0; b0 < n_blocks; b0 += blocks_per_group, gi++) {
            uint32_t b1 = b0 + blocks_per_group < n_blocks ? b0 + blocks_per_group : n_blocks;
            int32_t g = 0;
            for (uint32_t b = b0; b < b1; b++) {
                const uint8_t *blk = row + 16u * b;
                const int8_t *xa = xq + 32u * b;
                for (uint32_t k = 0; k < 16u; k++) {
                    g += ((int32_t)(blk[k] & 0x0Fu) - 8) * xa[k];
                    g += ((int32_t)(blk[k] >> 4) - 8) * xa[k + 16u];
                }
            }
            acc += (float)g * sc[gi];
        }
        y[r] = acc * xscale;
    }
}

/* Contract: exact int32 sum of a[i]*b[i] in index order (n <= 2^16 keeps it
 * far from overflow: 2^16 * 2^14 = 2^30). No alignment needed. */
int32_t llm_dot_s8_ref(const int8_t *a, const int8_t *b, uint32_t n) {
    int32_t acc = 0;
    for (uint32_t i = 0; i < n; i++) acc += (int32_t)a[i] * (int32_t)b[i];
    return acc;
}
