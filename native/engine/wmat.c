/*
 * The multi-format matvec and row lookup of wmat.h. Not LLM_HOT (hot.h): an
 * int4 image never comes here (the engine and the head call the int4 kernel
 * themselves), so its instruction RAM is not spent on the other formats.
 */
#include "wmat.h"

void llm_wmat_matvec(const llm_wmat *w, const llm_vin *const *in, uint32_t m, float *const *y,
                     uint32_t row_begin, uint32_t row_end) {
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

void llm_wmat_row_values(const llm_wmat *w, uint32_t r, float *out) {
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
