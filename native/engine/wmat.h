/*
 * A weight matrix of any of the image's matrix kinds (image_format.h: KIND_Q4,
 * KIND_Q8, KIND_F32M) and the one matvec that runs the kernel of its kind
 * (kernels.h). The engine and the head hold every matrix as an llm_wmat, so
 * staging, row views and byte accounting are written once for all formats.
 */
#ifndef LLM_WMAT_H
#define LLM_WMAT_H

#include <stddef.h>
#include <stdint.h>

#include "image_format.h"
#include "kernels.h"

/* data: Q4 nibbles / Q8 int8 codes / F32M values, rows row_bytes apart;
 * scales f32 [rows][n_groups] (F32M: none, n_groups 0). */
typedef struct llm_wmat {
    const uint8_t *data;
    const float *scales;
    uint32_t rows, cols, group, n_groups, row_bytes;
    uint32_t kind; /* last: no padding, the size of the llm_q4 it replaced */
} llm_wmat;

/* One matvec input in every form a kernel may take: the floats (F32M), one
 * int8 vector with one scale (Q4), and int8 in the matrix's groups with a
 * scale per group (Q8). A caller fills the forms its matrices' kinds read. */
typedef struct llm_vin {
    const float *x;
    const int8_t *q;
    float scale;
    const int8_t *q8;
    const float *q8_scale;
} llm_vin;

static inline llm_q4 llm_wmat_q4(const llm_wmat *w) {
    llm_q4 q = {w->data, w->scales, w->rows, w->cols, w->group, w->n_groups, w->row_bytes};
    return q;
}
static inline llm_q8 llm_wmat_q8(const llm_wmat *w) {
    llm_q8 q = {(const int8_t *)(const void *)w->data, w->scales, w->rows, w->cols, w->group,
                w->n_groups, w->row_bytes};
    return q;
}
static inline llm_f32m llm_wmat_f32(const llm_wmat *w) {
    llm_f32m f = {(const float *)(const void *)w->data, w->rows, w->cols, w->row_bytes / 4u};
    return f;
}

/* Rows [first, first + n) as a matrix of their own. */
static inline llm_wmat llm_wmat_rows(const llm_wmat *w, uint32_t first, uint32_t n) {
    llm_wmat v = *w;
    v.data += (size_t)first * w->row_bytes;
    if (v.scales != NULL) v.scales += (size_t)first * w->n_groups;
    v.rows = n;
    return v;
}

/* Bytes one row occupies, its scales included (what reading it costs). */
static inline uint64_t llm_wmat_row_cost(const llm_wmat *w) {
    return (uint64_t)w->row_bytes + (uint64_t)w->n_groups * sizeof(float);
}

/* y[c][r] for r in [row_begin, row_end), c < m: the kernel of w's kind on
 * in[c] (single-vector kernel for m == 1, the many-columns one else; the
 * same bits either way, kernels.h). */
static inline void llm_wmat_matvec(const llm_wmat *w, const llm_vin *const *in, uint32_t m,
                                   float *const *y, uint32_t row_begin, uint32_t row_end) {
    if (w->kind == LLM_IMAGE_KIND_F32M) {
        const llm_f32m f = llm_wmat_f32(w);
        const float *x[LLM_MATVEC_MAX_COLS];
        for (uint32_t c = 0; c < m; c++) x[c] = in[c]->x;
        if (m == 1u)
            llm_matvec_f32(&f, x[0], y[0], row_begin, row_end);
        else
            llm_matvec_f32_cols(&f, x, m, y, row_begin, row_end);
    } else if (w->kind == LLM_IMAGE_KIND_Q8) {
        const llm_q8 q = llm_wmat_q8(w);
        const int8_t *xq[LLM_MATVEC_MAX_COLS];
        const float *xs[LLM_MATVEC_MAX_COLS];
        for (uint32_t c = 0; c < m; c++) {
            xq[c] = in[c]->q8;
            xs[c] = in[c]->q8_scale;
        }
        if (m == 1u)
            llm_matvec_q8(&q, xq[0], xs[0], y[0], row_begin, row_end);
        else
            llm_matvec_q8_cols(&q, xq, xs, m, y, row_begin, row_end);
    } else {
        const llm_q4 q = llm_wmat_q4(w);
        const int8_t *xq[LLM_MATVEC_MAX_COLS];
        float xs[LLM_MATVEC_MAX_COLS];
        for (uint32_t c = 0; c < m; c++) {
            xq[c] = in[c]->q;
            xs[c] = in[c]->scale;
        }
        if (m == 1u)
            llm_matvec_q4(&q, xq[0], xs[0], y[0], row_begin, row_end);
        else
            llm_matvec_q4_cols(&q, xq, xs, m, y, row_begin, row_end);
    }
}

/* Row r's values as floats (the embedding lookup): Q4 (code - 8) * scale,
 * Q8 (float)code * scale (one rounding each, as the numpy reference), F32M
 * the values. */
static inline void llm_wmat_row_values(const llm_wmat *w, uint32_t r, float *out) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const float *sc = w->scales != NULL ? w->scales + (size_t)r * w->n_groups : NULL;
    const uint32_t group = w->group >= w->cols || w->group == 0 ? w->cols : w->group;
    for (uint32_t j = 0; j < w->cols; j++) {
        if (w->kind == LLM_IMAGE_KIND_F32M) {
            out[j] = ((const float *)(const void *)row)[j];
        } else if (w->kind == LLM_IMAGE_KIND_Q8) {
            out[j] = (float)(int8_t)row[j] * sc[j / group];
        } else {
            uint8_t byte = row[16u * (j / 32u) + (j % 16u)];
            int code = (j % 32u) < 16u ? (byte & 0x0F) : (byte >> 4);
            out[j] = (float)(code - 8) * sc[j / group];
        }
    }
}

#endif
