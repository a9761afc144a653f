/*
 * PIE twins of kernels_ref.c (kernels.h): same signatures, same bits.
 * Written only with pie.h instruction macros plus scalar bookkeeping, so the
 * same file runs natively on the ESP32-S3 and through the exact host model.
 *
 * q register plan (numbers must be literals for the assembler):
 *   q0 weight bytes of one 32-column block     q1 0x0F in every byte
 *   q2 low nibbles (codes of cols 32b..+15)    q3 high nibbles (cols +16..+31)
 *   q4 activations 32b..32b+15                 q5 activations 32b+16..+31
 *   q6 -8 in every byte (group correction)
 *
 * Method (chosen over converting the offset-binary codes to two's complement
 * first, which costs one more vector op per block): the codes are used as
 * they are stored, unsigned 0..15,
 * so each block costs
 *   ee.vld.128.ip (weights), ee.andq (low), ee.vsr.32 + ee.andq (high),
 *   2 x ee.vmulas.s8.accx.ld.ip (the MACs, which also load both activation
 *   halves)  = 6 PIE instructions per 32 weights,
 * and sum(code*x) - 8*sum(x) = sum((code-8)*x) is restored once per group by
 * adding -8*sum(x over the group), computed once per call (not per row) with
 * the same MAC against a vector of -8s.
 *
 * Schedule: the weight load and nibble split of block k+1 sit between the
 * MACs of block k, to give the loads time. This is not complete: three places
 * do consume a register loaded by the instruction just before (a row's first
 * ee.andq reads the q0 its ee.vld.128.ip just loaded; inside a block the
 * second MAC reads the q5 the first MAC's .ld.ip just loaded; and the last
 * block's second MAC reads the q5 of the .ld.xp before it). The pipeline
 * interlocks, so this costs cycles, never bits. The activation stream wraps at the end of every row (the
 * last high-half load uses .ld.xp with a negative step), so the second MAC of
 * a row's last block already loads the first activations of the next row and
 * nothing past the vector is ever read. ACCX is read after two NOPs (pie.h);
 * sums stay far below 2^31 so rur.accx_0 is the whole value.
 *
 * SAR: ee.vsr.32 reads SAR = 4, written by SSAI at the start of every row.
 * Keep the row loop free of variable shifts, 64-bit shifts and calls (they
 * would let the compiler overwrite SAR; see pie.h).
 */
#include "hot.h"
#include "kernels.h"
#include "pie.h"

#include <stddef.h>

/* Groups handled per pass; their -8*sum(x) corrections live on the stack.
 * The release model has one group per row, so one pass. */
#define LLM_PIE_GROUP_CHUNK 32u

/* ACCX's low 32 bits once the last MAC has landed: read after two NOPs
 * (pie.h: the accumulate of a MAC is not visible to RUR before then).
 * Always inlined: the row loops must make no calls (SAR, above). */
static inline __attribute__((always_inline)) uint32_t accx_low32(void) {
    NOP();
    NOP();
    uint32_t raw;
    RUR_ACCX_0(raw);
    return raw;
}
static const uint8_t k_low_nibbles = 0x0F;
static const int8_t k_minus8 = -8;

/* corr[i] = -8 * sum of xq over group i's columns, i = 0..n-1 of this pass. */
static void LLM_HOT group_corrections(const int8_t *xq, uint32_t n, uint32_t bpg, uint32_t b0,
                              uint32_t b_end, int32_t *corr) {
    const int8_t *m8 = &k_minus8;
    const int8_t *xp = xq + 32u * b0;
    EE_VLDBC_8_IP(6, m8, 0);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t gb = b0 + i * bpg;
        uint32_t nvec = 2u * ((gb + bpg < b_end ? gb + bpg : b_end) - gb); /* even, >= 2 */
        EE_ZERO_ACCX();
        EE_VLD_128_IP(4, xp, 16);
        for (uint32_t j = 0; j + 2u < nvec; j += 2u) {
            EE_VMULAS_S8_ACCX_LD_IP(5, xp, 16, 4, 6);
            EE_VMULAS_S8_ACCX_LD_IP(4, xp, 16, 5, 6);
        }
        EE_VMULAS_S8_ACCX_LD_IP(5, xp, 16, 4, 6);
        EE_VMULAS_S8_ACCX(5, 6);
        uint32_t raw = accx_low32();
        corr[i] = (int32_t)raw;
    }
}

void LLM_HOT llm_matvec_q4_pie(const llm_q4 *w, const int8_t *xq, float xscale, float *y,
                       uint32_t row_begin, uint32_t row_end) {
    const uint32_t n_blocks = w->row_bytes / 16u;
    uint32_t bpg = w->group >= w->cols ? n_blocks : w->group / 32u;
    if (bpg == 0) bpg = 1; /* contract broken: match the reference, never hang */
    if (n_blocks == 0) {
        for (uint32_t r = row_begin; r < row_end; r++) {
            float acc = 0.f;
            y[r] = acc * xscale;
        }
        return;
    }
    const uint32_t n_groups = (n_blocks + bpg - 1u) / bpg;

    for (uint32_t g0 = 0; g0 < n_groups && row_begin < row_end; g0 += LLM_PIE_GROUP_CHUNK) {
        const uint32_t g1 = g0 + LLM_PIE_GROUP_CHUNK < n_groups ? g0 + LLM_PIE_GROUP_CHUNK
                                                                : n_groups;
        const uint32_t b0 = g0 * bpg;
        const uint32_t b_end = g1 * bpg < n_blocks ? g1 * bpg : n_blocks;
        const int first = g0 == 0, last = g1 == n_groups;
        int32_t corr[LLM_PIE_GROUP_CHUNK];
        group_corrections(xq, g1 - g0, bpg, b0, b_end, corr);
        /* the mask is (re)loaded after that call, not before: PIE registers
         * are only known to survive plain C code the compiler sees, and
         * nothing here depends on a q register kept across a call */
        const uint8_t *mask = &k_low_nibbles;
        EE_VLDBC_8_IP(1, mask, 0);

        /* activation stream of this pass: q4 holds its first 16 bytes, xp
         * points at the next 16; each row's last load steps back by `wrap` */
        const int8_t *xp = xq + 32u * b0;
        const intptr_t wrap = -(intptr_t)(32u * (b_end - b0) - 16u);
        EE_VLD_128_IP(4, xp, 16);

        for (uint32_t r = row_begin; r < row_end; r++) {
            const uint8_t *wp = w->codes + (size_t)r * w->row_bytes + 16u * b0;
            const float *sc = w->scales + (size_t)r * w->n_groups;
            float acc = first ? 0.f : y[r];
            SSAI(4);
            EE_VLD_128_IP(0, wp, 16);
            EE_ANDQ(2, 0, 1);
            EE_VSR_32(3, 0);
            EE_ANDQ(3, 3, 1);
            for (uint32_t gi = g0; gi < g1; gi++) {
                const uint32_t gb = gi * bpg;
                const uint32_t ge = gb + bpg < b_end ? gb + bpg : b_end;
                EE_ZERO_ACCX();
                for (uint32_t b = gb; b < ge; b++) {
                    if (b + 1u < b_end) {
                        EE_VMULAS_S8_ACCX_LD_IP(5, xp, 16, 2, 4);
                        EE_VLD_128_IP(0, wp, 16);
                        EE_VMULAS_S8_ACCX_LD_IP(4, xp, 16, 3, 5);
                        EE_ANDQ(2, 0, 1);
                        EE_VSR_32(3, 0);
                        EE_ANDQ(3, 3, 1);
                    } else {
                        EE_VMULAS_S8_ACCX_LD_XP(5, xp, wrap, 2, 4);
                        EE_VMULAS_S8_ACCX_LD_IP(4, xp, 16, 3, 5);
                    }
                }
                uint32_t raw = accx_low32();
                /* exact: the true group sum fits int32, so wrapping adds are exact */
                const int32_t g = (int32_t)(raw + (uint32_t)corr[gi - g0]);
                acc += (float)g * sc[gi];
            }
            y[r] = last ? acc * xscale : acc;
        }
    }
}

/* Contract in kernels.h. For a row of one group and nb <= 3 blocks the row's
 * weights are split once into q0..q5 (low / high nibbles of each block) and
 * every column then costs zero.accx, 2*nb MACs whose fused loads stream its
 * activations through q6/q7, and the ACCX read: the weights are fetched once
 * for all m columns. Each column's sum, its -8*sum(x) correction and the two
 * float roundings are the single-vector kernel's, so the bits are too.
 * SAR = 4 is set right before the row's shifts; q6 holds the nibble mask only
 * until the split (it is reloaded every row: no q register lives across a C
 * call or a row). */
void llm_matvec_q4_cols_pie(const llm_q4 *w, const int8_t *const *xq, const float *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end) {
    const uint32_t nb = w->row_bytes / 16u;
    const int resident = w->n_groups == 1u && nb >= 1u && nb <= 3u && m <= LLM_MATVEC_MAX_COLS;
    if (!resident) {
        for (uint32_t c = 0; c < m; c++) llm_matvec_q4_pie(w, xq[c], xscale[c], y[c], row_begin, row_end);
        return;
    }
    int32_t corr[LLM_MATVEC_MAX_COLS];
    for (uint32_t c = 0; c < m; c++)
        group_corrections(xq[c], 1u, nb, 0u, nb, &corr[c]);
    const uint8_t *mask = &k_low_nibbles;
    for (uint32_t r = row_begin; r < row_end; r++) {
        const uint8_t *wp = w->codes + (size_t)r * w->row_bytes;
        const float sc = w->scales[r];
        EE_VLDBC_8_IP(6, mask, 0);
        SSAI(4);
        EE_VLD_128_IP(7, wp, 16);
        EE_ANDQ(0, 7, 6);
        EE_VSR_32(7, 7);
        EE_ANDQ(1, 7, 6);
        if (nb > 1u) {
            EE_VLD_128_IP(7, wp, 16);
            EE_ANDQ(2, 7, 6);
            EE_VSR_32(7, 7);
            EE_ANDQ(3, 7, 6);
        }
        if (nb > 2u) {
            EE_VLD_128_IP(7, wp, 16);
            EE_ANDQ(4, 7, 6);
            EE_VSR_32(7, 7);
            EE_ANDQ(5, 7, 6);
        }
        for (uint32_t c = 0; c < m; c++) {
            const int8_t *xp = xq[c];
            EE_ZERO_ACCX();
            EE_VLD_128_IP(6, xp, 16);
            if (nb == 1u) {
                EE_VMULAS_S8_ACCX_LD_IP(7, xp, 16, 0, 6);
                EE_VMULAS_S8_ACCX(1, 7);
            } else if (nb == 2u) {
                EE_VMULAS_S8_ACCX_LD_IP(7, xp, 16, 0, 6);
                EE_VMULAS_S8_ACCX_LD_IP(6, xp, 16, 1, 7);
                EE_VMULAS_S8_ACCX_LD_IP(7, xp, 16, 2, 6);
                EE_VMULAS_S8_ACCX(3, 7);
            } else {
                EE_VMULAS_S8_ACCX_LD_IP(7, xp, 16, 0, 6);
                EE_VMULAS_S8_ACCX_LD_IP(6, xp, 16, 1, 7);
                EE_VMULAS_S8_ACCX_LD_IP(7, xp, 16, 2, 6);
                EE_VMULAS_S8_ACCX_LD_IP(6, xp, 16, 3, 7);
                EE_VMULAS_S8_ACCX_LD_IP(7, xp, 16, 4, 6);
                EE_VMULAS_S8_ACCX(5, 7);
            }
            uint32_t raw = accx_low32();
            /* exact: the true sum fits int32, so the wrapping add is exact */
            const int32_t g = (int32_t)(raw + (uint32_t)corr[c]);
            float acc = 0.f;
            acc += (float)g * sc;
            y[c][r] = acc * xscale[c];
        }
    }
}

/* Contract in kernels.h (n a multiple of 16, a and x 16-byte aligned). Each
 * row is one ACCX sum; loads alternate q0/q1 and q2/q3 so a MAC's fused load
 * fetches the next pair while it multiplies the current one. */
void LLM_HOT llm_matvec_s8_pie(const int8_t *a, uint32_t rows, uint32_t n, const int8_t *x,
                       int32_t *out) {
    const uint32_t m = n / 16u;
    for (uint32_t r = 0; r < rows; r++) {
        if (m == 0) {
            out[r] = 0;
            continue;
        }
        const int8_t *ap = a + (size_t)r * n;
        const int8_t *xp = x;
        EE_ZERO_ACCX();
        EE_VLD_128_IP(0, ap, 16);
        EE_VLD_128_IP(1, xp, 16);
        uint32_t i = 1;
        for (; i + 1u < m; i += 2u) {
            EE_VMULAS_S8_ACCX_LD_IP(2, ap, 16, 0, 1);
            EE_VLD_128_IP(3, xp, 16);
            EE_VMULAS_S8_ACCX_LD_IP(0, ap, 16, 2, 3);
            EE_VLD_128_IP(1, xp, 16);
        }
        if (i < m) {
            EE_VMULAS_S8_ACCX_LD_IP(2, ap, 16, 0, 1);
            EE_VLD_128_IP(3, xp, 16);
            EE_VMULAS_S8_ACCX(2, 3);
        } else {
            EE_VMULAS_S8_ACCX(0, 1);
        }
        uint32_t raw = accx_low32();
        out[r] = (int32_t)raw;
    }
}

/* ---- int8 groups (Q8_0) ---------------------------------------------------
 * Contract in kernels.h. Each group is one ACCX sum of signed int8 products:
 * the codes are two's complement already, so there is no nibble split and no
 * correction, 16 columns per ee.vmulas.s8.accx; the weight loads alternate
 * q0/q2 and the activation loads q1/q3 (the MAC's fused load brings the next
 * activations while it multiplies). A group is a multiple of 32 columns, or
 * the whole padded row, so it is an even number (>= 2) of 16-byte vectors.
 * The float steps per group are the reference's, in the same order. */
void llm_matvec_q8_pie(const llm_q8 *w, const int8_t *xq, const float *xscale, float *y,
                               uint32_t row_begin, uint32_t row_end) {
    const uint32_t width = w->row_bytes;
    uint32_t group = w->group >= w->cols ? width : w->group;
    if (group == 0) group = width; /* contract broken: match the reference, never hang */
    for (uint32_t r = row_begin; r < row_end; r++) {
        const int8_t *wp = w->codes + (size_t)r * w->row_bytes;
        const int8_t *xp = xq;
        const float *sc = w->scales + (size_t)r * w->n_groups;
        float acc = 0.f;
        uint32_t k = 0;
        for (uint32_t j0 = 0; j0 < width; j0 += group, k++) {
            const uint32_t nvec = ((j0 + group < width ? j0 + group : width) - j0) / 16u;
            EE_ZERO_ACCX();
            EE_VLD_128_IP(0, wp, 16);
            EE_VLD_128_IP(1, xp, 16);
            for (uint32_t v = 0; v + 2u < nvec; v += 2u) {
                EE_VLD_128_IP(2, wp, 16);
                EE_VMULAS_S8_ACCX_LD_IP(3, xp, 16, 0, 1);
                EE_VLD_128_IP(0, wp, 16);
                EE_VMULAS_S8_ACCX_LD_IP(1, xp, 16, 2, 3);
            }
            EE_VLD_128_IP(2, wp, 16);
            EE_VMULAS_S8_ACCX_LD_IP(3, xp, 16, 0, 1);
            EE_VMULAS_S8_ACCX(2, 3);
            const int32_t g = (int32_t)accx_low32();
            acc += ((float)g * sc[k]) * xscale[k];
        }
        y[r] = acc;
    }
}

/* Contract in kernels.h: each column runs the single-vector kernel. */
void llm_matvec_q8_cols_pie(const llm_q8 *w, const int8_t *const *xq, const float *const *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end) {
    for (uint32_t c = 0; c < m; c++) llm_matvec_q8_pie(w, xq[c], xscale[c], y[c], row_begin, row_end);
}

/* ---- fp32 -----------------------------------------------------------------
 * The S3 has no float SIMD: this is the scalar FPU's flavour of the contract,
 * eight named accumulators (registers), the eight products of a step issued
 * lane after lane. Each lane sees its own products in ascending column order,
 * as the reference's lane array does, so the bits are the same. */
void llm_matvec_f32_pie(const llm_f32m *w, const float *x, float *y, uint32_t row_begin,
                                uint32_t row_end) {
    const uint32_t cols = w->cols, full = cols - cols % LLM_F32_LANES;
    for (uint32_t r = row_begin; r < row_end; r++) {
        const float *wr = w->w + (size_t)r * w->row_floats;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f, a4 = 0.f, a5 = 0.f, a6 = 0.f, a7 = 0.f;
        uint32_t j = 0;
        for (; j < full; j += 8u) {
            a0 += wr[j] * x[j];
            a1 += wr[j + 1u] * x[j + 1u];
            a2 += wr[j + 2u] * x[j + 2u];
            a3 += wr[j + 3u] * x[j + 3u];
            a4 += wr[j + 4u] * x[j + 4u];
            a5 += wr[j + 5u] * x[j + 5u];
            a6 += wr[j + 6u] * x[j + 6u];
            a7 += wr[j + 7u] * x[j + 7u];
        }
        /* the tail: lane k takes column full + k */
        const uint32_t t = cols - full;
        if (t > 0u) a0 += wr[j] * x[j];
        if (t > 1u) a1 += wr[j + 1u] * x[j + 1u];
        if (t > 2u) a2 += wr[j + 2u] * x[j + 2u];
        if (t > 3u) a3 += wr[j + 3u] * x[j + 3u];
        if (t > 4u) a4 += wr[j + 4u] * x[j + 4u];
        if (t > 5u) a5 += wr[j + 5u] * x[j + 5u];
        if (t > 6u) a6 += wr[j + 6u] * x[j + 6u];
        y[r] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    }
}

void llm_matvec_f32_cols_pie(const llm_f32m *w, const float *const *x, uint32_t m,
                             float *const *y, uint32_t row_begin, uint32_t row_end) {
    for (uint32_t c = 0; c < m; c++) llm_matvec_f32_pie(w, x[c], y[c], row_begin, row_end);
}
