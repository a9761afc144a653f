/*
 * Scalar reference kernels (kernels.h). Always compiled, on the board too, so
 * the PIE twins can be checked against them at run time. On a PC (simd.h's
 * LLM_SIMD) the fp32 and int8 matvecs run four rows at a time in the host's
 * vector registers, each row's sums in the contract's order: the same bits.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "hot.h"
#include "kernels.h"
#include "simd.h"

#include <float.h>

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "round_half_even needs FLT_EVAL_METHOD == 0 (plain float32 arithmetic)"
#endif

/* Round half to even without libm: for |v| <= 2^22, adding 1.5*2^23 moves v
 * to a binade whose spacing is 1, so the IEEE add itself rounds v to an
 * integer (to nearest, ties to even: the default mode on the host and the
 * only mode of the S3 FPU), and subtracting the constant back is exact. This
 * equals lrintf(v) for every such v; the engine only feeds |v| <= 127. Needs
 * float arithmetic in float (FLT_EVAL_METHOD 0: x86-64 SSE, Xtensa) and no
 * -ffast-math (which would cancel the two constants). Saves the libm call
 * (about 0.4 ms/token measured upstream on the S3). */
static inline float round_half_even(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (v + magic) - magic;
}

/* Contract: xmax starts at 1e-8f and takes max|x_i| in index order (a strict
 * `>` so the first of equal maxima wins, which cannot change the value);
 * inv = 127.f/xmax; q_i = x_i*inv rounded half to even (what lrintf does in
 * the default mode), clamped to [-127, 127]; *xscale = xmax/127.f. Clamping
 * before rounding gives the same integers as clamping after (127 and -127 are
 * integers), and keeps the rounding trick inside its range. One span: the
 * whole vector (llm_quantize_act) or one group (llm_quantize_act_groups). */
static inline void quantize_span(const float *x, uint32_t n, int8_t *xq, float *xscale) {
    float xmax = 1e-8f;
    for (uint32_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > xmax) xmax = a;
    }
    float inv = 127.f / xmax;
    for (uint32_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        /* NaN (a broken model) maps to 0; the comparisons below are false for it */
        if (v != v) v = 0.0f;
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        xq[i] = (int8_t)round_half_even(v);
    }
    *xscale = xmax / 127.f;
}

/* Entries n..n_padded-1 are 0. */
void LLM_HOT llm_quantize_act(const float *x, uint32_t n, uint32_t n_padded, int8_t *xq,
                      float *xscale) {
    quantize_span(x, n, xq, xscale);
    for (uint32_t i = n; i < n_padded; i++) xq[i] = 0;
}

/* Contract (kernels.h): quantize_span on each group alone. */
void llm_quantize_act_groups(const float *x, uint32_t n, uint32_t group,
                                     uint32_t n_padded, int8_t *xq, float *xscale) {
    if (group == 0 || group > n) group = n;
    uint32_t k = 0;
    for (uint32_t j = 0; j < n; j += group, k++)
        quantize_span(x + j, n - j < group ? n - j : group, xq + j, &xscale[k]);
    if (n == 0) xscale[0] = 1e-8f / 127.f;
    for (uint32_t i = n; i < n_padded; i++) xq[i] = 0;
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

/* Contract (kernels.h): each column is the single-vector kernel's result. */
void llm_matvec_q4_cols_ref(const llm_q4 *w, const int8_t *const *xq, const float *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end) {
    for (uint32_t c = 0; c < m; c++) llm_matvec_q4_ref(w, xq[c], xscale[c], y[c], row_begin, row_end);
}

/* Contract (kernels.h): out[r] = exact int32 sum over j < n of
 * a[r*n + j] * x[j]; n a multiple of 16, a and x 16-byte aligned. */
void llm_matvec_s8_ref(const int8_t *a, uint32_t rows, uint32_t n, const int8_t *x,
                       int32_t *out) {
    for (uint32_t r = 0; r < rows; r++) {
        const int8_t *row = a + (size_t)r * n;
        int32_t acc = 0;
        for (uint32_t j = 0; j < n; j++) acc += (int32_t)row[j] * (int32_t)x[j];
        out[r] = acc;
    }
}

/* The host build's wider vector units: the kernels below are compiled twice
 * on x86-64 Linux (AVX2 and the baseline) and the loader picks one per CPU.
 * Integer sums are exact and every float lane keeps its own order, so both
 * clones give the same bits (no FMA: -ffp-contract=off, and AVX2 alone does
 * not enable it). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define LLM_WIDE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LLM_WIDE_CLONES
#endif

/* One Q8 group's exact dot: int8 x int8 in int32 (|sum| <= 127*127*group).
 * size_t indices: with 32-bit ones the compiler must allow for j wrapping
 * and gives up vectorizing (integer sums are exact in any order, so it may
 * vectorize freely). */
static inline int32_t dot_s8(const int8_t *a, const int8_t *b, size_t n) {
    int32_t g = 0;
    for (size_t j = 0; j < n; j++) g += (int32_t)a[j] * (int32_t)b[j];
    return g;
}

#if LLM_SIMD && defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
/* Four rows at once with SSE2 (every x86-64; both clones). Each group's four
 * exact int32 dots come from pmaddwd on the codes widened to int16 (the
 * products and their pairwise sums are exact in int32, and integer sums
 * give the same value in any order), reduced for the four rows together;
 * then lane q runs row q's float steps, acc += ((float)g * scale) * xscale,
 * in group order: the scalar loop's operations, so its bits. Groups are
 * whole 16-byte steps (kernels.h: multiples of 32 bytes). */
#define LLM_Q8_ROWS4 1

static inline __m128i s8_lo16(__m128i v) { return _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8); }
static inline __m128i s8_hi16(__m128i v) { return _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8); }

static inline __m128i s8_dot16(const int8_t *a, __m128i xl, __m128i xh) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)a);
    return _mm_add_epi32(_mm_madd_epi16(s8_lo16(v), xl), _mm_madd_epi16(s8_hi16(v), xh));
}

static inline void rows4_q8(const llm_q8 *w, uint32_t r, const int8_t *xq, const float *xscale,
                            uint32_t group, float *y) {
    const uint32_t width = w->row_bytes, ng = w->n_groups;
    const int8_t *row = w->codes + (size_t)r * width;
    const float *sc = w->scales + (size_t)r * ng;
    llm_f4 acc = llm_f4_splat(0.f);
    uint32_t k = 0;
    for (uint32_t j0 = 0; j0 < width; j0 += group, k++) {
        const uint32_t end = j0 + group < width ? j0 + group : width;
        __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
        for (uint32_t j = j0; j < end; j += 16u) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(xq + j));
            const __m128i xl = s8_lo16(x), xh = s8_hi16(x);
            s0 = _mm_add_epi32(s0, s8_dot16(row + j, xl, xh));
            s1 = _mm_add_epi32(s1, s8_dot16(row + width + j, xl, xh));
            s2 = _mm_add_epi32(s2, s8_dot16(row + 2u * width + j, xl, xh));
            s3 = _mm_add_epi32(s3, s8_dot16(row + 3u * width + j, xl, xh));
        }
        /* lane q of g: the sum of s_q's four lanes */
        const __m128i u0 = _mm_add_epi32(_mm_unpacklo_epi32(s0, s1), _mm_unpackhi_epi32(s0, s1));
        const __m128i u1 = _mm_add_epi32(_mm_unpacklo_epi32(s2, s3), _mm_unpackhi_epi32(s2, s3));
        const __m128i g = _mm_add_epi32(_mm_unpacklo_epi64(u0, u1), _mm_unpackhi_epi64(u0, u1));
        llm_f4 gf;
        const __m128 gc = _mm_cvtepi32_ps(g); /* rounds as (float)g does */
        memcpy(&gf, &gc, sizeof gf);
        const llm_f4 scale = {sc[k], sc[ng + k], sc[2u * ng + k], sc[3u * ng + k]};
        acc += (gf * scale) * xscale[k];
    }
    llm_f4_store(y + r, acc);
}
#endif

/* Contract (kernels.h): per group an exact int32 dot, then acc += ((float)g *
 * scale) * xscale in group order. Padded columns are zero in both operands. */
LLM_WIDE_CLONES
void llm_matvec_q8_ref(const llm_q8 *w, const int8_t *xq, const float *xscale, float *y,
                       uint32_t row_begin, uint32_t row_end) {
    const uint32_t width = w->row_bytes;
    uint32_t group = w->group >= w->cols ? width : w->group;
    if (group == 0) group = width; /* contract broken: never hang */
    uint32_t r = row_begin;
#ifdef LLM_Q8_ROWS4
    if (width % 16u == 0 && group % 16u == 0)
        for (; r + 4u <= row_end; r += 4u) rows4_q8(w, r, xq, xscale, group, y);
#endif
    for (; r < row_end; r++) {
        const int8_t *row = w->codes + (size_t)r * w->row_bytes;
        const float *sc = w->scales + (size_t)r * w->n_groups;
        float acc = 0.f;
        uint32_t k = 0;
        for (uint32_t j0 = 0; j0 < width; j0 += group, k++) {
            const uint32_t n = (j0 + group < width ? j0 + group : width) - j0;
            const int32_t g = dot_s8(row + j0, xq + j0, n);
            acc += ((float)g * sc[k]) * xscale[k];
        }
        y[r] = acc;
    }
}

void llm_matvec_q8_cols_ref(const llm_q8 *w, const int8_t *const *xq, const float *const *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end) {
    for (uint32_t c = 0; c < m; c++) llm_matvec_q8_ref(w, xq[c], xscale[c], y[c], row_begin, row_end);
}

/* Contract (kernels.h): eight lane sums in ascending column order, combined in
 * a fixed tree. The eight lanes are one vector (GCC/clang vector extension:
 * lane-wise multiply, then lane-wise add, no reassociation and no FMA under
 * -ffp-contract=off), so the host runs them as SIMD lanes and each lane's
 * order is the contract's by construction; four rows at a time so each load
 * of x serves four rows. The tail is one more step of zeros past cols (+0.f
 * leaves a lane's bits alone: a lane starts at +0.f, so it is never -0.f). */
typedef float llm_v4f __attribute__((vector_size(16)));

/* Lanes 0-3 and 4-7 of one row's sum (two 16-byte vectors: no ABI question
 * on any target, and an AVX2 build joins them where it pays). */
typedef struct llm_lanes {
    llm_v4f lo, hi;
} llm_lanes;

static inline llm_v4f v4_load(const float *p) {
    llm_v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* lanes += w[j..j+8) * x[j..j+8), lane by lane. */
static inline void lanes_step(llm_lanes *a, const float *w, const float *x) {
    a->lo += v4_load(w) * v4_load(x);
    a->hi += v4_load(w + 4) * v4_load(x + 4);
}

/* The same for columns [j, cols) of row w, zero past cols. */
static inline void lanes_tail(llm_lanes *a, const float *w, const float *x, size_t j,
                              size_t cols) {
    float tw[LLM_F32_LANES] = {0.f}, tx[LLM_F32_LANES] = {0.f};
    for (size_t k = 0; j + k < cols; k++) {
        tw[k] = w[j + k];
        tx[k] = x[j + k];
    }
    lanes_step(a, tw, tx);
}

static inline float lanes_sum(const llm_lanes *a) {
    return ((a->lo[0] + a->lo[1]) + (a->lo[2] + a->lo[3])) +
           ((a->hi[0] + a->hi[1]) + (a->hi[2] + a->hi[3]));
}

#if LLM_SIMD
/* The host's vector registers (simd.h): a row's eight lanes as one 8-float
 * vector (one AVX register, or two SSE/NEON ones), lane k still column k's
 * sum in ascending j, so lanes_step's very operations; then the contract's
 * tree for four rows at once: the rows' lanes transposed (moves only) so
 * that vector lane q adds row q's l0..l7 in the tree's order. The same bits
 * as the loop below, which the board keeps. */
typedef float llm_v8f __attribute__((vector_size(32)));

/* (a macro: a function returning a 32-byte vector has no fixed ABI without AVX) */
#define V8_MULADD(acc, w, xv)                                                                   \
    do {                                                                                       \
        llm_v8f w8_;                                                                           \
        memcpy(&w8_, (w), sizeof w8_);                                                         \
        (acc) += w8_ * (xv);                                                                   \
    } while (0)

static inline void rows4_f32(const float *w0, size_t stride, const float *x, size_t full,
                             size_t cols, float *y) {
    llm_v8f a0 = {0.f}, a1 = {0.f}, a2 = {0.f}, a3 = {0.f}; /* +0.f in every lane */
    for (size_t j = 0; j < full; j += LLM_F32_LANES) {
        llm_v8f xv;
        memcpy(&xv, x + j, sizeof xv);
        V8_MULADD(a0, w0 + j, xv);
        V8_MULADD(a1, w0 + stride + j, xv);
        V8_MULADD(a2, w0 + 2u * stride + j, xv);
        V8_MULADD(a3, w0 + 3u * stride + j, xv);
    }
    if (full < cols) { /* one more step of zeros past cols, as lanes_tail */
        float tx[LLM_F32_LANES] = {0.f}, tw[4][LLM_F32_LANES] = {{0.f}};
        for (size_t k = 0; full + k < cols; k++) {
            tx[k] = x[full + k];
            for (size_t q = 0; q < 4u; q++) tw[q][k] = w0[q * stride + full + k];
        }
        llm_v8f xv;
        memcpy(&xv, tx, sizeof xv);
        V8_MULADD(a0, tw[0], xv);
        V8_MULADD(a1, tw[1], xv);
        V8_MULADD(a2, tw[2], xv);
        V8_MULADD(a3, tw[3], xv);
    }
    llm_f4 h[4][2], lo[4], hi[4];
    memcpy(h[0], &a0, sizeof a0);
    memcpy(h[1], &a1, sizeof a1);
    memcpy(h[2], &a2, sizeof a2);
    memcpy(h[3], &a3, sizeof a3);
    llm_f4_transpose(h[0][0], h[1][0], h[2][0], h[3][0], lo); /* lo[k]: lane k of rows 0..3 */
    llm_f4_transpose(h[0][1], h[1][1], h[2][1], h[3][1], hi); /* hi[k]: lane 4 + k */
    llm_f4_store(y, ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3])));
}
#endif

LLM_WIDE_CLONES
void llm_matvec_f32_ref(const llm_f32m *w, const float *x, float *y, uint32_t row_begin,
                        uint32_t row_end) {
    const size_t cols = w->cols, full = cols - cols % LLM_F32_LANES;
    const size_t stride = w->row_floats;
    uint32_t r = row_begin;
#if LLM_SIMD
    for (; r + 4u <= row_end; r += 4u)
        rows4_f32(w->w + (size_t)r * stride, stride, x, full, cols, y + r);
#endif
    for (; r + 4u <= row_end; r += 4u) {
        const float *w0 = w->w + (size_t)r * stride;
        llm_lanes a[4];
        memset(a, 0, sizeof a); /* +0.f in every lane */
        for (size_t j = 0; j < full; j += LLM_F32_LANES)
            for (size_t q = 0; q < 4u; q++) lanes_step(&a[q], w0 + q * stride + j, x + j);
        for (size_t q = 0; q < 4u; q++) {
            if (full < cols) lanes_tail(&a[q], w0 + q * stride, x, full, cols);
            y[r + q] = lanes_sum(&a[q]);
        }
    }
    for (; r < row_end; r++) {
        const float *wr = w->w + (size_t)r * stride;
        llm_lanes a;
        memset(&a, 0, sizeof a);
        for (size_t j = 0; j < full; j += LLM_F32_LANES) lanes_step(&a, wr + j, x + j);
        if (full < cols) lanes_tail(&a, wr, x, full, cols);
        y[r] = lanes_sum(&a);
    }
}

void llm_matvec_f32_cols_ref(const llm_f32m *w, const float *const *x, uint32_t m,
                             float *const *y, uint32_t row_begin, uint32_t row_end) {
    for (uint32_t c = 0; c < m; c++) llm_matvec_f32_ref(w, x[c], y[c], row_begin, row_end);
}
