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

#endif
