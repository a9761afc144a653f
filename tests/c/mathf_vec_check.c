/*
 * llm_expf_sub_n (mathf.c: softmax's weights on the host's vector lanes)
 * against llm_expf(x - sub) element by element, bit for bit: a sweep of
 * float bit patterns (every 97th, both signs: ~44 million values) taken in
 * runs of every length 1..19 (so each lane position, the 8-wide steps, the
 * 4-wide step and the scalar tail all see every kind of value), with sub 0
 * and a few others; the range edges and special values mixed with ordinary
 * lanes; and once in place (y == x, as the engine calls it).
 *
 *   mathf_vec_check   prints "compared=<n> mismatches=<m>", exits 1 on any
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "f32_bits.h"
#include "mathf.h"

static uint64_t compared, mismatches;

static void check(const float *x, uint32_t n, float sub, int in_place) {
    float y[32], tmp[32];
    if (in_place) {
        memcpy(tmp, x, n * sizeof(float));
        llm_expf_sub_n(tmp, sub, tmp, n);
        memcpy(y, tmp, n * sizeof(float));
    } else {
        llm_expf_sub_n(x, sub, y, n);
    }
    for (uint32_t i = 0; i < n; i++) {
        compared++;
        if (llm_f32_bits(y[i]) != llm_f32_bits(llm_expf(x[i] - sub)) && mismatches++ < 5)
            fprintf(stderr, "MISMATCH x=%a sub=%a element %u of %u\n", (double)x[i], (double)sub,
                    i, n);
    }
}

int main(void) {
    static const float edges[] = {-87.0f, 88.0f, -87.00001f, 88.00001f, -104.0f, 89.0f,
                                  -104.00001f, 89.00001f, -0.0f, 0.0f, 1.0f, -1.0f,
                                  0x1p-149f, -0x1p-149f, 3.4028235e38f, -3.4028235e38f};
    static const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u};
    static const float subs[] = {0.0f, 1.5f, -3.25f, 88.0f, -87.0f, 1e30f};
    float x[32];
    /* edges and specials in every lane position, between ordinary values */
    for (uint32_t k = 0; k < 32; k++) x[k] = (float)((int)k - 16) * 0.37f;
    for (size_t e = 0; e < sizeof edges / sizeof edges[0] + 4; e++) {
        const float v = e < sizeof edges / sizeof edges[0]
                            ? edges[e]
                            : llm_f32_from_bits(specials[e - sizeof edges / sizeof edges[0]]);
        for (uint32_t lane = 0; lane < 19; lane++) {
            float z[32];
            memcpy(z, x, sizeof z);
            z[lane] = v;
            for (size_t s = 0; s < sizeof subs / sizeof subs[0]; s++)
                for (uint32_t n = lane + 1; n <= 19; n++) check(z, n, subs[s], n & 1u);
        }
    }
    /* the sweep, in runs of 1..19 elements */
    uint32_t len = 1, have = 0, run = 0;
    for (uint64_t b = 0; b < 0x80000000ull; b += 97u) {
        x[have++] = llm_f32_from_bits((uint32_t)b);
        x[have++] = llm_f32_from_bits((uint32_t)b | 0x80000000u);
        if (have >= len) {
            check(x, len, subs[run % (sizeof subs / sizeof subs[0])], (int)(run % 7u == 0));
            memmove(x, x + len, (have - len) * sizeof(float));
            have -= len;
            len = len % 19u + 1u;
            run++;
        }
    }
    printf("compared=%llu mismatches=%llu\n", (unsigned long long)compared,
           (unsigned long long)mismatches);
    return mismatches ? 1 : 0;
}
