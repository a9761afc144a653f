/*
 * Kernel family: the matvec of each weight format (int4 and int8 weights x
 * int8 activations, fp32 x fp32), int8 dot products, and the activation
 * quantizers that feed them.
 * Every matvec and dot kernel has a scalar reference (kernels_ref.c, always
 * compiled, also on the board so it can self-test) and a PIE twin
 * (kernels_pie.c) with the SAME signature and the same bits; the dispatch at
 * the bottom picks one per build. The quantizers (llm_quantize_act,
 * llm_quantize_act_groups) have no twin: every build runs kernels_ref.c's
 * scalar code, once per vector rather than once per row.
 */
#ifndef LLM_KERNELS_H
#define LLM_KERNELS_H

#include <stdint.h>

/* A matrix in the image's KIND_Q4 layout (see image_format.h): codes are
 * offset-binary nibbles in 32-column blocks, byte 16b+k = col 32b+k (low) |
 * col 32b+k+16 (high); rows are row_bytes apart and 16-byte aligned; scales
 * are f32 [rows][n_groups]. */
typedef struct llm_q4 {
    const uint8_t *codes;
    const float *scales;
    uint32_t rows, cols, group, n_groups, row_bytes;
} llm_q4;

/* Quantize x[0..n) to int8 with one scale (the numerics contract), writing xq[0..n_padded)
 * (zeros past n, so padded weight columns meet zero activations).
 * Contract: xmax = max(1e-8f, max|x_i|) in index order; inv = 127.f / xmax;
 * q_i = x_i * inv rounded half to even (what lrintf does; computed without
 * libm, kernels_ref.c) and clamped to [-127, 127];
 * *xscale = xmax / 127.f. */
void llm_quantize_act(const float *x, uint32_t n, uint32_t n_padded, int8_t *xq,
                      float *xscale);

/* y[r] for r in [row_begin, row_end): rows outside are untouched, so two cores
 * can each take a range of the same call.
 * Contract: per group, g = sum over its columns of (code-8)*xq exact in int32;
 * acc = 0.f; for each group in order acc += (float)g * scale[r][group];
 * y[r] = acc * xscale. No fused multiply-add. xq holds cols rounded up to 32
 * values (llm_quantize_act's n_padded).
 * Alignment, for both flavours (the reference does not need it, but a caller
 * that only ever ran the reference must not learn otherwise on the board):
 * xq, codes and every row (row_bytes is a multiple of 16) are 16-byte
 * aligned. The PIE flavour's 128-bit loads ignore address bits 3:0: on the S3
 * a misaligned xq or row silently gives wrong sums (the host model aborts). */
void llm_matvec_q4_ref(const llm_q4 *w, const int8_t *xq, float xscale, float *y,
                       uint32_t row_begin, uint32_t row_end);
void llm_matvec_q4_pie(const llm_q4 *w, const int8_t *xq, float xscale, float *y,
                       uint32_t row_begin, uint32_t row_end);

/* Up to LLM_MATVEC_MAX_COLS activation vectors at once (speculative decoding
 * verifies several positions in one pass over the weights; prefill feeds
 * several prompt tokens): for every c < m, y[c][r] for r in [row_begin,
 * row_end) is exactly what llm_matvec_q4(w, xq[c], xscale[c], y[c],
 * row_begin, row_end) writes, bit for bit. Every xq[c] is 16-byte aligned.
 * The PIE flavour keeps a row's weights in vector registers across the
 * columns when the row is one group of at most 3 blocks (96 columns: every
 * matrix of the release model but ple_proj), else it runs the single-vector
 * kernel per column. */
#define LLM_MATVEC_MAX_COLS 8u
void llm_matvec_q4_cols_ref(const llm_q4 *w, const int8_t *const *xq, const float *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end);
void llm_matvec_q4_cols_pie(const llm_q4 *w, const int8_t *const *xq, const float *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end);

/* int8 matrix x int8 vector: out[r] = sum_j a[r*n + j] * x[j] for r < rows,
 * exact in int32 (n <= 2^16 keeps |sum| <= 2^30). One contract for both
 * flavours: n is a multiple of 16 and a, x are 16-byte aligned (so every row
 * is). The PIE flavour's 128-bit loads ignore address bits 3:0, so breaking
 * this on the S3 silently reads the wrong bytes (the host model aborts). The
 * certified head (head.c) uses it for its tile bounds: a = the tiles' boxes,
 * x = [xq | |xq|]. */
void llm_matvec_s8_ref(const int8_t *a, uint32_t rows, uint32_t n, const int8_t *x,
                       int32_t *out);
void llm_matvec_s8_pie(const int8_t *a, uint32_t rows, uint32_t n, const int8_t *x,
                       int32_t *out);

/* ---- int8 weights in groups (Q8_0, the image's KIND_Q8) -------------------
 * The int8 and fp32 kernels are not LLM_HOT (hot.h): an int4 image never
 * runs them, so the board's instruction RAM holds only the int4 path.
 * A matrix in the image's KIND_Q8 layout: codes are int8 [rows][row_bytes]
 * (row_bytes = cols rounded up to 32, zero padded), scales f32
 * [rows][n_groups]; a group is `group` columns (a multiple of 32), or the whole
 * row when group >= cols (then n_groups == 1). Rows 16-byte aligned. */
typedef struct llm_q8 {
    const int8_t *codes;
    const float *scales;
    uint32_t rows, cols, group, n_groups, row_bytes;
} llm_q8;

/* The matvec input of a Q8 matrix: x[0..n) quantized to int8 in the SAME
 * groups as the weights, one scale per group (llm_quantize_act's contract
 * applied to each group alone): for group k = columns [k*group, min((k+1)*group,
 * n)): xmax = max(1e-8f, max|x_i| over the group) in index order, inv =
 * 127.f / xmax, q_i = x_i * inv rounded half to even (no libm) and clamped to
 * [-127, 127], xscale[k] = xmax / 127.f. group >= n: one group, the whole
 * vector. xq[n..n_padded) = 0. */
void llm_quantize_act_groups(const float *x, uint32_t n, uint32_t group, uint32_t n_padded,
                             int8_t *xq, float *xscale);

/* y[r] for r in [row_begin, row_end).
 * Contract: per group k, g_k = sum over its columns (padding included: zero
 * on both sides) of code*xq exact in int32 (|g| <= 127*127*cols_padded);
 * acc = 0.f; for each group in order acc += ((float)g_k * scale[r][k]) *
 * xscale[k] (three float roundings per group: the conversion is exact below
 * 2^24, then the two products, then the add); y[r] = acc. No fused
 * multiply-add. xq holds cols rounded up to 32 values and xscale n_groups
 * (llm_quantize_act_groups with the matrix's group). Alignment as
 * llm_matvec_q4: xq, codes and every row 16-byte aligned. */
void llm_matvec_q8_ref(const llm_q8 *w, const int8_t *xq, const float *xscale, float *y,
                       uint32_t row_begin, uint32_t row_end);
void llm_matvec_q8_pie(const llm_q8 *w, const int8_t *xq, const float *xscale, float *y,
                       uint32_t row_begin, uint32_t row_end);
/* m vectors at once: column c is exactly llm_matvec_q8(w, xq[c], xscale[c], y[c], ...). */
void llm_matvec_q8_cols_ref(const llm_q8 *w, const int8_t *const *xq, const float *const *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end);
void llm_matvec_q8_cols_pie(const llm_q8 *w, const int8_t *const *xq, const float *const *xscale,
                            uint32_t m, float *const *y, uint32_t row_begin, uint32_t row_end);

/* ---- fp32 weights (the image's KIND_F32M) ---------------------------------
 * f32 [rows][row_floats], row_floats = cols rounded up to 4 (16-byte rows),
 * zero padded; the kernels read columns < cols only, so x needs cols floats. */
typedef struct llm_f32m {
    const float *w;
    uint32_t rows, cols, row_floats;
} llm_f32m;

/* Lanes of the fp32 sum: the contract's fixed order. */
#define LLM_F32_LANES 8u

/* y[r] for r in [row_begin, row_end).
 * Contract: eight lane sums, lane k = 0.f then += w[r][j] * x[j] for j = k,
 * k + 8, k + 16, ... < cols in ascending j (each product rounded to f32, then
 * the add); y[r] = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). No fused
 * multiply-add. The lanes are independent, so a compiler may run them as SIMD
 * lanes (the host build does) and a scalar FPU in any interleaving (the S3
 * does): every lane's own order, and so every bit, stays the contract's. */
void llm_matvec_f32_ref(const llm_f32m *w, const float *x, float *y, uint32_t row_begin,
                        uint32_t row_end);
void llm_matvec_f32_pie(const llm_f32m *w, const float *x, float *y, uint32_t row_begin,
                        uint32_t row_end);
/* m vectors at once: column c is exactly llm_matvec_f32(w, x[c], y[c], ...). */
void llm_matvec_f32_cols_ref(const llm_f32m *w, const float *const *x, uint32_t m,
                             float *const *y, uint32_t row_begin, uint32_t row_end);
void llm_matvec_f32_cols_pie(const llm_f32m *w, const float *const *x, uint32_t m,
                             float *const *y, uint32_t row_begin, uint32_t row_end);

/* One matvec as a row-range job: the form a port's parallel_rows (llm.h) runs
 * on two cores. `llm_matvec_job_rows(&job, a, b)` computes rows [a, b). */
typedef struct llm_matvec_job {
    const llm_q4 *w;
    const int8_t *xq;
    float xscale;
    float *y;
} llm_matvec_job;

#if defined(LLM_KERNELS_PIE)
#define llm_matvec_q4 llm_matvec_q4_pie
#define llm_matvec_s8 llm_matvec_s8_pie
#define llm_matvec_q4_cols llm_matvec_q4_cols_pie
#define llm_matvec_q8 llm_matvec_q8_pie
#define llm_matvec_q8_cols llm_matvec_q8_cols_pie
#define llm_matvec_f32 llm_matvec_f32_pie
#define llm_matvec_f32_cols llm_matvec_f32_cols_pie
#define LLM_KERNELS_NAME "pie"
#else
#define llm_matvec_q4 llm_matvec_q4_ref
#define llm_matvec_s8 llm_matvec_s8_ref
#define llm_matvec_q4_cols llm_matvec_q4_cols_ref
#define llm_matvec_q8 llm_matvec_q8_ref
#define llm_matvec_q8_cols llm_matvec_q8_cols_ref
#define llm_matvec_f32 llm_matvec_f32_ref
#define llm_matvec_f32_cols llm_matvec_f32_cols_ref
#define LLM_KERNELS_NAME "ref"
#endif

static inline void llm_matvec_job_rows(void *arg, uint32_t row_begin, uint32_t row_end) {
    const llm_matvec_job *job = (const llm_matvec_job *)arg;
    llm_matvec_q4(job->w, job->xq, job->xscale, job->y, row_begin, row_end);
}

#endif
