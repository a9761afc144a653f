/*
 * llm_expf4 / llm_erff4 (mathf.c) against llm_expf / llm_erff lane by lane,
 * bit for bit: a sweep of float bit patterns (every 97th, both signs: ~44
 * million values, positives in lanes 0 and 2, negatives in 1 and 3), the
 * range edges, and the special values mixed with ordinary lanes.
 *
 *   mathf4_check   prints "compared=<n> mismatches=<m>", exits 1 on any
 */
#include <stdint.h>
#include <stdio.h>

#include "f32_bits.h"
#include "mathf.h"

static uint64_t compared, mismatches;

static void check4(const float x[4]) {
    float e[4], r[4];
    llm_expf4(x, e);
    llm_erff4(x, r);
    for (int i = 0; i < 4; i++) {
        compared += 2;
        if (llm_f32_bits(e[i]) != llm_f32_bits(llm_expf(x[i])) && mismatches++ < 5)
            fprintf(stderr, "MISMATCH expf4 x=%a lane %d\n", (double)x[i], i);
        if (llm_f32_bits(r[i]) != llm_f32_bits(llm_erff(x[i])) && mismatches++ < 5)
            fprintf(stderr, "MISMATCH erff4 x=%a lane %d\n", (double)x[i], i);
    }
}

int main(void) {
    static const float edges[] = {-87.0f, 88.0f, -87.00001f, 88.00001f, -104.0f, 89.0f,
                                  -0.0f, 0.0f, 1.0f, -1.0f, 0.99999994f, 4.0f, 3.9999998f};
    float x[4];
    uint32_t i = 0;
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++) {
        x[i++ % 4] = edges[k];
        if (i % 4 == 0) check4(x);
    }
    uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u};
    for (int k = 0; k < 4; k++) {
        x[0] = llm_f32_from_bits(specials[k]);
        x[1] = 0.5f;
        x[2] = llm_f32_from_bits(specials[(k + 1) % 4]);
        x[3] = -3.0f;
        check4(x);
    }
    /* the sweep: consecutive patterns rotate through the four lanes */
    i = 0;
    for (uint64_t b = 0; b < 0x80000000ull; b += 97u) {
        x[i++ % 4] = llm_f32_from_bits((uint32_t)b);
        x[i++ % 4] = llm_f32_from_bits((uint32_t)b | 0x80000000u);
        if (i % 4 == 0) check4(x);
    }
    printf("compared=%llu mismatches=%llu\n", (unsigned long long)compared,
           (unsigned long long)mismatches);
    return mismatches ? 1 : 0;
}
