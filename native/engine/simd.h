/*
 * Four float lanes for the host's vector units (x86-64 SSE/AVX, ARM NEON),
 * through the GCC/clang vector extension: lane-wise + - * / and compares,
 * each lane rounding exactly as the scalar operation does (IEEE float32,
 * no reassociation, and no FMA under -ffp-contract=off). So a loop that
 * runs the scalar code's operations in the scalar code's order on each lane
 * gives its bits; only independent chains (softmax elements, attention rows,
 * the elements of a head's output) are ever put side by side.
 *
 * LLM_SIMD is 1 only where these lanes are real vector registers. Elsewhere
 * (the ESP32-S3: Xtensa, whose float unit is scalar and whose vector unit is
 * reached through the PIE kernels) it is 0 and the engine keeps its scalar
 * loops, so the board's code is unchanged. A host build with LLM_NO_SIMD
 * defined keeps them too: tests/test_engine_on_pie_kernels.py runs that
 * build beside the vector one and demands the same ids and logits bits, and
 * tests/test_engine_on_arm64.py the NEON build (under qemu-user) beside it.
 */
#ifndef LLM_SIMD_H
#define LLM_SIMD_H

#include <stdint.h>
#include <string.h>

#if !defined(LLM_NO_SIMD) && (defined(__GNUC__) || defined(__clang__)) && \
    ((defined(__x86_64__) && defined(__SSE2__)) || \
     (defined(__aarch64__) && defined(__ARM_NEON)))
#define LLM_SIMD 1
#else
#define LLM_SIMD 0
#endif

#if LLM_SIMD
typedef float llm_f4 __attribute__((vector_size(16)));
typedef int32_t llm_i4 __attribute__((vector_size(16)));

static inline llm_f4 llm_f4_load(const float *p) {
    llm_f4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void llm_f4_store(float *p, llm_f4 v) { memcpy(p, &v, sizeof v); }

static inline llm_f4 llm_f4_splat(float x) { return (llm_f4){x, x, x, x}; }

/* Rows a, b, c, d (four floats each) as columns: out[i] = {a[i], b[i],
 * c[i], d[i]}. Moves only, no arithmetic. */
static inline void llm_f4_transpose(llm_f4 a, llm_f4 b, llm_f4 c, llm_f4 d, llm_f4 out[4]) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
    llm_f4 t0 = __builtin_shufflevector(a, b, 0, 4, 1, 5);
    llm_f4 t1 = __builtin_shufflevector(a, b, 2, 6, 3, 7);
    llm_f4 t2 = __builtin_shufflevector(c, d, 0, 4, 1, 5);
    llm_f4 t3 = __builtin_shufflevector(c, d, 2, 6, 3, 7);
    out[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
    out[1] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
    out[2] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
    out[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
#else
    for (int i = 0; i < 4; i++) out[i] = (llm_f4){a[i], b[i], c[i], d[i]};
#endif
}
#endif

#endif
