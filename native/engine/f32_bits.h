/*
 * A float32's IEEE-754 bit pattern and back, for the code that reasons in
 * bits (mathf.c's range reduction, the self-test's float probes, the C test
 * drivers). memcpy is the portable way to reinterpret without breaking
 * strict aliasing; compilers turn it into a register move.
 */
#ifndef LLM_F32_BITS_H
#define LLM_F32_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t llm_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float llm_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp16 (IEEE binary16) bits of a finite f32 that an fp16 holds exactly
 * (image.c's rule for every int4 scale: a widened fp16): 1 with *out set,
 * else 0 (more than fp16's fraction bits, outside its range, NaN or Inf).
 * The certified head's staged copy keeps its row scales this way
 * (engine_open.c), half the bytes a scored tile reads for them. */
static inline int llm_f32_bits_to_f16(uint32_t bits, uint16_t *out) {
    const uint32_t sign = (bits >> 16) & 0x8000u, mag = bits & 0x7FFFFFFFu;
    if (mag == 0) {
        *out = (uint16_t)sign;
        return 1;
    }
    const int32_t e = (int32_t)(mag >> 23) - 127;
    /* f32 subnormals are below fp16's least value 2^-24; e 128 is NaN/Inf */
    if ((mag >> 23) == 0 || e > 15 || e < -24) return 0;
    const uint32_t frac = mag & 0x7FFFFFu;
    if (e >= -14) { /* an fp16 normal: 10 fraction bits */
        if (frac & 0x1FFFu) return 0;
        *out = (uint16_t)(sign | (uint32_t)(e + 15) << 10 | frac >> 13);
        return 1;
    }
    /* an fp16 subnormal m * 2^-24, m = 1.frac * 2^(e + 24) < 2^10 an integer */
    const uint32_t sig = 0x800000u | frac, shift = (uint32_t)(-1 - e); /* 14..23 */
    if (sig & ((1u << shift) - 1u)) return 0;
    *out = (uint16_t)(sign | sig >> shift);
    return 1;
}

/* The f32 bits of a finite fp16's value, exactly (what llm_f32_bits_to_f16
 * took apart; NaN and Inf never reach it: no bit pattern with exponent 31).
 * A normal's fraction moves up 13 bits and its exponent is rebiased 15 ->
 * 127; a positive normal (every scale of a trained head) takes the first
 * test alone, the one path the certified head runs per scored row (head.c).
 * Zero and subnormals m * 2^-24 go through one exact float multiply (m <
 * 2^10, the product a normal f32). */
static inline uint32_t llm_f16_to_f32_bits(uint32_t h) {
    if (__builtin_expect(h - 0x0400u < 0x7800u, 1)) /* 0x0400 <= h < 0x7C00 */
        return (h << 13) + (112u << 23);
    const uint32_t sign = (h & 0x8000u) << 16, mag = h & 0x7FFFu;
    if (mag >= 0x0400u) return sign | ((mag << 13) + (112u << 23));
    return sign | llm_f32_bits((float)mag * 0x1p-24f);
}

#endif
