/*
 * The engine's own float32 transcendentals: expf (softmax, SiLU), erff (GELU)
 * and logf (Gumbel noise for the sampler); and the exact fp16 -> f32 widening
 * of the PLE rows' scales.
 *
 * Why not libm: glibc and newlib round their expf/erff/logf differently in the
 * last ulp, so the host and the board would compute different logits. These
 * routines use only IEEE-exact float32 + - * / and integer bit moves, in a
 * fixed order, so every conforming C11 target (FLT_EVAL_METHOD 0, compiled
 * with -ffp-contract=off, no -ffast-math) returns the same bits.
 * tools/mpllm/reference/numerics.py mirrors each routine operation for operation.
 *
 * Accuracy (measured by tests/test_numerics.py against float64 libm):
 *   llm_expf  <= 1 ulp for normal results; subnormal results are rounded once
 *             (absolute error <= 1 subnormal ulp).
 *   llm_logf  <= 1 ulp on every positive float, subnormals included.
 *   llm_erff  <= 2 ulp on every float.
 *
 * Special values:
 *   llm_expf: NaN -> NaN; x > 89 (incl. +inf) -> +inf; results above FLT_MAX
 *             overflow to +inf; x < -104 (incl. -inf) -> +0; results below
 *             the smallest subnormal round to 0.
 *   llm_logf: NaN -> NaN; x < 0 (incl. -inf, not -0) -> NaN; +-0 -> -inf;
 *             +inf -> +inf; log(1) == +0 exactly.
 *   llm_erff: NaN -> NaN; |x| >= 4 (incl. +-inf) -> +-1 exactly (erf rounds
 *             to 1 in float32 from |x| > 3.916 on); erff(-x) == -erff(x),
 *             the sign of zero included.
 */
#ifndef LLM_MATHF_H
#define LLM_MATHF_H

#include <stdint.h>

float llm_expf(float x);
float llm_logf(float x);
float llm_erff(float x);

/* Four at a time: y[i] is bit for bit llm_expf(x[i]) / llm_erff(x[i]). Four
 * independent chains of dependent float operations give an in-order FPU
 * something to overlap (the S3's float ops wait for their inputs); the
 * engine uses these wherever the elements are independent (softmax weights,
 * SiLU, GELU). x and y may be the same array. */
void llm_expf4(const float x[4], float y[4]);
void llm_erff4(const float x[4], float y[4]);

/* y[i] = llm_expf(x[i] - sub) bit for bit, i < n (x - sub rounded once, as
 * softmax computes it; x and y may be the same array). Softmax's weights on
 * a host with vector registers (simd.h's LLM_SIMD): each lane runs
 * llm_expf's operations, eight elements a step. Where LLM_SIMD is 0 (the
 * ESP32-S3) it is not built: the engine keeps llm_expf4 there. */
void llm_expf_sub_n(const float *x, float sub, float *y, uint32_t n);
/* y[i] = llm_expf(x[i]) bit for bit, i < n, the same way (SiLU's exp). */
void llm_expf_n(const float *x, float *y, uint32_t n);

/* IEEE half -> float, exact (subnormals included): the PLE rows' scales. */
float llm_half_to_float(uint16_t h);

#endif
