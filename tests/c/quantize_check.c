/*
 * llm_quantize_act (kernels_ref.c) rounds without libm: check it against
 * lrintf, the rounding the numerics contract names, bit for bit.
 *
 *   quantize_check   prints "compared=<n> mismatches=<m>", exits 1 on any
 *
 * Inputs: every halfway point k + 0.5 in [-128, 128] and its float
 * neighbours, a sweep of float bit patterns across [-128, 128] (every 61st
 * pattern: about 35 million values), zeros, and random vectors whose max
 * element sets the scale (so x * (127 / xmax) meets every rounding case).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "align_up.h"
#include "kernels.h"

static uint64_t compared, mismatches;

/* What the contract says, written with lrintf. */
static int8_t expect_q(float x, float inv) {
    float v = x * inv;
    long q = v == v ? lrintf(v) : 0;
    return (int8_t)(q > 127 ? 127 : (q < -127 ? -127 : q));
}

/* One value through the kernel: a vector [x, 127] has xmax 127, so inv is
 * exactly 1 and q = round(x) (|x| <= 127 keeps 127 the max). */
static void one(float x) {
    float in[2] = {x, 127.0f};
    _Alignas(16) int8_t q[32];
    float xs;
    llm_quantize_act(in, 2, 32, q, &xs);
    compared++;
    if (q[0] != expect_q(x, 127.f / 127.f) && mismatches++ < 5)
        fprintf(stderr, "MISMATCH x=%.9g got %d want %d\n", (double)x, q[0], expect_q(x, 1.f));
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

int main(void) {
    for (int k = -128; k < 128; k++) {
        float h = (float)k + 0.5f;
        if (fabsf(h) > 127.0f) continue;
        one(h);
        one(nextafterf(h, 1e9f));
        one(nextafterf(h, -1e9f));
        one((float)k);
    }
    one(0.0f);
    one(-0.0f);
    /* bit patterns of |x| <= 127 (0x42FE0000), both signs */
    for (uint32_t b = 0; b <= 0x42FE0000u; b += 61u) {
        float x;
        memcpy(&x, &b, 4);
        one(x);
        one(-x);
    }
    /* whole vectors: the kernel's own scale */
    for (int t = 0; t < 20000; t++) {
        uint32_t n = 1 + rnd() % 200;
        float x[200];
        float amp = ldexpf(1.0f, (int)(rnd() % 40) - 20);
        for (uint32_t i = 0; i < n; i++)
            x[i] = amp * ((float)(int32_t)(rnd() % 2000001u - 1000000u) / 1e6f);
        if (rnd() % 4 == 0) x[rnd() % n] = amp * 0.5f; /* exact halves after scaling */
        _Alignas(16) int8_t q[224];
        float xs;
        uint32_t np = (uint32_t)llm_align_up(n, 32u);
        llm_quantize_act(x, n, np, q, &xs);
        float xmax = 1e-8f;
        for (uint32_t i = 0; i < n; i++)
            if (fabsf(x[i]) > xmax) xmax = fabsf(x[i]);
        float inv = 127.f / xmax;
        for (uint32_t i = 0; i < np; i++) {
            int8_t want = i < n ? expect_q(x[i], inv) : 0;
            compared++;
            if (q[i] != want && mismatches++ < 5)
                fprintf(stderr, "MISMATCH vector %d elem %u: got %d want %d\n", t, i, q[i], want);
        }
        compared++;
        if (xs != xmax / 127.f && mismatches++ < 5) fprintf(stderr, "MISMATCH scale\n");
    }
    printf("compared=%llu mismatches=%llu\n", (unsigned long long)compared,
           (unsigned long long)mismatches);
    return mismatches ? 1 : 0;
}
