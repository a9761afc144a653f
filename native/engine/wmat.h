/*
 * A weight matrix of any of the image's matrix kinds (image_format.h: KIND_Q4,
 * KIND_Q8, KIND_F32M) and the one matvec that runs the kernel of its kind
 * (kernels.h; wmat.c). The engine and the head hold every matrix as an
 * llm_wmat, so staging, row views and byte accounting are written once for
 * all formats. The engine's hot path (hot.h) keeps its own int4 call and
 * comes here only for the other kinds, so an int4 image's instruction RAM
 * holds no code for them.
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
void llm_wmat_matvec(const llm_wmat *w, const llm_vin *const *in, uint32_t m, float *const *y,
                     uint32_t row_begin, uint32_t row_end);

/* Row r's values as floats (the embedding lookup): Q4 (code - 8) * scale,
 * Q8 (float)code * scale (one rounding each, as the numpy reference), F32M
 * the values. */
void llm_wmat_row_values(const llm_wmat *w, uint32_t r, float *out);

#endif
