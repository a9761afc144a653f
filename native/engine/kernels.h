/*
 * Kernel family: int4-weight x int8-activation matvec and int8 dot products.
 * Every kernel has a scalar reference (kernels_ref.c, always compiled, also on
 * the board so it can self-test) and a PIE twin (kernels_pie.c) with the SAME
 * signature and the same bits. The dispatch at the bottom picks one per build.
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
#define LLM_KERNELS_NAME "pie"
#else
#define llm_matvec_q4 llm_matvec_q4_ref
#define llm_matvec_s8 llm_matvec_s8_ref
#define llm_matvec_q4_cols llm_matvec_q4_cols_ref
#define LLM_KERNELS_NAME "ref"
#endif

static inline void llm_matvec_job_rows(void *arg, uint32_t row_begin, uint32_t row_end) {
    const llm_matvec_job *job = (const llm_matvec_job *)arg;
    llm_matvec_q4(job->w, job->xq, job->xscale, job->y, row_begin, row_end);
}

#endif
